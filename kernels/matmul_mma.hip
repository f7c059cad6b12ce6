// Matrix-matrix product on GGUF weights on the matrix cores, for prompt evaluation and large batches:
//   y[t, r] = sum_c W[r, c] * x[t, c]   for r < rows, t < n_tokens
// Same layouts and results as matmul.hip (W [rows, cols] in its GGUF block format, x float32
// [n_tokens, cols], y float32 [n_tokens, rows]), but the products run as f16 x f16 -> f32 matrix
// instructions (hip_compat.h's rf_mma: mma.sync on NVIDIA, MFMA on CDNA, WMMA on RDNA3/4, FMA elsewhere):
// - A workgroup of 256 threads computes a tile of 128 rows x TILE_TOKENS tokens (32 or 64: the
//   launcher's `tile_tokens`), stepping through the columns a step at a time: 32 columns (Narrow: each
//   thread decodes 2 groups of 8 consecutive weights of one row), or 64 for Q4_K and Q5_K (Wide: each
//   thread decodes 32 weights of one row from one 16-byte word of codes) and Q6_K (Wide6: two runs of 32
//   columns that share their code bytes). In each step the 128 x step weights are decoded once into
//   shared memory as f16, and the TILE_TOKENS x step slice of x is rounded to f16 beside them.
// - The warps tile the output in 16 x 16 matrix tiles: four warps down the rows (32 rows = 2 tiles each),
//   the rest across the tokens (2 warps on wave32, 1 on wave64), so each A fragment feeds every token
//   tile of its warp and each B fragment both row tiles.
// - Shared rows are step + 8 halves (40 or 72): 16-byte aligned for the decoded stores, and the rows a
//   warp's fragment loads touch together start in different banks.
// - The next step's weights and x are loaded into registers before the current step's products, as in
//   matmul.hip; tiles past the last row or token read the last row / token again and write nothing; a
//   grid-stride loop over tiles makes any grid correct.
// - Split-K. With few tiles (a decode batch of up to 64 tokens has one token tile: 32 tiles of 128 rows for a
//   4096-row projection on a GPU of 132 compute units) the workgroups of a tile take `splits` disjoint
//   ranges of whole steps, as fused_matmul.hip does: each writes its partial tile to the workspace and
//   counts itself in the tile's counter; the last to arrive sums the partials in split order (the same
//   order whoever arrives last: a replay equals its eager twin bit for bit), writes the tile and sets the
//   counter back to zero for the next launch.
// - `accumulate` adds the product to y instead of storing it (the residual connection: no add launch).
// - Precision: W and x are rounded to f16 (|w| and |x| must stay below 65504; weights of LLMs and their
//   normed activations do), the products are exact and summed in f32: ops/matmul_mma.py error_bound.
// The format decoders are matmul.hip's: each op's source is built and hashed on its own.
// Requirements the launcher checks: cols % 32 == 0 (% 256 for the K-quants); W aligned as for matmul, Q4_K
// and Q5_K to 16 bytes; x 16-byte aligned; blockDim 256; splits <= the steps (cols / step); tiles * splits < 2^31; with splits > 1, at most
// kCounterBytes / 4 tiles and a workspace of kCounterBytes (zeroed once, left zeroed by every launch) +
// tiles * splits * 128 * tile_tokens floats.
#include "hip_compat.h"

namespace {
namespace mmq {

constexpr int kThreads = 256;
constexpr int kTileRows = 128;
constexpr int kMaxStepCols = 64;                 // the widest step of a format (Wide K-quants)
constexpr int kMaxStride = kMaxStepCols + 8;       // halves per shared row, at most
constexpr int kMaxTileTokens = 64;
constexpr int kWarps = kThreads / WARP_SIZE;
constexpr int kWarpsDown = 4;                    // warps along the rows, 32 rows each
constexpr int kWarpsAcross = kWarps / kWarpsDown;  // warps along the tokens
constexpr int kRowTilesPerWarp = kTileRows / kWarpsDown / 16;
constexpr int kCounterBytes = 4096;  // one int counter per tile, before the partials
// Steps loaded ahead (the step pipeline in mma_tiles), by token tile: 32-token tiles are decode batches,
// few workgroups waiting on loads; 64-token tiles are prompts, enough workgroups to hide them.
constexpr int kDepthTile32 = 2;
constexpr int kDepthTile64 = 1;

// Partials other workgroups of this launch wrote: read from L2, past the SM's L1, which NVIDIA does not
// keep coherent (the fence orders the writes but invalidates nothing there). On AMD the acquire side of
// __threadfence() invalidates the compute unit's cache, so plain loads see the writes.
static __device__ __forceinline__ float load_partial(const float* p) {
#if defined(RF_NVIDIA)
  float v;
  asm volatile("ld.global.cg.f32 %0, [%1];" : "=f"(v) : "l"(p));
  return v;
#else
  return *p;
#endif
}

// Each format: Raw load(row, col) reads what the 8 consecutive weights col .. col+7 (col % 8 == 0) of a
// row need; decode(raw, col, w) turns it into floats (as in matmul.hip).

// float(v) - bias for a code 0 <= v < 2^22 and a small integer bias, without the int-to-float converter: v
// goes into the mantissa of 2^23 and 2^23 + bias comes off, both exact. A step decodes one code per weight,
// and NVIDIA's converter issues at a quarter of the FP32 rate: the decode batches were throttled on it.
static __device__ __forceinline__ float code_to_float(unsigned int v, float bias = 0.0f) {
  return rf_uint_as_float(0x4B000000u | v) - (8388608.0f + bias);
}

// Q8_0 block {half d; int8 qs[32]} (34 bytes, 2-byte aligned): qs[k .. k+7], k = col % 32.
struct Q8_0 {
  struct Raw {
    unsigned short d, q[4];
  };
  static __device__ __forceinline__ unsigned long long row_bytes(int cols) { return (unsigned long long)(cols / 32) * 34; }
  static __device__ __forceinline__ Raw load(const unsigned char* __restrict__ row, int col) {
    const unsigned short* b = reinterpret_cast<const unsigned short*>(row + (col >> 5) * 34);
    const unsigned short* q = b + 1 + ((col & 31) >> 1);
    return {b[0], {q[0], q[1], q[2], q[3]}};
  }
  static __device__ __forceinline__ void decode(const Raw r, int, float w[8]) {
    const float d = rf_f16_to_float(r.d);
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      // (b ^ 0x80) - 128 is b as a signed byte
      w[2 * k] = d * code_to_float((r.q[k] & 0xffu) ^ 0x80u, 128.0f);
      w[2 * k + 1] = d * code_to_float((unsigned int)(r.q[k] >> 8) ^ 0x80u, 128.0f);
    }
  }
};

// Q4_0 block {half d; uint8 qs[16]} (18 bytes, 2-byte aligned): columns k .. k+7 (k = col % 32) are the
// low nibbles of qs[k .. k+7] when k < 16, else the high nibbles of qs[k-16 .. k-9].
struct Q4_0 {
  struct Raw {
    unsigned short d, q[4];
  };
  static __device__ __forceinline__ unsigned long long row_bytes(int cols) { return (unsigned long long)(cols / 32) * 18; }
  static __device__ __forceinline__ Raw load(const unsigned char* __restrict__ row, int col) {
    const unsigned short* b = reinterpret_cast<const unsigned short*>(row + (col >> 5) * 18);
    const unsigned short* q = b + 1 + ((col & 15) >> 1);
    return {b[0], {q[0], q[1], q[2], q[3]}};
  }
  static __device__ __forceinline__ void decode(const Raw r, int col, float w[8]) {
    const float d = rf_f16_to_float(r.d);
    const int shift = (col & 16) >> 2;  // 0 or 4
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      w[2 * k] = d * code_to_float((r.q[k] >> shift) & 15u, 8.0f);
      w[2 * k + 1] = d * code_to_float((r.q[k] >> (8 + shift)) & 15u, 8.0f);
    }
  }
};

