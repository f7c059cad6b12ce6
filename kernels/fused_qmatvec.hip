// The decode products of a llama layer on int8-quantized activations (qmatvec.hip's formats and dot
// products) with the layer's small ops folded in, for weights that cannot share one buffer: q, k and v
// (or gate and up) each come as their own matrix, each of its own type. A Q4_K_M file has attn_q and
// attn_k in Q4_K but attn_v in Q6_K, so the concatenated W of fused_matvec.hip does not exist there.
//
//   qmatvec_norm_rope(q, k, v, Wq, Wk, Wv, x, g, positions, freq_factors, types, q_rows, kv_rows, cols, batch,
//                     head_dim, rope_dim, eps, theta, freq_scale)
//       q = rope(n @ Wq^T), k = rope(n @ Wk^T), v = n @ Wv^T,  n = rmsnorm(x) * g; freq_factors: rope_dim / 2
//       per-pair divisors of the frequency (rope.hip), or null
//   qmatvec_norm_swiglu(y, Wg, Wu, x, g, types, rows, cols, batch, eps)
//       y = silu(n @ Wg^T) * (n @ Wu^T)
//   qmatvec_add(y, W, x, type, rows, cols, batch, k_split)   y += x @ W^T (the residual connection)
//   qmatvec_norm(y, W, x, g, type, rows, cols, batch, eps)   y = n @ W^T (the output head)
//
// `types` packs one type code per matrix, 4 bits each (q | k << 4 | v << 8; gate | up << 4); the codes
// are WeightType's. The type is a branch per row group, uniform across the warp. k_split (qmatvec_add at
// one token): the warps that share a row group's columns, 1, 2 or 4 (anything else counts as 1; see tile_dot).
//
// The norm: rmsnorm(x) * g = s * (x * g) with s = 1 / sqrt(mean(x^2) + eps) a scalar per token, so the
// products run on x * g, quantized per slice as qmatvec quantizes x, and s scales the sums. A lane's
// slices cover x once per row group, so the squares summed beside the quantization give mean(x^2) after
// one warp reduction: no separate pass, no shared memory, no barrier.
//
// Work: a warp takes four rows of one matrix at a time in decoding (two at 2..4 tokens, which keeps a
// RoPE pair in one warp), loads of all of them in flight before the first is used, as qmatvec does.
// q, k and v rows form one sequence of row groups over the three matrices; gate and up rows go in pairs
// (the warp walks four gate rows, then the same four up rows, and multiplies them). Batches of more
// than 4 tokens take further passes over W.
// Requirements the launcher checks: cols % 256 == 0 for the K-quants, % 32 otherwise; q_rows and kv_rows
// multiples of 4 (head_dim % 4 == 0); W of each type aligned as qmatvec.hip needs; x and g 16-byte aligned.
#define RF_QMATVEC_NO_ENTRIES
#include "qmatvec.hip"

namespace {
namespace fq {

using q8::XSlice;

enum WeightType { kQ4_K = 0, kQ5_K = 1, kQ6_K = 2, kQ8_0 = 3, kQ4_0 = 4 };

constexpr int kMaxBatchPerPass = 8;  // a decode step's tokens (FUSED_QMATVEC_MAX_TOKENS): one pass over W

// g over a slice's columns (run a in gv[0..3], run b in gv[4..7]): loaded once for every token of a pass.
static __device__ __forceinline__ void load_slice(const float* __restrict__ p, int col_a, int col_b, float4 v[8]) {
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    v[k] = *reinterpret_cast<const float4*>(p + col_a + 4 * k);
    v[4 + k] = *reinterpret_cast<const float4*>(p + col_b + 4 * k);
  }
}

// The slice of x (times g, given as gv, when normalizing) quantized, and ss += x^2 over the slice's columns.
template <bool NORM>
static __device__ __forceinline__ XSlice quantize_xg(const float* __restrict__ x, const float4 gv[8], int col_a,
                                                     int col_b, float& ss) {
  float4 v[8];
  load_slice(x, col_a, col_b, v);
  if (NORM) {
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      const float4 gk = gv[k];
      ss = fmaf(v[k].x, v[k].x, ss);
      ss = fmaf(v[k].y, v[k].y, ss);
      ss = fmaf(v[k].z, v[k].z, ss);
      ss = fmaf(v[k].w, v[k].w, ss);
      v[k] = {v[k].x * gk.x, v[k].y * gk.y, v[k].z * gk.z, v[k].w * gk.w};
    }
  }
  return q8::quantize_values(v);
}

