// Part of the matmul_mma op and of moe_experts_mma (matmul_mma_fragment_formats.h includes it; built and hashed with
// each: hipcore/runtime/kernels.py source_files): the fragment path's reading of the 32-element block formats, Q4_0,
// Q4_1, Q5_0, Q5_1, Q8_0 and MXFP4, and of F16 and BF16 in runs of 32, for NVIDIA's decode batches and the experts'
// few-pairs tiles (the K-quants' are in matmul_mma_fragment_formats.h, which explains the lanes' k order).
#pragma once
#include "hip_compat.h"

namespace {
namespace mmq {

#if RF_MMA_KIND == RF_MMA_NV_M16N8K16
// A step is two blocks, 64 columns: k-substeps 0 and 1 read the first block, 2 and 3 the second (frag_column's
// half s / 2), so lane t decodes columns 8t .. 8t + 7 of each block, in two words of four (word i: columns 8t +
// 4i .. 8t + 4i + 3, k-substep 2 half + i) of two f16 pairs each. Two blocks a step, not the shared tiles' one
// (Narrow), so that a lane has as many weight bytes in flight a step as a K-quant step gives it.
template <class L>
struct Pair32 {
  static constexpr int kStepCols = 64;
  static __device__ __forceinline__ unsigned long long row_bytes(int cols) { return (unsigned long long)(cols / 32) * L::kBlockBytes; }
  static __device__ __forceinline__ int column(int c0, int col) { return c0 + col; }
};

constexpr unsigned int kF16Byte = 0x64646464u;  // byte permutes put 0x64 above a code byte: the f16 1024 + code

// The f16 pair of two code bytes of v (bytes 0 and 1 for e = 0, 2 and 3 for e = 1; below 256 each) minus `bias` in
// both lanes (an f16 pair of 1024 + the codes' offset): exact, the codes and the results are f16 integers.
static __device__ __forceinline__ unsigned int code_pair(unsigned int v, unsigned int bias, int e) {
  return rf_h2_sub(rf_byte_perm(v, kF16Byte, e ? 0x4342u : 0x4140u), bias);
}

// The fifth bits of Q5_0 / Q5_1, or-ed onto their nibbles: a pair's (rf_blocks::fifth_bits2, Q5_1) and a word's
// (rf_blocks::fifth_bits4, Q5_0).
static __device__ __forceinline__ unsigned int fifth_bit_pair(unsigned int b) { return rf_blocks::fifth_bits2(b); }
static __device__ __forceinline__ unsigned int fifth_bit_word(unsigned int b) { return rf_blocks::fifth_bits4(b); }

// A block's f16 scale in both lanes of a pair.
static __device__ __forceinline__ unsigned int scale_pair(unsigned short d) { return (unsigned int)d * 0x10001u; }

// A lane's eight code bytes of a 2-byte aligned block (Q8_0 34 bytes, Q4_0 18, Q5_0 22) in aligned 4-byte words. A
// step starts 4-byte aligned (the launcher takes the fragment path for these formats only there: matmul_mma.py
// pair32_aligned), so the codes of its first block (kFirst) sit at 2 mod 4, read as the three words around them (the
// third reaching two bytes into the second block), and those of its second block at 0 mod 4, two words: 3 and 2 loads
// where 2-byte loads took 8.
template <bool kFirst>
struct CodeWords {
  unsigned int w[kFirst ? 3 : 2];
  static __device__ __forceinline__ CodeWords load(const unsigned char* __restrict__ p) {
    const unsigned int* a = reinterpret_cast<const unsigned int*>(p - (kFirst ? 2 : 0));
    CodeWords c;
#pragma unroll
    for (int k = 0; k < (kFirst ? 3 : 2); ++k) c.w[k] = a[k];
    return c;
  }
  // Bytes 4i .. 4i + 3 of the eight.
  __device__ __forceinline__ unsigned int word(int i) const { return kFirst ? (w[i] >> 16) | (w[i + 1] << 16) : w[i]; }
};

// A 2-byte aligned block's f16 scale d (its first two bytes) and a lane's eight code bytes `offset` bytes into it.
template <bool kFirst>
struct ScaledCodes {
  unsigned short d;
  CodeWords<kFirst> q;
  static __device__ __forceinline__ ScaledCodes load(const unsigned char* __restrict__ b, int offset) {
    return {*reinterpret_cast<const unsigned short*>(b), CodeWords<kFirst>::load(b + offset)};
  }
};

// Q8_0 {half d; int8 qs[32]} (34 bytes, 2-byte aligned): lane t reads qs[8t .. 8t + 7]. w = d * q: q + 128 from
// flipping the sign bits, 1152 + q as an f16, minus 1152 exactly, times d: one rounding, as the shared tiles' float
// decode. kDepth steps in flight: the staged entry takes one (with two, nvcc spilled 4 bytes at 128 registers on
// sm_90).
template <int kStepsInFlight>
struct Q8_0Lane {
  static constexpr int kBlockBytes = rf_blocks::Q8_0::kBytes, kDepth = kStepsInFlight;
  template <bool kFirst>
  using Raw = ScaledCodes<kFirst>;
  template <bool kFirst>
  static __device__ __forceinline__ Raw<kFirst> load(const unsigned char* __restrict__ b, int t) {
    return Raw<kFirst>::load(b, rf_blocks::Q8_0::kQsAt + 8 * t);
  }
  template <bool kFirst>
  static __device__ __forceinline__ void decode(const Raw<kFirst>& r, int, unsigned int out[4]) {
    constexpr unsigned int k1152 = 0x64806480u;
    const unsigned int d = scale_pair(r.d);
#pragma unroll
    for (int p = 0; p < 4; ++p) out[p] = rf_h2_mul(code_pair(r.q.word(p >> 1) ^ 0x80808080u, k1152, p & 1), d);
  }
};

// Q4_0 {half d; uint8 qs[16]} (18 bytes, 2-byte aligned): column k < 16 is the low nibble of qs[k], k >= 16 the high
// nibble of qs[k - 16], so lanes t and t + 2 read the same bytes qs[8 (t % 2) ..], nibbles apart. w = d * (q - 8).
struct Q4_0Lane {
  static constexpr int kBlockBytes = rf_blocks::Q4_0::kBytes, kDepth = 2;
  template <bool kFirst>
  using Raw = ScaledCodes<kFirst>;
  template <bool kFirst>
  static __device__ __forceinline__ Raw<kFirst> load(const unsigned char* __restrict__ b, int t) {
    return Raw<kFirst>::load(b, rf_blocks::Q4_0::kQsAt + 8 * (t & 1));
  }
  template <bool kFirst>
  static __device__ __forceinline__ void decode(const Raw<kFirst>& r, int t, unsigned int out[4]) {
    constexpr unsigned int k1032 = 0x64086408u;
    const unsigned int d = scale_pair(r.d), shift = 4u * (unsigned int)(t >> 1);
#pragma unroll
    for (int p = 0; p < 4; ++p) out[p] = rf_h2_mul(code_pair((r.q.word(p >> 1) >> shift) & 0x0f0f0f0fu, k1032, p & 1), d);
  }
};

// Q5_0 {half d; uint8 qh[4]; uint8 qs[16]} (22 bytes, 2-byte aligned): Q4_0's nibbles with bit k of qh (a
// little-endian word) as column k's fifth bit, so lane t's fifth bits are byte t of qh; w = d * (q - 16).
struct Q5_0Lane {
  typedef rf_blocks::Q5_0 B;
  static constexpr int kBlockBytes = B::kBytes, kDepth = 2;
  template <bool kFirst>
  struct Raw {
    unsigned short d;
    unsigned char h;
    CodeWords<kFirst> q;
  };
  template <bool kFirst>
  static __device__ __forceinline__ Raw<kFirst> load(const unsigned char* __restrict__ b, int t) {
    return {*reinterpret_cast<const unsigned short*>(b), b[B::kQhAt + t], CodeWords<kFirst>::load(b + B::kQsAt + 8 * (t & 1))};
  }
  template <bool kFirst>
  static __device__ __forceinline__ void decode(const Raw<kFirst>& r, int t, unsigned int out[4]) {
    constexpr unsigned int k1040 = 0x64106410u;
    const unsigned int d = scale_pair(r.d), shift = 4u * (unsigned int)(t >> 1), h = r.h;
#pragma unroll
    for (int p = 0; p < 4; ++p) {
      const unsigned int codes = ((r.q.word(p >> 1) >> shift) & 0x0f0f0f0fu) | fifth_bit_word(h >> (4 * (p >> 1)));
      out[p] = rf_h2_mul(code_pair(codes, k1040, p & 1), d);
    }
  }
};

// Q4_1 {half d; half m; uint8 qs[16]} (20 bytes, 4-byte aligned) and Q5_1 {half d; half m; uint8 qh[4]; uint8
// qs[16]} (24 bytes): Q4_0's and Q5_0's codes, w = d * q + m, one f16 fused multiply-add (one rounding).
template <bool kFiveBit>
struct Q41Lane {
  static constexpr int kBlockBytes = kFiveBit ? rf_blocks::Q5_1::kBytes : rf_blocks::Q4_1::kBytes;
  static constexpr int kQsOffset = kFiveBit ? rf_blocks::Q5_1::kQsAt : rf_blocks::Q4_1::kQsAt, kDepth = kFiveBit ? 2 : 3;
  template <bool>  // the same in either block of a step: 4-byte aligned
  struct Raw {
    unsigned int dm, h, q[2];
  };
  template <bool kFirst>
  static __device__ __forceinline__ Raw<kFirst> load(const unsigned char* __restrict__ b, int t) {
    const unsigned int* w = reinterpret_cast<const unsigned int*>(b);
    const unsigned int* q = reinterpret_cast<const unsigned int*>(b + kQsOffset) + 2 * (t & 1);
    return {w[0], kFiveBit ? w[rf_blocks::Q5_1::kQhAt / 4] : 0u, {q[0], q[1]}};
  }
  template <bool kFirst>
  static __device__ __forceinline__ void decode(const Raw<kFirst>& r, int t, unsigned int out[4]) {
    constexpr unsigned int k1024 = 0x64006400u;
    const unsigned int d = rf_byte_perm(r.dm, 0u, 0x1010u), m = rf_byte_perm(r.dm, 0u, 0x3232u);
    const unsigned int shift = 4u * (unsigned int)(t >> 1), h = r.h >> (8 * t);
#pragma unroll
    for (int p = 0; p < 4; ++p) {
      unsigned int codes = (r.q[p >> 1] >> (16 * (p & 1) + shift)) & 0x0f0fu;
      if (kFiveBit) codes |= fifth_bit_pair(h >> (2 * p));
      out[p] = rf_h2_fma(code_pair(codes, k1024, 0), d, m);
    }
  }
};

// MXFP4 {uint8 e; uint8 qs[16]} (17 bytes, byte aligned: block_format_mxfp4.h): Q4_0's nibble order, so lane t's
// eight codes are the low (t < 2) or high nibbles of qs[8 (t % 2) ..], read as MXFP4Eights reads eight weights (three
// aligned words shifted into place). w = kvalue[code] * 2^(e - 128), rounded once to f16 as the shared tiles round
// it: the doubled E2M1 values (0, 1, 2, 3, 4, 6, 8, 12) are f16s whose low byte is zero, so a byte permute of the
// codes gives their high bytes (the sign bit or-ed in from the code's), and one f16 multiply by 2^(e - 128) rounds
// the exact product. Where that scale is below f16's normal range, the multiply goes in two: by 2^-14 (exact: the
// values stay normal), then by 2^(e - 114) (an f16 subnormal, or zero below 2^-24, where the product rounds to zero
// anyway), still one rounding. Scales above 2^15 overflow: the launcher takes MXFP4 experts on this path only where
// their weights fit f16 (hipcore/model/weights.py).
template <int kStepsInFlight>
struct MXFP4Lane {
  typedef rf_blocks::MXFP4 B;
  static constexpr int kBlockBytes = B::kBytes, kDepth = kStepsInFlight;
  static constexpr unsigned int kHighLow = 0x42403C00u, kHighHigh = 0x4A484644u;  // f16 high bytes of 0, 1, 2, 3; 4, 6, 8, 12
  template <bool>  // the same in either block of a step: byte aligned
  using Raw = typename rf_blocks::MXFP4Eights<>::Raw;
  template <bool kFirst>
  static __device__ __forceinline__ Raw<kFirst> load(const unsigned char* __restrict__ b, int t) {
    return rf_blocks::MXFP4Eights<>::load(b, 8 * t);  // the block's columns 8t .. 8t + 7
  }
  static __device__ __forceinline__ void decode(const Raw<true>& r, int t, unsigned int out[4]) {  // either block's
    const int k = (int)r.e - 128;
    const bool small = k < -14;
    const unsigned int scale = k > 15 ? 0x7C00u : small ? 0x0400u : (unsigned int)(k + 15) << 10;
    const int k2 = k + 14;  // the second factor's exponent where small
    const unsigned int second = k2 < -24 ? 0u : k2 < -14 ? 1u << (k2 + 24) : (unsigned int)(k2 + 15) << 10;
    const unsigned int shift = 4u * (unsigned int)(t >> 1);
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const unsigned int codes = (r.q[i] >> shift) & 0x0f0f0f0fu;
      const unsigned int c = codes & 0x07070707u, spread = c | (c >> 4);
      const unsigned int selector = (spread & 0xffu) | ((spread >> 8) & 0xff00u);  // code n's magnitude at nibble n
      const unsigned int high = rf_byte_perm(kHighLow, kHighHigh, selector) | ((codes & 0x08080808u) << 4);
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        unsigned int v = rf_h2_mul(rf_byte_perm(high, 0u, e ? 0x3424u : 0x1404u), scale * 0x10001u);
        if (small) v = rf_h2_mul(v, second * 0x10001u);
        out[2 * i + e] = v;
      }
    }
  }
};

