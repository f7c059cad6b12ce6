// Q6_K (GGML type 14): 256 weights {uint8 ql[128]; uint8 qh[64]; int8 scales[16]; half d}, 210 bytes (2-byte
// aligned only), in 16 sub-blocks of 16: w = d * scales[k / 16] * (q - 32), q a 6-bit code. In half h (128
// elements) element 128h + 32s + l (s 0..3, l 0..31) is nibble s >> 1 of ql[64h + 32(s & 1) + l] with bits 2s,
// 2s + 1 of qh[32h + l] on top.
#pragma once
#include "block_format_common.h"

namespace rf_blocks {

struct Q6_K {
  struct Layout {
    unsigned char ql[128], qh[64];
    signed char scales[16];
    unsigned short d;
  };
  static constexpr int kValues = 256, kBytes = 210, kQhAt = 128, kScalesAt = 192, kDAt = 208;
  static constexpr int kBias = 32;
  static_assert(sizeof(Layout) == kBytes && RF_MEMBER_AT(Layout, qh, kQhAt) &&
                RF_MEMBER_AT(Layout, scales, kScalesAt) && RF_MEMBER_AT(Layout, d, kDAt),
                "Q6_K's layout");

  // Exact in float32 in this order: (d * scale) is a half times an int8 (at most 18 significant bits), times a
  // code of at most 6 bits.
  static __device__ __forceinline__ float element(const unsigned char* row, int j) {
    const unsigned char* block = row + (j >> 8) * kBytes;
    const int k = j & 255, h = k >> 7, s = (k >> 5) & 3, l = k & 31;
    const unsigned int low = (block[64 * h + 32 * (s & 1) + l] >> (4 * (s >> 1))) & 15u;
    const unsigned int top = (block[kQhAt + 32 * h + l] >> (2 * s)) & 3u;
    const float d = rf_f16_to_float(*reinterpret_cast<const unsigned short*>(block + kDAt));
    const float scale = (float)(signed char)block[kScalesAt + (k >> 4)];
    return (d * scale) * (float)((int)(low | (top << 4)) - kBias);
  }
  // A word of ql (four l's) and the matching word of qh as the four 6-bit codes of quarter s (lo: low nibbles, the
  // qh bits at `shift` = 2s) and of quarter s + 2 (hi: high nibbles, the bits at shift + 4), one per byte.
  static __device__ __forceinline__ void codes(unsigned int ql, unsigned int qh, int shift, unsigned int& lo,
                                               unsigned int& hi) {
    lo = low_nibbles(ql) | (((qh >> shift) & 0x03030303u) << 4);
    hi = high_nibbles(ql) | (((qh >> (shift + 4)) & 0x03030303u) << 4);
  }
};

}  // namespace rf_blocks
