// Matrix-vector product on GGUF weights with the activations quantized to int8 on the fly, the decode
// path for the K-quants (and Q8_0, Q4_0):
//   y[b, r] = sum_c W[r, c] * xq[b, c]   for r < rows, b < batch
// where xq is x quantized per slice of 32 columns (see below) to int8 codes times one float scale:
// d = amax / 127, q = rint(x * (127 / amax)) (0 when amax is 0). The products are integer dot products of
// the weight codes with the x codes (rf_dp4a: four byte products per instruction), scaled once per
// sub-block: this is how llama.cpp's MMVQ path computes decode products, and it is what lets a kernel
// keep up with the memory: the float path (matvec.hip) spends about four instructions per weight
// (unpack, convert, scale, FMA) and an H100 issues about five per weight at full bandwidth.
//
// Layout of the work:
// - A "slice" is 32 weights of one row, taken as two runs of 16 columns that the format stores side by
//   side (the low and the high nibbles of the same 16 bytes). A row has cols / 32 slices. Lane l of a
//   warp takes slices l, l + WARP_SIZE, ...: consecutive lanes read consecutive bytes of the row.
// - x is quantized per slice by the lane that uses it (its 32 values: eight 16-byte loads, one scale),
//   in registers: no shared memory, no barrier. The cost is shared by the rows a warp walks together
//   (two in decoding) and x, a few KiB shared by every warp, stays in L1/L2.
// - In decoding a warp walks four rows together, issuing the loads of all four before the first is used,
//   so that enough bytes are in flight to cover the memory latency. Batches of 2..4 tokens take one
//   row and one slice per step and apply the decoded weights to every token.
// - The partial sums are floats per lane; one shuffle reduction per row and token at the end.
// Formats and their loads: Q4_K (144-byte super-blocks) and Q5_K (176) are 16-byte aligned, so a lane
// reads its 16 code bytes and the 16-byte header with two 16-byte loads (Q5_K: one more for the fifth
// bits). Q6_K (210), Q8_0 (34) and Q4_0 (18) are only 2-byte aligned: their runs of bytes are read as
// aligned 4-byte words and shifted into place (one word more than the run).
// Requirements the launcher checks: cols % 256 == 0 for the K-quants, % 32 otherwise; W 16-byte aligned
// (Q4_K, Q5_K) or 2-byte (the others); x 16-byte aligned. Block size: a multiple of 64 up to 256.
#ifndef RF_QMATVEC_HIP  // fused_qmatvec.hip includes this file for its formats
#define RF_QMATVEC_HIP
#include "hip_compat.h"

namespace {
namespace q8 {

constexpr int kMaxBatchPerPass = 4;
constexpr unsigned int kLowNibbles = 0x0F0F0F0Fu;
constexpr unsigned int kOnes = 0x01010101u;

// One token's x over one slice, quantized: codes of run a (xq[0..3]) and run b (xq[4..7]), four per
// word, the scale d, and the sums of each run's codes (for the formats' offsets and mins).
struct XSlice {
  int xq[8];
  float d;
  int sum_a, sum_b;
};

static __device__ __forceinline__ unsigned int low_byte_code(float v, float inv) {
  // rint(v * inv) as the low byte of a float's bits: adding 1.5 * 2^23 rounds to an integer (to nearest
  // even, in the fused multiply-add: the exact product is rounded once) and leaves it in the low bits.
  return rf_float_as_uint(fmaf(v, inv, 12582912.0f)) & 0xffu;
}

// The slice's 32 values (run a in v[0..3], run b in v[4..7]) quantized.
static __device__ __forceinline__ XSlice quantize_values(const float4 v[8]) {
  float amax = 0.0f;
#pragma unroll
  for (int k = 0; k < 8; ++k)
    amax = fmaxf(fmaxf(fmaxf(amax, fabsf(v[k].x)), fmaxf(fabsf(v[k].y), fabsf(v[k].z))), fabsf(v[k].w));
  XSlice s;
  s.d = amax / 127.0f;
  const float inv = amax > 0.0f ? 127.0f / amax : 0.0f;
#pragma unroll
  for (int k = 0; k < 8; ++k)
    s.xq[k] = (int)(low_byte_code(v[k].x, inv) | (low_byte_code(v[k].y, inv) << 8) |
                    (low_byte_code(v[k].z, inv) << 16) | (low_byte_code(v[k].w, inv) << 24));
  s.sum_a = s.sum_b = 0;
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    s.sum_a = rf_dp4a(s.xq[k], (int)kOnes, s.sum_a);
    s.sum_b = rf_dp4a(s.xq[4 + k], (int)kOnes, s.sum_b);
  }
  return s;
}

static __device__ __forceinline__ XSlice quantize_x(const float* __restrict__ x, int col_a, int col_b) {
  float4 v[8];
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    v[k] = *reinterpret_cast<const float4*>(x + col_a + 4 * k);
    v[4 + k] = *reinterpret_cast<const float4*>(x + col_b + 4 * k);
  }
  return quantize_values(v);
}