// Q4_1 block {half d; half m; uint8 qs[16]} (20 bytes, 4-byte aligned): nibbles as in Q4_0.
struct Q4_1 {
  struct Raw {
    unsigned int dm, q[2];
  };
  static __device__ __forceinline__ unsigned long long row_bytes(int cols) { return (unsigned long long)(cols / 32) * 20; }
  static __device__ __forceinline__ Raw load(const unsigned char* __restrict__ row, int col) {
    const unsigned int* b = reinterpret_cast<const unsigned int*>(row + (col >> 5) * 20);
    const unsigned int* q = b + 1 + ((col & 15) >> 2);
    return {b[0], {q[0], q[1]}};
  }
  static __device__ __forceinline__ void decode(const Raw r, int col, float w[8]) {
    const float d = rf_f16_to_float((unsigned short)(r.dm & 0xffffu));
    const float m = rf_f16_to_float((unsigned short)(r.dm >> 16));
    const int shift = (col & 16) >> 2;
#pragma unroll
    for (int k = 0; k < 8; ++k) w[k] = fmaf(d, code_to_float((r.q[k >> 2] >> (8 * (k & 3) + shift)) & 15u), m);
  }
};

// Q5_1 block {half d; half m; uint8 qh[4]; uint8 qs[16]} (24 bytes, 4-byte aligned): Q4_1's nibbles with
// bit k of qh (a little-endian word) on top of column k's code (k = col % 32).
struct Q5_1 {
  struct Raw {
    unsigned int dm, h, q[2];
  };
  static __device__ __forceinline__ unsigned long long row_bytes(int cols) { return (unsigned long long)(cols / 32) * 24; }
  static __device__ __forceinline__ Raw load(const unsigned char* __restrict__ row, int col) {
    const unsigned int* b = reinterpret_cast<const unsigned int*>(row + (col >> 5) * 24);
    const unsigned int* q = b + 2 + ((col & 15) >> 2);
    return {b[0], b[1], {q[0], q[1]}};
  }
  static __device__ __forceinline__ void decode(const Raw r, int col, float w[8]) {
    const float d = rf_f16_to_float((unsigned short)(r.dm & 0xffffu));
    const float m = rf_f16_to_float((unsigned short)(r.dm >> 16));
    const int shift = (col & 16) >> 2;
    const unsigned int h = r.h >> (col & 31);
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      w[k] = fmaf(d, code_to_float(((r.q[k >> 2] >> (8 * (k & 3) + shift)) & 15u) | (((h >> k) & 1u) << 4)), m);
    }
  }
};

// Q5_0 block {half d; uint8 qh[4]; uint8 qs[16]} (22 bytes, 2-byte aligned): d * (q - 16), q as in Q5_1.
struct Q5_0 {
  struct Raw {
    unsigned short d, h[2], q[4];
  };
  static __device__ __forceinline__ unsigned long long row_bytes(int cols) { return (unsigned long long)(cols / 32) * 22; }
  static __device__ __forceinline__ Raw load(const unsigned char* __restrict__ row, int col) {
    const unsigned short* b = reinterpret_cast<const unsigned short*>(row + (col >> 5) * 22);
    const unsigned short* q = b + 3 + ((col & 15) >> 1);
    return {b[0], {b[1], b[2]}, {q[0], q[1], q[2], q[3]}};
  }
  static __device__ __forceinline__ void decode(const Raw r, int col, float w[8]) {
    const float d = rf_f16_to_float(r.d);
    const int shift = (col & 16) >> 2;
    const unsigned int h = ((unsigned int)r.h[0] | ((unsigned int)r.h[1] << 16)) >> (col & 31);
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      const unsigned int q = ((r.q[k >> 1] >> (8 * (k & 1) + shift)) & 15u) | (((h >> k) & 1u) << 4);
      w[k] = d * code_to_float(q, 16.0f);
    }
  }
};

