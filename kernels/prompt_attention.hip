// Prompt attention on the matrix cores: paged_attention's causal grouped-query attention for steps of many
// query tokens (prompts and prompt chunks), with both products (q . K and the weights . V) as f16 x f16 -> f32
// matrix instructions (matrix_cores.h's rf_mma: mma.sync on NVIDIA, MFMA on CDNA, WMMA on RDNA3/4, FMA elsewhere).
//
//   out[t, h, :] = sum_j softmax_j(scale * q[t, h, :] . K[j]) V[j]   over keys j = first(t) .. positions[t]
//
// of the sequence token_seq[t], first(t) = 0, or max(0, positions[t] - window + 1) with a sliding window,
// key j in physical block block_tables[seq][j / block_size] at offset j % block_size, for KV head
// h / (n_heads / n_kv_heads) (paged_attention.hip's rule and layouts: q and out float32 [n_tokens, n_heads,
// head_dim], f16 pools [num_blocks, n_kv_heads, block_size, head_dim], block_tables int32 [n_seqs, max_blocks],
// token_seq and positions int32 [n_tokens]; a negative position is padding, whose rows are zero).
//
// Work split (1-D grid; hipcore/ops/prompt_attention.py mirrors it): a workgroup of 4 warps serves one KV head,
// `hpw` of the query heads that read it (4, 2 or 1: the most that divides the group and the row tiles) and 16 *
// row tiles / hpw consecutive tokens; each row tile holds 16 tokens of one head, one matrix tile of rows, in one
// warp (two for a head of 256, each with half the output's columns: Tile), so every K and V row the workgroup
// loads serves all its heads and tokens. The query tiles run from the last to the first (the last tokens of a
// prompt see the most keys: the longest workgroups start first).
// - A workgroup's tokens are taken in runs of one sequence (a prompt's tokens are one run; a step that mixes
//   sequences has several), and each run walks the keys its tokens see (from the lowest first(t) to the
//   highest position), kKeys at a time: K and V rows go to shared memory as f16 (V transposed, as the second
//   product's operand wants it), every warp whose rows see some of those keys computes its 16 x kKeys scores
//   (q staged once as f16 with scale * log2(e) folded in), masks the keys each row does not see, folds them
//   into its rows' running max and sum (online softmax, base 2) and rescales its output accumulators, then
//   writes the weights as f16 to shared memory and adds weights . V to its accumulators.
// - Rows outside the run keep everything they hold: their scores are all masked, so their factor is 1 and
//   their weights 0.
// - A row's accumulators are spread over lanes as the matrix instruction leaves them (rf_mma_acc_row/col): a lane
//   keeps its rows' max and sum once each (kLaneRows), reduced over the lanes holding the row (kRowLanes).
// - On NVIDIA and CDNA the next step's K and V rows are loaded into registers while the current step's products
//   run (q's fragments are read from shared memory at each step instead of held, to leave the registers for them).
// Precision: q and the weights are rounded to f16 (|scale * q| must stay below 65504; the weights are in [0, 1]);
// K and V are the f16 pool's own values; products exact, sums in f32 (hipcore/ops/prompt_attention.py bounds it).
// A soft cap (softcap > 0, Gemma 2) caps each scaled score S at softcap * tanh(S / softcap) before the softmax.
// Requirements the launcher checks: head_dim a multiple of 16 up to 128, or 256; block_size a power of two;
// n_heads a multiple of n_kv_heads; q 16-byte aligned; pools 16-byte aligned, a pool block under 2 GiB; blockDim
// 4 warps.
// `out` may be `q`: a workgroup reads all its q rows before it writes any of its out rows, and no other
// workgroup touches them.
#include "hip_compat.h"
#include "matrix_cores.h"            // rf_mma: one warp's 16x16x16 f16 tile on the matrix cores
#include "attention_soft_cap.h"      // the capped entries' rf_attention_soft_cap
#include "prompt_attention_tiles.h"  // a head size's Tile, Params, Shared, and a step's K and V rows (Rows, Fetch)