static __device__ __forceinline__ unsigned int byte_of(unsigned int word, int i) { return (word >> (8 * i)) & 0xffu; }

// N little-endian words starting at a 2-byte aligned address: N + 1 aligned 4-byte loads, each pair
// shifted by 0 or 16 bits (a misaligned wide load would fault on NVIDIA).
template <int N>
static __device__ __forceinline__ void load_words(const unsigned char* __restrict__ p, unsigned int out[N]) {
  const unsigned long long addr = (unsigned long long)p;
  const unsigned int* base = reinterpret_cast<const unsigned int*>(addr & ~3ull);
  const int shift = (int)(addr & 2u) * 8;
  unsigned int w[N + 1];
#pragma unroll
  for (int k = 0; k <= N; ++k) w[k] = base[k];
#pragma unroll
  for (int k = 0; k < N; ++k) out[k] = (unsigned int)((((unsigned long long)w[k + 1] << 32) | w[k]) >> shift);
}

// The 6-bit scale and min of sub-block `sub` (0..7) of a Q4_K / Q5_K super-block from its three words of
// packed scales (the layout: matvec.hip's k_scale_min).
static __device__ __forceinline__ void k_scale_min(unsigned int s0, unsigned int s1, unsigned int s2, int sub, int& sc,
                                                   int& m) {
  const int k = sub & 3;
  const unsigned int a = byte_of(s0, k), b = byte_of(s1, k), c = byte_of(s2, k);
  sc = (int)(sub < 4 ? (a & 63u) : ((c & 15u) | ((a >> 6) << 4)));
  m = (int)(sub < 4 ? (b & 63u) : ((c >> 4) | ((b >> 6) << 4)));
}

static __device__ __forceinline__ unsigned int word_of(const uint4 v, int k) {
  return k == 0 ? v.x : k == 1 ? v.y : k == 2 ? v.z : v.w;
}

// A Q4_K / Q5_K slice decoded: the codes of run a (lo) and run b (hi), four per word, the sub-blocks'
// scales and mins, the super-block's d and dmin. Decoding (the scale bits, the nibbles) is most of a
// slice's work; batched passes decode a slice once and apply it to every token.
struct KDecoded {
  unsigned int lo[4], hi[4];
  int sc0, m0, sc1, m1;
  float d, dmin;
  __device__ __forceinline__ float apply(const XSlice& x) const {
    int da = 0, db = 0;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      da = rf_dp4a((int)lo[i], x.xq[i], da);
      db = rf_dp4a((int)hi[i], x.xq[4 + i], db);
    }
    // Both integers stay under 2^24, so their conversions are exact.
    return d * (float)(sc0 * da + sc1 * db) - dmin * (float)(m0 * x.sum_a + m1 * x.sum_b);
  }
};