// Q4_K super-block {half d; half dmin; uint8 scales[12]; uint8 qs[128]} (144 bytes) and Q5_K {half d;
// half dmin; uint8 scales[12]; uint8 qh[32]; uint8 qs[128]} (176 bytes): read in 64-column steps (Wide,
// below); w = d * sc * q - dmin * m, Q5_K's fifth bit of element l of sub-block i is bit i of qh[l].

// Q6_K super-block {uint8 ql[128]; uint8 qh[64]; int8 scales[16]; half d} (210 bytes, 2-byte aligned):
// w = d * scales[e / 16] * (q - 32), a 6-bit code q; read in steps of two runs (Wide6, below).

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

// The f16 constants of sub-blocks 2j (lo) and 2j + 1 (hi) of a Q4_K / Q5_K super-block, in both lanes of a
// pair, from its first 16 bytes (d, dmin, the 12 scale bytes: hipcore/ops/weight_formats.py k_scales
// documents them). No conversion instruction: those run at a quarter of the f16 rate on NVIDIA, and the
// float path's eleven per row and step (four int -> float, seven float -> f16) were a large part of a decode
// batch's instructions, which an issue-bound warp pays for (measured on an H100: docs/benchmarks.md).
// The two sub-blocks' 6-bit scales and mins come out as two bytes each (the low one 2j's), their f16 values
// as 1024 + v from a byte permute minus 1024 (exact); -1024 sc exactly; -(dmin m) is one f16 product,
// rounded once as the float path rounded dmin m (the product of an f16 and a 6-bit integer is exact in f32).
struct KPairScales {
  unsigned int d, sc_lo, sc_hi, off_lo, off_hi, min_lo, min_hi;
};
static __device__ __forceinline__ KPairScales k_pair_scales(const uint4& head, int j) {
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

// v rounded to f16, in both lanes of a pair. Q6_K's scales d * scales[] keep it (three conversions per row
// and step): the byte-permute form of k_pair_scales, the same values, made Q6_K's products 1-3% slower on an
// H100 (the 8B's down 45.1 -> 46.4 us at 32 tokens; docs/benchmarks.md).
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
  unsigned int a = word & 0x0f0f0f0fu, b = (word >> 4) & 0x0f0f0f0fu;
  if (kFiveBit) {
    a |= ((h >> (2 * j)) & 0x01010101u) << 4;
    b |= ((h >> (2 * j + 1)) & 0x01010101u) << 4;
  }
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
  static constexpr int kBlockBytes = kFiveBit ? 176 : 144, kQsOffset = kFiveBit ? 48 : 16;
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
    r.h = kFiveBit ? *reinterpret_cast<const uint4*>(b + 16 + 16 * g) : uint4{0u, 0u, 0u, 0u};
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
  const unsigned int a = (ql & 0x0f0f0f0fu) | (((qh >> (2 * t)) & 0x03030303u) << 4);
  const unsigned int b = ((ql >> 4) & 0x0f0f0f0fu) | (((qh >> (2 * t + 4)) & 0x03030303u) << 4);
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
  static __device__ __forceinline__ unsigned long long row_bytes(int cols) { return (unsigned long long)(cols / 256) * 210; }
  static __device__ __forceinline__ int column(int c0, int col) {
    const int k = c0 >> 6;
    return (k >> 2) * 256 + ((k >> 1) & 1) * 128 + (k & 1) * 32 + (col < 32 ? col : col + 32);
  }
  static __device__ __forceinline__ Raw load(const unsigned char* __restrict__ row, int c0, int g) {
    const int k = c0 >> 6, h = (k >> 1) & 1, t = k & 1;
    const unsigned char* b = row + (k >> 2) * 210;
    Raw r;
    // Both runs start at an even offset from b, so one shift serves the two.
    r.shift = load_aligned_words<4>(b + 64 * h + 32 * t + 16 * g, r.ql);
    load_aligned_words<4>(b + 128 + 32 * h + 16 * g, r.qh);
    r.scale_a = (int)(signed char)b[192 + 8 * h + 2 * t + g];
    r.scale_b = (int)(signed char)b[192 + 8 * h + 2 * t + 4 + g];
    r.d = *reinterpret_cast<const unsigned short*>(b + 208);
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

static __device__ __forceinline__ int lesser_of(int a, int b) { return a < b ? a : b; }

// The tiles of y with TN tokens (32 or 64), computed by one workgroup in turn.
// Step: a step shape (Narrow<F> or Wide<>); ws, xs: shared [kTileRows][kStride] and [TN][kStride] halves.
// The launch's shape and where its results go.
struct Launch {
  float* y;
  const unsigned char* W;
  const float* x;
  unsigned char* workspace;  // counters, then the partial tiles (splits > 1 only)
  int rows, cols, n_tokens, splits, accumulate;
};

// y[t, r] = v, or y[t, r] += v (the residual connection), where the tile's element exists.
static __device__ __forceinline__ void store_result(const Launch& a, int r, int t, float v) {
  if (t < a.n_tokens && r < a.rows) {
    float* out = a.y + (unsigned long long)t * a.rows + r;
    *out = a.accumulate ? *out + v : v;
  }
}

// Split-K: a workgroup's share of a tile (kAcc accumulators per thread, kTileRows x TN in all) is added to
// the others' by the last of the tile's splits to arrive. Each writes its accumulators to the workspace,
// slot k of every thread side by side (coalesced), and counts itself in the tile's counter; the last reads
// its own slots of every split back in split order (the same order whoever arrives last: a replay equals its
// eager twin bit for bit), so no fragment layout is involved, and sets the counter back to zero for the next
// launch. Returns whether this workgroup holds the whole tile in acc (uniform across the workgroup).
template <int kAcc>
__device__ __forceinline__ bool combine_splits(float (&acc)[kAcc], const Launch& a, int tile, int split, int tid, int* last) {
  constexpr unsigned long long kPartFloats = (unsigned long long)kAcc * kThreads;
  const int splits = a.splits;
  int* counters = reinterpret_cast<int*>(a.workspace);
  float* partials = reinterpret_cast<float*>(a.workspace + kCounterBytes);
  float* part = partials + ((unsigned long long)tile * splits + split) * kPartFloats + tid;
#pragma unroll
  for (int e = 0; e < kAcc; ++e) part[e * kThreads] = acc[e];
  // Publish the partial. Every thread fences its own writes (AMD's fence waits for the wave's own stores
  // only), and the counting thread fences again after the barrier, so the count is seen only after every write.
  __threadfence();
  __syncthreads();
  if (tid == 0) {
    __threadfence();
    *last = atomicAdd(counters + tile, 1) == splits - 1;
  }
  __syncthreads();
  if (!*last) return false;  // uniform: every thread read the same flag
  __threadfence();
  const float* mine = partials + (unsigned long long)tile * splits * kPartFloats + tid;
#pragma unroll
  for (int e = 0; e < kAcc; ++e) acc[e] = 0.0f;
  for (int s = 0; s < splits; ++s) {  // in split order
    const float* src = mine + (unsigned long long)s * kPartFloats;
#pragma unroll
    for (int e = 0; e < kAcc; ++e) acc[e] += load_partial(src + e * kThreads);
  }
  if (tid == 0) counters[tile] = 0;  // ready for the next launch
  return true;
}

template <class Step, int TN, int kDepth>
__device__ __forceinline__ void mma_tiles(const Launch& a, unsigned short* ws, unsigned short* xs, int* last) {
  constexpr int kStepCols = Step::kStepCols, kStride = kStepCols + 8;
  constexpr int kTokenTilesPerWarp = TN / 16 / kWarpsAcross;
  constexpr int kWLoads = kTileRows * Step::kGroupsPerRow / kThreads;  // groups of weights per thread
  constexpr int kXLoads = TN * kStepCols / 4 / kThreads;                // float4s of x per thread
  constexpr int kXPerToken = kStepCols / 4;                             // float4s of a token's step
  static_assert(kWLoads * kThreads == kTileRows * Step::kGroupsPerRow, "every thread loads whole groups");
  static_assert(kTokenTilesPerWarp >= 1 && kXLoads >= 1, "tile too small for the warps");
  constexpr int kAccPerThread = kRowTilesPerWarp * kTokenTilesPerWarp * RF_MMA_ACC;
  const float* __restrict__ x = a.x;
  const int rows = a.rows, cols = a.cols, n_tokens = a.n_tokens, splits = a.splits;
  const int tid = (int)threadIdx.x, lane = tid % WARP_SIZE, warp = tid / WARP_SIZE;
  const int warp_row = 32 * (warp % kWarpsDown), warp_token = 16 * kTokenTilesPerWarp * (warp / kWarpsDown);
  const unsigned long long row_bytes = Step::row_bytes(cols);
  const int row_tiles = (rows + kTileRows - 1) / kTileRows;
  const int tiles = row_tiles * ((n_tokens + TN - 1) / TN);
  const int steps = cols / kStepCols;
  const int items = tiles * splits;  // the launcher keeps it < 2^31
  for (int item = (int)blockIdx.x; item < items; item += (int)gridDim.x) {  // uniform across the workgroup
    const int tile = item / splits, split = item - tile * splits;
    const int c_begin = (int)((long long)split * steps / splits) * kStepCols;
    const int c_end = (int)((long long)(split + 1) * steps / splits) * kStepCols;
    const int r0 = (tile % row_tiles) * kTileRows, t0 = (tile / row_tiles) * TN;
    const unsigned char* w_src[kWLoads];
    int w_dst[kWLoads], w_group[kWLoads];
#pragma unroll
    for (int p = 0; p < kWLoads; ++p) {
      const int v = tid + kThreads * p;  // group v: row v / kGroupsPerRow, group v % kGroupsPerRow of it
      const int row = v / Step::kGroupsPerRow;
      w_src[p] = a.W + (unsigned long long)lesser_of(r0 + row, rows - 1) * row_bytes;
      w_group[p] = v % Step::kGroupsPerRow;
      w_dst[p] = row * kStride;
    }
    const float* x_src[kXLoads];
    int x_dst[kXLoads], x_col[kXLoads];
#pragma unroll
    for (int p = 0; p < kXLoads; ++p) {
      const int v = tid + kThreads * p;  // float4 v: token v / kXPerToken, step columns 4 (v % kXPerToken) ..
      const int token = v / kXPerToken;
      x_col[p] = 4 * (v % kXPerToken);
      x_src[p] = x + (unsigned long long)lesser_of(t0 + token, n_tokens - 1) * cols;
      x_dst[p] = token * kStride + x_col[p];
    }

    float acc[kAccPerThread];  // row tile i, token tile j at (i * kTokenTilesPerWarp + j) * RF_MMA_ACC
#pragma unroll
    for (int e = 0; e < kAccPerThread; ++e) acc[e] = 0.0f;

    // The step pipeline: kDepth steps' weights and x in registers, loaded kDepth steps ahead of their use,
    // so that while one step's products run the loads of the next kDepth - 1 are in flight (a decode batch
    // has one token tile and few workgroups per compute unit: the loads' latency, not the products, sets
    // its pace). Steps past the split's end read its last step again and are not used.
    typename Step::Raw raw[kDepth][kWLoads];
    float4 xv[kDepth][kXLoads];
#pragma unroll
    for (int d = 0; d < kDepth; ++d) {
      const int c = lesser_of(c_begin + d * kStepCols, c_end - kStepCols);
#pragma unroll
      for (int p = 0; p < kWLoads; ++p) raw[d][p] = Step::load(w_src[p], c, w_group[p]);
#pragma unroll
      for (int p = 0; p < kXLoads; ++p) {
        // Member by member, as in matmul.hip: a whole-struct copy into the array can land in scratch.
        const float4 v = *reinterpret_cast<const float4*>(x_src[p] + Step::column(c, x_col[p]));
        xv[d][p].x = v.x, xv[d][p].y = v.y, xv[d][p].z = v.z, xv[d][p].w = v.w;
      }
    }

    for (int c_base = c_begin; c_base < c_end; c_base += kDepth * kStepCols) {
#pragma unroll
      for (int d = 0; d < kDepth; ++d) {  // unrolled: raw[d] and xv[d] stay registers
        const int c0 = c_base + d * kStepCols;
        if (c0 >= c_end) break;  // uniform across the workgroup
        __syncthreads();  // every warp is done reading the previous step's tiles
#pragma unroll
        for (int p = 0; p < kWLoads; ++p) Step::store(raw[d][p], c0, w_group[p], ws + w_dst[p]);
#pragma unroll
        for (int p = 0; p < kXLoads; ++p) {
          unsigned int* dst = reinterpret_cast<unsigned int*>(xs + x_dst[p]);
          dst[0] = pack_f16(xv[d][p].x, xv[d][p].y);
          dst[1] = pack_f16(xv[d][p].z, xv[d][p].w);
        }
        __syncthreads();

        const int next = lesser_of(c0 + kDepth * kStepCols, c_end - kStepCols);
#pragma unroll
        for (int p = 0; p < kWLoads; ++p) raw[d][p] = Step::load(w_src[p], next, w_group[p]);
#pragma unroll
        for (int p = 0; p < kXLoads; ++p) {
          const float4 v = *reinterpret_cast<const float4*>(x_src[p] + Step::column(next, x_col[p]));
          xv[d][p].x = v.x, xv[d][p].y = v.y, xv[d][p].z = v.z, xv[d][p].w = v.w;
        }

#pragma unroll
        for (int k0 = 0; k0 < kStepCols; k0 += 16) {
          RfMmaA a[kRowTilesPerWarp];
#pragma unroll
          for (int i = 0; i < kRowTilesPerWarp; ++i) rf_mma_load_a(a[i], ws + (warp_row + 16 * i) * kStride + k0, kStride);
#pragma unroll
          for (int j = 0; j < kTokenTilesPerWarp; ++j) {
            RfMmaB b;
            rf_mma_load_b(b, xs + (warp_token + 16 * j) * kStride + k0, kStride);
#pragma unroll
            for (int i = 0; i < kRowTilesPerWarp; ++i) rf_mma(acc + (i * kTokenTilesPerWarp + j) * RF_MMA_ACC, a[i], b);
          }
        }
      }
    }

    if (splits > 1 && !combine_splits(acc, a, tile, split, tid, last)) continue;  // uniform

#pragma unroll
    for (int i = 0; i < kRowTilesPerWarp; ++i)
#pragma unroll
      for (int j = 0; j < kTokenTilesPerWarp; ++j)
#pragma unroll
        for (int e = 0; e < RF_MMA_ACC; ++e)
          store_result(a, r0 + warp_row + 16 * i + rf_mma_acc_row(lane, e), t0 + warp_token + 16 * j + rf_mma_acc_col(lane, e),
                       acc[(i * kTokenTilesPerWarp + j) * RF_MMA_ACC + e]);
  }
}

#if RF_MMA_KIND == RF_MMA_NV_M16N8K16
// ---- Decode batches on NVIDIA: the weights' fragments decoded in registers -----------------------------
// mma_tiles stages each step's decoded weights in shared memory for the warps' fragment loads: per step of a
// 32-token tile, 16 KB written and 32 KB read back for 4.6 KB of Q4_K weights, two barriers, and the loads
// of the steps ahead in registers the staging holds back. Here each warp owns 16 rows of the tile and all
// its tokens (one 16 x 8 product per token tile and k-substep), and each lane decodes the weights of its
// own A fragments straight from its loads: no shared weight tile at all. The fragments' k order is ours to
// choose as long as x follows it: lane 4 g + t takes bytes 8t .. 8t + 7 of a row's 32 code bytes of the
// step (rows g and g + 8), whose low nibbles are columns 8t .. 8t + 7 of the step's first half and high
// nibbles the same of its second; k-substep s (0 .. 3) gives the lane's k positions 2t, 2t + 1, 2t + 8,
// 2t + 9 to columns 8t + 4 (s % 2) + 0 .. 3 of half s / 2 (frag_column). x follows in one of two ways:
// - 32-token tiles stage x per step in shared memory in that order (stream_x_position), rounded to f16
//   once, so a lane's B fragment of a token is one 8-byte load; two barriers a step.
// - 8-token tiles (a batch of at most 8) read x straight from memory: the lane's four columns are adjacent
//   in x too, so its B fragment is one 16-byte load rounded to f16 in registers, and the eight warps of a
//   workgroup share it through the cache. No shared memory and no barrier in the loop: each warp runs at
//   its own pace. Measured on an H100 against the staged entry (docs/benchmarks.md), 8 tokens: gate/up 41.1
//   -> 31.0 us, q/o 16.5 -> 12.2; Q6_K gains only over short splits (v 11.4 -> 9.1, but the 8B's down 45.5
//   -> 51.1: hipcore/ops/matmul_mma.py DIRECT_Q6K_MAX_SPLIT_STEPS); at 32 tokens every warp rounding every
//   x value cost more than the barriers (gate/up 108 us against 42).
// Q4_K, Q5_K and Q6_K (Llama's K-quant layers); the other formats and prompt tiles keep mma_tiles.
constexpr int kStreamTokens = 32;
constexpr int kStreamStride = 80;  // halves per token of the x tile: a half-warp's 8-byte loads hit 32 banks
constexpr int kDirectTokens = 8;

// The step column of lane t's four weights (and x values) in k-substep s: 32 (s / 2) + 8 t + 4 (s % 2).
static __device__ __forceinline__ int frag_column(int s, int t) { return 32 * (s >> 1) + 8 * t + 4 * (s & 1); }

// Where tile column col (0 .. 63) of a step sits in a token's row of the staged x tile: k-substep s, lane
// t, position i at 16 s + 4 t + i (the inverse of frag_column).
static __device__ __forceinline__ int stream_x_position(int col) {
  const int half = col >> 5, c = col & 31;
  return 16 * (2 * half + ((c >> 2) & 1)) + 4 * (c >> 3) + (c & 3);
}

// Q4_K / Q5_K: a lane's 8 code bytes of the step's chunk j (and Q5_K's 8 matching bytes of fifth bits),
// with the super-block's 16 header bytes.
template <bool kFiveBit>
struct WideFragments {
  typedef Wide<kFiveBit> Step;
  static constexpr int kDepth = kFiveBit ? 2 : 3;  // steps of loads in flight per lane, within 128 registers
  struct Raw {
    uint4 head;
    uint2 q, h;
  };
  static __device__ __forceinline__ Raw load(const unsigned char* __restrict__ row, int c0, int t) {
    const unsigned char* b = row + (c0 >> 8) * Step::kBlockBytes;
    const int j = (c0 & 255) >> 6;
    Raw r;
    r.head = *reinterpret_cast<const uint4*>(b);
    r.q = *reinterpret_cast<const uint2*>(b + Step::kQsOffset + 32 * j + 8 * t);
    r.h = kFiveBit ? *reinterpret_cast<const uint2*>(b + 16 + 8 * t) : uint2{0u, 0u};
    return r;
  }
  // pairs[2 s + e]: pair e of k-substep s (code bytes 0..3 feed substeps 0 and 2, bytes 4..7 1 and 3).
  static __device__ __forceinline__ void decode(const Raw& r, int c0, unsigned int pairs[8]) {
    const int j = (c0 & 255) >> 6;
    const KPairScales k = k_pair_scales(r.head, j);
    decode_k_word<kFiveBit>(r.q.x, r.h.x, j, k, pairs + 0, pairs + 4);
    decode_k_word<kFiveBit>(r.q.y, r.h.y, j, k, pairs + 2, pairs + 6);
  }
};

// Q6_K: a lane's 8 bytes of ql and of qh (l = 8t .. 8t + 7 of both runs), the two runs' scales, d.
struct Wide6Fragments {
  typedef Wide6 Step;
  static constexpr int kDepth = 2;
  struct Raw {
    unsigned int ql[3], qh[3];
    int scale_a, scale_b, shift;
    unsigned short d;
  };
  static __device__ __forceinline__ Raw load(const unsigned char* __restrict__ row, int c0, int t) {
    const int k = c0 >> 6, h = (k >> 1) & 1, u = k & 1;
    const unsigned char* b = row + (k >> 2) * 210;
    Raw r;
    r.shift = load_aligned_words<2>(b + 64 * h + 32 * u + 8 * t, r.ql);  // both at even offsets: one shift
    load_aligned_words<2>(b + 128 + 32 * h + 8 * t, r.qh);
    r.scale_a = (int)(signed char)b[192 + 8 * h + 2 * u + (t >> 1)];  // scales of 16 elements: l / 16
    r.scale_b = (int)(signed char)b[192 + 8 * h + 2 * u + 4 + (t >> 1)];
    r.d = *reinterpret_cast<const unsigned short*>(b + 208);
    return r;
  }
  static __device__ __forceinline__ void decode(const Raw& r, int c0, unsigned int pairs[8]) {
    const int u = (c0 >> 6) & 1;
    const float d = rf_f16_to_float(r.d);
    const unsigned int scale_a = f16_pair(d * (float)r.scale_a), scale_b = f16_pair(d * (float)r.scale_b);
    unsigned int ql[2], qh[2];
    shift_words<2>(r.ql, r.shift, ql);
    shift_words<2>(r.qh, r.shift, qh);
    decode_q6_word(ql[0], qh[0], u, scale_a, scale_b, pairs + 0, pairs + 4);
    decode_q6_word(ql[1], qh[1], u, scale_a, scale_b, pairs + 2, pairs + 6);
  }
};

// The fragment format of a step shape (the K-quants only).
template <class Step>
struct Fragments;
template <>
struct Fragments<Wide<false>> {
  typedef WideFragments<false> Format;
};
template <>
struct Fragments<Wide<true>> {
  typedef WideFragments<true> Format;
};
template <>
struct Fragments<Wide6> {
  typedef Wide6Fragments Format;
};

// The tiles of 128 rows x TN tokens (kStreamTokens: x staged; kDirectTokens: x from memory) with the
// weights' fragments from registers (see above); the same items, split ranges, workspace and results as
// mma_tiles<Step, 32, ...> (a direct tile's partials are a quarter of the workspace slot's size).
template <class F, int TN>
__device__ __forceinline__ void fragment_tiles(const Launch& a, unsigned short* xs, int* last) {
  typedef typename F::Step Step;
  constexpr bool kStaged = TN != kDirectTokens;
  constexpr int kStepCols = Step::kStepCols, kDepth = F::kDepth;
  constexpr int kXLoads = kStaged ? TN * kStepCols / 4 / kThreads : 1;  // float4s of staged x per thread
  constexpr int kXPerToken = kStepCols / 4;
  constexpr int kTokenTiles = TN / 8;  // 16 x 8 products per k-substep
  constexpr int kAcc = kTokenTiles * 4;
  static_assert(kWarps * 16 == kTileRows && kXLoads >= 1, "eight warps of 16 rows");
  static_assert(TN == kStreamTokens || TN == kDirectTokens, "the two tile shapes");
  const float* __restrict__ x = a.x;
  const int rows = a.rows, cols = a.cols, n_tokens = a.n_tokens, splits = a.splits;
  const int tid = (int)threadIdx.x, lane = tid % WARP_SIZE, warp = tid / WARP_SIZE, g = lane >> 2, t = lane & 3;
  const unsigned long long row_bytes = Step::row_bytes(cols);
  const int row_tiles = (rows + kTileRows - 1) / kTileRows;
  const int tiles = row_tiles * ((n_tokens + TN - 1) / TN);
  const int steps = cols / kStepCols;
  const int items = tiles * splits;

  for (int item = (int)blockIdx.x; item < items; item += (int)gridDim.x) {  // uniform across the workgroup
    const int tile = item / splits, split = item - tile * splits;
    const int c_begin = (int)((long long)split * steps / splits) * kStepCols;
    const int c_end = (int)((long long)(split + 1) * steps / splits) * kStepCols;
    const int r0 = (tile % row_tiles) * kTileRows, t0 = (tile / row_tiles) * TN;
    const unsigned char* w_src[2];  // rows g and g + 8 of the warp's 16
#pragma unroll
    for (int e = 0; e < 2; ++e) w_src[e] = a.W + (unsigned long long)lesser_of(r0 + 16 * warp + g + 8 * e, rows - 1) * row_bytes;
    // Staged: float4 p of this thread is token v / kXPerToken, step columns 4 (v % kXPerToken) .. (v = tid +
    // kThreads p). Direct: token g of the tile (the last token where past the batch).
    const float* x_src[kXLoads];
    int x_dst[kXLoads], x_col[kXLoads];
#pragma unroll
    for (int p = 0; p < kXLoads; ++p) {
      const int v = tid + kThreads * p;
      const int token = kStaged ? v / kXPerToken : g;
      x_col[p] = 4 * (v % kXPerToken);
      x_src[p] = x + (unsigned long long)lesser_of(t0 + token, n_tokens - 1) * cols;
      x_dst[p] = token * kStreamStride + stream_x_position(x_col[p]);
    }

    float acc[kAcc];  // token tile j's c0 .. c3 at 4 j
#pragma unroll
    for (int e = 0; e < kAcc; ++e) acc[e] = 0.0f;

    // kDepth steps of weights (and of staged x) in registers, loaded kDepth steps ahead of their use.
    typename F::Raw raw[kDepth][2];
    float4 xv[kStaged ? kDepth : 1][kXLoads];
#pragma unroll
    for (int d = 0; d < kDepth; ++d) {
      const int c = lesser_of(c_begin + d * kStepCols, c_end - kStepCols);
#pragma unroll
      for (int e = 0; e < 2; ++e) raw[d][e] = F::load(w_src[e], c, t);
      if constexpr (kStaged) {
#pragma unroll
        for (int p = 0; p < kXLoads; ++p) xv[d][p] = *reinterpret_cast<const float4*>(x_src[p] + Step::column(c, x_col[p]));
      }
    }

    for (int c_base = c_begin; c_base < c_end; c_base += kDepth * kStepCols) {
#pragma unroll
      for (int d = 0; d < kDepth; ++d) {  // unrolled: raw[d] and xv[d] stay registers
        const int c0 = c_base + d * kStepCols;
        if (c0 >= c_end) break;  // uniform across the workgroup
        if constexpr (kStaged) {
          __syncthreads();  // every warp is done reading the previous step's x
#pragma unroll
          for (int p = 0; p < kXLoads; ++p) {
            unsigned int* dst = reinterpret_cast<unsigned int*>(xs + x_dst[p]);
            dst[0] = pack_f16(xv[d][p].x, xv[d][p].y);
            dst[1] = pack_f16(xv[d][p].z, xv[d][p].w);
          }
        }
        float4 xd[4];  // direct: the lane's x of each k-substep, loaded before the decode hides its latency
        if constexpr (!kStaged) {
#pragma unroll
          for (int s = 0; s < 4; ++s) xd[s] = *reinterpret_cast<const float4*>(x_src[0] + Step::column(c0, frag_column(s, t)));
        }
        unsigned int pairs[2][8];  // rows g, g + 8
#pragma unroll
        for (int e = 0; e < 2; ++e) F::decode(raw[d][e], c0, pairs[e]);
        if constexpr (kStaged) __syncthreads();

        const int next = lesser_of(c0 + kDepth * kStepCols, c_end - kStepCols);
#pragma unroll
        for (int e = 0; e < 2; ++e) raw[d][e] = F::load(w_src[e], next, t);
        if constexpr (kStaged) {
#pragma unroll
          for (int p = 0; p < kXLoads; ++p) xv[d][p] = *reinterpret_cast<const float4*>(x_src[p] + Step::column(next, x_col[p]));
        }

#pragma unroll
        for (int s = 0; s < 4; ++s) {
          const unsigned int fa[4] = {pairs[0][2 * s], pairs[1][2 * s], pairs[0][2 * s + 1], pairs[1][2 * s + 1]};
          if constexpr (kStaged) {
#pragma unroll
            for (int j = 0; j < kTokenTiles; ++j) {
              const unsigned int* src = reinterpret_cast<const unsigned int*>(xs + (8 * j + g) * kStreamStride + 16 * s + 4 * t);
              const unsigned int fb[2] = {src[0], src[1]};
              rf_mma_m16n8k16_f16(acc + 4 * j, fa, fb);
            }
          } else {
            const unsigned int fb[2] = {pack_f16(xd[s].x, xd[s].y), pack_f16(xd[s].z, xd[s].w)};
            rf_mma_m16n8k16_f16(acc, fa, fb);
          }
        }
      }
    }

    if (splits > 1 && !combine_splits(acc, a, tile, split, tid, last)) continue;  // uniform

    // c0, c1: row g, tokens 2t, 2t + 1 of token tile j; c2, c3: row g + 8.
#pragma unroll
    for (int j = 0; j < kTokenTiles; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e)
        store_result(a, r0 + 16 * warp + g + 8 * (e >> 1), t0 + 8 * j + 2 * t + (e & 1), acc[4 * j + e]);
  }
}
#endif

// The steps in flight of mma_tiles' 32-token tiles. On NVIDIA, Q6_K's decode batches take the fragment
// path (hipcore/ops/matmul_mma.py entry_name): its shared-tile 32-token tiles run only when named (path
// "shared", a measurement baseline), and with two steps in flight nvcc spilled 8 bytes of the whole kernel,
// its prompt tiles too, on sm_90; one step keeps the kernel in registers.
template <class Step>
struct DepthTile32 {
  static constexpr int value = kDepthTile32;
};
#if RF_MMA_KIND == RF_MMA_NV_M16N8K16
template <>
struct DepthTile32<Wide6> {
  static constexpr int value = 1;
};
#endif

template <class Step>
__device__ __forceinline__ void matmul_mma(const Launch& a, int tile_tokens, unsigned short* ws, unsigned short* xs,
                                           int* last) {
  rf_check_wave_size();
  if (tile_tokens == 32)  // uniform: a kernel argument
    mma_tiles<Step, 32, DepthTile32<Step>::value>(a, ws, xs, last);
  else
    mma_tiles<Step, 64, kDepthTile64>(a, ws, xs, last);
}

}  // namespace mmq
}  // namespace

