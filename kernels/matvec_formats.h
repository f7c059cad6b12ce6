// Part of the matvec op (kernels/matvec.hip includes it; built and hashed with it: hipcore/runtime/kernels.py
// source_files): the weight formats, each loading an item's raw words apart from decoding them with the primitives
// of block_formats.h (the layouts' one definition).
#pragma once
#include "block_formats.h"

namespace {

constexpr int kMaxBatchPerPass = 8;

// Each format loads an item's raw words (load) apart from turning them into 8 floats (decode), so that
// the loop can issue the loads of two items before it waits for the first.

// Q4_1: item s (0..3) of a block takes qs[4s .. 4s+3]: their low nibbles are elements 4s..4s+3 and their high
// nibbles elements 16+4s..16+4s+3.
struct Q4_1Format {
  typedef rf_blocks::Q4_1 B;
  struct Raw {
    unsigned int dm, q;  // d in the low half of dm, m in the high half
  };
  static __device__ __forceinline__ unsigned long long row_bytes(int cols) { return rf_blocks::row_bytes<B>(cols); }
  static __device__ __forceinline__ Raw load(const unsigned char* __restrict__ row, int item) {
    const unsigned char* b = row + (item >> 2) * B::kBytes;
    return {*reinterpret_cast<const unsigned int*>(b), *reinterpret_cast<const unsigned int*>(b + B::kQsAt + 4 * (item & 3))};
  }
  static __device__ __forceinline__ void decode(const Raw r, int item, float w[8], int& col_a, int& col_b) {
    B::decode_word(B::d_of(r.dm), B::m_of(r.dm), r.q, w);
    col_a = (item >> 2) * 32 + 4 * (item & 3);
    col_b = col_a + 16;
  }
};

// Q8_0: item s takes qs[8s .. 8s+7].
struct Q8_0Format {
  typedef rf_blocks::Q8_0 B;
  struct Raw {
    unsigned short d, q[4];
  };
  static __device__ __forceinline__ unsigned long long row_bytes(int cols) { return rf_blocks::row_bytes<B>(cols); }
  static __device__ __forceinline__ Raw load(const unsigned char* __restrict__ row, int item) {
    const unsigned short* b = reinterpret_cast<const unsigned short*>(row + (item >> 2) * B::kBytes);
    const unsigned short* q = b + B::kQsAt / 2 + 4 * (item & 3);
    return {b[0], {q[0], q[1], q[2], q[3]}};
  }
  static __device__ __forceinline__ void decode(const Raw r, int item, float w[8], int& col_a, int& col_b) {
    B::decode8(rf_f16_to_float(r.d), r.q, w);
    col_a = (item >> 2) * 32 + 8 * (item & 3);
    col_b = col_a + 4;
  }
};

// Q4_0 (18 bytes, so only 2-byte aligned): items as in Q4_1, 2-byte loads.
struct Q4_0Format {
  typedef rf_blocks::Q4_0 B;
  struct Raw {
    unsigned short d, q[2];
  };
  static __device__ __forceinline__ unsigned long long row_bytes(int cols) { return rf_blocks::row_bytes<B>(cols); }
  static __device__ __forceinline__ Raw load(const unsigned char* __restrict__ row, int item) {
    const unsigned short* b = reinterpret_cast<const unsigned short*>(row + (item >> 2) * B::kBytes);
    const unsigned short* q = b + B::kQsAt / 2 + 2 * (item & 3);
    return {b[0], {q[0], q[1]}};
  }
  static __device__ __forceinline__ void decode(const Raw r, int item, float w[8], int& col_a, int& col_b) {
    B::decode_word(rf_f16_to_float(r.d), (unsigned int)r.q[0] | ((unsigned int)r.q[1] << 16), w);
    col_a = (item >> 2) * 32 + 4 * (item & 3);
    col_b = col_a + 16;
  }
};

// Q5_1 (24 bytes, 4-byte aligned): items as in Q4_1; item s's fifth bits are bits 4s..4s+3 and 16+4s..16+4s+3
// of qh. Three 4-byte loads: d|m, qh, the item's qs word.
struct Q5_1Format {
  typedef rf_blocks::Q5_1 B;
  struct Raw {
    unsigned int dm, h, q;
  };
  static __device__ __forceinline__ unsigned long long row_bytes(int cols) { return rf_blocks::row_bytes<B>(cols); }
  static __device__ __forceinline__ Raw load(const unsigned char* __restrict__ row, int item) {
    const unsigned int* b = reinterpret_cast<const unsigned int*>(row + (item >> 2) * B::kBytes);
    return {b[0], b[B::kQhAt / 4], b[B::kQsAt / 4 + (item & 3)]};
  }
  static __device__ __forceinline__ void decode(const Raw r, int item, float w[8], int& col_a, int& col_b) {
    B::decode_word(B::d_of(r.dm), B::m_of(r.dm), r.q, r.h >> (4 * (item & 3)), w);
    col_a = (item >> 2) * 32 + 4 * (item & 3);
    col_b = col_a + 16;
  }
};

// Q5_0 (22 bytes, so only 2-byte aligned): items as in Q5_1; 2-byte loads.
struct Q5_0Format {
  typedef rf_blocks::Q5_0 B;
  struct Raw {
    unsigned short d, h[2], q[2];
  };
  static __device__ __forceinline__ unsigned long long row_bytes(int cols) { return rf_blocks::row_bytes<B>(cols); }
  static __device__ __forceinline__ Raw load(const unsigned char* __restrict__ row, int item) {
    const unsigned short* b = reinterpret_cast<const unsigned short*>(row + (item >> 2) * B::kBytes);
    const unsigned short* q = b + B::kQsAt / 2 + 2 * (item & 3);
    return {b[0], {b[B::kQhAt / 2], b[B::kQhAt / 2 + 1]}, {q[0], q[1]}};
  }
  static __device__ __forceinline__ void decode(const Raw r, int item, float w[8], int& col_a, int& col_b) {
    B::decode_word(rf_f16_to_float(r.d), (unsigned int)r.q[0] | ((unsigned int)r.q[1] << 16),
                   ((unsigned int)r.h[0] | ((unsigned int)r.h[1] << 16)) >> (4 * (item & 3)), w);
    col_a = (item >> 2) * 32 + 4 * (item & 3);
    col_b = col_a + 16;
  }
};

// The scale and min of sub-block `sub` of a Q4_K / Q5_K super-block as floats (rf_blocks::KScales::scale_min).
static __device__ __forceinline__ void k_scale_min(unsigned int s0, unsigned int s1, unsigned int s2, int sub, float& sc,
                                                   float& m) {
  rf_blocks::KScales::scale_min(s0, s1, s2, sub, sc, m);
}

// Q4_K (block_format_q4_k.h): item s (0..31) of a super-block takes qs[32j + 4u .. +3] (j = s / 8,
// u = s % 8): elements 64j + 4u .. +3 and 64j + 32 + 4u .. +3. One 4-byte load for the codes and four
// for the header, which the 8 lanes of a chunk share (one cache line).
struct Q4_KFormat {
  struct Raw {
    unsigned int dm, s0, s1, s2, q;
  };
  static __device__ __forceinline__ unsigned long long row_bytes(int cols) { return rf_blocks::row_bytes<rf_blocks::Q4_K>(cols); }
  static __device__ __forceinline__ Raw load(const unsigned char* __restrict__ row, int item) {
    const unsigned int* b = reinterpret_cast<const unsigned int*>(row + (item >> 5) * rf_blocks::Q4_K::kBytes);
    const int s = item & 31;
    return {b[0], b[1], b[2], b[3], b[rf_blocks::Q4_K::kQsAt / 4 + 8 * (s >> 3) + (s & 7)]};
  }
  static __device__ __forceinline__ void decode(const Raw r, int item, float w[8], int& col_a, int& col_b) {
    const int s = item & 31, j = s >> 3;
    const float d = rf_f16_to_float((unsigned short)(r.dm & 0xffffu));
    const float dmin = rf_f16_to_float((unsigned short)(r.dm >> 16));
    float sc0, m0, sc1, m1;
    k_scale_min(r.s0, r.s1, r.s2, 2 * j, sc0, m0);
    k_scale_min(r.s0, r.s1, r.s2, 2 * j + 1, sc1, m1);
    const float d0 = d * sc0, d1 = d * sc1, n0 = -(dmin * m0), n1 = -(dmin * m1);  // products exact in float32
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      w[k] = fmaf(d0, (float)((r.q >> (8 * k)) & 15u), n0);
      w[4 + k] = fmaf(d1, (float)((r.q >> (8 * k + 4)) & 15u), n1);
    }
    col_a = (item >> 5) * 256 + 64 * j + 4 * (s & 7);
    col_b = col_a + 32;
  }
};