// x (times g when normalizing) quantized once per workgroup, for one chunk of slices and every token of a
// pass, in shared memory: each warp then reads the codes of its slices (40 bytes a slice and token) instead
// of re-reading and re-quantizing 32 floats of x (and of g) per slice and token, which cost more traffic
// and instructions than the weights themselves. Run a's and run b's codes lie in separate arrays, so that
// the lanes' 16-byte loads fall on consecutive 16-byte words (no bank conflicts).
constexpr int kBlockThreads = 256;                   // the entries' launch bounds; the launcher's block
constexpr int kMaxWarps = kBlockThreads / 32;
constexpr int kStageSliceTokens = 512;               // 20 KiB: a chunk is 512 / NB slices of NB tokens
constexpr int kMaxPartials = 4;                      // M * ROWS * NB of a split tile_dot (the residual's, one token)
struct Stage {
  uint4 codes_a[kStageSliceTokens], codes_b[kStageSliceTokens];
  float d[kStageSliceTokens];
  int sums[kStageSliceTokens];                       // sum_a in the low 16 bits, sum_b in the high (|sum| <= 2032)
  float ss[kMaxWarps][kMaxBatchPerPass];             // each warp's sums of x^2, per token
  float partial[kMaxWarps][kMaxPartials];            // a split row group's sums, per warp (tile_dot, KS > 1)
  // What the codes hold when x fits one chunk (a whole staging): the x, type code and tokens they were
  // staged from, and the block's sums of x^2 per token. A workgroup that takes several tiles of one matrix
  // (or of matrices of one type) stages x once: the staging is a barrier-bound phase with no weight
  // loads in flight, and it re-read x and g from L2 for every tile. Reset by every entry (reset_key).
  const float* key_x;
  int key_type, key_tokens;
  float ss_total[kMaxBatchPerPass];
};

static __device__ __forceinline__ void reset_key(Stage& st) {
  if (threadIdx.x == 0) st.key_x = nullptr;  // read only after tile_dot's first barrier
}

// Slices c0 .. c0 + n - 1 of the NB tokens quantized into st (slice i of token b at b * chunk + i) by the
// threads of the block together; ss[b] += x[b]^2 over the columns this thread quantized. Tokens past
// `tokens` repeat the last one (a pass of NB tokens carries fewer; their results are not written).
template <class Format, int NB, bool NORM>
__device__ __forceinline__ void stage_chunk(Stage& st, const float* __restrict__ x, const float* __restrict__ g, int cols,
                                            int tokens, int c0, int n, float ss[NB]) {
  constexpr int chunk = kStageSliceTokens / NB;
  for (int i = (int)threadIdx.x; i < n; i += (int)blockDim.x) {
    int col_a, col_b;
    Format::columns(c0 + i, col_a, col_b);
    // g once for the slice, not once per token: in a batched pass the staging's reads of x and g from L2
    // rival the weights' own traffic (every workgroup stages the whole of x).
    float4 gv[8];
    if (NORM) load_slice(g, col_a, col_b, gv);
#pragma unroll
    for (int b = 0; b < NB; ++b) {
      const int t = b < tokens ? b : tokens - 1;
      const XSlice s = quantize_xg<NORM>(x + (unsigned long long)t * cols, gv, col_a, col_b, ss[b]);
      const int j = b * chunk + i;
      uint4 a, c;
      a.x = (unsigned int)s.xq[0], a.y = (unsigned int)s.xq[1], a.z = (unsigned int)s.xq[2], a.w = (unsigned int)s.xq[3];
      c.x = (unsigned int)s.xq[4], c.y = (unsigned int)s.xq[5], c.z = (unsigned int)s.xq[6], c.w = (unsigned int)s.xq[7];
      st.codes_a[j] = a;
      st.codes_b[j] = c;
      st.d[j] = s.d;
      st.sums[j] = (int)(((unsigned int)s.sum_a & 0xffffu) | ((unsigned int)s.sum_b << 16));
    }
  }
}

static __device__ __forceinline__ XSlice staged_slice(const Stage& st, int j) {
  const uint4 a = st.codes_a[j], c = st.codes_b[j];
  XSlice s;
  s.xq[0] = (int)a.x, s.xq[1] = (int)a.y, s.xq[2] = (int)a.z, s.xq[3] = (int)a.w;
  s.xq[4] = (int)c.x, s.xq[5] = (int)c.y, s.xq[6] = (int)c.z, s.xq[7] = (int)c.w;
  s.d = st.d[j];
  const int sums = st.sums[j];
  s.sum_a = (int)(signed short)(unsigned short)(sums & 0xffff);
  s.sum_b = sums >> 16;  // arithmetic: the high half's sign
  return s;
}