// F16 as runs of 32 halves (64 bytes): lane t's columns 8t .. 8t + 7 are one 16-byte load, its four pairs as loaded.
// kDepth steps in flight: the staged entry takes one (with two, nvcc spilled 12 bytes at 128 registers on sm_90).
template <int kStepsInFlight>
struct F16Lane {
  static constexpr int kBlockBytes = 64, kDepth = kStepsInFlight;
  template <bool>  // the same in either run of a step
  struct Raw {
    unsigned int w[4];
  };
  template <bool kFirst>
  static __device__ __forceinline__ Raw<kFirst> load(const unsigned char* __restrict__ b, int t) {
    const uint4 v = *reinterpret_cast<const uint4*>(b + 16 * t);
    return {{v.x, v.y, v.z, v.w}};
  }
  template <bool kFirst>
  static __device__ __forceinline__ void decode(const Raw<kFirst>& r, int, unsigned int out[4]) {
#pragma unroll
    for (int p = 0; p < 4; ++p) out[p] = r.w[p];
  }
};

// BF16 as runs of 32 (64 bytes), loaded as F16Lane's: each word's two bfloat16 widened to floats (a shift, a mask)
// and narrowed to one f16 pair, one conversion (matmul_mma_formats.h's BF16 says where that is exact). Steps in flight:
// two staged, one direct (staged at one nvcc spilled 4 bytes on sm_90, direct at two 12 bytes on sm_80).
template <int kStepsInFlight>
struct BF16Lane : F16Lane<kStepsInFlight> {
  template <bool kFirst>
  static __device__ __forceinline__ void decode(const typename F16Lane<kStepsInFlight>::template Raw<kFirst>& r, int,
                                                unsigned int out[4]) {
#pragma unroll
    for (int p = 0; p < 4; ++p) out[p] = BF16::narrow(r.w[p]);
  }
};

