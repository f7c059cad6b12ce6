// MXFP4 (GGML type 39) in qmatvec's integer path (qmatvec_formats.h's Format interface: load, columns, decode,
// apply, dot), for moe_experts.hip; included after qmatvec_formats.h. The block's layout and decoding are
// block_format_mxfp4.h's (rf_blocks::MXFP4: the E8M0 scale halved, the e2m1 codes as signed doubled int8 values by
// byte permutes); here only how a lane reads a block: a slice is a block, run a its elements 0..15, run b 16..31,
// and the 17-byte blocks are only byte-aligned, so they are read as aligned words.
#pragma once
#include "block_format_mxfp4.h"

namespace {
namespace q8 {

struct MXFP4Format {
  struct Raw {
    unsigned int q[4];
    unsigned int e;
  };
  static __device__ __forceinline__ unsigned long long row_bytes(int cols) {
    return rf_blocks::row_bytes<rf_blocks::MXFP4>(cols);
  }
  // The block's 17 bytes from five aligned words (a misaligned wide load would fault), shifted into place.
  static __device__ __forceinline__ Raw load(const unsigned char* __restrict__ row, int slice) {
    const unsigned long long addr = (unsigned long long)(row + (unsigned long long)slice * rf_blocks::MXFP4::kBytes);
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
      k.lo[i] = rf_blocks::MXFP4::int8_values(rf_blocks::low_nibbles(r.q[i]));
      k.hi[i] = rf_blocks::MXFP4::int8_values(rf_blocks::high_nibbles(r.q[i]));
    }
    k.d = rf_blocks::MXFP4::scale(r.e);
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
