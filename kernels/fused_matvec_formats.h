// Part of the fused_matvec op (kernels/fused_matvec.hip includes it; its code objects are built and hashed with
// it: hipcore/runtime/kernels.py source_files): the GGUF block formats the products read. Each format's
// Raw load(row, item) reads what item `item` (8 weights) of a row needs, and decode(raw, item, w, col_a, col_b)
// turns it into 8 floats and the two column offsets of x they multiply (4 + 4 columns, 16 apart for the
// 32-weight blocks, as matvec.hip's items). kPrefetch: whether a one-token launch fetches its first step's
// lines into L2 before it waits for the kernel ahead (fused_matvec.hip: prefetch_first_step).
#pragma once
#include "hip_compat.h"
#include "weight_loads.h"  // the weights read with an L2 evict-first policy on NVIDIA (F32's: plain)

namespace {
namespace fused {

struct Q4_1Format {
  static constexpr bool kPrefetch = true;  // fused_matvec.hip: prefetch_first_step
  struct Raw {
    unsigned int dm, q;
  };
  static __device__ __forceinline__ unsigned long long row_bytes(int cols) { return (unsigned long long)(cols / 32) * 20; }
  static __device__ __forceinline__ Raw load(const unsigned char* __restrict__ row, int item) {
    const unsigned char* b = row + (item >> 2) * 20;
    return {load_weights4(b), load_weights4(b + 4 + 4 * (item & 3))};
  }
  static __device__ __forceinline__ void decode(const Raw r, int item, float w[8], int& col_a, int& col_b) {
    const float d = rf_f16_to_float((unsigned short)(r.dm & 0xffffu));
    const float m = rf_f16_to_float((unsigned short)(r.dm >> 16));
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      w[j] = fmaf(d, (float)((r.q >> (8 * j)) & 15u), m);
      w[4 + j] = fmaf(d, (float)((r.q >> (8 * j + 4)) & 15u), m);
    }
    col_a = (item >> 2) * 32 + 4 * (item & 3);
    col_b = col_a + 16;
  }
};

// Q5_1 block: {half d; half m; uint8 qh[4]; uint8 qs[16]} (24 bytes, 4-byte aligned): Q4_1's nibbles with
// bit j of qh (a little-endian word) as element j's fifth bit. Items as in Q4_1: item s's fifth bits are
// bits 4s..4s+3 and 16+4s..16+4s+3 of qh. Three 4-byte loads: d|m, qh, the item's qs word.
struct Q5_1Format {
  static constexpr bool kPrefetch = true;  // fused_matvec.hip: prefetch_first_step
  struct Raw {
    unsigned int dm, h, q;
  };
  static __device__ __forceinline__ unsigned long long row_bytes(int cols) { return (unsigned long long)(cols / 32) * 24; }
  static __device__ __forceinline__ Raw load(const unsigned char* __restrict__ row, int item) {
    const unsigned int* b = reinterpret_cast<const unsigned int*>(row + (item >> 2) * 24);
    return {load_weights4(b), load_weights4(b + 1), load_weights4(b + 2 + (item & 3))};
  }
  static __device__ __forceinline__ void decode(const Raw r, int item, float w[8], int& col_a, int& col_b) {
    const float d = rf_f16_to_float((unsigned short)(r.dm & 0xffffu));
    const float m = rf_f16_to_float((unsigned short)(r.dm >> 16));
    const unsigned int h = r.h >> (4 * (item & 3));
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      w[j] = fmaf(d, (float)(((r.q >> (8 * j)) & 15u) | (((h >> j) & 1u) << 4)), m);
      w[4 + j] = fmaf(d, (float)(((r.q >> (8 * j + 4)) & 15u) | (((h >> (16 + j)) & 1u) << 4)), m);
    }
    col_a = (item >> 2) * 32 + 4 * (item & 3);
    col_b = col_a + 16;
  }
};

// Q5_0 block: {half d; uint8 qh[4]; uint8 qs[16]} (22 bytes, so only 2-byte aligned); element j is
// d * (q - 16), q as in Q5_1. Items as in Q4_1; 2-byte loads.
struct Q5_0Format {
  static constexpr bool kPrefetch = true;  // fused_matvec.hip: prefetch_first_step
  struct Raw {
    unsigned short d, h[2], q[2];
  };
  static __device__ __forceinline__ unsigned long long row_bytes(int cols) { return (unsigned long long)(cols / 32) * 22; }
  static __device__ __forceinline__ Raw load(const unsigned char* __restrict__ row, int item) {
    const unsigned short* b = reinterpret_cast<const unsigned short*>(row + (item >> 2) * 22);
    const unsigned short* q = b + 3 + 2 * (item & 3);
    return {load_weights2(b), {load_weights2(b + 1), load_weights2(b + 2)}, {load_weights2(q), load_weights2(q + 1)}};
  }
  static __device__ __forceinline__ void decode(const Raw r, int item, float w[8], int& col_a, int& col_b) {
    const float d = rf_f16_to_float(r.d);
    const unsigned int q = (unsigned int)r.q[0] | ((unsigned int)r.q[1] << 16);
    const unsigned int h = ((unsigned int)r.h[0] | ((unsigned int)r.h[1] << 16)) >> (4 * (item & 3));
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      w[j] = d * (float)((int)(((q >> (8 * j)) & 15u) | (((h >> j) & 1u) << 4)) - 16);
      w[4 + j] = d * (float)((int)(((q >> (8 * j + 4)) & 15u) | (((h >> (16 + j)) & 1u) << 4)) - 16);
    }
    col_a = (item >> 2) * 32 + 4 * (item & 3);
    col_b = col_a + 16;
  }
};