// out[m][r][b] = row r0 + r of matrix W[m] times quantized (x * g)[b], in every lane of the warp; ss[b] =
// sum of x[b]^2 over the row (when NORM), in every thread. Every thread of the block calls it (barriers):
// the block stages x chunk by chunk, then each warp walks its ROWS rows of each of the M matrices (all of
// one format) over the chunk's slices, their loads in flight together. A warp whose rows start past
// `rows` stages with the others and reads no weights; rows past `rows` read the last row again (their
// results are not to be written).
// Split (KS > 1): the KS warps of a row group (adjacent warps, `part` 0 .. KS - 1) share its rows, each
// taking every KS-th run of 32 slices, and their sums meet in shared memory, added in part order (the same
// result every run); part 0's warp holds them. A product of few rows (an 8B's o and down: 128 tiles of 32
// rows for 132 SMs) otherwise leaves too few loads in flight per SM to cover DRAM latency. KS is a template
// argument: with a run-time stride the unsplit products lost ~15% (measured on an H100, gate|up).
template <class Format, int NB, int ROWS, int M, bool NORM, int KS = 1>
__device__ __forceinline__ void tile_dot(Stage& st, int type, const unsigned char* const W[M], int rows, int r0,
                                         const float* __restrict__ x, const float* __restrict__ g, int cols, int tokens,
                                         float out[M][ROWS][NB], float ss[NB], int part = 0) {
  constexpr int chunk = kStageSliceTokens / NB;
  const int lane = (int)threadIdx.x % WARP_SIZE;
  const int slices = cols / 32;
  const unsigned long long row_bytes = Format::row_bytes(cols);
  const bool reads = r0 < rows;  // uniform across the warp
  const unsigned char* w[M][ROWS];
#pragma unroll
  for (int m = 0; m < M; ++m)
#pragma unroll
    for (int r = 0; r < ROWS; ++r) w[m][r] = W[m] + (unsigned long long)(r0 + r < rows ? r0 + r : rows - 1) * row_bytes;
  float acc[M][ROWS][NB], sq[NB];
#pragma unroll
  for (int b = 0; b < NB; ++b) {
    sq[b] = 0.0f;
#pragma unroll
    for (int m = 0; m < M; ++m)
#pragma unroll
      for (int r = 0; r < ROWS; ++r) acc[m][r][b] = 0.0f;
  }
  const bool whole = slices <= chunk;  // uniform: x in one staging, kept while the key holds
  for (int c0 = 0; c0 < slices; c0 += chunk) {
    const int n = slices - c0 < chunk ? slices - c0 : chunk;
    __syncthreads();  // every warp is done with the previous chunk; the key was written before a barrier
    // Uniform: every thread reads the same key. One staging site, so that the kernel's code does not grow
    // by a second inlined copy of it.
    if (!(whole && st.key_x == x && st.key_type == type && st.key_tokens == tokens)) {
      stage_chunk<Format, NB, NORM>(st, x, g, cols, tokens, c0, n, sq);
      if (NORM && whole) {  // the block's sums of squares, kept with the codes
#pragma unroll
        for (int b = 0; b < NB; ++b) {
          const float s = rf_warp_sum(sq[b]);
          if (lane == 0) st.ss[(int)threadIdx.x / WARP_SIZE][b] = s;
        }
      }
      __syncthreads();
      if (threadIdx.x == 0) {  // every thread read the old key before the barrier above
        if (NORM && whole) {
          const int warps = (int)blockDim.x / WARP_SIZE;
#pragma unroll
          for (int b = 0; b < NB; ++b) {
            float t = 0.0f;
            for (int k = 0; k < warps; ++k) t += st.ss[k][b];
            st.ss_total[b] = t;
          }
        }
        st.key_x = whole ? x : nullptr, st.key_type = type, st.key_tokens = tokens;
      }
    }
    __syncthreads();
    if (!reads) continue;
    for (int i = lane + part * WARP_SIZE; i < n; i += WARP_SIZE * KS) {
      typename Format::Raw raw[M][ROWS];
#pragma unroll
      for (int m = 0; m < M; ++m)
#pragma unroll
        for (int r = 0; r < ROWS; ++r) raw[m][r] = Format::load(w[m][r], c0 + i);
      // Decoded once (the scale bits, the nibbles: most of a slice's work), applied to every token.
      typename Format::Decoded dec[M][ROWS];
#pragma unroll
      for (int m = 0; m < M; ++m)
#pragma unroll
        for (int r = 0; r < ROWS; ++r) dec[m][r] = Format::decode(raw[m][r], c0 + i);
#pragma unroll
      for (int b = 0; b < NB; ++b) {
        const XSlice xs = staged_slice(st, b * chunk + i);
#pragma unroll
        for (int m = 0; m < M; ++m)
#pragma unroll
          for (int r = 0; r < ROWS; ++r) acc[m][r][b] = fmaf(xs.d, Format::apply(dec[m][r], xs), acc[m][r][b]);
      }
    }
  }
#pragma unroll
  for (int b = 0; b < NB; ++b)
#pragma unroll
    for (int m = 0; m < M; ++m)
#pragma unroll
      for (int r = 0; r < ROWS; ++r) out[m][r][b] = rf_warp_sum(acc[m][r][b]);
  if constexpr (KS > 1) {  // every thread passes the barrier; part 0's warp adds its group's sums
    static_assert(M * ROWS * NB <= kMaxPartials, "Stage::partial holds a warp's sums");
    const int warp = (int)threadIdx.x / WARP_SIZE;
    if (lane == 0) {
#pragma unroll
      for (int b = 0; b < NB; ++b)
#pragma unroll
        for (int m = 0; m < M; ++m)
#pragma unroll
          for (int r = 0; r < ROWS; ++r) st.partial[warp][(b * M + m) * ROWS + r] = out[m][r][b];
    }
    __syncthreads();  // the next writes to partial come after the next tile's first barrier
    if (part == 0) {
#pragma unroll
      for (int b = 0; b < NB; ++b)
#pragma unroll
        for (int m = 0; m < M; ++m)
#pragma unroll
          for (int r = 0; r < ROWS; ++r) {
            float sum = out[m][r][b];
#pragma unroll
            for (int p = 1; p < KS; ++p) sum += st.partial[warp + p][(b * M + m) * ROWS + r];
            out[m][r][b] = sum;
          }
    }
  }
  if (NORM && whole) {
#pragma unroll
    for (int b = 0; b < NB; ++b) ss[b] = st.ss_total[b];  // written before the staging's last barrier
  } else if (NORM) {  // the block's sums of squares: each thread's, over its warp, then over the warps
    const int warp = (int)threadIdx.x / WARP_SIZE, warps = (int)blockDim.x / WARP_SIZE;
#pragma unroll
    for (int b = 0; b < NB; ++b) {
      const float s = rf_warp_sum(sq[b]);
      if (lane == 0) st.ss[warp][b] = s;
    }
    __syncthreads();
#pragma unroll
    for (int b = 0; b < NB; ++b) {
      float t = 0.0f;
      for (int k = 0; k < warps; ++k) t += st.ss[k][b];
      ss[b] = t;
    }
  }
}

