// Part of the qmatvec op (kernels/qmatvec.hip includes it, and fused_qmatvec.hip for the same products;
// built and hashed with both: hipcore/runtime/kernels.py source_files): x quantized per slice to int8
// (XSlice) and the weight formats' loads, decodes (block_formats.h's packed codes) and integer dot products.
#pragma once

#include "block_formats.h"  // the layouts and their decode primitives
#include "weight_loads.h"  // the weights read with an L2 evict-first policy on NVIDIA

namespace {
namespace q8 {

constexpr int kMaxBatchPerPass = 4;
constexpr unsigned int kLowNibbles = rf_blocks::kLowNibbles;
constexpr unsigned int kOnes = rf_blocks::kByteOnes;

// One token's x over one slice, quantized: codes of run a (xq[0..3]) and run b (xq[4..7]), four per
// word, the scale d, and the sums of each run's codes (for the formats' offsets and mins).
struct XSlice {
  int xq[8];
  float d;
  int sum_a, sum_b;
};

static __device__ __forceinline__ unsigned int low_byte_code(float v, float inv) {
  // rint(v * inv) as the low byte of a float's bits: adding 1.5 * 2^23 rounds to an integer (to nearest
  // even, in the fused multiply-add: the exact product is rounded once) and leaves it in the low bits.
  return rf_float_as_uint(fmaf(v, inv, 12582912.0f)) & 0xffu;
}

// The slice's 32 values (run a in v[0..3], run b in v[4..7]) quantized.
static __device__ __forceinline__ XSlice quantize_values(const float4 v[8]) {
  float amax = 0.0f;
#pragma unroll
  for (int k = 0; k < 8; ++k)
    amax = fmaxf(fmaxf(fmaxf(amax, fabsf(v[k].x)), fmaxf(fabsf(v[k].y), fabsf(v[k].z))), fabsf(v[k].w));
  XSlice s;
  s.d = amax / 127.0f;
  const float inv = amax > 0.0f ? 127.0f / amax : 0.0f;
#pragma unroll
  for (int k = 0; k < 8; ++k)
    s.xq[k] = (int)(low_byte_code(v[k].x, inv) | (low_byte_code(v[k].y, inv) << 8) |
                    (low_byte_code(v[k].z, inv) << 16) | (low_byte_code(v[k].w, inv) << 24));
  s.sum_a = s.sum_b = 0;
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    s.sum_a = rf_dp4a(s.xq[k], (int)kOnes, s.sum_a);
    s.sum_b = rf_dp4a(s.xq[4 + k], (int)kOnes, s.sum_b);
  }
  return s;
}

static __device__ __forceinline__ XSlice quantize_x(const float* __restrict__ x, int col_a, int col_b) {
  float4 v[8];
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    v[k] = *reinterpret_cast<const float4*>(x + col_a + 4 * k);
    v[4 + k] = *reinterpret_cast<const float4*>(x + col_b + 4 * k);
  }
  return quantize_values(v);
}

// N little-endian words starting at a 2-byte aligned address: N + 1 aligned 4-byte loads, each pair
// shifted by 0 or 16 bits (a misaligned wide load would fault on NVIDIA).
template <int N>
static __device__ __forceinline__ void load_words(const unsigned char* __restrict__ p, unsigned int out[N]) {
  const unsigned long long addr = (unsigned long long)p;
  const unsigned int* base = reinterpret_cast<const unsigned int*>(addr & ~3ull);
  const int shift = (int)(addr & 2u) * 8;
  unsigned int w[N + 1];
#pragma unroll
  for (int k = 0; k < N; ++k) w[k] = load_weights4(base + k);
  // The word past the run is needed only when the run starts mid-word; at a word boundary it lies wholly past
  // the run and, for a Q8_0 block ending its buffer at a page's end, past the mapping (an illegal address): the
  // last word is read again instead, its bits shifted out.
  w[N] = load_weights4(base + N - (shift == 0 ? 1 : 0));
#pragma unroll
  for (int k = 0; k < N; ++k) out[k] = (unsigned int)((((unsigned long long)w[k + 1] << 32) | w[k]) >> shift);
}