// Q5_K (block_format_q5_k.h): items as in Q4_K; the item's qh bytes are qh[4u .. 4u+3].
struct Q5_KFormat {
  struct Raw {
    unsigned int dm, s0, s1, s2, q, h;
  };
  static __device__ __forceinline__ unsigned long long row_bytes(int cols) { return rf_blocks::row_bytes<rf_blocks::Q5_K>(cols); }
  static __device__ __forceinline__ Raw load(const unsigned char* __restrict__ row, int item) {
    const unsigned int* b = reinterpret_cast<const unsigned int*>(row + (item >> 5) * rf_blocks::Q5_K::kBytes);
    const int s = item & 31;
    return {b[0], b[1], b[2], b[3], b[rf_blocks::Q5_K::kQsAt / 4 + 8 * (s >> 3) + (s & 7)], b[rf_blocks::Q5_K::kQhAt / 4 + (s & 7)]};
  }
  static __device__ __forceinline__ void decode(const Raw r, int item, float w[8], int& col_a, int& col_b) {
    const int s = item & 31, j = s >> 3;
    const float d = rf_f16_to_float((unsigned short)(r.dm & 0xffffu));
    const float dmin = rf_f16_to_float((unsigned short)(r.dm >> 16));
    float sc0, m0, sc1, m1;
    k_scale_min(r.s0, r.s1, r.s2, 2 * j, sc0, m0);
    k_scale_min(r.s0, r.s1, r.s2, 2 * j + 1, sc1, m1);
    const float d0 = d * sc0, d1 = d * sc1, n0 = -(dmin * m0), n1 = -(dmin * m1);
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const unsigned int lo = ((r.q >> (8 * k)) & 15u) | (((r.h >> (8 * k + 2 * j)) & 1u) << 4);
      const unsigned int hi = ((r.q >> (8 * k + 4)) & 15u) | (((r.h >> (8 * k + 2 * j + 1)) & 1u) << 4);
      w[k] = fmaf(d0, (float)lo, n0);
      w[4 + k] = fmaf(d1, (float)hi, n1);
    }
    col_a = (item >> 5) * 256 + 64 * j + 4 * (s & 7);
    col_b = col_a + 32;
  }
};