// tile_dot for matrices whose format is known only at run time (uniform across the block).
template <int NB, int ROWS, int M, bool NORM, int KS = 1>
__device__ __forceinline__ void typed_tile_dot(int type, Stage& st, const unsigned char* const W[M], int rows, int r0,
                                               const float* x, const float* g, int cols, int tokens,
                                               float out[M][ROWS][NB], float ss[NB], int part = 0) {
  switch (type) {
    case kQ4_K: tile_dot<q8::Q4_KFormat, NB, ROWS, M, NORM, KS>(st, type, W, rows, r0, x, g, cols, tokens, out, ss, part); break;
    case kQ5_K: tile_dot<q8::Q5_KFormat, NB, ROWS, M, NORM, KS>(st, type, W, rows, r0, x, g, cols, tokens, out, ss, part); break;
    case kQ6_K: tile_dot<q8::Q6_KFormat, NB, ROWS, M, NORM, KS>(st, type, W, rows, r0, x, g, cols, tokens, out, ss, part); break;
    case kQ8_0: tile_dot<q8::Q8_0Format, NB, ROWS, M, NORM, KS>(st, type, W, rows, r0, x, g, cols, tokens, out, ss, part); break;
    default: tile_dot<q8::Q4_0Format, NB, ROWS, M, NORM, KS>(st, type, W, rows, r0, x, g, cols, tokens, out, ss, part); break;
  }
}

