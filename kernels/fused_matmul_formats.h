// Part of the fused_matmul op (kernels/fused_matmul.hip includes it; built and hashed with it:
// hipcore/runtime/kernels.py source_files): the kernel's constants and the weight formats it reads.
#pragma once

namespace {
namespace fmm {

constexpr int kThreads = 256;
constexpr int kTileRows = 64;                  // rows of W per tile
constexpr int kHalfRows = kTileRows / 2;       // gate (and up) rows of a SwiGLU tile
constexpr int kStepCols = 32;                  // columns per step
constexpr int kShared4 = (kStepCols + 4) / 4;  // float4s per shared row (36 floats: see matmul.hip)
constexpr int kMaxTileTokens = 64;
constexpr int kOutStride = kTileRows + 1;     // floats per token row of the finished tile in shared memory
constexpr int kCounterBytes = 4096;            // one int per tile, before the partials

// Each format: Raw load(row, col) reads what the 8 consecutive weights col .. col+7 (col % 8 == 0) of a
// row need; decode(raw, col, w) turns them into floats (matmul.hip's decoders, copied from the time a kernel's
// object was keyed on its one source file; the two ops could now share them through a header).
struct F32 {
  struct Raw {
    float4 a, b;
  };
  static __device__ __forceinline__ unsigned long long row_bytes(int cols) { return (unsigned long long)cols * 4; }
  static __device__ __forceinline__ Raw load(const unsigned char* __restrict__ row, int col) {
    const float4* p = reinterpret_cast<const float4*>(row + 4 * col);
    return {p[0], p[1]};
  }
  static __device__ __forceinline__ void decode(const Raw r, int, float w[8]) {
    w[0] = r.a.x; w[1] = r.a.y; w[2] = r.a.z; w[3] = r.a.w;
    w[4] = r.b.x; w[5] = r.b.y; w[6] = r.b.z; w[7] = r.b.w;
  }
};

struct F16 {
  typedef uint4 Raw;
  static __device__ __forceinline__ unsigned long long row_bytes(int cols) { return (unsigned long long)cols * 2; }
  static __device__ __forceinline__ Raw load(const unsigned char* __restrict__ row, int col) {
    return *reinterpret_cast<const uint4*>(row + 2 * col);
  }
  static __device__ __forceinline__ void decode(const Raw v, int, float w[8]) {
    const unsigned int words[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      w[2 * k] = rf_f16_to_float((unsigned short)(words[k] & 0xffffu));
      w[2 * k + 1] = rf_f16_to_float((unsigned short)(words[k] >> 16));
    }
  }
};

// BF16: as F16's, each bfloat16 widened by a shift (the top half of a float32).
struct BF16 : F16 {
  static __device__ __forceinline__ void decode(const Raw v, int, float w[8]) {
    const unsigned int words[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      w[2 * k] = rf_uint_as_float(words[k] << 16);
      w[2 * k + 1] = rf_uint_as_float(words[k] & 0xffff0000u);
    }
  }
};

// Q8_0 block {half d; int8 qs[32]} (34 bytes, 2-byte aligned): qs[k .. k+7], k = col % 32.
struct Q8_0 {
  struct Raw {
    unsigned short d, q[4];
  };
  static __device__ __forceinline__ unsigned long long row_bytes(int cols) { return (unsigned long long)(cols / 32) * 34; }
  static __device__ __forceinline__ Raw load(const unsigned char* __restrict__ row, int col) {
    const unsigned short* b = reinterpret_cast<const unsigned short*>(row + (col >> 5) * 34);
    const unsigned short* q = b + 1 + ((col & 31) >> 1);
    return {b[0], {q[0], q[1], q[2], q[3]}};
  }
  static __device__ __forceinline__ void decode(const Raw r, int, float w[8]) {
    const float d = rf_f16_to_float(r.d);
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      w[2 * k] = d * (float)(signed char)(r.q[k] & 0xffu);
      w[2 * k + 1] = d * (float)(signed char)(r.q[k] >> 8);
    }
  }
};

// Q4_1 block {half d; half m; uint8 qs[16]} (20 bytes, 4-byte aligned): columns k .. k+7 (k = col % 32)
// are the low nibbles of qs[k .. k+7] when k < 16, else the high nibbles of qs[k-16 .. k-9].
struct Q4_1 {
  struct Raw {
    unsigned int dm, q[2];
  };
  static __device__ __forceinline__ unsigned long long row_bytes(int cols) { return (unsigned long long)(cols / 32) * 20; }
  static __device__ __forceinline__ Raw load(const unsigned char* __restrict__ row, int col) {
    const unsigned int* b = reinterpret_cast<const unsigned int*>(row + (col >> 5) * 20);
    const unsigned int* q = b + 1 + ((col & 15) >> 2);
    return {b[0], {q[0], q[1]}};
  }
  static __device__ __forceinline__ void decode(const Raw r, int col, float w[8]) {
    const float d = rf_f16_to_float((unsigned short)(r.dm & 0xffffu));
    const float m = rf_f16_to_float((unsigned short)(r.dm >> 16));
    const int shift = (col & 16) >> 2;
#pragma unroll
    for (int k = 0; k < 8; ++k) w[k] = fmaf(d, (float)((r.q[k >> 2] >> (8 * (k & 3) + shift)) & 15u), m);
  }
};

// Q5_1 block {half d; half m; uint8 qh[4]; uint8 qs[16]} (24 bytes, 4-byte aligned): Q4_1's nibbles with
// bit k of qh (a little-endian word) on top of column k's code (k = col % 32).
struct Q5_1 {
  struct Raw {
    unsigned int dm, h, q[2];
  };
  static __device__ __forceinline__ unsigned long long row_bytes(int cols) { return (unsigned long long)(cols / 32) * 24; }
  static __device__ __forceinline__ Raw load(const unsigned char* __restrict__ row, int col) {
    const unsigned int* b = reinterpret_cast<const unsigned int*>(row + (col >> 5) * 24);
    const unsigned int* q = b + 2 + ((col & 15) >> 2);
    return {b[0], b[1], {q[0], q[1]}};
  }
  static __device__ __forceinline__ void decode(const Raw r, int col, float w[8]) {
    const float d = rf_f16_to_float((unsigned short)(r.dm & 0xffffu));
    const float m = rf_f16_to_float((unsigned short)(r.dm >> 16));
    const int shift = (col & 16) >> 2;
    const unsigned int h = r.h >> (col & 31);
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      w[k] = fmaf(d, (float)(((r.q[k >> 2] >> (8 * (k & 3) + shift)) & 15u) | (((h >> k) & 1u) << 4)), m);
    }
  }
};

