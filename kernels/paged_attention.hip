// Paged attention: causal grouped-query attention whose K and V are read through block tables, for
// decode (one query token per sequence) and prompt evaluation (many) alike.
//
//   out[t, h, :] = sum_j softmax_j(scale * q[t, h, :] . K[j]) V[j]   over keys j = first .. positions[t]
//
// of the sequence token_seq[t] (first = 0, or with a sliding window of `window` > 0 keys, as Gemma's local
// layers attend, first = max(0, positions[t] - window + 1): the window holds the token itself and the
// window - 1 keys before it, llama.cpp's rule. Keys before the window are never read, nor their
// block-table entries, which the KV cache may already have pointed at the null block), where key j lives in physical block block_tables[seq][j / block_size]
// at offset j % block_size, for KV head h / (n_heads / n_kv_heads). Layouts: q and out float32
// [n_tokens, n_heads, head_dim]; pools [num_blocks, n_kv_heads, block_size, row] in the KV format;
// block_tables int32 [n_seqs, max_blocks]; token_seq and positions int32 [n_tokens]. A negative
// position marks a padding token: its output rows are zero and nothing is read for it.
//
// The `_softcap` entry points (Gemma 2's attention logit soft-capping) cap every score before the softmax:
// S = softcap * tanh(scale * q . K[j] / softcap), as llama.cpp does to the scaled scores; the others ignore
// `softcap` (the launcher passes 0 to them).
// The `_sinks` entry points (gpt-oss's attn_sinks, float32 [n_heads], one more argument) add exp(sink - M) to every
// softmax's denominator, M the largest of the scores and the sink (ggml's soft_max with sinks), once per (token,
// head): in the workgroup's merge when the keys are not split, in the combining workgroup's when they are.
//
// Work split (1-D grid of n_tokens x n_kv_heads x `slots` workgroups; hipcore/ops/paged_attention.py
// picks `slots` and mirrors the plan in paged_attention_plan.h). Each token's plan is made in the kernel from its own
// context length, so a graph captured with fixed arguments adapts to the context at every replay;
// workgroups past the plan's count exit at once.
// - Normally a workgroup serves one token, one KV head and up to four of the query heads that read it
//   (the group's heads in balanced chunks of at most four), so each K/V row it loads serves them all.
// - Decoding has few tokens: a token with a context of at most kSpreadMaxContext keys, in a launch of
//   at most kSpreadMaxWorkgroups (token, query head) pairs, takes one workgroup per query head
//   instead (the group's workgroups read the same rows, from the L2 cache after the first). A single
//   workgroup's work is bound by its issue rate, so this divides the latency by the group size,
//   without the cost of combining splits.
// - A longer context's keys are split among up to `slots / chunks` (at most kMaxSplits) workgroups
//   per chunk, each with at least kMinKeysPerSplit keys (a split costs a fence, an atomic and a
//   combine: about as much as 128 keys). With one split the workgroup writes `out` itself; with
//   several, each writes its partial result (max, sum, unnormalized output) to the workspace, and the
//   last to finish, found with a fence and a per-(token, KV head, chunk) counter, combines them and
//   sets the counter back to zero. The counters must be zero before the first launch (see the
//   launcher). Without a workspace nothing is split.
// - Inside a workgroup each of 4 warps takes tiles of keys in turn. A key's row is spread over
//   lanes_per_key lanes, 8 elements each (16-byte loads for f16/bf16, 32 for f32, q8_0's 2-byte
//   aligned blocks with 2-byte loads); the dot products finish with xor shuffles within those lanes,
//   all of a tile's at once. Every key slot of a warp keeps its own running max and sum (online
//   softmax, float32, base 2 with log2(e) folded into q), then the slots merge with shuffles and the
//   warps through shared memory.
// - The loads are pipelined: while a warp computes one tile, the K and V rows of its next tile are in
//   flight, and the block-table entries of the tile after that. Decoding at short contexts is bound
//   by the latency of these loads, not by bandwidth.
// Requirements the launcher checks: head_dim a multiple of 8 up to 256, block_size a power of two,
// n_heads a multiple of n_kv_heads, q 16-byte aligned, a pool block (n_kv_heads x block_size rows)
// under 2 GiB. Block size: 4 warps (the launch bounds).
// `out` may be `q`: every read of q happens before the writes to out of the same rows.
#include "hip_compat.h"
#include "paged_attention_formats.h"  // the constants and the KV formats
#include "attention_soft_cap.h"        // the capped entries' rf_attention_soft_cap
#include "paged_attention_tiles.h"    // a warp's walk over its keys (Walk, fetch_blocks, load_rows, consume)
#include "paged_attention_plan.h"     // Params, the work's plan, the workspace, prefetch_rows