// Q4_K super-block {half d; half dmin; uint8 scales[12]; uint8 qs[128]}: slice s (0..7) takes
// qs[32j + 16u .. +15] (j = s / 2, u = s % 2): low nibbles are elements 64j + 16u .. +15 of sub-block 2j,
// high nibbles 64j + 32 + 16u .. +15 of sub-block 2j + 1. w = d * sc * q - dmin * m.
struct Q4_KFormat {
  struct Raw {
    uint4 head, q;
  };
  static __device__ __forceinline__ unsigned long long row_bytes(int cols) { return (unsigned long long)(cols / 256) * 144; }
  static __device__ __forceinline__ Raw load(const unsigned char* __restrict__ row, int slice) {
    const uint4* b = reinterpret_cast<const uint4*>(row + (slice >> 3) * 144);
    return {b[0], b[1 + (slice & 7)]};
  }
  static __device__ __forceinline__ void columns(int slice, int& col_a, int& col_b) {
    col_a = (slice >> 3) * 256 + 64 * ((slice & 7) >> 1) + 16 * (slice & 1);
    col_b = col_a + 32;
  }
  typedef KDecoded Decoded;
  static __device__ __forceinline__ Decoded decode(const Raw r, int slice) {
    const int j = (slice & 7) >> 1;
    KDecoded k;
    k_scale_min(r.head.y, r.head.z, r.head.w, 2 * j, k.sc0, k.m0);
    k_scale_min(r.head.y, r.head.z, r.head.w, 2 * j + 1, k.sc1, k.m1);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const unsigned int q = word_of(r.q, i);
      k.lo[i] = q & kLowNibbles;
      k.hi[i] = (q >> 4) & kLowNibbles;
    }
    k.d = rf_f16_to_float((unsigned short)(r.head.x & 0xffffu));
    k.dmin = rf_f16_to_float((unsigned short)(r.head.x >> 16));
    return k;
  }
  static __device__ __forceinline__ float apply(const Decoded& k, const XSlice& x) { return k.apply(x); }
  static __device__ __forceinline__ float dot(const Raw r, int slice, const XSlice& x) { return apply(decode(r, slice), x); }
};

// Q5_K super-block {half d; half dmin; uint8 scales[12]; uint8 qh[32]; uint8 qs[128]}: slices as Q4_K's;
// the fifth bit of element l of sub-block i is bit i of qh[l], so slice s reads qh[16u .. +15].
struct Q5_KFormat {
  struct Raw {
    uint4 head, q, h;
  };
  static __device__ __forceinline__ unsigned long long row_bytes(int cols) { return (unsigned long long)(cols / 256) * 176; }
  static __device__ __forceinline__ Raw load(const unsigned char* __restrict__ row, int slice) {
    const uint4* b = reinterpret_cast<const uint4*>(row + (slice >> 3) * 176);
    return {b[0], b[3 + (slice & 7)], b[1 + (slice & 1)]};
  }
  static __device__ __forceinline__ void columns(int slice, int& col_a, int& col_b) {
    Q4_KFormat::columns(slice, col_a, col_b);
  }
  typedef KDecoded Decoded;
  static __device__ __forceinline__ Decoded decode(const Raw r, int slice) {
    const int j = (slice & 7) >> 1;
    KDecoded k;
    k_scale_min(r.head.y, r.head.z, r.head.w, 2 * j, k.sc0, k.m0);
    k_scale_min(r.head.y, r.head.z, r.head.w, 2 * j + 1, k.sc1, k.m1);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const unsigned int q = word_of(r.q, i), h = word_of(r.h, i);
      k.lo[i] = (q & kLowNibbles) | (((h >> (2 * j)) & kOnes) << 4);
      k.hi[i] = ((q >> 4) & kLowNibbles) | (((h >> (2 * j + 1)) & kOnes) << 4);
    }
    k.d = rf_f16_to_float((unsigned short)(r.head.x & 0xffffu));
    k.dmin = rf_f16_to_float((unsigned short)(r.head.x >> 16));
    return k;
  }
  static __device__ __forceinline__ float apply(const Decoded& k, const XSlice& x) { return k.apply(x); }
  static __device__ __forceinline__ float dot(const Raw r, int slice, const XSlice& x) { return apply(decode(r, slice), x); }
};