// The 6-bit scale and min of sub-block `sub` (0..7) of a Q4_K / Q5_K super-block from its three words of
// packed scales (rf_blocks::KScales::scale_min), as ints.
static __device__ __forceinline__ void k_scale_min(unsigned int s0, unsigned int s1, unsigned int s2, int sub, int& sc,
                                                   int& m) {
  rf_blocks::KScales::scale_min(s0, s1, s2, sub, sc, m);
}

static __device__ __forceinline__ unsigned int word_of(const uint4 v, int k) {
  return k == 0 ? v.x : k == 1 ? v.y : k == 2 ? v.z : v.w;
}

// A Q4_K / Q5_K slice decoded: the codes of run a (lo) and run b (hi), four per word, the sub-blocks'
// scales and mins, the super-block's d and dmin. Decoding (the scale bits, the nibbles) is most of a
// slice's work; batched passes decode a slice once and apply it to every token.
struct KDecoded {
  unsigned int lo[4], hi[4];
  int sc0, m0, sc1, m1;
  float d, dmin;
  __device__ __forceinline__ float apply(const XSlice& x) const {
    int da = 0, db = 0;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      da = rf_dp4a((int)lo[i], x.xq[i], da);
      db = rf_dp4a((int)hi[i], x.xq[4 + i], db);
    }
    // Both integers stay under 2^24, so their conversions are exact.
    return d * (float)(sc0 * da + sc1 * db) - dmin * (float)(m0 * x.sum_a + m1 * x.sum_b);
  }
};

// Q4_K (block_format_q4_k.h): slice s (0..7) takes
// qs[32j + 16u .. +15] (j = s / 2, u = s % 2): low nibbles are elements 64j + 16u .. +15 of sub-block 2j,
// high nibbles 64j + 32 + 16u .. +15 of sub-block 2j + 1. w = d * sc * q - dmin * m.
struct Q4_KFormat {
  struct Raw {
    uint4 head, q;
  };
  typedef rf_blocks::Q4_K B;
  static __device__ __forceinline__ unsigned long long row_bytes(int cols) { return rf_blocks::row_bytes<B>(cols); }
  static __device__ __forceinline__ Raw load(const unsigned char* __restrict__ row, int slice) {
    const uint4* b = reinterpret_cast<const uint4*>(row + (slice >> 3) * B::kBytes);
    return {load_weights16(b), load_weights16(b + B::kQsAt / 16 + (slice & 7))};
  }
  static __device__ __forceinline__ void columns(int slice, int& col_a, int& col_b) {
    col_a = (slice >> 3) * 256 + 64 * ((slice & 7) >> 1) + 16 * (slice & 1);
    col_b = col_a + 32;
  }
  typedef KDecoded Decoded;
  static __device__ __forceinline__ Decoded decode(const Raw r, int slice) {
    const int j = (slice & 7) >> 1;
    KDecoded k;
    k_scale_min(r.head.y, r.head.z, r.head.w, 2 * j, k.sc0, k.m0);
    k_scale_min(r.head.y, r.head.z, r.head.w, 2 * j + 1, k.sc1, k.m1);
#pragma unroll
    for (int i = 0; i < 4; ++i) B::codes(word_of(r.q, i), k.lo[i], k.hi[i]);
    k.d = rf_f16_to_float((unsigned short)(r.head.x & 0xffffu));
    k.dmin = rf_f16_to_float((unsigned short)(r.head.x >> 16));
    return k;
  }
  static __device__ __forceinline__ float apply(const Decoded& k, const XSlice& x) { return k.apply(x); }
  static __device__ __forceinline__ float dot(const Raw r, int slice, const XSlice& x) { return apply(decode(r, slice), x); }
};

