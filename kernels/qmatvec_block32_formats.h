// Part of the fused_qmatvec op (kernels/fused_qmatvec.hip includes it after qmatvec_formats.h, whose XSlice,
// loads and Q4_0Format it uses; built and hashed with it: hipcore/runtime/kernels.py source_files): the 32-element
// block formats with a min or a fifth bit, Q4_1, Q5_0 and Q5_1, as int8 dot products. Only the one-token `_1b`
// entries read them (fused_qmatvec_tiles.h: TypeSet).
#pragma once

namespace {
namespace q8 {

// codes . x over a slice: the low (run a) and high (run b) codes against x's, in int32 (exact).
static __device__ __forceinline__ int slice_codes_dot(const unsigned int lo[4], const unsigned int hi[4], const XSlice& x) {
  int s = 0;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    s = rf_dp4a((int)lo[i], x.xq[i], s);
    s = rf_dp4a((int)hi[i], x.xq[4 + i], s);
  }
  return s;
}

// Q4_1 (block_format_q4_1.h; 20 bytes, 4-byte aligned): Q4_0's nibbles, w = d * q + m, so a slice's sum is
// d * (codes . x) + m * sum(x). Five aligned 4-byte loads: d|m and the 16 code bytes.
struct Q4_1Format {
  struct Raw {
    unsigned int dm, q[4];
  };
  typedef rf_blocks::Q4_1 B;
  static __device__ __forceinline__ unsigned long long row_bytes(int cols) { return rf_blocks::row_bytes<B>(cols); }
  static __device__ __forceinline__ Raw load(const unsigned char* __restrict__ row, int slice) {
    const unsigned char* b = row + slice * B::kBytes;
    Raw r;
    r.dm = load_weights4(b);
#pragma unroll
    for (int i = 0; i < 4; ++i) r.q[i] = load_weights4(b + B::kQsAt + 4 * i);
    return r;
  }
  static __device__ __forceinline__ void columns(int slice, int& col_a, int& col_b) {
    Q4_0Format::columns(slice, col_a, col_b);
  }
  struct Decoded {
    unsigned int lo[4], hi[4];
    float d, m;
  };
  static __device__ __forceinline__ Decoded decode(const Raw r, int) {
    Decoded k;
    Q4_0Format::nibble_codes(r.q, k.lo, k.hi);
    k.d = B::d_of(r.dm);
    k.m = B::m_of(r.dm);
    return k;
  }
  static __device__ __forceinline__ float apply(const Decoded& k, const XSlice& x) {
    return k.d * (float)slice_codes_dot(k.lo, k.hi, x) + k.m * (float)(x.sum_a + x.sum_b);
  }
  static __device__ __forceinline__ float dot(const Raw r, int slice, const XSlice& x) { return apply(decode(r, slice), x); }
};

// The fifth bits of Q5_0 / Q5_1: bits 4i .. 4i + 3 of h (elements 4i .. 4i + 3 of a run) moved to bit 4 of
// bytes 0 .. 3, to be or-ed onto the nibbles (rf_blocks::fifth_bits4).
static __device__ __forceinline__ unsigned int fifth_bits(unsigned int h, int i) {
  return rf_blocks::fifth_bits4((h >> (4 * i)) & 15u);
}

// A Q5_0 / Q5_1 slice's codes: the nibbles of q with the fifth bits of h (bits 0..15 run a's, 16..31 run b's).
static __device__ __forceinline__ void five_bit_codes(const unsigned int q[4], unsigned int h, unsigned int lo[4],
                                                      unsigned int hi[4]) {
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    lo[i] = rf_blocks::low_nibbles(q[i]) | fifth_bits(h, i);
    hi[i] = rf_blocks::high_nibbles(q[i]) | fifth_bits(h >> 16, i);
  }
}

// Q5_0 (block_format_q5_0.h; 22 bytes, 2-byte aligned): element j < 16 is the low nibble of qs[j] with bit j
// of qh (a little-endian word) as its fifth bit, element 16 + j the high nibble with bit 16 + j; w = d * (q - 16).
struct Q5_0Format {
  struct Raw {
    unsigned int h, q[4];
    unsigned short d;
  };
  typedef rf_blocks::Q5_0 B;
  static __device__ __forceinline__ unsigned long long row_bytes(int cols) { return rf_blocks::row_bytes<B>(cols); }
  static __device__ __forceinline__ Raw load(const unsigned char* __restrict__ row, int slice) {
    const unsigned char* b = row + slice * B::kBytes;
    Raw r;
    unsigned int hq[5];  // qh and qs: 20 bytes from qh
    load_words<5>(b + B::kQhAt, hq);
    r.h = hq[0];
#pragma unroll
    for (int i = 0; i < 4; ++i) r.q[i] = hq[1 + i];
    r.d = *reinterpret_cast<const unsigned short*>(b);
    return r;
  }
  static __device__ __forceinline__ void columns(int slice, int& col_a, int& col_b) {
    Q4_0Format::columns(slice, col_a, col_b);
  }
  typedef Q4_0Format::Decoded Decoded;
  static __device__ __forceinline__ Decoded decode(const Raw r, int) {
    Decoded k;
    five_bit_codes(r.q, r.h, k.lo, k.hi);
    k.d = rf_f16_to_float(r.d);
    return k;
  }
  static __device__ __forceinline__ float apply(const Decoded& k, const XSlice& x) {
    return k.d * (float)(slice_codes_dot(k.lo, k.hi, x) - 16 * (x.sum_a + x.sum_b));
  }
  static __device__ __forceinline__ float dot(const Raw r, int slice, const XSlice& x) { return apply(decode(r, slice), x); }
};

// Q5_1 (block_format_q5_1.h; 24 bytes, 4-byte aligned): Q5_0's codes, w = d * q + m.
struct Q5_1Format {
  struct Raw {
    unsigned int dm, h, q[4];
  };
  typedef rf_blocks::Q5_1 B;
  static __device__ __forceinline__ unsigned long long row_bytes(int cols) { return rf_blocks::row_bytes<B>(cols); }
  static __device__ __forceinline__ Raw load(const unsigned char* __restrict__ row, int slice) {
    const unsigned char* b = row + slice * B::kBytes;
    Raw r;
    r.dm = load_weights4(b);
    r.h = load_weights4(b + B::kQhAt);
#pragma unroll
    for (int i = 0; i < 4; ++i) r.q[i] = load_weights4(b + B::kQsAt + 4 * i);
    return r;
  }
  static __device__ __forceinline__ void columns(int slice, int& col_a, int& col_b) {
    Q4_0Format::columns(slice, col_a, col_b);
  }
  typedef Q4_1Format::Decoded Decoded;
  static __device__ __forceinline__ Decoded decode(const Raw r, int) {
    Decoded k;
    five_bit_codes(r.q, r.h, k.lo, k.hi);
    k.d = B::d_of(r.dm);
    k.m = B::m_of(r.dm);
    return k;
  }
  static __device__ __forceinline__ float apply(const Decoded& k, const XSlice& x) { return Q4_1Format::apply(k, x); }
  static __device__ __forceinline__ float dot(const Raw r, int slice, const XSlice& x) { return apply(decode(r, slice), x); }
};

}  // namespace q8
}  // namespace
