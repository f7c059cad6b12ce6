// MXFP4 (GGML type 39) in qmatvec's integer path (qmatvec_formats.h's Format interface: load, columns, decode,
// apply, dot), for moe_experts.hip; included after qmatvec_formats.h. To move into the block format headers.
//
// Block {uint8 e; uint8 qs[16]} (17 bytes, so only byte-aligned): element j < 16 is the low nibble of qs[j], 16 + j
// its high nibble, as Q4_0's; w = 2^(e - 128) * v[q], v the e2m1 values doubled {0, 1, 2, 3, 4, 6, 8, 12}, bit 3
// of q the sign (ggml's kvalues_mxfp4 with E8M0's scale halved). A slice is a block: run a its elements 0..15,
// run b 16..31. The codes become signed bytes by a byte-permute table lookup of their magnitudes, negated where
// the sign bit is set, and go into the integer dot products as they are.
#pragma once

namespace {
namespace q8 {

// Four codes (one a byte, 0..15) as their signed doubled e2m1 values, one a byte.
static __device__ __forceinline__ unsigned int mxfp4_values(unsigned int codes) {
  const unsigned int m = codes & 0x07070707u;
  const unsigned int pairs = m | (m >> 4);  // bytes 0 and 2: two magnitudes a byte, as a selector's nibbles
  const unsigned int selector = (pairs & 0xffu) | ((pairs >> 8) & 0xff00u);
  const unsigned int magnitude = rf_byte_perm(0x03020100u, 0x0C080604u, selector);
  // 0x80 - m never borrows for m <= 12, and ^ 0x80 turns it into -m mod 256 byte by byte.
  const unsigned int negated = (0x80808080u - magnitude) ^ 0x80808080u;
  const unsigned int sign = ((codes >> 3) & 0x01010101u) * 0xffu;
  return magnitude ^ ((magnitude ^ negated) & sign);
}

// 2^(e - 128) from its E8M0 byte (ggml_e8m0_to_fp32_half): subnormal for e < 2.
static __device__ __forceinline__ float e8m0_half(unsigned int e) {
  return rf_uint_as_float(e < 2 ? 0x00200000u << e : (e - 1) << 23);
}

struct MXFP4Format {
  struct Raw {
    unsigned int q[4];
    unsigned int e;
  };
  static __device__ __forceinline__ unsigned long long row_bytes(int cols) { return (unsigned long long)(cols / 32) * 17; }
  // The block's 17 bytes from five aligned words (a misaligned wide load would fault), shifted into place.
  static __device__ __forceinline__ Raw load(const unsigned char* __restrict__ row, int slice) {
    const unsigned long long addr = (unsigned long long)(row + (unsigned long long)slice * 17);
    const unsigned int* base = reinterpret_cast<const unsigned int*>(addr & ~3ull);
    const int offset = (int)(addr & 3u);
    unsigned int w[5];
#pragma unroll
    for (int i = 0; i < 5; ++i) w[i] = load_weights4(base + i);
    Raw r;
    r.e = (w[0] >> (8 * offset)) & 0xffu;
    const int shift = 8 * ((offset + 1) & 3);  // qs starts at byte offset + 1: word 1 exactly when offset is 3
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const unsigned int shifted = (unsigned int)((((unsigned long long)w[i + 1] << 32) | w[i]) >> shift);
      r.q[i] = offset == 3 ? w[i + 1] : shifted;
    }
    return r;
  }
  static __device__ __forceinline__ void columns(int slice, int& col_a, int& col_b) {
    col_a = slice * 32;
    col_b = col_a + 16;
  }
  struct Decoded {
    unsigned int lo[4], hi[4];
    float d;
  };
  static __device__ __forceinline__ Decoded decode(const Raw r, int) {
    Decoded k;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      k.lo[i] = mxfp4_values(r.q[i] & kLowNibbles);
      k.hi[i] = mxfp4_values((r.q[i] >> 4) & kLowNibbles);
    }
    k.d = e8m0_half(r.e);
    return k;
  }
  static __device__ __forceinline__ float apply(const Decoded& k, const XSlice& x) {
    int s = 0;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      s = rf_dp4a((int)k.lo[i], x.xq[i], s);
      s = rf_dp4a((int)k.hi[i], x.xq[4 + i], s);
    }
    return k.d * (float)s;
  }
  static __device__ __forceinline__ float dot(const Raw r, int slice, const XSlice& x) { return apply(decode(r, slice), x); }
};

}  // namespace q8
}  // namespace
