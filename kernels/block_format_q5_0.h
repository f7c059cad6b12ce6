// Q5_0 (GGML type 6): 32 weights {half d; uint8 qh[4]; uint8 qs[16]}, 22 bytes (2-byte aligned only). Q4_0's
// nibbles with bit j of qh (a little-endian word) as element j's fifth bit; w = d * (q - 16).
#pragma once
#include "block_format_common.h"

namespace rf_blocks {

// The fifth bits of Q5_0 / Q5_1 four at a time: bits 0 .. 3 of b moved to bit 4 of bytes 0 .. 3 (two at a time:
// bits 0, 1 to bytes 0, 1), to be or-ed onto four (two) nibble codes one per byte.
static __device__ __forceinline__ unsigned int fifth_bits4(unsigned int b) {
  return ((b & 1u) | ((b & 2u) << 7) | ((b & 4u) << 14) | ((b & 8u) << 21)) << 4;
}
static __device__ __forceinline__ unsigned int fifth_bits2(unsigned int b) { return ((b & 1u) | ((b & 2u) << 7)) << 4; }

struct Q5_0 {
  struct Layout {
    unsigned short d;
    unsigned char qh[4], qs[16];
  };
  static constexpr int kValues = 32, kBytes = 22, kQhAt = 2, kQsAt = 6, kBias = 16;
  static_assert(sizeof(Layout) == kBytes && RF_MEMBER_AT(Layout, qh, kQhAt) &&
                RF_MEMBER_AT(Layout, qs, kQsAt), "Q5_0's layout");

  // Element j of a row of blocks.
  static __device__ __forceinline__ float element(const unsigned char* row, int j) {
    const unsigned char* block = row + (j >> 5) * kBytes;
    const float d = rf_f16_to_float(*reinterpret_cast<const unsigned short*>(block));
    const int k = j & 31;
    const int byte = block[kQsAt + (k & 15)];
    const int q = (k < 16 ? byte & 15 : byte >> 4) | (((block[kQhAt + (k >> 3)] >> (k & 7)) & 1) << 4);
    return (float)(q - kBias) * d;
  }
  // The code word qs[4i .. 4i + 3] with h = qh >> 4i: elements 4i .. 4i + 3 in w[0..3], 16 + 4i .. in w[4..7].
  static __device__ __forceinline__ void decode_word(float d, unsigned int q, unsigned int h, float w[8]) {
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      w[j] = d * (float)((int)(((q >> (8 * j)) & 15u) | (((h >> j) & 1u) << 4)) - kBias);
      w[4 + j] = d * (float)((int)(((q >> (8 * j + 4)) & 15u) | (((h >> (16 + j)) & 1u) << 4)) - kBias);
    }
  }
  // Elements k .. k + 7 (k % 8 == 0) from the four 2-byte code words at qs[k % 16 ..]; shift 0 (k < 16) or 4; h = qh >> k.
  template <class Code = PlainCodes>
  static __device__ __forceinline__ void decode8(float d, const unsigned short q[4], int shift, unsigned int h, float w[8]) {
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      const unsigned int code = ((q[k >> 1] >> (8 * (k & 1) + shift)) & 15u) | (((h >> k) & 1u) << 4);
      w[k] = d * Code::biased(code, kBias);
    }
  }
};

}  // namespace rf_blocks