// Q6_K (block_format_q6_k.h: element 128h + 32s + l is nibble s >> 1 of ql[64h + 32(s & 1) + l] with bits 2s,
// 2s + 1 of qh[32h + l] on top). Item (s 0..31 of the super-block: h = s / 16, p = s % 8, odd = (s / 8) % 2) takes ql[64h + 32odd + 4p .. +3]
// and qh[32h + 4p .. +3]: its low nibbles are elements 128h + 32odd + 4p .. +3, its high nibbles the same
// plus 64. Every bit of the eight bytes loaded is used.
struct Q6_KFormat {
  struct Raw {
    unsigned short ql[2], qh[2], sa, sb, d;
  };
  static __device__ __forceinline__ unsigned long long row_bytes(int cols) { return rf_blocks::row_bytes<rf_blocks::Q6_K>(cols); }
  static __device__ __forceinline__ int scale_index(int s) { return 8 * (s >> 4) + 2 * ((s >> 3) & 1) + ((s & 7) >> 2); }
  static __device__ __forceinline__ Raw load(const unsigned char* __restrict__ row, int item) {
    const unsigned short* b = reinterpret_cast<const unsigned short*>(row + (item >> 5) * rf_blocks::Q6_K::kBytes);
    const int s = item & 31, h = s >> 4, p = s & 7;
    const unsigned short* ql = b + 32 * h + 16 * ((s >> 3) & 1) + 2 * p;
    const unsigned short* qh = b + rf_blocks::Q6_K::kQhAt / 2 + 16 * h + 2 * p;
    const int sa = scale_index(s);  // the high nibbles' scale is 4 further on: same 2-byte word parity
    constexpr int kScales = rf_blocks::Q6_K::kScalesAt / 2;
    return {{ql[0], ql[1]}, {qh[0], qh[1]}, b[kScales + (sa >> 1)], b[kScales + ((sa + 4) >> 1)], b[rf_blocks::Q6_K::kDAt / 2]};
  }
  static __device__ __forceinline__ void decode(const Raw r, int item, float w[8], int& col_a, int& col_b) {
    const int s = item & 31, odd = (s >> 3) & 1, sa = scale_index(s);
    const float d = rf_f16_to_float(r.d);
    const float da = d * (float)(signed char)(r.sa >> (8 * (sa & 1)));  // exact: 11 x 8 bits
    const float db = d * (float)(signed char)(r.sb >> (8 * (sa & 1)));
    const unsigned int q = (unsigned int)r.ql[0] | ((unsigned int)r.ql[1] << 16);
    const unsigned int h = (unsigned int)r.qh[0] | ((unsigned int)r.qh[1] << 16);
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const int lo = (int)(((q >> (8 * k)) & 15u) | (((h >> (8 * k + 2 * odd)) & 3u) << 4));
      const int hi = (int)(((q >> (8 * k + 4)) & 15u) | (((h >> (8 * k + 4 + 2 * odd)) & 3u) << 4));
      w[k] = da * (float)(lo - 32);
      w[4 + k] = db * (float)(hi - 32);
    }
    col_a = (item >> 5) * 256 + 128 * (s >> 4) + 32 * odd + 4 * (s & 7);
    col_b = col_a + 64;
  }
};