// The fragment format of Pair32<L>: each of a row's two blocks a step read by L, whose decode gives a lane's four
// pairs of a block (pairs 2i + e: word i, pair e) in the order fragment_tiles takes them (pairs[2s + e], s = 2 half +
// i).
template <class L>
struct Block32Fragments {
  typedef Pair32<L> Step;
  static constexpr int kDepth = L::kDepth;
  static constexpr int kCombineFloats = 0;  // combine_splits one split at a time: the light entries keep their registers
  static constexpr bool kWeightsBeforeWait = false;  // their entries wait first (fragment_tiles says why)
  struct Raw {
    typename L::template Raw<true> first;
    typename L::template Raw<false> second;
  };
  static __device__ __forceinline__ Raw load(const unsigned char* __restrict__ row, int c0, int t) {
    const unsigned char* b = row + (unsigned long long)(c0 >> 5) * L::kBlockBytes;
    return {L::template load<true>(b, t), L::template load<false>(b + L::kBlockBytes, t)};
  }
  static __device__ __forceinline__ void decode(const Raw& r, int, unsigned int pairs[8]) {
    const int t = (int)threadIdx.x & 3;
    L::decode(r.first, t, pairs);
    L::decode(r.second, t, pairs + 4);
  }
};

template <class L>
struct Fragments<Pair32<L>> {
  typedef Block32Fragments<L> Format;
};
#endif

}  // namespace mmq
}  // namespace