// The block's tiles: a tile is ROWS rows per row group of one matrix, warps / KS * ROWS rows in all; a row
// group is KS adjacent warps (tile_dot), `group` its index in the block and `part` the warp's in the group.
struct Tiles {
  int warp, lane, tile_rows, group, part;
  template <int ROWS, int KS = 1>
  static __device__ __forceinline__ Tiles of() {
    const int warp = (int)threadIdx.x / WARP_SIZE;
    return {warp, (int)threadIdx.x % WARP_SIZE, (int)blockDim.x / WARP_SIZE / KS * ROWS, warp / KS, warp % KS};
  }
  __device__ __forceinline__ int count(int rows) const { return (rows + tile_rows - 1) / tile_rows; }
};

static __device__ __forceinline__ float norm_scale(float ss, int cols, float eps) {
  return 1.0f / sqrtf(ss / (float)cols + eps);
}

// rope.hip's sin/cos (Cody-Waite reduction, Cephes polynomials, as fused_matvec.hip copies it), so that
// the fused RoPE rotates exactly as the rope_f32 kernel does.
static __device__ __forceinline__ void rope_sincos(float angle, float* sin_out, float* cos_out) {
  const float k = rintf(angle * 0.636619772f);
  float r = fmaf(-k, 1.57079637050628662109375f, angle);
  r = fmaf(-k, -4.37113882867379e-08f, r);
  r = fmaf(-k, -1.71512451e-15f, r);
  const float z = r * r;
  const float s = fmaf(fmaf(fmaf(-1.9515295891e-4f, z, 8.3321608736e-3f), z, -1.6666654611e-1f), z * r, r);
  const float c = fmaf(fmaf(fmaf(fmaf(2.443315711809948e-5f, z, -1.388731625493765e-3f), z, 4.166664568298827e-2f), z,
                            -0.5f),
                       z, 1.0f);
  const int quadrant = (int)k & 3;
  const float s_q = (quadrant & 1) ? c : s;
  const float c_q = (quadrant & 1) ? s : c;
  *sin_out = (quadrant & 2) ? -s_q : s_q;
  *cos_out = ((quadrant + 1) & 2) ? -c_q : c_q;
}

struct Rope {
  const int* positions;
  const float* freq_factors;  // null: none
  int head_dim, rope_dim;
  float theta, freq_scale;
};

// Rows r, r + 1 (r even, one head) of token b rotated as rope_f32 rotates them (NORM mode).
static __device__ __forceinline__ void rotate(const Rope& p, int b, int r, float& s0, float& s1) {
  const int in_head = r % p.head_dim;
  if (in_head >= p.rope_dim) return;
  const float log2_step = -2.0f * log2f(p.theta) / (float)p.rope_dim;
  float freq = p.freq_scale * exp2f((float)(in_head / 2) * log2_step);
  if (p.freq_factors) freq = freq / p.freq_factors[in_head / 2];
  const float angle = (float)p.positions[b] * freq;
  float sn, cs;
  rope_sincos(angle, &sn, &cs);
  const float a = s0, c = s1;
  s0 = a * cs - c * sn;
  s1 = a * sn + c * cs;
}

// Rows per warp and matrix: four rows' loads in flight cover the memory latency (measured on an H100,
// see qmatvec.hip); gate and up go two rows of each. Batched passes take half as many (their tokens'
// accumulators and dot products already fill the registers and the issue slots). Even for q|k|v, so that
// a RoPE pair stays in one warp.
template <bool ONE_TOKEN>
struct WarpRows {
  static constexpr int kRows = ONE_TOKEN ? 4 : 2, kGateUpRows = ONE_TOKEN ? 2 : 1;
};

