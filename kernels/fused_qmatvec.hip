// The decode products of a llama layer on int8-quantized activations (qmatvec_formats.h's formats and dot
// products) with the layer's small ops folded in, for weights that cannot share one buffer: q, k and v
// (or gate and up) each come as their own matrix, each of its own type. A Q4_K_M file has attn_q and
// attn_k in Q4_K but attn_v in Q6_K, so the concatenated W of fused_matvec.hip does not exist there.
//
//   qmatvec_norm_rope(q, k, v, Wq, Wk, Wv, x, g, positions, freq_factors, bq, bk, bv, types, q_rows, kv_rows, cols,
//                     batch, head_dim, rope_dim, eps, theta, freq_scale, k_pool, v_pool, slots, block_size,
//                     num_blocks, kv_format, k_split, tile_groups)
//       q = rope(n @ Wq^T + bq), k = rope(n @ Wk^T + bk), v = n @ Wv^T + bv,  n = rmsnorm(x) * g; freq_factors:
//       rope_dim / 2 per-pair divisors of the frequency (rope.hip), or null; bq, bk, bv: the biases (qwen2), all
//       three or none (null), added before RoPE. kv_format 0: k and v go to their float
//       buffers; 1 (f16), 2 (bf16), 3 (f32): they go straight into the paged cache's pools at each token's
//       slot instead, the bytes kv_store.hip would write (that launch and its gap leave the step).
//   qmatvec_norm_swiglu(y, Wg, Wu, x, g, types, rows, cols, batch, eps)
//       y = silu(n @ Wg^T) * (n @ Wu^T), or with GeGLU in `types` (Gemma) y = gelu(n @ Wg^T) * (n @ Wu^T), GELU's
//       tanh form as gelu_mul.hip computes it
//   qmatvec_add(y, W, x, type, rows, cols, batch, k_split)   y += x @ W^T (the residual connection), or y = x @ W^T
//       with kStoreFlag in `type` (a product whose output is normalized before its residual add: Gemma's)
//   qmatvec_norm(y, W, x, g, type, rows, cols, batch, eps)   y = n @ W^T (the output head)
//
// `types` packs one type code per matrix, 4 bits each (q | k << 4 | v << 8; gate | up << 4, and for gate|up the
// activation at kActivationShift: 0 SiLU, 1 GELU); the codes
// are WeightType's: the `_1` and `_n` entries read the K-quants, Q8_0 and Q4_0, the one-token `_1b` entries Q4_1,
// Q5_0, Q5_1, Q8_0 and Q4_0, the `_1m` and `_nm` entries MXFP4 alone (fused_qmatvec_tiles.h: TypeSet). The type is a branch per row group, uniform across the warp. k_split (qmatvec_add and
// qmatvec_norm_rope at one token): the warps that share a row group's columns, 1, 2 or 4 (anything else
// counts as 1; see tile_dot). tile_groups (qmatvec_norm_rope at one token): the row groups of a tile, fewer
// than the block's to spread q|k|v's few hundred tiles evenly over the SMs (Tiles; 0: all of them).
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
// than 4 tokens take further passes over W. At one token, gate|up's last round of tiles, when it would leave
// half the workgroups idle or more, goes as tiles of split row groups (norm_swiglu_pass) in an entry of its
// own, qmatvec_norm_swiglu_split_1, which the launcher picks where that round exists.
// Requirements the launcher checks: cols % 256 == 0 for the K-quants, % 32 otherwise; q_rows and kv_rows
// multiples of 4 (head_dim % 4 == 0); W of each type aligned as qmatvec.hip needs; x and g 16-byte aligned.
#include "hip_compat.h"
#include "qmatvec_formats.h"      // x quantized per slice, the formats and their int8 dot products
#include "qmatvec_block32_formats.h"  // Q4_1, Q5_0, Q5_1 (the one-token _1b entries)
#include "mxfp4_q8_format.h"  // MXFP4 (the _1m and _nm entries), as qmatvec.hip and moe_experts.hip read it
#include "fused_qmatvec_tiles.h"  // x staged in shared memory and the row groups' dot products (tile_dot)
#include "fused_qmatvec_epilogue.h"  // the norm's scale, RoPE and the store of k and v into the paged cache
#include "gated_activation.h"        // gate|up's SwiGLU or GeGLU