// F16: plain halves; item i is columns 8i .. 8i+7, one 16-byte load.
struct F16Format {
  typedef uint4 Raw;
  static __device__ __forceinline__ unsigned long long row_bytes(int cols) { return (unsigned long long)cols * 2; }
  static __device__ __forceinline__ Raw load(const unsigned char* __restrict__ row, int item) {
    return *reinterpret_cast<const uint4*>(row + 16 * item);
  }
  static __device__ __forceinline__ void decode(const Raw v, int item, float w[8], int& col_a, int& col_b) {
    w[0] = rf_f16_to_float((unsigned short)(v.x & 0xffffu));
    w[1] = rf_f16_to_float((unsigned short)(v.x >> 16));
    w[2] = rf_f16_to_float((unsigned short)(v.y & 0xffffu));
    w[3] = rf_f16_to_float((unsigned short)(v.y >> 16));
    w[4] = rf_f16_to_float((unsigned short)(v.z & 0xffffu));
    w[5] = rf_f16_to_float((unsigned short)(v.z >> 16));
    w[6] = rf_f16_to_float((unsigned short)(v.w & 0xffffu));
    w[7] = rf_f16_to_float((unsigned short)(v.w >> 16));
    col_a = 8 * item;
    col_b = col_a + 4;
  }
};

// BF16: plain bfloat16 values, placed as F16's.
struct BF16Format {
  typedef uint4 Raw;
  static __device__ __forceinline__ unsigned long long row_bytes(int cols) { return (unsigned long long)cols * 2; }
  static __device__ __forceinline__ Raw load(const unsigned char* __restrict__ row, int item) {
    return *reinterpret_cast<const uint4*>(row + 16 * item);
  }
  static __device__ __forceinline__ void decode(const Raw v, int item, float w[8], int& col_a, int& col_b) {
    const unsigned int words[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      w[2 * k] = rf_bf16_to_float((unsigned short)(words[k] & 0xffffu));
      w[2 * k + 1] = rf_bf16_to_float((unsigned short)(words[k] >> 16));
    }
    col_a = 8 * item;
    col_b = col_a + 4;
  }
};

// F32: plain floats (GGUF files may store small matrices so; the cpu backend stores every matrix so);
// item i is columns 8i .. 8i+7, two 16-byte loads.
struct F32Format {
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

}  // namespace