// Q5_K (block_format_q5_k.h): slices as Q4_K's;
// the fifth bit of element l of sub-block i is bit i of qh[l], so slice s reads qh[16u .. +15].
struct Q5_KFormat {
  struct Raw {
    uint4 head, q, h;
  };
  typedef rf_blocks::Q5_K B;
  static __device__ __forceinline__ unsigned long long row_bytes(int cols) { return rf_blocks::row_bytes<B>(cols); }
  static __device__ __forceinline__ Raw load(const unsigned char* __restrict__ row, int slice) {
    const uint4* b = reinterpret_cast<const uint4*>(row + (slice >> 3) * B::kBytes);
    return {load_weights16(b), load_weights16(b + B::kQsAt / 16 + (slice & 7)),
            load_weights16(b + B::kQhAt / 16 + (slice & 1))};
  }
  static __device__ __forceinline__ void columns(int slice, int& col_a, int& col_b) {
    Q4_KFormat::columns(slice, col_a, col_b);
  }
  typedef KDecoded Decoded;
  static __device__ __forceinline__ Decoded decode(const Raw r, int slice) {
    const int j = (slice & 7) >> 1;
    KDecoded k;
    k_scale_min(r.head.y, r.head.z, r.head.w, 2 * j, k.sc0, k.m0);
    k_scale_min(r.head.y, r.head.z, r.head.w, 2 * j + 1, k.sc1, k.m1);
#pragma unroll
    for (int i = 0; i < 4; ++i) B::codes(word_of(r.q, i), word_of(r.h, i), j, k.lo[i], k.hi[i]);
    k.d = rf_f16_to_float((unsigned short)(r.head.x & 0xffffu));
    k.dmin = rf_f16_to_float((unsigned short)(r.head.x >> 16));
    return k;
  }
  static __device__ __forceinline__ float apply(const Decoded& k, const XSlice& x) { return k.apply(x); }
  static __device__ __forceinline__ float dot(const Raw r, int slice, const XSlice& x) { return apply(decode(r, slice), x); }
};

// Q6_K (block_format_q6_k.h; 210 bytes, 2-byte aligned): slice s (half h = s / 4, t = s % 4) takes ql[64h + 16t .. +15], whose low nibbles are elements
// 128h + 16t .. +15 (sub-block 8h + t) and high nibbles 128h + 64 + 16t .. +15 (sub-block 8h + t + 4),
// and the two high bits of each from qh[32h + 16(t % 2) .. +15], bits 2(t / 2) and 4 + 2(t / 2).
// w = d * scale * (q - 32): the codes 0..63 go into the dot product as they are and 32 * sum(x) comes off.
struct Q6_KFormat {
  struct Raw {
    unsigned int ql[4], qh[4];
    int scale_a, scale_b;
    unsigned short d;
  };
  typedef rf_blocks::Q6_K B;
  static __device__ __forceinline__ unsigned long long row_bytes(int cols) { return rf_blocks::row_bytes<B>(cols); }
  static __device__ __forceinline__ Raw load(const unsigned char* __restrict__ row, int slice) {
    const unsigned char* b = row + (slice >> 3) * B::kBytes;
    const int h = (slice >> 2) & 1, t = slice & 3;
    Raw r;
    load_words<4>(b + 64 * h + 16 * t, r.ql);
    load_words<4>(b + B::kQhAt + 32 * h + 16 * (t & 1), r.qh);
    r.scale_a = (int)(signed char)b[B::kScalesAt + 8 * h + t];
    r.scale_b = (int)(signed char)b[B::kScalesAt + 4 + 8 * h + t];
    r.d = *reinterpret_cast<const unsigned short*>(b + B::kDAt);
    return r;
  }
  static __device__ __forceinline__ void columns(int slice, int& col_a, int& col_b) {
    col_a = (slice >> 3) * 256 + 128 * ((slice >> 2) & 1) + 16 * (slice & 3);
    col_b = col_a + 64;
  }
  // The 6-bit codes of both runs, their scales and d: what each token's product reads.
  struct Decoded {
    unsigned int lo[4], hi[4];
    int scale_a, scale_b;
    float d;
  };
  static __device__ __forceinline__ Decoded decode(const Raw r, int slice) {
    const int shift = 2 * ((slice & 3) >> 1);
    Decoded k;
#pragma unroll
    for (int i = 0; i < 4; ++i) B::codes(r.ql[i], r.qh[i], shift, k.lo[i], k.hi[i]);
    k.scale_a = r.scale_a, k.scale_b = r.scale_b;
    k.d = rf_f16_to_float(r.d);
    return k;
  }
  static __device__ __forceinline__ float apply(const Decoded& k, const XSlice& x) {
    int da = 0, db = 0;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      da = rf_dp4a((int)k.lo[i], x.xq[i], da);
      db = rf_dp4a((int)k.hi[i], x.xq[4 + i], db);
    }
    return k.d * (float)(k.scale_a * (da - 32 * x.sum_a) + k.scale_b * (db - 32 * x.sum_b));
  }
  static __device__ __forceinline__ float dot(const Raw r, int slice, const XSlice& x) { return apply(decode(r, slice), x); }
};