namespace {
namespace fq {

// Rows per warp and matrix: four rows' loads in flight cover the memory latency (measured on an H100,
// see qmatvec.hip); gate and up go two rows of each. Batched passes take half as many (their tokens'
// accumulators and dot products already fill the registers and the issue slots). Even for q|k|v, so that
// a RoPE pair stays in one warp.
template <bool ONE_TOKEN>
struct WarpRows {
  static constexpr int kRows = ONE_TOKEN ? 4 : 2, kGateUpRows = ONE_TOKEN ? 2 : 1;
};

template <int NB, int kRows, int KS = 1, int TYPES = kKQuantTypes>
__device__ __forceinline__ void norm_rope_pass(Stage& st, float* const y[3], const unsigned char* const W[3],
                                               const int types[3], const int rows[3], const float* x, const float* g,
                                               const float* const bias[3], const Rope& rope, const KvTarget& kv,
                                               int cols, float eps, int b0, int tokens, int tile_groups) {
  const Tiles t = Tiles::of<kRows, KS>(tile_groups);
  const int tiles0 = t.count(rows[0]), tiles1 = t.count(rows[1]);
  const int tiles = tiles0 + tiles1 + t.count(rows[2]);
  for (int tile = (int)blockIdx.x; tile < tiles; tile += (int)gridDim.x) {  // uniform across the block
    // The matrix as selects, not an index into the arrays, which would put them in local memory.
    const int m = tile < tiles0 ? 0 : tile < tiles0 + tiles1 ? 1 : 2;
    // An inactive warp's rows start past the matrix: it reads nothing and writes nothing.
    const int r0 = t.active() ? (tile - (m == 0 ? 0 : m == 1 ? tiles0 : tiles0 + tiles1)) * t.tile_rows + t.group * kRows
                              : (m == 0 ? rows[0] : m == 1 ? rows[1] : rows[2]);
    const unsigned char* const Wm[1] = {m == 0 ? W[0] : m == 1 ? W[1] : W[2]};
    const int type = m == 0 ? types[0] : m == 1 ? types[1] : types[2];
    const int rows_m = m == 0 ? rows[0] : m == 1 ? rows[1] : rows[2];
    float* ym = m == 0 ? y[0] : m == 1 ? y[1] : y[2];
    const float* bm = m == 0 ? bias[0] : m == 1 ? bias[1] : bias[2];  // null: no biases
    float out[1][kRows][NB], ss[NB];
    typed_tile_dot<NB, kRows, 1, true, KS, 1, TYPES>(type, st, Wm, rows_m, r0, x, g, cols, tokens, out, ss, t.part);
    // rows come in whole groups of kRows (rows % 4 == 0); part 0's warp holds a split group's sums
    if (t.lane != 0 || t.part != 0 || r0 >= rows_m) continue;
#pragma unroll
    for (int b = 0; b < NB; ++b) {
      if (b >= tokens) break;
      const float s = norm_scale(ss[b], cols, eps);
#pragma unroll
      for (int r = 0; r < kRows; r += 2) {
        float s0 = out[0][r][b] * s, s1 = out[0][r + 1][b] * s;
        if (bm != nullptr) s0 += bm[r0 + r], s1 += bm[r0 + r + 1];
        if (m < 2) rotate(rope, b0 + b, r0 + r, s0, s1);
        if (m > 0 && kv.format != 0) {
          store_pair(kv, m == 2, b0 + b, r0 + r, s0, s1);
          continue;
        }
        float* yb = ym + (unsigned long long)(b0 + b) * rows_m + r0 + r;
        yb[0] = s0;
        yb[1] = s1;
      }
    }
  }
}

constexpr int kActivationShift = 8;  // gate|up's `types`: the activation's code above the two type codes

// Gate|up tiles of KS-split row groups (tile_dot) covering rows begin .. end - 1 of `rows`, the block's in turn.
// GELU_OK: the activation code is read (GeGLU); the split entry leaves it out, SiLU only, since it raised that
// entry's spill on sm_90 (20 -> 28 bytes), and the launcher takes it for SwiGLU alone.
template <int NB, int kGateUpRows, int KS, int TYPES, bool GELU_OK = true>
__device__ __forceinline__ void swiglu_tiles(Stage& st, float* y, const unsigned char* Wg, const unsigned char* Wu,
                                             int types, const float* x, const float* g, int rows, int cols, float eps,
                                             int b0, int tokens, int begin, int end) {
  const Tiles t = Tiles::of<kGateUpRows, KS>();
  const int tiles = (end - begin + t.tile_rows - 1) / t.tile_rows;
  const int type_gate = types & 15, type_up = (types >> 4) & 15;
  const bool gelu = GELU_OK && ((types >> kActivationShift) & 15) == 1;
  const unsigned char* const W[2] = {Wg, Wu};
  const unsigned char* const W_gate[1] = {Wg}, *const W_up[1] = {Wu};  // not &W[i]: that would put W in local memory
  for (int tile = (int)blockIdx.x; tile < tiles; tile += (int)gridDim.x) {
    const int r0 = begin + tile * t.tile_rows + t.group * kGateUpRows;
    float out[2][kGateUpRows][NB], ss[NB];  // out[0]: gate, out[1]: up
    if (type_gate == type_up) {  // one staging of x for both matrices
      typed_tile_dot<NB, kGateUpRows, 2, true, KS, 1, TYPES>(type_gate, st, W, end, r0, x, g, cols, tokens, out, ss, t.part);
    } else {  // the formats group x's columns differently: one staging each
      typed_tile_dot<NB, kGateUpRows, 1, true, KS, 1, TYPES>(type_gate, st, W_gate, end, r0, x, g, cols, tokens, &out[0], ss,
                                                   t.part);
      typed_tile_dot<NB, kGateUpRows, 1, true, KS, 1, TYPES>(type_up, st, W_up, end, r0, x, g, cols, tokens, &out[1], ss, t.part);
    }
    if (t.lane != 0 || t.part != 0) continue;  // part 0's warp holds a split group's sums
#pragma unroll
    for (int b = 0; b < NB; ++b) {
      if (b >= tokens) break;
      const float s = norm_scale(ss[b], cols, eps);
#pragma unroll
      for (int r = 0; r < kGateUpRows; ++r) {
        const float a = out[0][r][b] * s, u = out[1][r][b] * s;
        if (r0 + r < end) y[(unsigned long long)(b0 + b) * rows + r0 + r] = rf_gated(a, u, gelu);
      }
    }
  }
}

// At one token the workgroups take the tiles round by round, and a round takes about as long whether every
// workgroup has a tile or a few have: the warps wait on DRAM with few loads in flight. An 8B's 896 tiles on
// 264 workgroups make 3.39 rounds, and its gate|up took as long as 4 whole rounds' (measured on an H200:
// 14,336 rows 24.9 us, 16,896 rows 25.5, 12,672 rows 19.9). So where the last round would leave at least half
// the workgroups without a tile, its rows go as tiles of split row groups (two warps a group, each half the
// columns; one tile a workgroup at most): every workgroup takes part and each warp's walk is half as long.
// Split throughout, gate|up lost (24.9 -> 26.8 us; a split tile pays two barriers and a second reduction).
// SPLIT_LAST (the _split_1 entry only): the split tiles' code raised the one-token entry from 108 to 128
// registers on sm_90 with 20 bytes of spill, which cost a 3B, whose 512 tiles on 264 workgroups never split,
// 0.3% of tg128; so the entry without them stays as it was and the launcher picks (splits_last_round).
template <int NB, int kGateUpRows, bool SPLIT_LAST, int TYPES>
__device__ __forceinline__ void norm_swiglu_pass(Stage& st, float* y, const unsigned char* Wg, const unsigned char* Wu,
                                                 int types, const float* x, const float* g, int rows, int cols, float eps,
                                                 int b0, int tokens) {
  if constexpr (SPLIT_LAST) {
    const int tile_rows = Tiles::of<kGateUpRows>().tile_rows, tiles = (rows + tile_rows - 1) / tile_rows;
    const int rounds = tiles / (int)gridDim.x, last = tiles - rounds * (int)gridDim.x;  // uniform
    if (rounds > 0 && last > 0 && 2 * last <= (int)gridDim.x) {
      const int body = rounds * (int)gridDim.x * tile_rows;  // the whole rounds' rows
      swiglu_tiles<NB, kGateUpRows, 1, TYPES, false>(st, y, Wg, Wu, types, x, g, rows, cols, eps, b0, tokens, 0, body);
      swiglu_tiles<NB, kGateUpRows, 2, TYPES, false>(st, y, Wg, Wu, types, x, g, rows, cols, eps, b0, tokens, body, rows);
      return;
    }
  }
  swiglu_tiles<NB, kGateUpRows, 1, TYPES, !SPLIT_LAST>(st, y, Wg, Wu, types, x, g, rows, cols, eps, b0, tokens, 0, rows);
}

// y = n @ W^T (NORM: the head) or y += x @ W^T (the residual add; y = x @ W^T where `store`); KS warps per row
// group (tile_dot).
template <int NB, int kRows, bool NORM, int KS = 1, int UNROLL = 1, int TYPES = kKQuantTypes>
__device__ __forceinline__ void single_pass(Stage& st, float* y, const unsigned char* W, int type, const float* x,
                                            const float* g, int rows, int cols, float eps, int b0, int tokens,
                                            bool store = false) {
  const Tiles t = Tiles::of<kRows, KS>();
  const int tiles = t.count(rows);
  const unsigned char* const Wl[1] = {W};
  for (int tile = (int)blockIdx.x; tile < tiles; tile += (int)gridDim.x) {
    const int r0 = tile * t.tile_rows + t.group * kRows;
    float out[1][kRows][NB], ss[NB];
    typed_tile_dot<NB, kRows, 1, NORM, KS, UNROLL, TYPES>(type, st, Wl, rows, r0, x, g, cols, tokens, out, ss, t.part);
    if (t.lane != 0 || t.part != 0) continue;
#pragma unroll
    for (int b = 0; b < NB; ++b) {
      if (b >= tokens) break;
      const float s = NORM ? norm_scale(ss[b], cols, eps) : 1.0f;
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
        if (r0 + r >= rows) continue;
        float* yr = y + (unsigned long long)(b0 + b) * rows + r0 + r;
        *yr = NORM ? out[0][r][b] * s : store ? out[0][r][b] : *yr + out[0][r][b];
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

// The passes' functors (not lambdas: nvrtc compiles no lambda in device code without -default-device); TYPES:
// the formats their type switch reads (TypeSet).
template <int TYPES>
struct RopePass {
  Stage* st;
  float* const* y;
  const unsigned char* const* W;
  const int *type_of, *rows;
  const float *x, *g;
  const float* const* bias;
  const Rope* rope;
  const KvTarget* kv;
  int cols;
  float eps;
  int k_split;      // one token: 2 or 4 split its row groups (within the block's warps), as SinglePass's
  int tile_groups;  // one token: row groups a tile (Tiles::of; 0 or past the block's: all of them)
  template <int NB, bool ONE_TOKEN>
  __device__ __forceinline__ void run(int b0, int tokens) const {
    constexpr int kRows = WarpRows<ONE_TOKEN>::kRows;
    const float* xb = x + (unsigned long long)b0 * cols;
    if constexpr (ONE_TOKEN) {
      const int warps = (int)blockDim.x / WARP_SIZE;
      if (k_split == 2 && warps % 2 == 0) {
        norm_rope_pass<NB, kRows, 2, TYPES>(*st, y, W, type_of, rows, xb, g, bias, *rope, *kv, cols, eps, b0, tokens, tile_groups);
        return;
      }
      if (k_split == 4 && warps % 4 == 0) {
        norm_rope_pass<NB, kRows, 4, TYPES>(*st, y, W, type_of, rows, xb, g, bias, *rope, *kv, cols, eps, b0, tokens, tile_groups);
        return;
      }
    }
    norm_rope_pass<NB, kRows, 1, TYPES>(*st, y, W, type_of, rows, xb, g, bias, *rope, *kv, cols, eps, b0, tokens,
                              ONE_TOKEN ? tile_groups : 0);
  }
};

template <bool SPLIT_LAST, int TYPES>
struct SwigluPass {
  Stage* st;
  float* y;
  const void *Wg, *Wu;
  const float *x, *g;
  int types, rows, cols;
  float eps;
  template <int NB, bool ONE_TOKEN>
  __device__ __forceinline__ void run(int b0, int tokens) const {
    norm_swiglu_pass<NB, WarpRows<ONE_TOKEN>::kGateUpRows, ONE_TOKEN && SPLIT_LAST, TYPES>(*st, y, static_cast<const unsigned char*>(Wg),
                                                           static_cast<const unsigned char*>(Wu), types,
                         x + (unsigned long long)b0 * cols, g, rows, cols, eps, b0, tokens);
  }
};

// The one-token head's slice loop unrolled by two (tile_dot's UNROLL) where it was measured and fits the
// registers: NVIDIA (an H200: the 8B's head 151.1 -> 136.2 us, 71% -> 75% of copy; tg128 +0.5%). The same
// unroll in gate|up and q|k|v lost in the step (docs/history/2026-11-28-h200-table-launch-boundary.md). AMD keeps
// one: RDNA's wave32 builds spill 80-108 bytes with it, and no AMD GPU has measured either family.
#if defined(RF_NVIDIA)
constexpr int kHeadUnroll = 2;
#else
constexpr int kHeadUnroll = 1;
#endif

template <bool NORM, int TYPES>
struct SinglePass {
  Stage* st;
  float* y;
  const void* W;
  const float *x, *g;
  int type, rows, cols;
  float eps;
  int k_split;  // the residual at one token: 2 or 4 split its row groups (within the block's warps)
  bool store;   // !NORM: y = x @ W^T instead of y += x @ W^T
  template <int NB, bool ONE_TOKEN>
  __device__ __forceinline__ void run(int b0, int tokens) const {
    constexpr int kRows = WarpRows<ONE_TOKEN>::kRows;
    const unsigned char* w = static_cast<const unsigned char*>(W);
    const float* xb = x + (unsigned long long)b0 * cols;
    if constexpr (ONE_TOKEN && !NORM) {
      const int warps = (int)blockDim.x / WARP_SIZE;
      if (k_split == 2 && warps % 2 == 0) {
        single_pass<NB, kRows, NORM, 2, 1, TYPES>(*st, y, w, type, xb, g, rows, cols, eps, b0, tokens, store);
        return;
      }
      if (k_split == 4 && warps % 4 == 0) {
        single_pass<NB, kRows, NORM, 4, 1, TYPES>(*st, y, w, type, xb, g, rows, cols, eps, b0, tokens, store);
        return;
      }
    }
    if constexpr (ONE_TOKEN && NORM && kHeadUnroll > 1) {
      single_pass<NB, kRows, NORM, 1, kHeadUnroll, TYPES>(*st, y, w, type, xb, g, rows, cols, eps, b0, tokens);
      return;
    }
    single_pass<NB, kRows, NORM, 1, 1, TYPES>(*st, y, w, type, xb, g, rows, cols, eps, b0, tokens, store);
  }
};

template <bool ONE_TOKEN, int TYPES = kKQuantTypes>
__device__ __forceinline__ void norm_rope(Stage* st, float* q, float* k, float* v, const void* Wq, const void* Wk,
                                          const void* Wv, const float* x, const float* g, const int* positions,
                                          const float* freq_factors, const float* bq, const float* bk,
                                          const float* bv, int types, int q_rows, int kv_rows, int cols,
                                          int batch, int head_dim, int rope_dim, float eps, float theta,
                                          float freq_scale, void* k_pool, void* v_pool, const int* slots,
                                          int block_size, int num_blocks, int kv_format, int k_split,
                                          int tile_groups) {
  float* const y[3] = {q, k, v};
  const unsigned char* const W[3] = {static_cast<const unsigned char*>(Wq), static_cast<const unsigned char*>(Wk),
                                     static_cast<const unsigned char*>(Wv)};
  const int type_of[3] = {types & 15, (types >> 4) & 15, (types >> 8) & 15};
  const int rows[3] = {q_rows, kv_rows, kv_rows};
  const float* const bias[3] = {bq, bk, bv};
  const Rope rope = {positions, freq_factors, head_dim, rope_dim, theta, freq_scale};
  const KvTarget kv = {static_cast<unsigned char*>(k_pool), static_cast<unsigned char*>(v_pool), slots, block_size,
                       num_blocks, kv_rows / head_dim, head_dim, kv_format};
  passes<ONE_TOKEN>(batch, RopePass<TYPES>{st, y, W, type_of, rows, x, g, bias, &rope, &kv, cols, eps, k_split, tile_groups});
}

template <bool ONE_TOKEN, bool SPLIT_LAST = false, int TYPES = kKQuantTypes>
__device__ __forceinline__ void norm_swiglu(Stage* st, float* y, const void* Wg, const void* Wu, const float* x, const float* g,
                                            int types, int rows, int cols, int batch, float eps) {
  passes<ONE_TOKEN>(batch, SwigluPass<SPLIT_LAST, TYPES>{st, y, Wg, Wu, x, g, types, rows, cols, eps});
}

// qmatvec_add's `type`: the weight's type code, and kStoreFlag for y = x @ W^T.
constexpr int kStoreFlag = 1 << 8;

template <bool ONE_TOKEN, bool NORM, int TYPES = kKQuantTypes>
__device__ __forceinline__ void single(Stage* st, float* y, const void* W, const float* x, const float* g, int type, int rows,
                                       int cols, int batch, float eps, int k_split) {
  const bool store = !NORM && (type & kStoreFlag) != 0;
  passes<ONE_TOKEN>(batch, SinglePass<NORM, TYPES>{st, y, W, x, g, type & 15, rows, cols, eps, k_split, store});
}

}  // namespace fq
}  // namespace

// Entries: <name>_1 for one token, <name>_n for any number (passes of up to eight), <name>_1b for one token of the
// 32-element block types. Blocks of kBlockThreads.
#define RF_FUSED_QMATVEC_ENTRIES(suffix, ONE_TOKEN, TYPES)                                                                   \
  extern "C" __global__ __launch_bounds__(fq::kBlockThreads) void qmatvec_norm_rope_##suffix(                                      \
      float* q, float* k, float* v, const void* Wq, const void* Wk, const void* Wv, const float* x, const float* g,   \
      const int* positions, const float* freq_factors, const float* bq, const float* bk, const float* bv, int types, \
      int q_rows, int kv_rows, int cols, int batch,                                                                   \
      int head_dim, int rope_dim, float eps, float theta, float freq_scale, void* k_pool, void* v_pool,               \
      const int* slots, int block_size, int num_blocks, int kv_format, int k_split, int tile_groups) {                \
    __shared__ fq::Stage stage;                                                                                       \
    rf_grid_dependency_deferred(); /* waits in tile_dot (hipcore/ops/fused_qmatvec.py) */                             \
    fq::reset_key(stage);                                                                                             \
    fq::norm_rope<ONE_TOKEN, TYPES>(&stage, q, k, v, Wq, Wk, Wv, x, g, positions, freq_factors, bq, bk, bv, types,      \
                                    q_rows, kv_rows, cols, batch, head_dim, rope_dim, eps, theta, freq_scale, k_pool, \
                                    v_pool, slots, block_size, num_blocks, kv_format, k_split, tile_groups);          \
  }                                                                                                                   \
  extern "C" __global__ __launch_bounds__(fq::kBlockThreads) void qmatvec_norm_swiglu_##suffix(                                    \
      float* y, const void* Wg, const void* Wu, const float* x, const float* g, int types, int rows, int cols,        \
      int batch, float eps) {                                                                                         \
    __shared__ fq::Stage stage;                                                                                       \
    rf_grid_dependency_deferred(); /* waits in tile_dot (hipcore/ops/fused_qmatvec.py) */                             \
    fq::reset_key(stage);                                                                                             \
    fq::norm_swiglu<ONE_TOKEN, false, TYPES>(&stage, y, Wg, Wu, x, g, types, rows, cols, batch, eps);                                       \
  }                                                                                                                   \
  extern "C" __global__ __launch_bounds__(fq::kBlockThreads) void qmatvec_add_##suffix(                             \
      float* y, const void* W, const float* x, int type, int rows, int cols, int batch, int k_split) {                \
    __shared__ fq::Stage stage;                                                                                       \
    rf_grid_dependency_deferred(); /* waits in tile_dot (hipcore/ops/fused_qmatvec.py) */                             \
    fq::reset_key(stage);                                                                                             \
    fq::single<ONE_TOKEN, false, TYPES>(&stage, y, W, x, nullptr, type, rows, cols, batch, 0.0f, k_split);                   \
  }                                                                                                                   \
  extern "C" __global__ __launch_bounds__(fq::kBlockThreads) void qmatvec_norm_##suffix(                                           \
      float* y, const void* W, const float* x, const float* g, int type, int rows, int cols, int batch, float eps) {  \
    __shared__ fq::Stage stage;                                                                                       \
    rf_grid_dependency_deferred(); /* waits in tile_dot (hipcore/ops/fused_qmatvec.py) */                             \
    fq::reset_key(stage);                                                                                             \
    fq::single<ONE_TOKEN, true, TYPES>(&stage, y, W, x, g, type, rows, cols, batch, eps, 1);                                            \
  }