// One entry point per format: matmul_mma_<format>(y, W, x, workspace, rows, cols, n_tokens, tile_tokens,
// splits, accumulate); blockDim 256.
#define RF_MATMUL_MMA_ENTRY(name, Step)                                                                           \
  extern "C" __global__ __launch_bounds__(256) void name(float* __restrict__ y, const void* __restrict__ W,         \
                                                         const float* __restrict__ x, void* workspace, int rows,    \
                                                         int cols, int n_tokens, int tile_tokens, int splits,       \
                                                         int accumulate) {                                         \
    __shared__ __attribute__((aligned(16))) unsigned short ws[mmq::kTileRows * mmq::kMaxStride];                 \
    __shared__ __attribute__((aligned(16))) unsigned short xs[mmq::kMaxTileTokens * mmq::kMaxStride];            \
    __shared__ int last;                                                                                          \
    const mmq::Launch a = {y, static_cast<const unsigned char*>(W), x, static_cast<unsigned char*>(workspace),     \
                           rows, cols, n_tokens, splits, accumulate};                                             \
    mmq::matmul_mma<Step>(a, tile_tokens, ws, xs, &last);                                                   \
  }

RF_MATMUL_MMA_ENTRY(matmul_mma_q4_0, mmq::Narrow<mmq::Q4_0>)
RF_MATMUL_MMA_ENTRY(matmul_mma_q4_1, mmq::Narrow<mmq::Q4_1>)
RF_MATMUL_MMA_ENTRY(matmul_mma_q5_0, mmq::Narrow<mmq::Q5_0>)
RF_MATMUL_MMA_ENTRY(matmul_mma_q5_1, mmq::Narrow<mmq::Q5_1>)
RF_MATMUL_MMA_ENTRY(matmul_mma_q8_0, mmq::Narrow<mmq::Q8_0>)
RF_MATMUL_MMA_ENTRY(matmul_mma_q4_k, mmq::Wide<false>)
RF_MATMUL_MMA_ENTRY(matmul_mma_q5_k, mmq::Wide<true>)
RF_MATMUL_MMA_ENTRY(matmul_mma_q6_k, mmq::Wide6)