namespace {
namespace rf_prompt_attention {

// The rows of an accumulator tile a lane holds, and the lanes that hold one row. NVIDIA: lane 4g + t holds rows
// g (accumulators 0, 1, 4, 5) and g + 8 (2, 3, 6, 7), with lanes 4g .. 4g + 3. The AMD kinds and the FMA path:
// accumulator i is a row of its own, held by the 16 lanes of one l / 16. A row's max, sum and visible keys are
// kept once per lane (kLaneRows), not once per accumulator.
#if RF_MMA_KIND == RF_MMA_NV_M16N8K16
constexpr int kRowLanes = 4;
constexpr int kLaneRows = 2;
static __device__ __forceinline__ int lane_row_of(int acc) { return (acc >> 1) & 1; }
static __device__ __forceinline__ int acc_of_lane_row(int r) { return 2 * r; }
#else
constexpr int kRowLanes = 16;
constexpr int kLaneRows = RF_MMA_ACC;
static __device__ __forceinline__ int lane_row_of(int acc) { return acc; }
static __device__ __forceinline__ int acc_of_lane_row(int r) { return r; }
#endif

static __device__ __forceinline__ unsigned int pack_halves(float lo, float hi) {
  return (unsigned int)rf_float_to_f16(lo) | (unsigned int)rf_float_to_f16(hi) << 16;
}

// exp2 of (x - reference) where an all -inf reference counts as 0, so that -inf - -inf never occurs.
static __device__ __forceinline__ float safe_reference(float max_value) {
  return max_value == -RF_INFINITY ? 0.0f : max_value;
}

// A lane's values of its rows combined over the lanes that hold each row (max or sum).
template <bool kMax>
static __device__ __forceinline__ void reduce_rows(float (&v)[kLaneRows]) {
#pragma unroll
  for (int o = 1; o < kRowLanes; o <<= 1)
#pragma unroll
    for (int r = 0; r < kLaneRows; ++r) {
      const float other = __shfl_xor(v[r], o);
      v[r] = kMax ? fmaxf(v[r], other) : v[r] + other;
    }
}

// kCap: the soft-capped entries (the scores in base 2, softcap * log2(e) their cap); kSinks: the entries with a sink
// logit per query head (gpt-oss's attn_sinks), which joins each row's max and denominator and adds no value.
template <int HD, bool kCap, bool kSinks>
__device__ __forceinline__ void attend(const Params& p, Shared<HD>& sh) {
  using T = Tile<HD>;
  constexpr int NT = HD / 16;  // matrix tiles of columns
  constexpr int kRowWarps = T::kRowWarps, kKeys = T::kKeys, kMaxTokens = T::kMaxTokens;
  constexpr int kQStride = T::kQStride, kKStride = T::kKStride, kVStride = T::kVStride, kPStride = T::kPStride;
  constexpr int NO = NT / T::kColumnSplit;  // the output's column tiles a warp accumulates
  constexpr int kKeyTiles = kKeys / 16;
  const int tid = (int)threadIdx.x, threads = (int)blockDim.x;
  const int lane = tid % WARP_SIZE, warp = tid / WARP_SIZE;
  const int row_warp = warp / T::kColumnSplit, part = warp % T::kColumnSplit;  // its row tile, its columns' share
  const int group = p.n_heads / p.n_kv_heads;
  const int hpw = kRowWarps % 4 == 0 && group % 4 == 0 ? 4 : group % 2 == 0 ? 2 : 1;  // query heads per workgroup
  const int chunks = group / hpw, tokens = kRows * (kRowWarps / hpw);
  const int units = p.n_kv_heads * chunks;
  const int n_tiles = (p.n_tokens + tokens - 1) / tokens;
  const int tile = n_tiles - 1 - (int)blockIdx.x / units;  // the last query tiles first
  if (tile < 0) return;  // uniform: workgroups past the launch's tiles
  const int unit = (int)blockIdx.x % units, kv_head = unit / chunks;
  const int first_head = kv_head * group + (unit % chunks) * hpw;
  const int head = first_head + row_warp % hpw;  // this warp's head and first token of the workgroup's
  const int row0 = kRows * (row_warp / hpw);
  const int t0 = tile * tokens;

  for (int i = tid; i < tokens; i += threads) {
    const int t = t0 + i;
    sh.seq[i] = t < p.n_tokens ? p.token_seq[t] : 0;
    sh.pos[i] = t < p.n_tokens ? p.positions[t] : -1;
  }
  // q staged as f16, scale * log2(e) folded in; row w * 16 + r is row tile w's row r.
  const float q_scale = p.scale * kLog2e;
  const float cap = kCap ? p.softcap * kLog2e : 0.0f, two_over_cap = kCap ? 2.0f / p.softcap : 0.0f;
  for (int e = tid; e < kMaxTokens * (HD / 4); e += threads) {
    const int R = e / (HD / 4), c = 4 * (e % (HD / 4));
    const int w = R / kRows, t = t0 + kRows * (w / hpw) + R % kRows;
    float4 v = {0.0f, 0.0f, 0.0f, 0.0f};
    if (t < p.n_tokens)
      v = *reinterpret_cast<const float4*>(p.q + ((unsigned long long)t * p.n_heads + first_head + w % hpw) * HD + c);
    unsigned int* dst = reinterpret_cast<unsigned int*>(sh.q + R * kQStride + c);
    dst[0] = pack_halves(v.x * q_scale, v.y * q_scale);
    dst[1] = pack_halves(v.z * q_scale, v.w * q_scale);
  }
  __syncthreads();
  // q's fragments are loaded from shared memory at every step rather than kept: the registers go to the next
  // step's K and V rows in flight, which hide the loads' latency (block table, then rows) behind the products.
  const unsigned short* my_q = sh.q + row_warp * kRows * kQStride;

  int block_shift = 0;
  while ((1 << block_shift) < p.block_size) ++block_shift;
  const unsigned int row_bytes = (unsigned int)HD * 2;
  Rows rows = {nullptr, (unsigned int)p.num_blocks, (unsigned int)(p.n_kv_heads * p.block_size) * row_bytes, row_bytes,
               block_shift, p.block_size - 1, (unsigned long long)kv_head * p.block_size * row_bytes};

  // o: this warp's columns 16 (part NO + c) + ..; l: this lane's part of its rows' sums until the end
  float o[NO][RF_MMA_ACC], m[kLaneRows], l[kLaneRows];
#pragma unroll
  for (int r = 0; r < kLaneRows; ++r) m[r] = -RF_INFINITY, l[r] = 0.0f;
#pragma unroll
  for (int c = 0; c < NO; ++c)
#pragma unroll
    for (int e = 0; e < RF_MMA_ACC; ++e) o[c][e] = 0.0f;
  unsigned short* my_p = sh.p[row_warp];

  for (int rb = 0; rb < tokens;) {  // runs of one sequence (uniform: every thread reads the same shared values)
    if (sh.pos[rb] < 0) {
      ++rb;
      continue;
    }
    const int seq = sh.seq[rb];
    int re = rb, lo = 0x7fffffff, hi = -1;
    for (; re < tokens && sh.pos[re] >= 0 && sh.seq[re] == seq; ++re) {
      lo = lesser(lo, p.window > 0 ? greater(sh.pos[re] - p.window + 1, 0) : 0);
      hi = greater(hi, sh.pos[re]);
    }
    // This warp's keys in the run, and the last key of each of its lane's rows (-1: outside the run).
    int warp_lo = 0x7fffffff, warp_hi = -1;
    for (int r = row0; r < row0 + kRows; ++r)
      if (r >= rb && r < re) {
        warp_lo = lesser(warp_lo, p.window > 0 ? greater(sh.pos[r] - p.window + 1, 0) : 0);
        warp_hi = greater(warp_hi, sh.pos[r]);
      }
    // A row sees keys row_last - window_keys .. row_last (window_keys: window - 1, or all before it).
    const int window_keys = p.window > 0 ? p.window - 1 : 0x7fffffff;
    int row_last[kLaneRows];
#pragma unroll
    for (int lr = 0; lr < kLaneRows; ++lr) {
      const int r = row0 + rf_mma_acc_row(lane, acc_of_lane_row(lr));
      row_last[lr] = r >= rb && r < re ? sh.pos[r] : -1;
    }
    rows.table = p.block_tables + (unsigned long long)seq * p.max_blocks;

    Fetch<HD> next;
    if (kPrefetch) next.issue(p, rows, lo, hi, tid);
    for (int k0 = lo; k0 <= hi; k0 += kKeys) {
      __syncthreads();  // every warp is done with the previous step's K, V and weights
      if (kPrefetch)
        next.store(sh, tid);
      else
        Fetch<HD>::load_and_store(p, rows, k0, hi, tid, sh);
      __syncthreads();
      if (kPrefetch && k0 + kKeys <= hi) next.issue(p, rows, k0 + kKeys, hi, tid);  // in flight during the products
      const bool active = k0 <= warp_hi && k0 + kKeys - 1 >= warp_lo;  // uniform across the warp
      if (active) {
        float s[kKeyTiles][RF_MMA_ACC];
#pragma unroll
        for (int n = 0; n < kKeyTiles; ++n)
#pragma unroll
          for (int e = 0; e < RF_MMA_ACC; ++e) s[n][e] = 0.0f;
#pragma unroll
        for (int c = 0; c < NT; ++c) {  // each q fragment loaded once, for every key tile
          RfMmaA a;
          rf_mma_load_a(a, my_q + 16 * c, kQStride);
#pragma unroll
          for (int n = 0; n < kKeyTiles; ++n) {
            RfMmaB b;
            rf_mma_load_b(b, sh.k + 16 * n * kKStride + 16 * c, kKStride);
            rf_mma(s[n], a, b);
          }
        }
        if (kCap) {  // before the mask: a capped -inf would mask nothing
#pragma unroll
          for (int n = 0; n < kKeyTiles; ++n)
#pragma unroll
            for (int e = 0; e < RF_MMA_ACC; ++e) s[n][e] = rf_attention_soft_cap(s[n][e], cap, two_over_cap);
        }
        float mx[kLaneRows];
#pragma unroll
        for (int r = 0; r < kLaneRows; ++r) mx[r] = -RF_INFINITY;
#pragma unroll
        for (int e = 0; e < RF_MMA_ACC; ++e) {
          const int r = lane_row_of(e);
#pragma unroll
          for (int n = 0; n < kKeyTiles; ++n) {
            const int key = k0 + 16 * n + rf_mma_acc_col(lane, e);
            if (key > row_last[r] || row_last[r] - key > window_keys) s[n][e] = -RF_INFINITY;
            mx[r] = fmaxf(mx[r], s[n][e]);
          }
        }
        reduce_rows<true>(mx);
        float ref[kLaneRows];
#pragma unroll
        for (int r = 0; r < kLaneRows; ++r) {
          const float m_new = fmaxf(m[r], mx[r]);
          ref[r] = safe_reference(m_new);
          const float correction = exp2f(m[r] - ref[r]);
          m[r] = m_new;
          l[r] *= correction;
          mx[r] = correction;
        }
#pragma unroll
        for (int e = 0; e < RF_MMA_ACC; ++e) {
          const int r = lane_row_of(e);
#pragma unroll
          for (int c = 0; c < NO; ++c) o[c][e] *= mx[r];
#pragma unroll
          for (int n = 0; n < kKeyTiles; ++n) {
            const float w = exp2f(s[n][e] - ref[r]);
            l[r] += w;
            if (part == 0)  // a row tile's warps have the same weights: one writes them
              my_p[rf_mma_acc_row(lane, e) * kPStride + 16 * n + rf_mma_acc_col(lane, e)] = rf_float_to_f16(w);
          }
        }
      }
      __syncthreads();  // the weights are in shared memory
      if (active) {
#pragma unroll
        for (int n = 0; n < kKeyTiles; ++n) {
          RfMmaA a;
          rf_mma_load_a(a, my_p + 16 * n, kPStride);
#pragma unroll
          for (int c = 0; c < NO; ++c) {
            RfMmaB b;
            rf_mma_load_b(b, sh.vt + 16 * (part * NO + c) * kVStride + 16 * n, kVStride);
            rf_mma(o[c], a, b);
          }
        }
      }
    }
    rb = re;
  }

  reduce_rows<false>(l);
  float row_scale[kLaneRows];  // what each row's accumulators are multiplied by: 1 / its softmax's denominator
#pragma unroll
  for (int r = 0; r < kLaneRows; ++r) {
    if (kSinks) {  // the sink in base 2, as the scores; a row that saw no key keeps m = -inf, so kept = 0
      const float sink = p.sinks[head] * kLog2e, top = fmaxf(m[r], sink), kept = exp2f(m[r] - top);
      row_scale[r] = kept / (l[r] * kept + exp2f(sink - top));
    } else {
      row_scale[r] = l[r] > 0.0f ? 1.0f / l[r] : 0.0f;  // padding rows saw no key: zero
    }
  }
#pragma unroll
  for (int e = 0; e < RF_MMA_ACC; ++e) {
    const int t = t0 + row0 + rf_mma_acc_row(lane, e);
    if (t >= p.n_tokens) continue;
    const float inv = row_scale[lane_row_of(e)];
    const unsigned long long row = ((unsigned long long)t * p.n_heads + head) * HD;
    if (p.out_f16) {  // uniform: a kernel argument
      unsigned short* out_row = reinterpret_cast<unsigned short*>(p.out) + row;
#pragma unroll
      for (int c = 0; c < NO; ++c)
        out_row[16 * (part * NO + c) + rf_mma_acc_col(lane, e)] = rf_float_to_f16(o[c][e] * inv);
    } else {
      float* out_row = p.out + row;
#pragma unroll
      for (int c = 0; c < NO; ++c) out_row[16 * (part * NO + c) + rf_mma_acc_col(lane, e)] = o[c][e] * inv;
    }
  }
}

}  // namespace rf_prompt_attention
}  // namespace