template <int NB, int kRows>
__device__ __forceinline__ void norm_rope_pass(Stage& st, float* const y[3], const unsigned char* const W[3],
                                               const int types[3], const int rows[3], const float* x, const float* g,
                                               const Rope& rope, int cols, float eps, int b0, int tokens) {
  const Tiles t = Tiles::of<kRows>();
  const int tiles0 = t.count(rows[0]), tiles1 = t.count(rows[1]);
  const int tiles = tiles0 + tiles1 + t.count(rows[2]);
  for (int tile = (int)blockIdx.x; tile < tiles; tile += (int)gridDim.x) {  // uniform across the block
    // The matrix as selects, not an index into the arrays, which would put them in local memory.
    const int m = tile < tiles0 ? 0 : tile < tiles0 + tiles1 ? 1 : 2;
    const int r0 = (tile - (m == 0 ? 0 : m == 1 ? tiles0 : tiles0 + tiles1)) * t.tile_rows + t.warp * kRows;
    const unsigned char* const Wm[1] = {m == 0 ? W[0] : m == 1 ? W[1] : W[2]};
    const int type = m == 0 ? types[0] : m == 1 ? types[1] : types[2];
    const int rows_m = m == 0 ? rows[0] : m == 1 ? rows[1] : rows[2];
    float* ym = m == 0 ? y[0] : m == 1 ? y[1] : y[2];
    float out[1][kRows][NB], ss[NB];
    typed_tile_dot<NB, kRows, 1, true>(type, st, Wm, rows_m, r0, x, g, cols, tokens, out, ss);
    if (t.lane != 0 || r0 >= rows_m) continue;  // rows come in whole groups of kRows (rows % 4 == 0)
#pragma unroll
    for (int b = 0; b < NB; ++b) {
      if (b >= tokens) break;
      const float s = norm_scale(ss[b], cols, eps);
#pragma unroll
      for (int r = 0; r < kRows; r += 2) {
        float s0 = out[0][r][b] * s, s1 = out[0][r + 1][b] * s;
        if (m < 2) rotate(rope, b0 + b, r0 + r, s0, s1);
        float* yb = ym + (unsigned long long)(b0 + b) * rows_m + r0 + r;
        yb[0] = s0;
        yb[1] = s1;
      }
    }
  }
}

template <int NB, int kGateUpRows>
__device__ __forceinline__ void norm_swiglu_pass(Stage& st, float* y, const unsigned char* Wg, const unsigned char* Wu,
                                                 int types, const float* x, const float* g, int rows, int cols, float eps,
                                                 int b0, int tokens) {
  const Tiles t = Tiles::of<kGateUpRows>();
  const int tiles = t.count(rows);
  const int type_gate = types & 15, type_up = (types >> 4) & 15;
  const unsigned char* const W[2] = {Wg, Wu};
  const unsigned char* const W_gate[1] = {Wg}, *const W_up[1] = {Wu};  // not &W[i]: that would put W in local memory
  for (int tile = (int)blockIdx.x; tile < tiles; tile += (int)gridDim.x) {
    const int r0 = tile * t.tile_rows + t.warp * kGateUpRows;
    float out[2][kGateUpRows][NB], ss[NB];  // out[0]: gate, out[1]: up
    if (type_gate == type_up) {  // one staging of x for both matrices
      typed_tile_dot<NB, kGateUpRows, 2, true>(type_gate, st, W, rows, r0, x, g, cols, tokens, out, ss);
    } else {  // the formats group x's columns differently: one staging each
      typed_tile_dot<NB, kGateUpRows, 1, true>(type_gate, st, W_gate, rows, r0, x, g, cols, tokens, &out[0], ss);
      typed_tile_dot<NB, kGateUpRows, 1, true>(type_up, st, W_up, rows, r0, x, g, cols, tokens, &out[1], ss);
    }
    if (t.lane != 0) continue;
#pragma unroll
    for (int b = 0; b < NB; ++b) {
      if (b >= tokens) break;
      const float s = norm_scale(ss[b], cols, eps);
#pragma unroll
      for (int r = 0; r < kGateUpRows; ++r) {
        const float a = out[0][r][b] * s, u = out[1][r][b] * s;
        if (r0 + r < rows) y[(unsigned long long)(b0 + b) * rows + r0 + r] = a / (1.0f + expf(-a)) * u;
      }
    }
  }
}

// y = n @ W^T (NORM: the head) or y += x @ W^T (the residual add); KS warps per row group (tile_dot).
template <int NB, int kRows, bool NORM, int KS = 1>
__device__ __forceinline__ void single_pass(Stage& st, float* y, const unsigned char* W, int type, const float* x,
                                            const float* g, int rows, int cols, float eps, int b0, int tokens) {
  const Tiles t = Tiles::of<kRows, KS>();
  const int tiles = t.count(rows);
  const unsigned char* const Wl[1] = {W};
  for (int tile = (int)blockIdx.x; tile < tiles; tile += (int)gridDim.x) {
    const int r0 = tile * t.tile_rows + t.group * kRows;
    float out[1][kRows][NB], ss[NB];
    typed_tile_dot<NB, kRows, 1, NORM, KS>(type, st, Wl, rows, r0, x, g, cols, tokens, out, ss, t.part);
    if (t.lane != 0 || t.part != 0) continue;
#pragma unroll
    for (int b = 0; b < NB; ++b) {
      if (b >= tokens) break;
      const float s = NORM ? norm_scale(ss[b], cols, eps) : 1.0f;
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
        if (r0 + r >= rows) continue;
        float* yr = y + (unsigned long long)(b0 + b) * rows + r0 + r;
        *yr = NORM ? out[0][r][b] * s : *yr + out[0][r][b];
      }
    }
  }
}

