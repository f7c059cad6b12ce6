// Part of the matmul_mma op (kernels/matmul_mma.hip includes it; its code objects are built and hashed with
// it: hipcore/runtime/kernels.py source_files): the GGUF block formats the product reads and the step shapes
// that read them into the matrix cores' f16 operands (Narrow for every format, F16 and BF16 too, Wide for Q4_K / Q5_K, Wide6
// for Q6_K), with the K-quants' packed-f16 decoders; and x's two forms (XF32, XF16). The layouts and the decode
// primitives are block_formats.h's.
#pragma once
#include "hip_compat.h"
#include "block_formats.h"  // the layouts and their decode primitives

namespace {
namespace mmq {

// Each format: Raw load(row, col) reads what the 8 consecutive weights col .. col+7 (col % 8 == 0) of a
// row need; decode(raw, col, w) turns it into floats (as in matmul.hip, with FastCodes' conversions).

// float(v) - bias for a code 0 <= v < 2^22 and a small integer bias, without the int-to-float converter: v
// goes into the mantissa of 2^23 and 2^23 + bias comes off, both exact. A step decodes one code per weight,
// and NVIDIA's converter issues at a quarter of the FP32 rate: the decode batches were throttled on it.
static __device__ __forceinline__ float code_to_float(unsigned int v, float bias = 0.0f) {
  return rf_uint_as_float(0x4B000000u | v) - (8388608.0f + bias);
}

// block_formats.h's decode8 with code_to_float; a signed byte b is (b ^ 0x80) - 128.
struct FastCodes {
  static __device__ __forceinline__ float of(unsigned int v) { return code_to_float(v); }
  static __device__ __forceinline__ float biased(unsigned int v, int bias) { return code_to_float(v, (float)bias); }
  static __device__ __forceinline__ float of_int8(unsigned int byte) { return code_to_float(byte ^ 0x80u, 128.0f); }
};

// Q8_0 (34 bytes, 2-byte aligned): qs[k .. k+7], k = col % 32.
struct Q8_0 {
  typedef rf_blocks::Q8_0 B;
  struct Raw {
    unsigned short d, q[4];
  };
  static __device__ __forceinline__ unsigned long long row_bytes(int cols) { return rf_blocks::row_bytes<B>(cols); }
  static __device__ __forceinline__ Raw load(const unsigned char* __restrict__ row, int col) {
    const unsigned short* b = reinterpret_cast<const unsigned short*>(row + (col >> 5) * B::kBytes);
    const unsigned short* q = b + B::kQsAt / 2 + ((col & 31) >> 1);
    return {b[0], {q[0], q[1], q[2], q[3]}};
  }
  static __device__ __forceinline__ void decode(const Raw r, int, float w[8]) {
    B::decode8<FastCodes>(rf_f16_to_float(r.d), r.q, w);
  }
};

// Q4_0 (18 bytes, 2-byte aligned): columns k .. k+7 (k = col % 32) are the low nibbles of qs[k .. k+7] when
// k < 16, else the high nibbles of qs[k-16 .. k-9].
struct Q4_0 {
  typedef rf_blocks::Q4_0 B;
  struct Raw {
    unsigned short d, q[4];
  };
  static __device__ __forceinline__ unsigned long long row_bytes(int cols) { return rf_blocks::row_bytes<B>(cols); }
  static __device__ __forceinline__ Raw load(const unsigned char* __restrict__ row, int col) {
    const unsigned short* b = reinterpret_cast<const unsigned short*>(row + (col >> 5) * B::kBytes);
    const unsigned short* q = b + B::kQsAt / 2 + ((col & 15) >> 1);
    return {b[0], {q[0], q[1], q[2], q[3]}};
  }
  static __device__ __forceinline__ void decode(const Raw r, int col, float w[8]) {
    B::decode8<FastCodes>(rf_f16_to_float(r.d), r.q, (col & 16) >> 2, w);
  }
};

// MXFP4 (17 bytes, byte aligned): block_format_mxfp4.h's reading of eight weights, as matmul.hip's, with FastCodes.
typedef rf_blocks::MXFP4Eights<FastCodes> MXFP4;

// Q4_1 (20 bytes, 4-byte aligned): nibbles as in Q4_0.
struct Q4_1 {
  typedef rf_blocks::Q4_1 B;
  struct Raw {
    unsigned int dm, q[2];
  };
  static __device__ __forceinline__ unsigned long long row_bytes(int cols) { return rf_blocks::row_bytes<B>(cols); }
  static __device__ __forceinline__ Raw load(const unsigned char* __restrict__ row, int col) {
    const unsigned int* b = reinterpret_cast<const unsigned int*>(row + (col >> 5) * B::kBytes);
    const unsigned int* q = b + B::kQsAt / 4 + ((col & 15) >> 2);
    return {b[0], {q[0], q[1]}};
  }
  static __device__ __forceinline__ void decode(const Raw r, int col, float w[8]) {
    B::decode8<FastCodes>(B::d_of(r.dm), B::m_of(r.dm), r.q, (col & 16) >> 2, w);
  }
};

// Q5_1 (24 bytes, 4-byte aligned): Q4_1's nibbles with bit k of qh on top of column k's code (k = col % 32).
struct Q5_1 {
  typedef rf_blocks::Q5_1 B;
  struct Raw {
    unsigned int dm, h, q[2];
  };
  static __device__ __forceinline__ unsigned long long row_bytes(int cols) { return rf_blocks::row_bytes<B>(cols); }
  static __device__ __forceinline__ Raw load(const unsigned char* __restrict__ row, int col) {
    const unsigned int* b = reinterpret_cast<const unsigned int*>(row + (col >> 5) * B::kBytes);
    const unsigned int* q = b + B::kQsAt / 4 + ((col & 15) >> 2);
    return {b[0], b[B::kQhAt / 4], {q[0], q[1]}};
  }
  static __device__ __forceinline__ void decode(const Raw r, int col, float w[8]) {
    B::decode8<FastCodes>(B::d_of(r.dm), B::m_of(r.dm), r.q, (col & 16) >> 2, r.h >> (col & 31), w);
  }
};

// Q5_0 (22 bytes, 2-byte aligned): Q5_1's codes, 2-byte loads.
struct Q5_0 {
  typedef rf_blocks::Q5_0 B;
  struct Raw {
    unsigned short d, h[2], q[4];
  };
  static __device__ __forceinline__ unsigned long long row_bytes(int cols) { return rf_blocks::row_bytes<B>(cols); }
  static __device__ __forceinline__ Raw load(const unsigned char* __restrict__ row, int col) {
    const unsigned short* b = reinterpret_cast<const unsigned short*>(row + (col >> 5) * B::kBytes);
    const unsigned short* q = b + B::kQsAt / 2 + ((col & 15) >> 1);
    return {b[0], {b[B::kQhAt / 2], b[B::kQhAt / 2 + 1]}, {q[0], q[1], q[2], q[3]}};
  }
  static __device__ __forceinline__ void decode(const Raw r, int col, float w[8]) {
    B::decode8<FastCodes>(rf_f16_to_float(r.d), r.q, (col & 16) >> 2,
                          ((unsigned int)r.h[0] | ((unsigned int)r.h[1] << 16)) >> (col & 31), w);
  }
};

// Q4_K and Q5_K are read in 64-column steps (Wide, below), Q6_K in steps of two runs (Wide6, below).

static __device__ __forceinline__ unsigned int pack_f16(float lo, float hi) {
  return (unsigned int)rf_float_to_f16(lo) | ((unsigned int)rf_float_to_f16(hi) << 16);
}

static __device__ __forceinline__ uint4 pack8(const float w[8]) {
  return uint4{pack_f16(w[0], w[1]), pack_f16(w[2], w[3]), pack_f16(w[4], w[5]), pack_f16(w[6], w[7])};
}

// The four bytes of w (codes below 1024) as two f16 pairs of 1024 + code, bytes 0, 1 and 2, 3: each byte with
// 0x64 above it (the f16 exponent of 1024, so the byte is the mantissa), one byte permute per pair.
static __device__ __forceinline__ void biased_pairs(unsigned int w, unsigned int out[2]) {
  out[0] = rf_byte_perm(w, 0x64646464u, 0x4140u);
  out[1] = rf_byte_perm(w, 0x64646464u, 0x4342u);
}

// How a step of the tile loop reads W: kStepCols columns of each of the 128 rows, in kGroupsPerRow groups;
// load(row, c0, g) issues group g's loads for step c0 (c0 = the step's index times kStepCols),
// store(raw, c0, g, ws_row) decodes them into the row's f16 tile, and column(c0, col) is the column of W
// (and x) that column col of the tile holds: c0 + col, except where a step takes two runs (Wide6).
//
// Narrow<F>: F's groups of 8 consecutive weights, 4 per 32-column step (every format).
template <class F>
struct Narrow {
  typedef typename F::Raw Raw;
  static constexpr int kStepCols = 32, kGroupsPerRow = 4;
  static __device__ __forceinline__ unsigned long long row_bytes(int cols) { return F::row_bytes(cols); }
  static __device__ __forceinline__ int column(int c0, int col) { return c0 + col; }
  static __device__ __forceinline__ Raw load(const unsigned char* __restrict__ row, int c0, int g) {
    return F::load(row, c0 + 8 * g);
  }
  static __device__ __forceinline__ void store(const Raw& r, int c0, int g, unsigned short* ws_row) {
    float w[8];
    F::decode(r, c0 + 8 * g, w);
    *reinterpret_cast<uint4*>(ws_row + 8 * g) = pack8(w);
  }
};

// F16, GGUF's plain half weights: a group is 8 halves (16 bytes, 16-byte aligned: cols is a multiple of 32 and the
// tensors 16-byte aligned), stored into the tile as loaded, no decode.
struct F16 {
  typedef uint4 Raw;
  static __device__ __forceinline__ unsigned long long row_bytes(int cols) { return (unsigned long long)cols * 2; }
  static __device__ __forceinline__ Raw load(const unsigned char* __restrict__ row, int col) {
    return *reinterpret_cast<const uint4*>(row + 2 * (unsigned long long)col);
  }
};
template <>
struct Narrow<F16> {
  typedef uint4 Raw;
  static constexpr int kStepCols = 32, kGroupsPerRow = 4;
  static __device__ __forceinline__ unsigned long long row_bytes(int cols) { return F16::row_bytes(cols); }
  static __device__ __forceinline__ int column(int c0, int col) { return c0 + col; }
  static __device__ __forceinline__ Raw load(const unsigned char* __restrict__ row, int c0, int g) {
    return F16::load(row, c0 + 8 * g);
  }
  static __device__ __forceinline__ void store(const Raw& r, int, int g, unsigned short* ws_row) {
    *reinterpret_cast<uint4*>(ws_row + 8 * g) = r;
  }
};

// BF16, GGUF's bfloat16 weights: a group is 8 of them (16 bytes, aligned as F16's), each word's two widened to
// floats (a shift, a mask) and narrowed to one f16 pair as the tile takes them. Exact for |w| in f16's normal range
// (6.1e-5 .. 65,504: bfloat16's 8 bits of mantissa fit f16's 11); smaller values round once as f16 subnormals
// (matmul_mma.error_bound's h). Larger ones would overflow: hipcore/model/weights.py stores a matrix holding any as
// F32 instead, which this path never reads.
struct BF16 : F16 {  // F16's layout and loads
  static __device__ __forceinline__ unsigned int narrow(unsigned int word) { return rf_blocks::BF16::to_f16_pair(word); }
};
template <>
struct Narrow<BF16> : Narrow<F16> {  // F16's loads, narrowed as stored
  static __device__ __forceinline__ void store(const Raw& r, int, int g, unsigned short* ws_row) {
    *reinterpret_cast<uint4*>(ws_row + 8 * g) = uint4{BF16::narrow(r.x), BF16::narrow(r.y), BF16::narrow(r.z), BF16::narrow(r.w)};
  }
};

// The f16 constants of sub-blocks 2j (lo) and 2j + 1 (hi) of a Q4_K / Q5_K super-block, in both lanes of a
// pair (rf_blocks::KScales::pair_scales). No conversion instruction: those run at a quarter of the f16 rate on
// NVIDIA, and the float path's eleven per row and step (four int -> float, seven float -> f16) were a large part
// of a decode batch's instructions, which an issue-bound warp pays for (measured on an H100:
// docs/history/2026-11-27-conversion-free-kquant-scales.md).
typedef rf_blocks::KPairScales KPairScales;
static __device__ __forceinline__ KPairScales k_pair_scales(const uint4& head, int j) {
  return rf_blocks::KScales::pair_scales(head, j);
}

// v rounded to f16, in both lanes of a pair. Q6_K's scales d * scales[] keep it (three conversions per row
// and step): the byte-permute form of k_pair_scales, the same values, made Q6_K's products 1-3% slower on an
// H100 (the 8B's down 45.1 -> 46.4 us at 32 tokens; the same note).
static __device__ __forceinline__ unsigned int f16_pair(float v) { return (unsigned int)rf_float_to_f16(v) * 0x10001u; }

// One word of a Q4_K / Q5_K chunk's codes (bytes 4i .. 4i + 3: four columns of sub-block 2j in the low
// nibbles, the same four of 2j + 1 in the high ones; h the matching word of Q5_K's fifth bits) as two f16
// pairs of each sub-block, in packed f16 arithmetic (two weights per instruction, where the float path took
// five instructions per weight): biased_pairs puts 0x64 above each code byte, which as an f16 is 1024 + q;
// one fused multiply-add takes it to q * sc exactly ((1024 + q) sc - 1024 sc, q sc <= 31 * 63 < 2048 an
// f16 integer, 1024 sc <= 64512 exact), the second to d (q sc) - dmin m with one rounding (d is the file's
// f16; dmin m, rounded to f16 first, is the one rounding the float path did not have: error_bound counts it).
template <bool kFiveBit>
static __device__ __forceinline__ void decode_k_word(unsigned int word, unsigned int h, int j, const KPairScales& k,
                                                     unsigned int lo[2], unsigned int hi[2]) {
  unsigned int a, b;
  rf_blocks::Q4_K::codes(word, a, b);
  if (kFiveBit) rf_blocks::Q5_K::add_fifth_bits(h, j, a, b);
  unsigned int pa[2], pb[2];
  biased_pairs(a, pa);
  biased_pairs(b, pb);
#pragma unroll
  for (int e = 0; e < 2; ++e) {
    lo[e] = rf_h2_fma(rf_h2_fma(pa[e], k.sc_lo, k.off_lo), k.d, k.min_lo);
    hi[e] = rf_h2_fma(rf_h2_fma(pb[e], k.sc_hi, k.off_hi), k.d, k.min_hi);
  }
}

// A group's 16 columns of each half of a step (lo: tile columns 0..31, hi: 32..63), eight f16 pairs each, into
// its shared row at ws (the group's first column).
static __device__ __forceinline__ void store_pairs(const unsigned int lo[8], const unsigned int hi[8], unsigned short* ws) {
  uint4* dst_lo = reinterpret_cast<uint4*>(ws);
  uint4* dst_hi = reinterpret_cast<uint4*>(ws + 32);
  dst_lo[0] = uint4{lo[0], lo[1], lo[2], lo[3]};
  dst_lo[1] = uint4{lo[4], lo[5], lo[6], lo[7]};
  dst_hi[0] = uint4{hi[0], hi[1], hi[2], hi[3]};
  dst_hi[1] = uint4{hi[4], hi[5], hi[6], hi[7]};
}

// Wide<kFiveBit>: Q4_K / Q5_K in 64-column steps, one chunk j of a super-block: qs[32j .. 32j+31] holds
// columns 64j .. 64j+31 in its low nibbles (sub-block 2j) and 64j+32 .. 64j+63 in its high ones (2j+1).
// Group g (0, 1) is 16 bytes of them, qs[32j + 16g ..]: 32 weights from one 16-byte load, where a Narrow
// group reads 8 weights' half bytes with the header again. A thread's registers hold 16 bytes of codes
// instead of 8, so twice the weight bytes are in flight for the same registers (the decode batches are
// latency-bound: a workgroup waits for each step's loads).
template <bool kFiveBit>
struct Wide {
  static constexpr int kStepCols = 64, kGroupsPerRow = 2;
  typedef typename rf_blocks::Q4or5_K<kFiveBit>::type B;
  static constexpr int kBlockBytes = B::kBytes, kQsOffset = B::kQsAt;
  struct Raw {
    uint4 head, q, h;  // h: Q5_K's fifth bits qh[16g ..], zero for Q4_K
  };
  static __device__ __forceinline__ unsigned long long row_bytes(int cols) {
    return (unsigned long long)(cols / 256) * kBlockBytes;
  }
  static __device__ __forceinline__ int column(int c0, int col) { return c0 + col; }
  static __device__ __forceinline__ Raw load(const unsigned char* __restrict__ row, int c0, int g) {
    const unsigned char* b = row + (c0 >> 8) * kBlockBytes;
    const int j = (c0 & 255) >> 6;
    Raw r;
    r.head = *reinterpret_cast<const uint4*>(b);
    r.q = *reinterpret_cast<const uint4*>(b + kQsOffset + 32 * j + 16 * g);
    r.h = kFiveBit ? *reinterpret_cast<const uint4*>(b + rf_blocks::Q5_K::kQhAt + 16 * g) : uint4{0u, 0u, 0u, 0u};
    return r;
  }
  static __device__ __forceinline__ void store(const Raw& r, int c0, int g, unsigned short* ws_row) {
    const int j = (c0 & 255) >> 6;
    const KPairScales k = k_pair_scales(r.head, j);
    const unsigned int q[4] = {r.q.x, r.q.y, r.q.z, r.q.w}, h[4] = {r.h.x, r.h.y, r.h.z, r.h.w};
    unsigned int lo[8], hi[8];  // f16 pairs: columns 16g + 2i, +1 of sub-block 2j (lo) and 2j + 1 (hi)
#pragma unroll
    for (int w = 0; w < 4; ++w) decode_k_word<kFiveBit>(q[w], h[w], j, k, lo + 2 * w, hi + 2 * w);
    store_pairs(lo, hi, ws_row + 16 * g);
  }
};

// N little-endian words from a 2-byte aligned address p, in two parts (a misaligned wide load would fault
// on NVIDIA): load_aligned_words reads the N + 1 aligned 4-byte words around them and returns the shift (0
// or 16 bits); shift_words then joins each pair. The parts are apart so that the loads can stay in flight
// until the words are used.
template <int N>
static __device__ __forceinline__ int load_aligned_words(const unsigned char* __restrict__ p, unsigned int w[N + 1]) {
  const unsigned long long addr = (unsigned long long)p;
  const unsigned int* base = reinterpret_cast<const unsigned int*>(addr & ~3ull);
#pragma unroll
  for (int k = 0; k <= N; ++k) w[k] = base[k];
  return (int)(addr & 2u) * 8;
}

template <int N>
static __device__ __forceinline__ void shift_words(const unsigned int w[N + 1], int shift, unsigned int out[N]) {
#pragma unroll
  for (int k = 0; k < N; ++k) out[k] = (unsigned int)((((unsigned long long)w[k + 1] << 32) | w[k]) >> shift);
}

// One word of a Q6_K step's codes (four columns of run A in ql's low nibbles, the same four of run B in its
// high ones, their top bits in qh at bits 2t, 2t + 1 and 2t + 4, 2t + 5) as two f16 pairs of each run, in
// packed f16 arithmetic as decode_k_word: 1024 + q from a byte permute, minus 1056 is q - 32 exactly, times
// the sub-block's scale d * scales[] rounded to f16 (a second rounding: error_bound counts it).
static __device__ __forceinline__ void decode_q6_word(unsigned int ql, unsigned int qh, int t, unsigned int scale_a,
                                                      unsigned int scale_b, unsigned int lo[2], unsigned int hi[2]) {
  constexpr unsigned int k1056 = 0x64206420u;  // 1056 = 1024 + 32 in both lanes
  unsigned int a, b;
  rf_blocks::Q6_K::codes(ql, qh, 2 * t, a, b);
  unsigned int pa[2], pb[2];
  biased_pairs(a, pa);
  biased_pairs(b, pb);
#pragma unroll
  for (int e = 0; e < 2; ++e) {
    lo[e] = rf_h2_mul(rf_h2_sub(pa[e], k1056), scale_a);
    hi[e] = rf_h2_mul(rf_h2_sub(pb[e], k1056), scale_b);
  }
}

// Wide6: Q6_K in steps of two 32-column runs that share their code bytes. In half h of a super-block,
// ql[64h + 32t + l] holds column 128h + 32t + l in its low nibble (quarter t) and 128h + 64 + 32t + l in
// its high one (quarter t + 2), and qh[32h + l] the two high bits of both (bits 2t and 2t + 4). Step k of a
// row (c0 = 64k) is super-block k / 4, half (k / 2) % 2, t = k % 2: run A = 128h + 32t .. +31 in tile
// columns 0..31, run B = A + 64 .. in 32..63. Group g (0, 1) is l = 16g .. 16g + 15: 16 bytes of ql and 16
// of qh for 32 weights (Narrow reads the same bytes for 8 weights twice over, in 2-byte pieces). The rows
// are 210 bytes, 2-byte aligned: the bytes come in 4-byte words, shifted.
struct Wide6 {
  static constexpr int kStepCols = 64, kGroupsPerRow = 2;
  // The aligned words as loaded, shifted in store(): a shift at load time would wait for the loads there,
  // and the step pipeline below needs them still in flight while the current step's products run.
  struct Raw {
    unsigned int ql[5], qh[5];
    int scale_a, scale_b, shift;
    unsigned short d;
  };
  typedef rf_blocks::Q6_K B;
  static __device__ __forceinline__ unsigned long long row_bytes(int cols) { return rf_blocks::row_bytes<B>(cols); }
  static __device__ __forceinline__ int column(int c0, int col) {
    const int k = c0 >> 6;
    return (k >> 2) * 256 + ((k >> 1) & 1) * 128 + (k & 1) * 32 + (col < 32 ? col : col + 32);
  }
  static __device__ __forceinline__ Raw load(const unsigned char* __restrict__ row, int c0, int g) {
    const int k = c0 >> 6, h = (k >> 1) & 1, t = k & 1;
    const unsigned char* b = row + (k >> 2) * B::kBytes;
    Raw r;
    // Both runs start at an even offset from b, so one shift serves the two.
    r.shift = load_aligned_words<4>(b + 64 * h + 32 * t + 16 * g, r.ql);
    load_aligned_words<4>(b + B::kQhAt + 32 * h + 16 * g, r.qh);
    r.scale_a = (int)(signed char)b[B::kScalesAt + 8 * h + 2 * t + g];
    r.scale_b = (int)(signed char)b[B::kScalesAt + 8 * h + 2 * t + 4 + g];
    r.d = *reinterpret_cast<const unsigned short*>(b + B::kDAt);
    return r;
  }
  static __device__ __forceinline__ void store(const Raw& r, int c0, int g, unsigned short* ws_row) {
    const int t = (c0 >> 6) & 1;
    const float d = rf_f16_to_float(r.d);
    const unsigned int scale_a = f16_pair(d * (float)r.scale_a), scale_b = f16_pair(d * (float)r.scale_b);
    unsigned int ql_words[4], qh_words[4];
    shift_words<4>(r.ql, r.shift, ql_words);
    shift_words<4>(r.qh, r.shift, qh_words);
    unsigned int lo[8], hi[8];  // f16 pairs: run A's columns 16g + 2i, +1 (lo), run B's (hi)
#pragma unroll
    for (int w = 0; w < 4; ++w) decode_q6_word(ql_words[w], qh_words[w], t, scale_a, scale_b, lo + 2 * w, hi + 2 * w);
    store_pairs(lo, hi, ws_row + 16 * g);
  }
};

// x as a launch holds it: float32, rounded to f16 as it is staged (XF32), or f16 already (XF16: half the
// bytes each tile reads). A load is kValues consecutive values of one token; load_into assigns member by
// member, as in matmul.hip: a whole-struct copy into the array can land in scratch.
struct XF32 {
  static constexpr int kValues = 4, kBytes = 4;
  typedef float4 Raw;
  static __device__ __forceinline__ void load_into(Raw& r, const unsigned char* row, int col) {
    const float4 v = *reinterpret_cast<const float4*>(reinterpret_cast<const float*>(row) + col);
    r.x = v.x, r.y = v.y, r.z = v.z, r.w = v.w;
  }
  static __device__ __forceinline__ void store(const Raw& r, unsigned short* dst) {
    unsigned int* d = reinterpret_cast<unsigned int*>(dst);
    d[0] = pack_f16(r.x, r.y);
    d[1] = pack_f16(r.z, r.w);
  }
};
struct XF16 {
  static constexpr int kValues = 8, kBytes = 2;
  typedef uint4 Raw;
  static __device__ __forceinline__ void load_into(Raw& r, const unsigned char* row, int col) {
    const uint4 v = *reinterpret_cast<const uint4*>(reinterpret_cast<const unsigned short*>(row) + col);
    r.x = v.x, r.y = v.y, r.z = v.z, r.w = v.w;
  }
  static __device__ __forceinline__ void store(const Raw& r, unsigned short* dst) { *reinterpret_cast<uint4*>(dst) = r; }
};

}  // namespace mmq
}  // namespace