// prompt_attention_f16_d<head_dim>[_softcap](out, q, k_pool, v_pool, block_tables, token_seq, positions, n_tokens,
// n_heads, n_kv_heads, head_dim, block_size, max_blocks, num_blocks, window, scale, out_f16, softcap); blockDim 4
// warps; out_f16 1: out is written as f16 (the o product reads it so,
// hipcore/model/blocks.py), 0: float32. One entry per head size (multiples of 16 up to 128, and 256): each gets the
// registers of its own accumulators (one kernel that switched over them all took the largest's and spilled on
// sm_90). The `_softcap` entries (below) cap the scores at `softcap` (Gemma 2); the others ignore it (the launcher
// passes 0), and compile as without the cap: its arithmetic would take registers from them all.
// BOUNDS: the launch bounds; head size 112 says one workgroup per SM at least, without which ptxas held it to 168
// registers on sm_80 and spilled 12 bytes.
#define RF_PROMPT_ATTENTION_KERNEL(NAME, HD, CAP, SINKS, BOUNDS, SINKS_PARAM, SINKS_ARG)                            \
  extern "C" __global__ BOUNDS void NAME(                                                                          \
      float* out, const float* q, const void* __restrict__ k_pool, const void* __restrict__ v_pool,               \
      const int* __restrict__ block_tables, const int* __restrict__ token_seq, const int* __restrict__ positions, \
      int n_tokens, int n_heads, int n_kv_heads, int head_dim, int block_size, int max_blocks, int num_blocks,     \
      int window, float scale, int out_f16, float softcap SINKS_PARAM) {                                           \
    rf_grid_dependency_sync(); /* a programmatic launch (hipcore/ops/prompt_attention.py) */                      \
    __shared__ __attribute__((aligned(16))) rf_prompt_attention::Shared<HD> sh;                                   \
    const rf_prompt_attention::Params p = {out, q, static_cast<const unsigned char*>(k_pool),                     \
                                           static_cast<const unsigned char*>(v_pool), block_tables, token_seq,     \
                                           positions, n_tokens, n_heads, n_kv_heads, head_dim, block_size,         \
                                           max_blocks, num_blocks, window, scale, out_f16, softcap, SINKS_ARG};    \
    rf_check_wave_size();                                                                                          \
    if (head_dim == HD) rf_prompt_attention::attend<HD, CAP, SINKS>(p, sh); /* the launcher picks the entry */    \
  }
