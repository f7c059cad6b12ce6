// Q4_K (GGML type 12): 256 weights {half d; half dmin; uint8 scales[12]; uint8 qs[128]}, 144 bytes (4-byte
// aligned), in 8 sub-blocks of 32 with a 6-bit scale sc and min m each: w = d * sc * q - dmin * m. Chunk c (0..3)
// of 64 elements is qs[32c .. 32c + 31]: element 64c + l (l < 32) the low nibble of qs[32c + l] (sub-block 2c),
// element 64c + 32 + l its high nibble (sub-block 2c + 1). KScales: the scales' packing, Q5_K's too.
#pragma once
#include "block_format_common.h"

namespace rf_blocks {

// A Q4_K / Q5_K sub-block's two f16 constants of a pair of sub-blocks, 2j (lo) and 2j + 1 (hi), in both lanes of
// an f16 pair (the matrix cores' packed decode: KScales::pair_scales).
struct KPairScales {
  unsigned int d, sc_lo, sc_hi, off_lo, off_hi, min_lo, min_hi;
};

// The 12 scale bytes of a Q4_K / Q5_K super-block: sub-block i < 4 has sc = scales[i] & 63, m = scales[i + 4] & 63;
// i >= 4 has its low four bits in scales[i + 4] (sc: low nibble, m: high) and its top two in bits 6-7 of
// scales[i - 4] (sc) and scales[i] (m). hipcore/ops/weight_formats.py k_scales is the host's.
struct KScales {
  static constexpr int kScalesAt = 4;  // after d and dmin

  // Sub-block `sub` (0..7) from the scales as three little-endian words s0, s1, s2, as T (float or int). Plain
  // words, no arrays: a lane-dependent index into a register array would put it in local memory.
  template <class T>
  static __device__ __forceinline__ void scale_min(unsigned int s0, unsigned int s1, unsigned int s2, int sub, T& sc,
                                                   T& m) {
    const int k = sub & 3;
    const unsigned int a = byte_of(s0, k), b = byte_of(s1, k), c = byte_of(s2, k);
    sc = (T)(sub < 4 ? (a & 63u) : ((c & 15u) | ((a >> 6) << 4)));
    m = (T)(sub < 4 ? (b & 63u) : ((c >> 4) | ((b >> 6) << 4)));
  }
  // The same from the scale bytes in memory, byte loads.
  static __device__ __forceinline__ void scale_min_bytes(const unsigned char* scales, int sub, float& sc, float& m) {
    const int k = sub & 3;
    const unsigned int a = scales[k], b = scales[k + 4], c = scales[k + 8];
    sc = (float)(sub < 4 ? (a & 63u) : ((c & 15u) | ((a >> 6) << 4)));
    m = (float)(sub < 4 ? (b & 63u) : ((c >> 4) | ((b >> 6) << 4)));
  }
  // Sub-blocks 2j and 2j + 1 as f16 pairs, from the super-block's first 16 bytes (d, dmin, the scales) as a uint4:
  // d, sc and -1024 sc of each (for the codes' 1024 + q form: decode_k_word in matmul_mma_formats.h) and -(dmin m).
  // No conversion instruction (those run at a quarter of the f16 rate on NVIDIA): the 6-bit scales and mins come
  // out as two bytes each (the low one 2j's), their f16 values as 1024 + v from a byte permute minus 1024 (exact);
  // -1024 sc exactly; -(dmin m) one f16 product, rounded once as a float decode rounds dmin m (the product of an f16
  // and a 6-bit integer is exact in f32).
  static __device__ __forceinline__ KPairScales pair_scales(const uint4& head, int j) {
    const unsigned int shift = 16u * (unsigned int)(j & 1);  // sub-blocks 2j, 2j + 1: bytes 2 (j % 2), + 1
    const unsigned int a = head.y >> shift, b = head.z >> shift, c = head.w >> shift;
    const unsigned int sc = j < 2 ? a & 0x3f3fu : (c & 0x0f0fu) | ((a & 0xc0c0u) >> 2);
    const unsigned int m = j < 2 ? b & 0x3f3fu : ((c >> 4) & 0x0f0fu) | ((b & 0xc0c0u) >> 2);
    constexpr unsigned int k64 = 0x64646464u, k1024 = 0x64006400u, kMinus1024 = 0xe400e400u;
    const unsigned int sc_lo = rf_h2_sub(rf_byte_perm(sc, k64, 0x4040u), k1024);
    const unsigned int sc_hi = rf_h2_sub(rf_byte_perm(sc, k64, 0x4141u), k1024);
    const unsigned int neg_dmin = rf_byte_perm(head.x, 0u, 0x3232u) ^ 0x80008000u;  // -dmin in both lanes
    return {rf_byte_perm(head.x, 0u, 0x1010u),  // the file's f16 d in both lanes
            sc_lo, sc_hi, rf_h2_mul(sc_lo, kMinus1024), rf_h2_mul(sc_hi, kMinus1024),
            rf_h2_mul(neg_dmin, rf_h2_sub(rf_byte_perm(m, k64, 0x4040u), k1024)),
            rf_h2_mul(neg_dmin, rf_h2_sub(rf_byte_perm(m, k64, 0x4141u), k1024))};
  }
  // d and dmin from the super-block's first word.
  static __device__ __forceinline__ float d_of(unsigned int dm) { return rf_f16_to_float((unsigned short)(dm & 0xffffu)); }
  static __device__ __forceinline__ float dmin_of(unsigned int dm) { return rf_f16_to_float((unsigned short)(dm >> 16)); }
};

struct Q4_K : KScales {
  struct Layout {
    unsigned short d, dmin;
    unsigned char scales[12], qs[128];
  };
  static constexpr int kValues = 256, kBytes = 144, kQsAt = 16;
  static_assert(sizeof(Layout) == kBytes && RF_MEMBER_AT(Layout, scales, kScalesAt) &&
                RF_MEMBER_AT(Layout, qs, kQsAt), "Q4_K's layout");

  // Element j of a row of super-blocks.
  static __device__ __forceinline__ float element(const unsigned char* row, int j) {
    const unsigned char* block = row + (j >> 8) * kBytes;
    const unsigned short* halves = reinterpret_cast<const unsigned short*>(block);
    const int k = j & 255, chunk = k >> 6, high = (k >> 5) & 1, l = k & 31, sub = 2 * chunk + high;
    float sc, m;
    scale_min_bytes(block + kScalesAt, sub, sc, m);
    const unsigned char* qs = block + kQsAt;
    const unsigned int q = (qs[32 * chunk + l] >> (4 * high)) & 15u;
    const float d = rf_f16_to_float(halves[0]), dmin = rf_f16_to_float(halves[1]);
    return fmaf(d * sc, (float)q, -(dmin * m));  // products exact; one rounding
  }
  // A code word of chunk c (qs[32c + 4i .. + 3]) as its four codes of sub-block 2c (lo) and of 2c + 1 (hi).
  static __device__ __forceinline__ void codes(unsigned int q, unsigned int& lo, unsigned int& hi) {
    lo = low_nibbles(q);
    hi = high_nibbles(q);
  }
};

}  // namespace rf_blocks
