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
  static_assert(sizeof(Layout) == kBytes && RF_MEMBER_AT(Layout, qs, kQsAt), "MXFP4's layout");
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
  // Eight consecutive elements k .. k + 7 (k % 8 == 0) from the code bytes qs[k % 16 ..] as two words q; shift: 0
  // for k < 16 (low nibbles), 4 above. d = scale(e): a power of two, so each product is exact.
  template <class Code = PlainCodes>
  static __device__ __forceinline__ void decode8(float d, const unsigned int q[2], int shift, float w[8]) {
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      const unsigned int code = (q[k >> 2] >> (8 * (k & 3) + shift)) & 15u;
      const float magnitude = Code::of((kMagnitudes >> (4u * (code & 7u))) & 15u);
      w[k] = d * ((code & 8u) ? -magnitude : magnitude);
    }
  }
};

// The float tiles' reading of MXFP4 (matmul.hip's formats, matmul_mma's Narrow; Code: their conversion): load(row,
// col) reads what weights col .. col + 7 (col % 8 == 0) of a row need, decode(raw, col, w) turns it into floats.
// The 17-byte blocks are only byte aligned: the eight code bytes come from three aligned words shifted into place,
// the third read again in place of the word past them where they start at a word boundary (that word can lie past
// the last block, and past the buffer's mapping).
template <class Code = PlainCodes>
struct MXFP4Eights {
  typedef MXFP4 B;
  struct Raw {
    unsigned int e, q[2];
  };
  static __device__ __forceinline__ unsigned long long row_bytes(int cols) { return rf_blocks::row_bytes<B>(cols); }
  static __device__ __forceinline__ Raw load(const unsigned char* __restrict__ row, int col) {
    const unsigned char* block = row + (unsigned long long)(col >> 5) * B::kBytes;
    const unsigned long long addr = (unsigned long long)(block + B::kQsAt + (col & 15));
    const unsigned int* base = reinterpret_cast<const unsigned int*>(addr & ~3ull);
    const int shift = 8 * (int)(addr & 3u);
    const unsigned int w0 = base[0], w1 = base[1], w2 = base[shift == 0 ? 1 : 2];
    Raw r;
    r.e = block[0];
    r.q[0] = (unsigned int)((((unsigned long long)w1 << 32) | w0) >> shift);
    r.q[1] = (unsigned int)((((unsigned long long)w2 << 32) | w1) >> shift);
    return r;
  }
  static __device__ __forceinline__ void decode(const Raw r, int col, float w[8]) {
    B::decode8<Code>(B::scale(r.e), r.q, (col & 16) >> 2, w);
  }
};

}  // namespace rf_blocks
