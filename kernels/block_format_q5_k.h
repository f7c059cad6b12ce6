// Q5_K (GGML type 13): 256 weights {half d; half dmin; uint8 scales[12]; uint8 qh[32]; uint8 qs[128]}, 176 bytes
// (4-byte aligned): Q4_K's scales (KScales) and nibbles, plus a fifth bit per code: bit i of qh[l] for element l
// of sub-block i.
#pragma once
#include "block_format_common.h"
#include "block_format_q4_k.h"  // KScales

namespace rf_blocks {

struct Q5_K : KScales {
  struct Layout {
    unsigned short d, dmin;
    unsigned char scales[12], qh[32], qs[128];
  };
  static constexpr int kValues = 256, kBytes = 176, kQhAt = 16, kQsAt = 48;
  static_assert(sizeof(Layout) == kBytes && RF_MEMBER_AT(Layout, scales, kScalesAt) &&
                RF_MEMBER_AT(Layout, qh, kQhAt) && RF_MEMBER_AT(Layout, qs, kQsAt), "Q5_K's layout");

  // Element j of a row of super-blocks.
  static __device__ __forceinline__ float element(const unsigned char* row, int j) {
    const unsigned char* block = row + (j >> 8) * kBytes;
    const unsigned short* halves = reinterpret_cast<const unsigned short*>(block);
    const int k = j & 255, chunk = k >> 6, high = (k >> 5) & 1, l = k & 31, sub = 2 * chunk + high;
    float sc, m;
    scale_min_bytes(block + kScalesAt, sub, sc, m);
    const unsigned char* qs = block + kQsAt;
    unsigned int q = (qs[32 * chunk + l] >> (4 * high)) & 15u;
    q |= ((block[kQhAt + l] >> sub) & 1u) << 4;
    const float d = rf_f16_to_float(halves[0]), dmin = rf_f16_to_float(halves[1]);
    return fmaf(d * sc, (float)q, -(dmin * m));  // products exact; one rounding
  }
  // A code word of chunk c (qs[32c + 4i .. + 3]) with the matching word of fifth bits (qh[4i .. + 3]) as its four
  // codes of sub-block 2c (lo) and of 2c + 1 (hi).
  static __device__ __forceinline__ void codes(unsigned int q, unsigned int h, int c, unsigned int& lo, unsigned int& hi) {
    lo = low_nibbles(q) | (((h >> (2 * c)) & kByteOnes) << 4);
    hi = high_nibbles(q) | (((h >> (2 * c + 1)) & kByteOnes) << 4);
  }
  // The fifth bits alone, or-ed onto Q4_K::codes' nibbles (the same codes, in that order).
  static __device__ __forceinline__ void add_fifth_bits(unsigned int h, int c, unsigned int& lo, unsigned int& hi) {
    lo |= ((h >> (2 * c)) & kByteOnes) << 4;
    hi |= ((h >> (2 * c + 1)) & kByteOnes) << 4;
  }
};

// Q4_K or Q5_K by whether the codes have a fifth bit (the ops that read both with one template).
template <bool kFiveBit>
struct Q4or5_K {
  typedef Q4_K type;
};
template <>
struct Q4or5_K<true> {
  typedef Q5_K type;
};

}  // namespace rf_blocks
