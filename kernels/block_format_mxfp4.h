// MXFP4 (GGML type 39, OCP microscaling FP4): 32 weights {uint8 e; uint8 qs[16]}, 17 bytes (byte aligned). e is
// an E8M0 scale, 2^(e - 127); the codes are E2M1 floats, element j in the low nibble of qs[j], element 16 + j in
// its high nibble. As ggml stores them (ggml-common.h kvalues_mxfp4), the code values are doubled (0, 1, 2, 3, 4,
// 6, 8, 12 and their negatives: integers, so an int8 dot product can take them) and the scale halved: w =
// kvalue[code] * 2^(e - 128) (ggml-impl.h ggml_e8m0_to_fp32_half; e = 0 and 1 give float32 subnormals, exactly).
#pragma once
#include "block_format_common.h"

namespace rf_blocks {

struct MXFP4 {
  struct Layout {
    unsigned char e, qs[16];
  };
  static constexpr int kValues = 32, kBytes = 17, kQsAt = 1;
  static_assert(sizeof(Layout) == kBytes && __builtin_offsetof(Layout, qs) == kQsAt, "MXFP4's layout");
  // The doubled E2M1 magnitudes of codes 0..7, a nibble each (code 5 is 6, 6 is 8, 7 is 12); codes 8..15 are their
  // negatives. As int8 bytes for byte permutes: codes 0..3, 4..7, 8..11, 12..15.
  static constexpr unsigned int kMagnitudes = 0xC8643210u;
  static constexpr unsigned int kInt8Low = 0x03020100u, kInt8High = 0x0C080604u;
  static constexpr unsigned int kInt8NegLow = 0xFDFEFF00u, kInt8NegHigh = 0xF4F8FAFCu;

  // ggml's scale: 2^(e - 128) as a float32 (from its bits; e < 2 a subnormal).
  static __device__ __forceinline__ float scale(unsigned int e) {
    return rf_uint_as_float(e < 2u ? 0x00200000u << e : (e - 1u) << 23);
  }
  // The doubled E2M1 value of a 4-bit code (-12 .. 12).
  static __device__ __forceinline__ int code_value(unsigned int code) {
    const int v = (int)((kMagnitudes >> (4u * (code & 7u))) & 15u);
    return (code & 8u) ? -v : v;
  }
  // Element j of a row of blocks.
  static __device__ __forceinline__ float element(const unsigned char* row, int j) {
    const unsigned char* block = row + (j >> 5) * kBytes;
    const int k = j & 31;
    const unsigned int byte = block[kQsAt + (k & 15)];
    return (float)code_value(k < 16 ? byte & 15u : byte >> 4) * scale(block[0]);
  }
  // Four codes one per byte (low_nibbles / high_nibbles of a code word) as four int8 values, for dp4a: two byte
  // permutes (the positive and the negative table) and a byte select by each code's sign bit.
  static __device__ __forceinline__ unsigned int int8_values(unsigned int codes) {
    const unsigned int c = codes & 0x07070707u, spread = c | (c >> 4);
    const unsigned int selector = (spread & 0xffu) | ((spread >> 8) & 0xff00u);  // code i's magnitude index at nibble i
    const unsigned int positive = rf_byte_perm(kInt8Low, kInt8High, selector);
    const unsigned int negative = rf_byte_perm(kInt8NegLow, kInt8NegHigh, selector);
    const unsigned int sign = ((codes >> 3) & kByteOnes) * 0xffu;  // 0xff in the bytes of codes 8..15
    return (positive & ~sign) | (negative & sign);
  }
};

}  // namespace rf_blocks
