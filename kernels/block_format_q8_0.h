// Q8_0 (GGML type 8): 32 weights {half d; int8 qs[32]}, 34 bytes (2-byte aligned only); w = d * qs[j]. Also the
// paged KV cache's q8_0 rows (kv_store.hip writes them as ggml's quantize_row_q8_0_ref does).
#pragma once
#include "block_format_common.h"

namespace rf_blocks {

struct Q8_0 {
  struct Layout {
    unsigned short d;
    signed char qs[32];
  };
  static constexpr int kValues = 32, kBytes = 34, kQsAt = 2;
  static_assert(sizeof(Layout) == kBytes && RF_MEMBER_AT(Layout, qs, kQsAt), "Q8_0's layout");

  // Element j of a row of blocks.
  static __device__ __forceinline__ float element(const unsigned char* row, int j) {
    const unsigned char* block = row + (j >> 5) * kBytes;
    const float d = rf_f16_to_float(*reinterpret_cast<const unsigned short*>(block));
    return d * (float)(signed char)block[kQsAt + (j & 31)];
  }
  // Eight consecutive elements from four 2-byte words of codes (qs[2i], qs[2i + 1] in word i).
  template <class Code = PlainCodes>
  static __device__ __forceinline__ void decode8(float d, const unsigned short q[4], float w[8]) {
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      w[2 * k] = d * Code::of_int8(q[k] & 0xffu);
      w[2 * k + 1] = d * Code::of_int8((unsigned int)(q[k] >> 8));
    }
  }
};

}  // namespace rf_blocks