RF_FUSED_QMATVEC_ENTRIES(1, true, fq::kKQuantTypes)
RF_FUSED_QMATVEC_ENTRIES(n, false, fq::kKQuantTypes)
// One token of the 32-element blocks with a min or a fifth bit (and Q8_0, Q4_0): fused_qmatvec_tiles.h, TypeSet.
RF_FUSED_QMATVEC_ENTRIES(1b, true, fq::kBlock32Types)
// MXFP4 alone (every matrix of the launch), one token and any number: their own entries, so that the switches above
// keep the registers they were measured with.
RF_FUSED_QMATVEC_ENTRIES(1m, true, fq::kMXFP4Types)
RF_FUSED_QMATVEC_ENTRIES(nm, false, fq::kMXFP4Types)

// One token's gate|up whose last round of tiles goes split (norm_swiglu_pass: SPLIT_LAST).
extern "C" __global__ __launch_bounds__(fq::kBlockThreads) void qmatvec_norm_swiglu_split_1(
    float* y, const void* Wg, const void* Wu, const float* x, const float* g, int types, int rows, int cols, int batch,
    float eps) {
  __shared__ fq::Stage stage;
  rf_grid_dependency_deferred(); /* waits in tile_dot (hipcore/ops/fused_qmatvec.py) */
  fq::reset_key(stage);
  fq::norm_swiglu<true, true>(&stage, y, Wg, Wu, x, g, types, rows, cols, batch, eps);
}