struct Q8_0Format {
  static constexpr bool kPrefetch = true;  // fused_matvec.hip: prefetch_first_step
  struct Raw {
    unsigned short d, q[4];
  };
  static __device__ __forceinline__ unsigned long long row_bytes(int cols) { return (unsigned long long)(cols / 32) * 34; }
  static __device__ __forceinline__ Raw load(const unsigned char* __restrict__ row, int item) {
    const unsigned short* b = reinterpret_cast<const unsigned short*>(row + (item >> 2) * 34);
    const unsigned short* q = b + 1 + 4 * (item & 3);
    return {load_weights2(b), {load_weights2(q), load_weights2(q + 1), load_weights2(q + 2), load_weights2(q + 3)}};
  }
  static __device__ __forceinline__ void decode(const Raw r, int item, float w[8], int& col_a, int& col_b) {
    const float d = rf_f16_to_float(r.d);
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      w[2 * j] = d * (float)(signed char)(r.q[j] & 0xffu);
      w[2 * j + 1] = d * (float)(signed char)(r.q[j] >> 8);
    }
    col_a = (item >> 2) * 32 + 8 * (item & 3);
    col_b = col_a + 4;
  }
};

// F16 and BF16: an item is 8 values, one 16-byte load, each widened to a float by Bits::widen (F16's conversion;
// BF16's shift: the top half of a float32).
struct F16Bits {
  static __device__ __forceinline__ float widen(unsigned short bits) { return rf_f16_to_float(bits); }
};
struct BF16Bits {
  static __device__ __forceinline__ float widen(unsigned short bits) { return rf_bf16_to_float(bits); }
};
template <class Bits>
struct Halves16Format {
  // No prefetch of the first step (fused_matvec.hip): measured on an NVIDIA H200, a Llama-3.2-1B shape in F16
  // decoded 1,024 -> 1,013 t/s with it (its rows stream 4 KB each at full bandwidth anyway).
  static constexpr bool kPrefetch = false;
  typedef uint4 Raw;
  static __device__ __forceinline__ unsigned long long row_bytes(int cols) { return (unsigned long long)cols * 2; }
  static __device__ __forceinline__ Raw load(const unsigned char* __restrict__ row, int item) {
    return load_weights16(row + 16 * item);
  }
  // Element by element: the same over an array of the four words spilled 16 bytes in BF16's matvec_add on sm_90.
  static __device__ __forceinline__ void decode(const Raw v, int item, float w[8], int& col_a, int& col_b) {
    w[0] = Bits::widen((unsigned short)(v.x & 0xffffu));
    w[1] = Bits::widen((unsigned short)(v.x >> 16));
    w[2] = Bits::widen((unsigned short)(v.y & 0xffffu));
    w[3] = Bits::widen((unsigned short)(v.y >> 16));
    w[4] = Bits::widen((unsigned short)(v.z & 0xffffu));
    w[5] = Bits::widen((unsigned short)(v.z >> 16));
    w[6] = Bits::widen((unsigned short)(v.w & 0xffffu));
    w[7] = Bits::widen((unsigned short)(v.w >> 16));
    col_a = 8 * item;
    col_b = col_a + 4;
  }
};
typedef Halves16Format<F16Bits> F16Format;
typedef Halves16Format<BF16Bits> BF16Format;

struct F32Format {
  static constexpr bool kPrefetch = false;  // as F16's (F32 weights are the small tensors)
  struct Raw {
    float4 a, b;
  };
  static __device__ __forceinline__ unsigned long long row_bytes(int cols) { return (unsigned long long)cols * 4; }
  static __device__ __forceinline__ Raw load(const unsigned char* __restrict__ row, int item) {
    const float4* p = reinterpret_cast<const float4*>(row + 32 * item);
    return {p[0], p[1]};
  }
  static __device__ __forceinline__ void decode(const Raw v, int item, float w[8], int& col_a, int& col_b) {
    w[0] = v.a.x; w[1] = v.a.y; w[2] = v.a.z; w[3] = v.a.w;
    w[4] = v.b.x; w[5] = v.b.y; w[6] = v.b.z; w[7] = v.b.w;
    col_a = 8 * item;
    col_b = col_a + 4;
  }
};

}  // namespace fused
}  // namespace