#if RF_MMA_KIND == RF_MMA_NV_M16N8K16
// The decode batches' fragment path (NVIDIA, K-quants): matmul_mma_fragments_<format> (32-token tiles, x
// staged) and matmul_mma_direct_<format> (a batch of at most 8 tokens, x from memory), the same arguments;
// tile_tokens is the launcher's 32 for both (hipcore/ops/matmul_mma.py entry_name picks). Entries of their
// own, so that their registers are counted apart from the shared-tile path's. BOUNDS: their launch bounds;
// Q5_K's direct entry says two workgroups per SM, without which nvcc held it to 80 registers and spilled 8-16
// bytes (the others keep the bounds they were measured with).
#define RF_MATMUL_MMA_FRAGMENT_ENTRY(name, Step, TN, kXsHalves, BOUNDS)                                          \
  extern "C" __global__ BOUNDS void name(float* __restrict__ y, const void* __restrict__ W,                       \
                                                         const float* __restrict__ x, void* workspace, int rows,    \
                                                         int cols, int n_tokens, int tile_tokens, int splits,       \
                                                         int accumulate) {                                         \
    __shared__ __attribute__((aligned(16))) unsigned short xs[kXsHalves];                                         \
    __shared__ int last;                                                                                          \
    const mmq::Launch a = {y, static_cast<const unsigned char*>(W), x, static_cast<unsigned char*>(workspace),     \
                           rows, cols, n_tokens, splits, accumulate};                                             \
    (void)tile_tokens;                                                                                            \
    mmq::fragment_tiles<typename mmq::Fragments<Step>::Format, TN>(a, xs, &last);                                \
  }