// Q8_0 (block_format_q8_0.h): a slice is a block, run a its elements 0..15, run b 16..31.
struct Q8_0Format {
  struct Raw {
    unsigned int q[8];
    unsigned short d;
  };
  typedef rf_blocks::Q8_0 B;
  static __device__ __forceinline__ unsigned long long row_bytes(int cols) { return rf_blocks::row_bytes<B>(cols); }
  static __device__ __forceinline__ Raw load(const unsigned char* __restrict__ row, int slice) {
    const unsigned char* b = row + slice * B::kBytes;
    Raw r;
    load_words<8>(b + B::kQsAt, r.q);
    r.d = *reinterpret_cast<const unsigned short*>(b);
    return r;
  }
  static __device__ __forceinline__ void columns(int slice, int& col_a, int& col_b) {
    col_a = slice * 32;
    col_b = col_a + 16;
  }
  struct Decoded {
    unsigned int q[8];
    float d;
  };
  static __device__ __forceinline__ Decoded decode(const Raw r, int) {
    Decoded k;
#pragma unroll
    for (int i = 0; i < 8; ++i) k.q[i] = r.q[i];
    k.d = rf_f16_to_float(r.d);
    return k;
  }
  static __device__ __forceinline__ float apply(const Decoded& k, const XSlice& x) {
    int s = 0;
#pragma unroll
    for (int i = 0; i < 8; ++i) s = rf_dp4a((int)k.q[i], x.xq[i], s);
    return k.d * (float)s;
  }
  static __device__ __forceinline__ float dot(const Raw r, int slice, const XSlice& x) { return apply(decode(r, slice), x); }
};

// Q4_0 (block_format_q4_0.h): low nibbles are elements 0..15 (run a), high nibbles 16..31 (run b);
// w = d * (q - 8).
struct Q4_0Format {
  struct Raw {
    unsigned int q[4];
    unsigned short d;
  };
  typedef rf_blocks::Q4_0 B;
  static __device__ __forceinline__ unsigned long long row_bytes(int cols) { return rf_blocks::row_bytes<B>(cols); }
  static __device__ __forceinline__ Raw load(const unsigned char* __restrict__ row, int slice) {
    const unsigned char* b = row + slice * B::kBytes;
    Raw r;
    load_words<4>(b + B::kQsAt, r.q);
    r.d = *reinterpret_cast<const unsigned short*>(b);
    return r;
  }
  static __device__ __forceinline__ void columns(int slice, int& col_a, int& col_b) {
    col_a = slice * 32;
    col_b = col_a + 16;
  }
  struct Decoded {
    unsigned int lo[4], hi[4];
    float d;
  };
  // A slice's 16 code bytes as the nibbles of columns 0..15 (lo) and 16..31 (hi), four to a word (Q4_1's too).
  static __device__ __forceinline__ void nibble_codes(const unsigned int q[4], unsigned int lo[4], unsigned int hi[4]) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      lo[i] = rf_blocks::low_nibbles(q[i]);
      hi[i] = rf_blocks::high_nibbles(q[i]);
    }
  }
  static __device__ __forceinline__ Decoded decode(const Raw r, int) {
    Decoded k;
    nibble_codes(r.q, k.lo, k.hi);
    k.d = rf_f16_to_float(r.d);
    return k;
  }
  static __device__ __forceinline__ float apply(const Decoded& k, const XSlice& x) {
    int s = 0;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      s = rf_dp4a((int)k.lo[i], x.xq[i], s);
      s = rf_dp4a((int)k.hi[i], x.xq[4 + i], s);
    }
    return k.d * (float)(s - 8 * (x.sum_a + x.sum_b));
  }
  static __device__ __forceinline__ float dot(const Raw r, int slice, const XSlice& x) { return apply(decode(r, slice), x); }
};

}  // namespace q8
}  // namespace
