// Part of the fused_matmul op (kernels/fused_matmul.hip includes it; built and hashed with it:
// hipcore/runtime/kernels.py source_files): the kernel's constants and the weight formats it reads.
#pragma once
#include "block_formats.h"  // the layouts and their decode primitives

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
// row need; decode(raw, col, w) turns them into floats with block_formats.h's decode8 (as matmul.hip's).
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

// Q8_0 (34 bytes, 2-byte aligned): qs[k .. k+7], k = col % 32.
struct Q8_0 {
  typedef rf_blocks::Q8_0 B;
  struct Raw {
    unsigned short d, q[4];
  };
  static __device__ __forceinline__ unsigned long long row_bytes(int cols) { return rf_blocks::row_bytes<B>(cols); }
  static __device__ __forceinline__ Raw load(const unsigned char* __restrict__ row, int col) {
    const unsigned short* b = reinterpret_cast<const unsigned short*>(row + (col >> 5) * B::kBytes);
    const unsigned short* q = b + B::kQsAt / 2 + ((col & 31) >> 1);
    return {b[0], {q[0], q[1], q[2], q[3]}};
  }
  static __device__ __forceinline__ void decode(const Raw r, int, float w[8]) { B::decode8(rf_f16_to_float(r.d), r.q, w); }
};

// Q4_1 block {half d; half m; uint8 qs[16]} (20 bytes, 4-byte aligned): columns k .. k+7 (k = col % 32)
// are the low nibbles of qs[k .. k+7] when k < 16, else the high nibbles of qs[k-16 .. k-9].
struct Q4_1 {
  typedef rf_blocks::Q4_1 B;
  struct Raw {
    unsigned int dm, q[2];
  };
  static __device__ __forceinline__ unsigned long long row_bytes(int cols) { return rf_blocks::row_bytes<B>(cols); }
  static __device__ __forceinline__ Raw load(const unsigned char* __restrict__ row, int col) {
    const unsigned int* b = reinterpret_cast<const unsigned int*>(row + (col >> 5) * B::kBytes);
    const unsigned int* q = b + B::kQsAt / 4 + ((col & 15) >> 2);
    return {b[0], {q[0], q[1]}};
  }
  static __device__ __forceinline__ void decode(const Raw r, int col, float w[8]) {
    B::decode8(B::d_of(r.dm), B::m_of(r.dm), r.q, (col & 16) >> 2, w);
  }
};

// Q5_1 (24 bytes, 4-byte aligned): Q4_1's nibbles with bit k of qh on top of column k's code (k = col % 32).
struct Q5_1 {
  typedef rf_blocks::Q5_1 B;
  struct Raw {
    unsigned int dm, h, q[2];
  };
  static __device__ __forceinline__ unsigned long long row_bytes(int cols) { return rf_blocks::row_bytes<B>(cols); }
  static __device__ __forceinline__ Raw load(const unsigned char* __restrict__ row, int col) {
    const unsigned int* b = reinterpret_cast<const unsigned int*>(row + (col >> 5) * B::kBytes);
    const unsigned int* q = b + B::kQsAt / 4 + ((col & 15) >> 2);
    return {b[0], b[B::kQhAt / 4], {q[0], q[1]}};
  }
  static __device__ __forceinline__ void decode(const Raw r, int col, float w[8]) {
    B::decode8(B::d_of(r.dm), B::m_of(r.dm), r.q, (col & 16) >> 2, r.h >> (col & 31), w);
  }
};

// Q5_0 (22 bytes, 2-byte aligned): Q5_1's codes, 2-byte loads.
struct Q5_0 {
  typedef rf_blocks::Q5_0 B;
  struct Raw {
    unsigned short d, h[2], q[4];
  };
  static __device__ __forceinline__ unsigned long long row_bytes(int cols) { return rf_blocks::row_bytes<B>(cols); }
  static __device__ __forceinline__ Raw load(const unsigned char* __restrict__ row, int col) {
    const unsigned short* b = reinterpret_cast<const unsigned short*>(row + (col >> 5) * B::kBytes);
    const unsigned short* q = b + B::kQsAt / 2 + ((col & 15) >> 1);
    return {b[0], {b[B::kQhAt / 2], b[B::kQhAt / 2 + 1]}, {q[0], q[1], q[2], q[3]}};
  }
  static __device__ __forceinline__ void decode(const Raw r, int col, float w[8]) {
    B::decode8(rf_f16_to_float(r.d), r.q, (col & 16) >> 2,
               ((unsigned int)r.h[0] | ((unsigned int)r.h[1] << 16)) >> (col & 31), w);
  }
};

}  // namespace fmm
}  // namespace