// Q6_K super-block {uint8 ql[128]; uint8 qh[64]; int8 scales[16]; half d} (210 bytes, 2-byte aligned):
// slice s (half h = s / 4, t = s % 4) takes ql[64h + 16t .. +15], whose low nibbles are elements
// 128h + 16t .. +15 (sub-block 8h + t) and high nibbles 128h + 64 + 16t .. +15 (sub-block 8h + t + 4),
// and the two high bits of each from qh[32h + 16(t % 2) .. +15], bits 2(t / 2) and 4 + 2(t / 2).
// w = d * scale * (q - 32): the codes 0..63 go into the dot product as they are and 32 * sum(x) comes off.
struct Q6_KFormat {
  struct Raw {
    unsigned int ql[4], qh[4];
    int scale_a, scale_b;
    unsigned short d;
  };
  static __device__ __forceinline__ unsigned long long row_bytes(int cols) { return (unsigned long long)(cols / 256) * 210; }
  static __device__ __forceinline__ Raw load(const unsigned char* __restrict__ row, int slice) {
    const unsigned char* b = row + (slice >> 3) * 210;
    const int h = (slice >> 2) & 1, t = slice & 3;
    Raw r;
    load_words<4>(b + 64 * h + 16 * t, r.ql);
    load_words<4>(b + 128 + 32 * h + 16 * (t & 1), r.qh);
    r.scale_a = (int)(signed char)b[192 + 8 * h + t];
    r.scale_b = (int)(signed char)b[196 + 8 * h + t];
    r.d = *reinterpret_cast<const unsigned short*>(b + 208);
    return r;
  }
  static __device__ __forceinline__ void columns(int slice, int& col_a, int& col_b) {
    col_a = (slice >> 3) * 256 + 128 * ((slice >> 2) & 1) + 16 * (slice & 3);
    col_b = col_a + 64;
  }
  // The 6-bit codes of both runs, their scales and d: what each token's product reads.
  struct Decoded {
    unsigned int lo[4], hi[4];
    int scale_a, scale_b;
    float d;
  };
  static __device__ __forceinline__ Decoded decode(const Raw r, int slice) {
    const int shift = 2 * ((slice & 3) >> 1);
    Decoded k;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      k.lo[i] = (r.ql[i] & kLowNibbles) | (((r.qh[i] >> shift) & 0x03030303u) << 4);
      k.hi[i] = ((r.ql[i] >> 4) & kLowNibbles) | (((r.qh[i] >> (shift + 4)) & 0x03030303u) << 4);
    }
    k.scale_a = r.scale_a, k.scale_b = r.scale_b;
    k.d = rf_f16_to_float(r.d);
    return k;
  }
  static __device__ __forceinline__ float apply(const Decoded& k, const XSlice& x) {
    int da = 0, db = 0;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      da = rf_dp4a((int)k.lo[i], x.xq[i], da);
      db = rf_dp4a((int)k.hi[i], x.xq[4 + i], db);
    }
    return k.d * (float)(k.scale_a * (da - 32 * x.sum_a) + k.scale_b * (db - 32 * x.sum_b));
  }
  static __device__ __forceinline__ float dot(const Raw r, int slice, const XSlice& x) { return apply(decode(r, slice), x); }
};

// Q8_0 block {half d; int8 qs[32]}: a slice is a block, run a its elements 0..15, run b 16..31.
struct Q8_0Format {
  struct Raw {
    unsigned int q[8];
    unsigned short d;
  };
  static __device__ __forceinline__ unsigned long long row_bytes(int cols) { return (unsigned long long)(cols / 32) * 34; }
  static __device__ __forceinline__ Raw load(const unsigned char* __restrict__ row, int slice) {
    const unsigned char* b = row + slice * 34;
    Raw r;
    load_words<8>(b + 2, r.q);
    r.d = *reinterpret_cast<const unsigned short*>(b);
    return r;
  }
  static __device__ __forceinline__ void columns(int slice, int& col_a, int& col_b) {
    col_a = slice * 32;
    col_b = col_a + 16;
  }
  struct Decoded {
    unsigned int q[8];
    float d;
  };
  static __device__ __forceinline__ Decoded decode(const Raw r, int) {
    Decoded k;
#pragma unroll
    for (int i = 0; i < 8; ++i) k.q[i] = r.q[i];
    k.d = rf_f16_to_float(r.d);
    return k;
  }
  static __device__ __forceinline__ float apply(const Decoded& k, const XSlice& x) {
    int s = 0;
#pragma unroll
    for (int i = 0; i < 8; ++i) s = rf_dp4a((int)k.q[i], x.xq[i], s);
    return k.d * (float)s;
  }
  static __device__ __forceinline__ float dot(const Raw r, int slice, const XSlice& x) { return apply(decode(r, slice), x); }
};