namespace rf_paged_attention {

// ---- the kernel --------------------------------------------------------------------------------

struct Shared {
  float o[kMaxWarps][kMaxGroupHeads][kMaxHeadDim];  // each warp's unnormalized output
  float m[kMaxWarps][kMaxGroupHeads];               // its running max (base 2)
  float l[kMaxWarps][kMaxGroupHeads];               // its sum of exponentials
  float split_weight[kMaxGroupHeads][kMaxSplits];   // the combining workgroup's factor per split
  int last;
};

template <class KV, int NG, bool kCap, bool kSinks>
__device__ __forceinline__ void attend(const Params& p, Shared& sh, const int* __restrict__ table, int token, int kv_head,
                                       int first_head, int first_key, int ctx, const Plan& plan, int split,
                                       int counter_index) {
  const int hd = p.head_dim;
  const int tid = (int)threadIdx.x, threads = (int)blockDim.x;
  const int lane = tid % WARP_SIZE, warp = tid / WARP_SIZE;
  const int all_warps = threads / WARP_SIZE;
  const int key_warps = min(all_warps, kMaxWarps);
  float* out_rows = p.out + ((unsigned long long)token * p.n_heads + first_head) * hd;  // NG heads, contiguous

  // Lane roles: lanes_per_key consecutive lanes hold one key's row, 8 elements each.
  int lanes_per_key = 1;
  while (lanes_per_key * kChunk < hd) lanes_per_key <<= 1;
  const int keys_per_warp = WARP_SIZE / lanes_per_key;
  constexpr int U = KV::kUnroll;
  const int tile = keys_per_warp * U;  // keys of one warp's step
  const int k_begin = first_key + split * plan.keys_per_split;
  const int k_end = min(ctx, k_begin + plan.keys_per_split);

  const int key_slot = lane / lanes_per_key, chunk = lane % lanes_per_key;
  const bool chunk_live = chunk * kChunk < hd;  // head_dim 80 uses 10 of 16 lanes
  const int load_chunk = chunk_live ? chunk : 0;
  const int dim0 = load_chunk * kChunk;

  const float q_scale = p.scale * kLog2e;
  float qv[NG][kChunk];
#pragma unroll
  for (int g = 0; g < NG; ++g) {
    const float4* qp = reinterpret_cast<const float4*>(p.q + ((unsigned long long)token * p.n_heads + first_head + g) * hd + dim0);
    const float4 a = qp[0], b = qp[1];
    const float s = chunk_live ? q_scale : 0.0f;
    qv[g][0] = a.x * s; qv[g][1] = a.y * s; qv[g][2] = a.z * s; qv[g][3] = a.w * s;
    qv[g][4] = b.x * s; qv[g][5] = b.y * s; qv[g][6] = b.z * s; qv[g][7] = b.w * s;
  }

  Walk w;
  w.table = table;
  w.row_bytes = KV::row_bytes(hd);
  const unsigned int head_stride = (unsigned int)p.block_size * w.row_bytes;
  w.block_stride = head_stride * (unsigned int)p.n_kv_heads;
  const int lane_at = KV::lane_offset(load_chunk);
  w.k_lane = p.k_pool + (unsigned long long)kv_head * head_stride + lane_at;
  w.v_lane = p.v_pool + (unsigned long long)kv_head * head_stride + lane_at;
  w.aux = KV::lane_aux(load_chunk);
  w.keys_per_warp = keys_per_warp;
  w.key_slot = key_slot;
  w.last_key = k_end - 1;
  w.block_shift = 0;
  while ((1 << w.block_shift) < p.block_size) ++w.block_shift;
  w.in_block_mask = p.block_size - 1;
  w.num_blocks = (unsigned int)p.num_blocks;
  w.cap = kCap ? p.softcap * kLog2e : 0.0f;
  w.two_over_cap = kCap ? 2.0f / p.softcap : 0.0f;

  float m[NG], l[NG], acc[NG][kChunk];
#pragma unroll
  for (int g = 0; g < NG; ++g) {
    m[g] = -RF_INFINITY;
    l[g] = 0.0f;
#pragma unroll
    for (int j = 0; j < kChunk; ++j) acc[g][j] = 0.0f;
  }

  // The warp's tiles, two buffers in turn: the rows of the next tile load while this one is folded
  // in, and the blocks of the one after. (A copy from one buffer to the other would wait for the
  // loads, hence the two halves of the loop.) Warps past kMaxWarps start past the end. The trip count
  // is uniform per warp, as the shuffles need.
  const int warp_stride = key_warps * tile;
  int base = warp < kMaxWarps ? k_begin + warp * tile : k_end;
  typename KV::Raw k0[U], v0[U], k1[U], v1[U];
  unsigned int blocks[U];
  if (base < k_end) {
    fetch_blocks<U>(w, base, blocks);
    load_rows<KV>(w, base, blocks, k0, v0);
    fetch_blocks<U>(w, base + warp_stride, blocks);
  }
  while (base < k_end) {
    int next = base + warp_stride;
    if (next < k_end) {
      load_rows<KV>(w, next, blocks, k1, v1);
      fetch_blocks<U>(w, next + warp_stride, blocks);
    }
    consume<KV, NG, kCap>(w, base, k_end, lanes_per_key, k0, v0, qv, m, l, acc);
    base = next;
    if (base >= k_end) break;
    next = base + warp_stride;
    if (next < k_end) {
      load_rows<KV>(w, next, blocks, k0, v0);
      fetch_blocks<U>(w, next + warp_stride, blocks);
    }
    consume<KV, NG, kCap>(w, base, k_end, lanes_per_key, k1, v1, qv, m, l, acc);
    base = next;
  }

  // Merge the key slots of the warp (lanes lanes_per_key apart hold the same elements).
  for (int o = lanes_per_key; o < WARP_SIZE; o <<= 1) {
#pragma unroll
    for (int g = 0; g < NG; ++g) {
      const float m_other = __shfl_xor(m[g], o), l_other = __shfl_xor(l[g], o);
      const float mx = fmaxf(m[g], m_other);
      const float r = safe_reference(mx);
      const float mine = exp2f(m[g] - r), theirs = exp2f(m_other - r);
      l[g] = l[g] * mine + l_other * theirs;
#pragma unroll
      for (int j = 0; j < kChunk; ++j) acc[g][j] = acc[g][j] * mine + __shfl_xor(acc[g][j], o) * theirs;
      m[g] = mx;
    }
  }
  if (warp < key_warps) {
    if (key_slot == 0 && chunk_live) {
#pragma unroll
      for (int g = 0; g < NG; ++g)
#pragma unroll
        for (int j = 0; j < kChunk; ++j) sh.o[warp][g][dim0 + j] = acc[g][j];
    }
    if (lane == 0) {
#pragma unroll
      for (int g = 0; g < NG; ++g) {
        sh.m[warp][g] = m[g];
        sh.l[warp][g] = l[g];
      }
    }
  }
  __syncthreads();

  // Merge the warps: warp 0 saw the split's first key, so the max is finite.
  const int n_split = plan.n_split;
  const Workspace ws = n_split > 1 ? workspace_layout(p, plan) : Workspace{nullptr, nullptr, nullptr};
  const unsigned long long first_partial = ((unsigned long long)token * p.n_heads + first_head) * plan.split_stride;
  for (int i = tid; i < NG * hd; i += threads) {
    const int g = i / hd, dim = i - g * hd;
    float mx = sh.m[0][g];
    for (int w2 = 1; w2 < key_warps; ++w2) mx = fmaxf(mx, sh.m[w2][g]);
    // A sink (base 2, as the scores) joins the max and the denominator once: here when the keys are not split, in
    // the combine below when they are.
    const float sink = kSinks && n_split == 1 ? p.sinks[first_head + g] * kLog2e : -RF_INFINITY;
    mx = fmaxf(mx, sink);
    float sum = 0.0f, o = 0.0f;
    for (int w2 = 0; w2 < key_warps; ++w2) {
      const float f = exp2f(sh.m[w2][g] - mx);
      sum = fmaf(sh.l[w2][g], f, sum);
      o = fmaf(sh.o[w2][g][dim], f, o);
    }
    if (n_split == 1) {
      if (kSinks) sum += exp2f(sink - mx);
      out_rows[i] = o / sum;
    } else {
      const unsigned long long at = first_partial + (unsigned long long)g * plan.split_stride + split;
      ws.partial[at * hd + dim] = o;
      if (dim == 0) {
        ws.stats[2 * at] = mx;
        ws.stats[2 * at + 1] = sum;
      }
    }
  }
  if (n_split == 1) return;

  // Publish the partial result; the last of the token's splits to arrive combines them all. Every
  // thread fences its own writes (AMD's fence waits for the wave's own stores only), and the thread
  // that counts fences again after the barrier, so that the count is seen only after every write.
  __threadfence();
  __syncthreads();
  if (tid == 0) {
    __threadfence();
    sh.last = atomicAdd(ws.counters + counter_index, 1) == n_split - 1;
  }
  __syncthreads();
  if (!sh.last) return;
  __threadfence();

  // Each split's factor: exp2(max_s - max) / total sum, one warp per head. Volatile reads: other
  // workgroups wrote these during this kernel, so no cached copy may answer.
  for (int g = warp; g < NG; g += all_warps) {
    const volatile float* stats = ws.stats + 2 * (first_partial + (unsigned long long)g * plan.split_stride);
    float mx = -RF_INFINITY;
    for (int s0 = 0; s0 < n_split; s0 += WARP_SIZE)
      if (s0 + lane < n_split) mx = fmaxf(mx, stats[2 * (s0 + lane)]);
    mx = warp_max(mx);
    const float sink = kSinks ? p.sinks[first_head + g] * kLog2e : -RF_INFINITY;
    mx = fmaxf(mx, sink);
    float sum = 0.0f;
    for (int s0 = 0; s0 < n_split; s0 += WARP_SIZE)
      if (s0 + lane < n_split) sum += stats[2 * (s0 + lane) + 1] * exp2f(stats[2 * (s0 + lane)] - mx);
    sum = rf_warp_sum(sum);
    if (kSinks) sum += exp2f(sink - mx);
    for (int s0 = 0; s0 < n_split; s0 += WARP_SIZE)
      if (s0 + lane < n_split) sh.split_weight[g][s0 + lane] = exp2f(stats[2 * (s0 + lane)] - mx) / sum;
  }
  __syncthreads();
  // The partial rows: a thread's values together (NG * hd / threads of them: 4 at a chunk of 4 heads of 128 and warps
  // of 32, 2 at wave 64), eight splits of each at a time: four times (at wave 64 twice) the loads in flight of one value
  // at a time, whose round trips were the combine's time (docs/history/2026-12-07-paged-attention-matrix-cores.md).
  constexpr int kBatch = 8, kValues = 128 / WARP_SIZE;
  for (int i0 = tid; i0 < NG * hd; i0 += kValues * threads) {
    const volatile float* partial[kValues];
    int head_of[kValues];
    bool live[kValues];  // a thread past the chunk's values loads nothing for them (heads of 64: 2 of 4 live)
    float o[kValues];
#pragma unroll
    for (int v = 0; v < kValues; ++v) {
      live[v] = i0 + v * threads < NG * hd;
      const int i = live[v] ? i0 + v * threads : i0, g = i / hd, dim = i - g * hd;
      partial[v] = ws.partial + (first_partial + (unsigned long long)g * plan.split_stride) * hd + dim;
      head_of[v] = g;
      o[v] = 0.0f;
    }
    for (int s0 = 0; s0 < n_split; s0 += kBatch) {
      float part[kValues][kBatch];
#pragma unroll
      for (int v = 0; v < kValues; ++v)
#pragma unroll
        for (int j = 0; j < kBatch; ++j)
          part[v][j] = live[v] && s0 + j < n_split ? partial[v][(unsigned long long)(s0 + j) * hd] : 0.0f;
#pragma unroll
      for (int v = 0; v < kValues; ++v)
#pragma unroll
        for (int j = 0; j < kBatch; ++j)
          if (s0 + j < n_split) o[v] = fmaf(sh.split_weight[head_of[v]][s0 + j], part[v][j], o[v]);
    }
#pragma unroll
    for (int v = 0; v < kValues; ++v)
      if (live[v]) out_rows[i0 + v * threads] = o[v];
  }
  if (tid == 0) ws.counters[counter_index] = 0;  // ready for the next launch
}

// The entries defer their wait to here (rf_grid_dependency_deferred): what comes before it reads only the
// step's positions, sequences and block tables, which the host uploads before the step's first kernel and no
// kernel writes, and prefetches the rows they name (prefetch_rows); q, the pools' data, `out` and the
// workspace come after it (tests/test_programmatic_launch.py checks the order on this source).
template <class KV, bool kCap, bool kSinks>
__device__ __forceinline__ void run(const Params& p) {
  __shared__ Shared sh;  // one instance for every head count: the switch below picks one per workgroup
  rf_check_wave_size();
  int rest = (int)blockIdx.x;
  const int slot = rest % p.slots;
  rest /= p.slots;
  const int kv_head = rest % p.n_kv_heads;
  const int token = rest / p.n_kv_heads;
  if (token >= p.n_tokens) return;
  const int group = p.n_heads / p.n_kv_heads;
  const long long capacity = (long long)p.max_blocks * p.block_size;
  const long long wanted_ctx = (long long)p.positions[token] + 1;
  const int seq = p.token_seq[token];  // loaded beside the position: the table's address waits on it
  const int ctx = (int)(wanted_ctx < capacity ? wanted_ctx : capacity);
  // The first key the token sees: its window's, or the sequence's first. The plan divides only those.
  const int first_key = p.window > 0 && ctx > p.window ? ctx - p.window : 0;
  int lanes_per_key = 1;
  while (lanes_per_key * kChunk < p.head_dim) lanes_per_key <<= 1;
  // (a padding token's plan, of one key, is never used: no division by an empty split)
  const Plan plan = make_plan(p, max(ctx - first_key, 1), kMaxWarps * (WARP_SIZE / lanes_per_key) * KV::kUnroll);
  const bool attends = ctx > 0 && slot < plan.n_chunks * plan.n_split;
  const int chunk = slot / plan.n_split, split = slot - chunk * plan.n_split;
  const int* __restrict__ table = p.block_tables + (unsigned long long)seq * p.max_blocks;
  const int split_begin = first_key + split * plan.keys_per_split;
  if (attends)
    prefetch_rows<KV>(p, table, kv_head, split_begin, min(ctx, split_begin + plan.keys_per_split),
                      kPrefetchKeys / plan.n_split);
  rf_grid_dependency_sync();  // a programmatic launch (hipcore/ops/paged_attention.py)
  if (ctx <= 0) {  // a padding token: the KV head's first workgroup zeroes the group's rows
    if (slot == 0) {
      float* rows = p.out + ((unsigned long long)token * p.n_heads + kv_head * group) * p.head_dim;
      for (int i = (int)threadIdx.x; i < group * p.head_dim; i += (int)blockDim.x) rows[i] = 0.0f;
    }
    return;
  }
  if (!attends) return;
  const int first_head = kv_head * group + chunk * plan.chunk_heads;
  const int counter_index = (token * p.n_kv_heads + kv_head) * plan.n_chunks + chunk;  // used when splitting only
  switch (min(plan.chunk_heads, group - chunk * plan.chunk_heads)) {
    case 1: attend<KV, 1, kCap, kSinks>(p, sh, table, token, kv_head, first_head, first_key, ctx, plan, split, counter_index); break;
    case 2: attend<KV, 2, kCap, kSinks>(p, sh, table, token, kv_head, first_head, first_key, ctx, plan, split, counter_index); break;
    case 3: attend<KV, 3, kCap, kSinks>(p, sh, table, token, kv_head, first_head, first_key, ctx, plan, split, counter_index); break;
    case 4: attend<KV, 4, kCap, kSinks>(p, sh, table, token, kv_head, first_head, first_key, ctx, plan, split, counter_index); break;
    default: break;
  }
}

}  // namespace rf_paged_attention