// Q5_0 block {half d; uint8 qh[4]; uint8 qs[16]} (22 bytes, 2-byte aligned): d * (q - 16), q as in Q5_1.
struct Q5_0 {
  struct Raw {
    unsigned short d, h[2], q[4];
  };
  static __device__ __forceinline__ unsigned long long row_bytes(int cols) { return (unsigned long long)(cols / 32) * 22; }
  static __device__ __forceinline__ Raw load(const unsigned char* __restrict__ row, int col) {
    const unsigned short* b = reinterpret_cast<const unsigned short*>(row + (col >> 5) * 22);
    const unsigned short* q = b + 3 + ((col & 15) >> 1);
    return {b[0], {b[1], b[2]}, {q[0], q[1], q[2], q[3]}};
  }
  static __device__ __forceinline__ void decode(const Raw r, int col, float w[8]) {
    const float d = rf_f16_to_float(r.d);
    const int shift = (col & 16) >> 2;
    const unsigned int h = ((unsigned int)r.h[0] | ((unsigned int)r.h[1] << 16)) >> (col & 31);
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      const unsigned int q = ((r.q[k >> 1] >> (8 * (k & 1) + shift)) & 15u) | (((h >> k) & 1u) << 4);
      w[k] = d * (float)((int)q - 16);
    }
  }
};

}  // namespace fmm
}  // namespace