#define RF_STAGED_X (mmq::kStreamTokens * mmq::kStreamStride)
#define RF_BOUNDS __launch_bounds__(256)
#define RF_BOUNDS_TWO_PER_SM __launch_bounds__(256, 2)
RF_MATMUL_MMA_FRAGMENT_ENTRY(matmul_mma_fragments_q4_k, mmq::Wide<false>, mmq::kStreamTokens, RF_STAGED_X, RF_BOUNDS)
RF_MATMUL_MMA_FRAGMENT_ENTRY(matmul_mma_fragments_q5_k, mmq::Wide<true>, mmq::kStreamTokens, RF_STAGED_X, RF_BOUNDS)
RF_MATMUL_MMA_FRAGMENT_ENTRY(matmul_mma_fragments_q6_k, mmq::Wide6, mmq::kStreamTokens, RF_STAGED_X, RF_BOUNDS)
RF_MATMUL_MMA_FRAGMENT_ENTRY(matmul_mma_direct_q4_k, mmq::Wide<false>, mmq::kDirectTokens, 8, RF_BOUNDS)
RF_MATMUL_MMA_FRAGMENT_ENTRY(matmul_mma_direct_q5_k, mmq::Wide<true>, mmq::kDirectTokens, 8, RF_BOUNDS_TWO_PER_SM)
RF_MATMUL_MMA_FRAGMENT_ENTRY(matmul_mma_direct_q6_k, mmq::Wide6, mmq::kDirectTokens, 8, RF_BOUNDS)
#endif