// pass.template run<NB, ONE_TOKEN>(b0, tokens) for each pass of at most kMaxBatchPerPass tokens, NB = 2, 4 or 8 (a
// pass of fewer tokens pads: W is still read once, and three instantiations, not eight, keep the build
// time). Single-token steps have entries of their own (ONE_TOKEN): a kernel's registers are those of its
// widest path, and the batched passes' accumulators would cost the single-token pass occupancy.
template <bool ONE_TOKEN, class Pass>
__device__ __forceinline__ void passes(int batch, const Pass& pass) {
  rf_check_wave_size();
  if (ONE_TOKEN) {
    for (int b0 = 0; b0 < batch; ++b0) pass.template run<1, true>(b0, 1);
    return;
  }
  for (int b0 = 0; b0 < batch; b0 += kMaxBatchPerPass) {
    const int left = batch - b0 < kMaxBatchPerPass ? batch - b0 : kMaxBatchPerPass;
    if (left <= 2) {
      pass.template run<2, false>(b0, left);
    } else if (left <= 4) {
      pass.template run<4, false>(b0, left);
    } else {
      pass.template run<8, false>(b0, left);
    }
  }
}

// The passes' functors (not lambdas: nvrtc compiles no lambda in device code without -default-device).
struct RopePass {
  Stage* st;
  float* const* y;
  const unsigned char* const* W;
  const int *type_of, *rows;
  const float *x, *g;
  const Rope* rope;
  int cols;
  float eps;
  template <int NB, bool ONE_TOKEN>
  __device__ __forceinline__ void run(int b0, int tokens) const {
    norm_rope_pass<NB, WarpRows<ONE_TOKEN>::kRows>(*st, y, W, type_of, rows, x + (unsigned long long)b0 * cols, g, *rope,
                                                   cols, eps, b0, tokens);
  }
};

struct SwigluPass {
  Stage* st;
  float* y;
  const void *Wg, *Wu;
  const float *x, *g;
  int types, rows, cols;
  float eps;
  template <int NB, bool ONE_TOKEN>
  __device__ __forceinline__ void run(int b0, int tokens) const {
    norm_swiglu_pass<NB, WarpRows<ONE_TOKEN>::kGateUpRows>(*st, y, static_cast<const unsigned char*>(Wg),
                                                           static_cast<const unsigned char*>(Wu), types,
                         x + (unsigned long long)b0 * cols, g, rows, cols, eps, b0, tokens);
  }
};

template <bool NORM>
struct SinglePass {
  Stage* st;
  float* y;
  const void* W;
  const float *x, *g;
  int type, rows, cols;
  float eps;
  int k_split;  // the residual at one token: 2 or 4 split its row groups (within the block's warps)
  template <int NB, bool ONE_TOKEN>
  __device__ __forceinline__ void run(int b0, int tokens) const {
    constexpr int kRows = WarpRows<ONE_TOKEN>::kRows;
    const unsigned char* w = static_cast<const unsigned char*>(W);
    const float* xb = x + (unsigned long long)b0 * cols;
    if constexpr (ONE_TOKEN && !NORM) {
      const int warps = (int)blockDim.x / WARP_SIZE;
      if (k_split == 2 && warps % 2 == 0) {
        single_pass<NB, kRows, NORM, 2>(*st, y, w, type, xb, g, rows, cols, eps, b0, tokens);
        return;
      }
      if (k_split == 4 && warps % 4 == 0) {
        single_pass<NB, kRows, NORM, 4>(*st, y, w, type, xb, g, rows, cols, eps, b0, tokens);
        return;
      }
    }
    single_pass<NB, kRows, NORM>(*st, y, w, type, xb, g, rows, cols, eps, b0, tokens);
  }
};

template <bool ONE_TOKEN>
__device__ __forceinline__ void norm_rope(Stage* st, float* q, float* k, float* v, const void* Wq, const void* Wk,
                                          const void* Wv, const float* x, const float* g, const int* positions,
                                          const float* freq_factors, int types, int q_rows, int kv_rows, int cols,
                                          int batch, int head_dim, int rope_dim, float eps, float theta,
                                          float freq_scale) {
  float* const y[3] = {q, k, v};
  const unsigned char* const W[3] = {static_cast<const unsigned char*>(Wq), static_cast<const unsigned char*>(Wk),
                                     static_cast<const unsigned char*>(Wv)};
  const int type_of[3] = {types & 15, (types >> 4) & 15, (types >> 8) & 15};
  const int rows[3] = {q_rows, kv_rows, kv_rows};
  const Rope rope = {positions, freq_factors, head_dim, rope_dim, theta, freq_scale};
  passes<ONE_TOKEN>(batch, RopePass{st, y, W, type_of, rows, x, g, &rope, cols, eps});
}