// The launcher's block: 4 warps, 128 threads on NVIDIA and RDNA, 256 on CDNA. Bounding the kernel to
// it with RF_ATTENTION_MIN_BLOCKS workgroups per multiprocessor (on AMD: waves per SIMD) caps the
// registers so that several workgroups fit, for prompts and large batches, yet leaves a thread room for
// four query heads' q and outputs and two tiles of rows in flight without spilling.
#define RF_ATTENTION_THREADS (rf_paged_attention::kMaxWarps * WARP_SIZE)
#define RF_ATTENTION_MIN_BLOCKS 2

#define RF_PAGED_ATTENTION_KERNEL(name, KV, CAP)                                                                      \
  extern "C" __global__ __launch_bounds__(RF_ATTENTION_THREADS, RF_ATTENTION_MIN_BLOCKS) void name(                 \
      float* out, const float* q, const void* __restrict__ k_pool, const void* __restrict__ v_pool,                   \
      const int* __restrict__ block_tables, const int* __restrict__ token_seq, const int* __restrict__ positions,     \
      void* workspace, int n_tokens, int n_heads, int n_kv_heads, int head_dim, int block_size, int max_blocks,       \
      int num_blocks, int slots, int window, float scale, float softcap) {                                            \
    rf_grid_dependency_deferred(); /* waits in run(), after prefetching its rows */                                  \
    const rf_paged_attention::Params p = {out, q, static_cast<const unsigned char*>(k_pool),                         \
                                          static_cast<const unsigned char*>(v_pool), block_tables, token_seq,         \
                                          positions, workspace, n_tokens, n_heads, n_kv_heads, head_dim, block_size,  \
                                          max_blocks, num_blocks, slots, window, scale, softcap, nullptr};            \
    rf_paged_attention::run<rf_paged_attention::KV, CAP, false>(p);                                                   \
  }

// The soft-capped variants (Gemma 2) are their own entry points, so that the kernels every other model runs
// compile exactly as without the cap: its arithmetic would otherwise take registers from them all.
RF_PAGED_ATTENTION_KERNEL(paged_attention_f16, F16Kv, false)
RF_PAGED_ATTENTION_KERNEL(paged_attention_bf16, BF16Kv, false)
RF_PAGED_ATTENTION_KERNEL(paged_attention_f32, F32Kv, false)
RF_PAGED_ATTENTION_KERNEL(paged_attention_q8_0, Q8_0Kv, false)
RF_PAGED_ATTENTION_KERNEL(paged_attention_f16_softcap, F16Kv, true)
RF_PAGED_ATTENTION_KERNEL(paged_attention_bf16_softcap, BF16Kv, true)
RF_PAGED_ATTENTION_KERNEL(paged_attention_f32_softcap, F32Kv, true)
RF_PAGED_ATTENTION_KERNEL(paged_attention_q8_0_softcap, Q8_0Kv, true)
#include "paged_attention_sinks.h"  // the `_sinks` entries: RF_PAGED_ATTENTION_SINKS_KERNEL
