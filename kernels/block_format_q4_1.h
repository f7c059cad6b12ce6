// Q4_1 (GGML type 3): 32 weights {half d; half m; uint8 qs[16]}, 20 bytes (4-byte aligned). Q4_0's nibbles,
// w = d * q + m.
#pragma once
#include "block_format_common.h"

namespace rf_blocks {

struct Q4_1 {
  struct Layout {
    unsigned short d, m;
    unsigned char qs[16];
  };
  static constexpr int kValues = 32, kBytes = 20, kQsAt = 4;
  static_assert(sizeof(Layout) == kBytes && RF_MEMBER_AT(Layout, qs, kQsAt), "Q4_1's layout");

  // Element j of a row of blocks.
  static __device__ __forceinline__ float element(const unsigned char* row, int j) {
    const unsigned char* block = row + (j >> 5) * kBytes;
    const unsigned short* halves = reinterpret_cast<const unsigned short*>(block);
    const float d = rf_f16_to_float(halves[0]), m = rf_f16_to_float(halves[1]);
    const int k = j & 31;
    const int byte = block[kQsAt + (k & 15)];
    return fmaf(d, (float)(k < 16 ? byte & 15 : byte >> 4), m);
  }
  // d and m from the block's first word.
  static __device__ __forceinline__ float d_of(unsigned int dm) { return rf_f16_to_float((unsigned short)(dm & 0xffffu)); }
  static __device__ __forceinline__ float m_of(unsigned int dm) { return rf_f16_to_float((unsigned short)(dm >> 16)); }
  // The code word qs[4i .. 4i + 3]: elements 4i .. 4i + 3 in w[0..3], 16 + 4i .. in w[4..7].
  static __device__ __forceinline__ void decode_word(float d, float m, unsigned int q, float w[8]) {
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      w[j] = fmaf(d, (float)((q >> (8 * j)) & 15u), m);
      w[4 + j] = fmaf(d, (float)((q >> (8 * j + 4)) & 15u), m);
    }
  }
  // Elements k .. k + 7 (k % 8 == 0) from the two code words at qs[k % 16 ..]; shift 0 (k < 16) or 4.
  template <class Code = PlainCodes>
  static __device__ __forceinline__ void decode8(float d, float m, const unsigned int q[2], int shift, float w[8]) {
#pragma unroll
    for (int k = 0; k < 8; ++k) w[k] = fmaf(d, Code::of((q[k >> 2] >> (8 * (k & 3) + shift)) & 15u), m);
  }
};

}  // namespace rf_blocks
