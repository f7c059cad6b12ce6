// Part of the fused_matvec op (kernels/fused_matvec.hip includes it; its code objects are built and hashed with
// it: hipcore/runtime/kernels.py source_files): how the products read the GGUF block formats (block_formats.h's
// layouts and decode primitives). Each format's
// Raw load(row, item) reads what item `item` (8 weights) of a row needs, and decode(raw, item, w, col_a, col_b)
// turns it into 8 floats and the two column offsets of x they multiply (4 + 4 columns, 16 apart for the
// 32-weight blocks, as matvec.hip's items). kPrefetch: whether a one-token launch fetches its first step's
// lines into L2 before it waits for the kernel ahead (fused_matvec.hip: prefetch_first_step).
#pragma once
#include "hip_compat.h"
#include "block_formats.h"  // the layouts and their decode primitives
#include "weight_loads.h"  // the weights read with an L2 evict-first policy on NVIDIA (F32's: plain)

namespace {
namespace fused {

// Q4_1: item s (0..3) of a block takes qs[4s .. 4s+3] (elements 4s..4s+3 and 16+4s..16+4s+3).
struct Q4_1Format {
  static constexpr bool kPrefetch = true;  // fused_matvec.hip: prefetch_first_step
  typedef rf_blocks::Q4_1 B;
  struct Raw {
    unsigned int dm, q;
  };
  static __device__ __forceinline__ unsigned long long row_bytes(int cols) { return rf_blocks::row_bytes<B>(cols); }
  static __device__ __forceinline__ Raw load(const unsigned char* __restrict__ row, int item) {
    const unsigned char* b = row + (item >> 2) * B::kBytes;
    return {load_weights4(b), load_weights4(b + B::kQsAt + 4 * (item & 3))};
  }
  static __device__ __forceinline__ void decode(const Raw r, int item, float w[8], int& col_a, int& col_b) {
    B::decode_word(B::d_of(r.dm), B::m_of(r.dm), r.q, w);
    col_a = (item >> 2) * 32 + 4 * (item & 3);
    col_b = col_a + 16;
  }
};

// Q5_1: items as in Q4_1; item s's fifth bits are bits 4s..4s+3 and 16+4s..16+4s+3 of qh. Three 4-byte loads:
// d|m, qh, the item's qs word.
struct Q5_1Format {
  static constexpr bool kPrefetch = true;  // fused_matvec.hip: prefetch_first_step
  typedef rf_blocks::Q5_1 B;
  struct Raw {
    unsigned int dm, h, q;
  };
  static __device__ __forceinline__ unsigned long long row_bytes(int cols) { return rf_blocks::row_bytes<B>(cols); }
  static __device__ __forceinline__ Raw load(const unsigned char* __restrict__ row, int item) {
    const unsigned int* b = reinterpret_cast<const unsigned int*>(row + (item >> 2) * B::kBytes);
    return {load_weights4(b), load_weights4(b + B::kQhAt / 4), load_weights4(b + B::kQsAt / 4 + (item & 3))};
  }
  static __device__ __forceinline__ void decode(const Raw r, int item, float w[8], int& col_a, int& col_b) {
    B::decode_word(B::d_of(r.dm), B::m_of(r.dm), r.q, r.h >> (4 * (item & 3)), w);
    col_a = (item >> 2) * 32 + 4 * (item & 3);
    col_b = col_a + 16;
  }
};

// Q5_0 (22 bytes, so only 2-byte aligned): items as in Q5_1; 2-byte loads.
struct Q5_0Format {
  static constexpr bool kPrefetch = true;  // fused_matvec.hip: prefetch_first_step
  typedef rf_blocks::Q5_0 B;
  struct Raw {
    unsigned short d, h[2], q[2];
  };
  static __device__ __forceinline__ unsigned long long row_bytes(int cols) { return rf_blocks::row_bytes<B>(cols); }
  static __device__ __forceinline__ Raw load(const unsigned char* __restrict__ row, int item) {
    const unsigned short* b = reinterpret_cast<const unsigned short*>(row + (item >> 2) * B::kBytes);
    const unsigned short* q = b + B::kQsAt / 2 + 2 * (item & 3);
    return {load_weights2(b), {load_weights2(b + B::kQhAt / 2), load_weights2(b + B::kQhAt / 2 + 1)},
            {load_weights2(q), load_weights2(q + 1)}};
  }
  static __device__ __forceinline__ void decode(const Raw r, int item, float w[8], int& col_a, int& col_b) {
    B::decode_word(rf_f16_to_float(r.d), (unsigned int)r.q[0] | ((unsigned int)r.q[1] << 16),
                   ((unsigned int)r.h[0] | ((unsigned int)r.h[1] << 16)) >> (4 * (item & 3)), w);
    col_a = (item >> 2) * 32 + 4 * (item & 3);
    col_b = col_a + 16;
  }
};

// Q8_0: item s takes qs[8s .. 8s+7].
struct Q8_0Format {
  static constexpr bool kPrefetch = true;  // fused_matvec.hip: prefetch_first_step
  typedef rf_blocks::Q8_0 B;
  struct Raw {
    unsigned short d, q[4];
  };
  static __device__ __forceinline__ unsigned long long row_bytes(int cols) { return rf_blocks::row_bytes<B>(cols); }
  static __device__ __forceinline__ Raw load(const unsigned char* __restrict__ row, int item) {
    const unsigned short* b = reinterpret_cast<const unsigned short*>(row + (item >> 2) * B::kBytes);
    const unsigned short* q = b + B::kQsAt / 2 + 4 * (item & 3);
    return {load_weights2(b), {load_weights2(q), load_weights2(q + 1), load_weights2(q + 2), load_weights2(q + 3)}};
  }
  static __device__ __forceinline__ void decode(const Raw r, int item, float w[8], int& col_a, int& col_b) {
    B::decode8(rf_f16_to_float(r.d), r.q, w);
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