#define RF_NO_SINKS_PARAM
#define RF_SINKS_PARAM , const float* __restrict__ sinks
#define RF_PROMPT_ATTENTION_ENTRY(HD, BOUNDS) \
  RF_PROMPT_ATTENTION_KERNEL(prompt_attention_f16_d##HD, HD, false, false, BOUNDS, RF_NO_SINKS_PARAM, nullptr)
#define RF_PROMPT_ATTENTION_CAPPED_ENTRY(HD, BOUNDS) \
  RF_PROMPT_ATTENTION_KERNEL(prompt_attention_f16_d##HD##_softcap, HD, true, false, BOUNDS, RF_NO_SINKS_PARAM, nullptr)
#define RF_PROMPT_ATTENTION_SINKS_ENTRY(HD, BOUNDS) \
  RF_PROMPT_ATTENTION_KERNEL(prompt_attention_f16_d##HD##_sinks, HD, false, true, BOUNDS, RF_SINKS_PARAM, sinks)

#define RF_PROMPT_ATTENTION_BOUNDS __launch_bounds__(4 * WARP_SIZE)
RF_PROMPT_ATTENTION_ENTRY(16, RF_PROMPT_ATTENTION_BOUNDS)
RF_PROMPT_ATTENTION_ENTRY(32, RF_PROMPT_ATTENTION_BOUNDS)
RF_PROMPT_ATTENTION_ENTRY(48, RF_PROMPT_ATTENTION_BOUNDS)
RF_PROMPT_ATTENTION_ENTRY(64, RF_PROMPT_ATTENTION_BOUNDS)
RF_PROMPT_ATTENTION_ENTRY(80, RF_PROMPT_ATTENTION_BOUNDS)
RF_PROMPT_ATTENTION_ENTRY(96, RF_PROMPT_ATTENTION_BOUNDS)
RF_PROMPT_ATTENTION_ENTRY(112, __launch_bounds__(4 * WARP_SIZE, 1))
RF_PROMPT_ATTENTION_ENTRY(128, RF_PROMPT_ATTENTION_BOUNDS)
RF_PROMPT_ATTENTION_ENTRY(256, RF_PROMPT_ATTENTION_BOUNDS)
// Capped entries for the head sizes of the models that cap their scores (Gemma 2: 128 at 27B, 256 at 2B and 9B;
// hipcore/ops/prompt_attention.py's SOFTCAP_HEAD_DIMS): with the cap, sm_90's d32 and d64 spilled 8-12 bytes.
RF_PROMPT_ATTENTION_CAPPED_ENTRY(128, RF_PROMPT_ATTENTION_BOUNDS)
RF_PROMPT_ATTENTION_CAPPED_ENTRY(256, RF_PROMPT_ATTENTION_BOUNDS)
// Entries with sinks (the trailing `sinks p`: float32 [n_heads]) for gpt-oss's heads of 64 and the tiny test models'
// 32 (hipcore/ops/prompt_attention.py's SINKS_HEAD_DIMS).
RF_PROMPT_ATTENTION_SINKS_ENTRY(32, RF_PROMPT_ATTENTION_BOUNDS)
RF_PROMPT_ATTENTION_SINKS_ENTRY(64, RF_PROMPT_ATTENTION_BOUNDS)
