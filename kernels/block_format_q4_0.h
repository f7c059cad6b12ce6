// Q4_0 (GGML type 2): 32 weights {half d; uint8 qs[16]}, 18 bytes (2-byte aligned only). Element j < 16 is
// d * ((qs[j] & 15) - 8), element 16 + j is d * ((qs[j] >> 4) - 8).
#pragma once
#include "block_format_common.h"

namespace rf_blocks {

struct Q4_0 {
  struct Layout {
    unsigned short d;
    unsigned char qs[16];
  };
  static constexpr int kValues = 32, kBytes = 18, kQsAt = 2, kBias = 8;
  static_assert(sizeof(Layout) == kBytes && RF_MEMBER_AT(Layout, qs, kQsAt), "Q4_0's layout");

  // Element j of a row of blocks.
  static __device__ __forceinline__ float element(const unsigned char* row, int j) {
    const unsigned char* block = row + (j >> 5) * kBytes;
    const float d = rf_f16_to_float(*reinterpret_cast<const unsigned short*>(block));
    const int k = j & 31;
    const int byte = block[kQsAt + (k & 15)];
    return (float)((k < 16 ? byte & 15 : byte >> 4) - kBias) * d;
  }
  // The code bytes qs[4i .. 4i + 3] as one word: elements 4i .. 4i + 3 (low nibbles) in w[0..3], 16 + 4i .. in w[4..7].
  static __device__ __forceinline__ void decode_word(float d, unsigned int q, float w[8]) {
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      w[j] = d * (float)((int)((q >> (8 * j)) & 15u) - kBias);
      w[4 + j] = d * (float)((int)((q >> (8 * j + 4)) & 15u) - kBias);
    }
  }
  // Eight consecutive elements k .. k + 7 (k % 8 == 0) from the code bytes qs[k % 16 ..] as four 2-byte words q;
  // shift: 0 for k < 16 (low nibbles), 4 above.
  template <class Code = PlainCodes>
  static __device__ __forceinline__ void decode8(float d, const unsigned short q[4], int shift, float w[8]) {
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      w[2 * k] = d * Code::biased((q[k] >> shift) & 15u, kBias);
      w[2 * k + 1] = d * Code::biased((q[k] >> (8 + shift)) & 15u, kBias);
    }
  }
};

}  // namespace rf_blocks