template <bool ONE_TOKEN>
__device__ __forceinline__ void norm_swiglu(Stage* st, float* y, const void* Wg, const void* Wu, const float* x, const float* g,
                                            int types, int rows, int cols, int batch, float eps) {
  passes<ONE_TOKEN>(batch, SwigluPass{st, y, Wg, Wu, x, g, types, rows, cols, eps});
}

template <bool ONE_TOKEN, bool NORM>
__device__ __forceinline__ void single(Stage* st, float* y, const void* W, const float* x, const float* g, int type, int rows,
                                       int cols, int batch, float eps, int k_split) {
  passes<ONE_TOKEN>(batch, SinglePass<NORM>{st, y, W, x, g, type, rows, cols, eps, k_split});
}

}  // namespace fq
}  // namespace

// Entries: <name>_1 for one token, <name>_n for any number (passes of up to eight). Blocks of kBlockThreads.
#define RF_FUSED_QMATVEC_ENTRIES(suffix, ONE_TOKEN)                                                                   \
  extern "C" __global__ __launch_bounds__(fq::kBlockThreads) void qmatvec_norm_rope_##suffix(                                      \
      float* q, float* k, float* v, const void* Wq, const void* Wk, const void* Wv, const float* x, const float* g,   \
      const int* positions, const float* freq_factors, int types, int q_rows, int kv_rows, int cols, int batch,       \
      int head_dim, int rope_dim, float eps, float theta, float freq_scale) {                                         \
    __shared__ fq::Stage stage;                                                                                       \
    rf_grid_dependency_sync(); /* a programmatic launch (hipcore/ops/fused_qmatvec.py) */                             \
    fq::reset_key(stage);                                                                                             \
    fq::norm_rope<ONE_TOKEN>(&stage, q, k, v, Wq, Wk, Wv, x, g, positions, freq_factors, types, q_rows, kv_rows,      \
                             cols, batch, head_dim, rope_dim, eps, theta, freq_scale);                                \
  }                                                                                                                   \
  extern "C" __global__ __launch_bounds__(fq::kBlockThreads) void qmatvec_norm_swiglu_##suffix(                                    \
      float* y, const void* Wg, const void* Wu, const float* x, const float* g, int types, int rows, int cols,        \
      int batch, float eps) {                                                                                         \
    __shared__ fq::Stage stage;                                                                                       \
    rf_grid_dependency_sync(); /* a programmatic launch (hipcore/ops/fused_qmatvec.py) */                             \
    fq::reset_key(stage);                                                                                             \
    fq::norm_swiglu<ONE_TOKEN>(&stage, y, Wg, Wu, x, g, types, rows, cols, batch, eps);                                       \
  }                                                                                                                   \
  extern "C" __global__ __launch_bounds__(fq::kBlockThreads) void qmatvec_add_##suffix(                             \
      float* y, const void* W, const float* x, int type, int rows, int cols, int batch, int k_split) {                \
    __shared__ fq::Stage stage;                                                                                       \
    rf_grid_dependency_sync(); /* a programmatic launch (hipcore/ops/fused_qmatvec.py) */                             \
    fq::reset_key(stage);                                                                                             \
    fq::single<ONE_TOKEN, false>(&stage, y, W, x, nullptr, type, rows, cols, batch, 0.0f, k_split);                   \
  }                                                                                                                   \
  extern "C" __global__ __launch_bounds__(fq::kBlockThreads) void qmatvec_norm_##suffix(                                           \
      float* y, const void* W, const float* x, const float* g, int type, int rows, int cols, int batch, float eps) {  \
    __shared__ fq::Stage stage;                                                                                       \
    rf_grid_dependency_sync(); /* a programmatic launch (hipcore/ops/fused_qmatvec.py) */                             \
    fq::reset_key(stage);                                                                                             \
    fq::single<ONE_TOKEN, true>(&stage, y, W, x, g, type, rows, cols, batch, eps, 1);                                            \
  }

RF_FUSED_QMATVEC_ENTRIES(1, true)
RF_FUSED_QMATVEC_ENTRIES(n, false)