// Q4_0 block {half d; uint8 qs[16]}: low nibbles are elements 0..15 (run a), high nibbles 16..31 (run b);
// w = d * (q - 8).
struct Q4_0Format {
  struct Raw {
    unsigned int q[4];
    unsigned short d;
  };
  static __device__ __forceinline__ unsigned long long row_bytes(int cols) { return (unsigned long long)(cols / 32) * 18; }
  static __device__ __forceinline__ Raw load(const unsigned char* __restrict__ row, int slice) {
    const unsigned char* b = row + slice * 18;
    Raw r;
    load_words<4>(b + 2, r.q);
    r.d = *reinterpret_cast<const unsigned short*>(b);
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
      k.lo[i] = r.q[i] & kLowNibbles;
      k.hi[i] = (r.q[i] >> 4) & kLowNibbles;
    }
    k.d = rf_f16_to_float(r.d);
    return k;
  }
  static __device__ __forceinline__ float apply(const Decoded& k, const XSlice& x) {
    int s = 0;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      s = rf_dp4a((int)k.lo[i], x.xq[i], s);
      s = rf_dp4a((int)k.hi[i], x.xq[4 + i], s);
    }
    return k.d * (float)(s - 8 * (x.sum_a + x.sum_b));
  }
  static __device__ __forceinline__ float dot(const Raw r, int slice, const XSlice& x) { return apply(decode(r, slice), x); }
};

// acc[r][b] += the slice's products for every row r and token b, when `live` (a select, not a branch,
// so that the loads feeding it stay where they were issued).
template <class Format, int NB, int ROWS>
__device__ __forceinline__ void accumulate(const typename Format::Raw raw[ROWS], int slice, const float* __restrict__ x,
                                           int cols, float acc[ROWS][NB], bool live) {
  int col_a, col_b;
  Format::columns(slice, col_a, col_b);
  typename Format::Decoded dec[ROWS];  // decoded once, applied to every token
#pragma unroll
  for (int r = 0; r < ROWS; ++r) dec[r] = Format::decode(raw[r], slice);
#pragma unroll
  for (int b = 0; b < NB; ++b) {
    const XSlice xs = quantize_x(x + (unsigned long long)b * cols, col_a, col_b);
#pragma unroll
    for (int r = 0; r < ROWS; ++r) {
      const float sum = fmaf(xs.d, Format::apply(dec[r], xs), acc[r][b]);
      acc[r][b] = live ? sum : acc[r][b];
    }
  }
}

// One pass over W for the NB tokens starting at x / y, ROWS rows of W per warp at a time.
template <class Format, int NB, int ROWS>
__device__ __forceinline__ void qmatvec_pass(float* __restrict__ y, const unsigned char* __restrict__ W,
                                             const float* __restrict__ x, int rows, int cols) {
  const int lane = (int)threadIdx.x % WARP_SIZE;
  const int warps_per_block = (int)blockDim.x / WARP_SIZE;
  const int first_group = (int)blockIdx.x * warps_per_block + (int)threadIdx.x / WARP_SIZE;
  const int group_stride = (int)gridDim.x * warps_per_block;
  const int groups = (rows + ROWS - 1) / ROWS;
  const int slices = cols / 32;
  const unsigned long long row_bytes = Format::row_bytes(cols);

  for (int group = first_group; group < groups; group += group_stride) {  // uniform across the warp
    const int r0 = ROWS * group;
    const unsigned char* w[ROWS];
#pragma unroll
    for (int r = 0; r < ROWS; ++r)  // rows past the end read the first row again and are not written
      w[r] = W + (unsigned long long)(r0 + r < rows ? r0 + r : r0) * row_bytes;

    float acc[ROWS][NB];
#pragma unroll
    for (int r = 0; r < ROWS; ++r)
#pragma unroll
      for (int b = 0; b < NB; ++b) acc[r][b] = 0.0f;

    // One slice per step: in decoding the four rows' loads already put enough bytes in flight (measured
    // on an H100: two rows with two slices per step reached 1,440 GB/s on 14336 x 4096 Q4_K, four rows
    // with one slice 2,008), and x is quantized once for four rows. The second-slice path is kept for
    // variants that walk fewer rows.
    constexpr int kSlicesPerStep = 1;
    for (int slice = lane; slice < slices; slice += kSlicesPerStep * WARP_SIZE) {
      const bool has_second = kSlicesPerStep == 2 && slice + WARP_SIZE < slices;
      const int slice2 = has_second ? slice + WARP_SIZE : slice;
      typename Format::Raw raw[ROWS], next[ROWS];
#pragma unroll
      for (int r = 0; r < ROWS; ++r) raw[r] = Format::load(w[r], slice);
      if (kSlicesPerStep == 2) {
#pragma unroll
        for (int r = 0; r < ROWS; ++r) next[r] = Format::load(w[r], slice2);
      }
      accumulate<Format, NB, ROWS>(raw, slice, x, cols, acc, true);
      if (kSlicesPerStep == 2) accumulate<Format, NB, ROWS>(next, slice2, x, cols, acc, has_second);
    }

#pragma unroll
    for (int b = 0; b < NB; ++b)
#pragma unroll
      for (int r = 0; r < ROWS; ++r) {
        const float s = rf_warp_sum(acc[r][b]);
        if (lane == 0 && r0 + r < rows) y[(unsigned long long)b * rows + r0 + r] = s;
      }
  }
}

template <class Format>
__device__ __forceinline__ void qmatvec(float* __restrict__ y, const void* __restrict__ W_, const float* __restrict__ x,
                                        int rows, int cols, int batch) {
  rf_check_wave_size();
  const unsigned char* W = static_cast<const unsigned char*>(W_);
  for (int b0 = 0; b0 < batch; b0 += kMaxBatchPerPass) {
    float* yp = y + (unsigned long long)b0 * rows;
    const float* xp = x + (unsigned long long)b0 * cols;
    const int left = batch - b0;
    switch (left < kMaxBatchPerPass ? left : kMaxBatchPerPass) {
      case 1: qmatvec_pass<Format, 1, 4>(yp, W, xp, rows, cols); break;
      case 2: qmatvec_pass<Format, 2, 1>(yp, W, xp, rows, cols); break;
      case 3: qmatvec_pass<Format, 3, 1>(yp, W, xp, rows, cols); break;
      default: qmatvec_pass<Format, 4, 1>(yp, W, xp, rows, cols); break;
    }
  }
}

}  // namespace q8
}  // namespace

#ifndef RF_QMATVEC_NO_ENTRIES  // defined by fused_qmatvec.hip, which has entries of its own
// One entry point per format: qmatvec_<format>(y, W, x, rows, cols, batch).
#define RF_QMATVEC_ENTRY(name, Format)                                                                          \
  extern "C" __global__ __launch_bounds__(256) void name(float* __restrict__ y, const void* __restrict__ W,       \
                                                         const float* __restrict__ x, int rows, int cols, int batch) { \
    q8::qmatvec<Format>(y, W, x, rows, cols, batch);                                                            \
  }

RF_QMATVEC_ENTRY(qmatvec_q4_k, q8::Q4_KFormat)
RF_QMATVEC_ENTRY(qmatvec_q5_k, q8::Q5_KFormat)
RF_QMATVEC_ENTRY(qmatvec_q6_k, q8::Q6_KFormat)
RF_QMATVEC_ENTRY(qmatvec_q8_0, q8::Q8_0Format)
RF_QMATVEC_ENTRY(qmatvec_q4_0, q8::Q4_0Format)
#endif  // RF_QMATVEC_NO_ENTRIES
#endif  // RF_QMATVEC_HIP
