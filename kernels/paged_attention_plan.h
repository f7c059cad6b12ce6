// Part of the paged_attention op (kernels/paged_attention.hip includes it after paged_attention_tiles.h;
// built and hashed with it: hipcore/runtime/kernels.py source_files): the kernel's arguments and how a
// (token, KV head)'s workgroups share its keys: the plan, the split workspace's layout, and the L2 prefetch
// of a split's rows ahead of the wait for the kernel before.
#pragma once

namespace rf_paged_attention {

struct Params {
  float* out;
  const float* q;
  const unsigned char* __restrict__ k_pool;
  const unsigned char* __restrict__ v_pool;
  const int* __restrict__ block_tables;
  const int* __restrict__ token_seq;
  const int* __restrict__ positions;
  void* workspace;
  int n_tokens, n_heads, n_kv_heads, head_dim, block_size, max_blocks, num_blocks, slots, window;
  float scale;
  float softcap;  // 0: scores as they are
  const float* __restrict__ sinks;  // the `_sinks` entries: a logit per query head in every softmax's denominator
};

// How the `slots` workgroups of one (token, KV head) share its work, from the number of keys the token
// attends to (its context, or its window).
struct Plan {
  int n_chunks;        // workgroups over the group's query heads
  int chunk_heads;     // query heads per chunk (the last chunk may have fewer)
  int n_split;         // workgroups over the keys, per chunk
  int keys_per_split;  // whole steps of the workgroup, so that no step is half empty but the last
  int split_stride;    // splits per (token, query head) in the workspace
};

static __device__ __forceinline__ Plan make_plan(const Params& p, int n_keys, int step_keys) {
  const int group = p.n_heads / p.n_kv_heads;
  const int chunks = (group + kMaxGroupHeads - 1) / kMaxGroupHeads;
  const int split_stride = max(min(p.slots / chunks, kMaxSplits), 1);
  if (group > 1 && p.slots >= group && n_keys <= kSpreadMaxContext &&
      (long long)p.n_tokens * p.n_heads <= kSpreadMaxWorkgroups)
    return {group, 1, 1, n_keys, split_stride};
  const int max_split = p.workspace != nullptr ? split_stride : 1;
  int n_split = max(min(max_split, (n_keys + kMinKeysPerSplit - 1) / kMinKeysPerSplit), 1);
  int keys_per_split = (n_keys + n_split - 1) / n_split;
  keys_per_split = (keys_per_split + step_keys - 1) / step_keys * step_keys;
  n_split = (n_keys + keys_per_split - 1) / keys_per_split;
  return {chunks, (group + chunks - 1) / chunks, n_split, keys_per_split, split_stride};
}

// Workspace: [int counters per (token, KV head, head chunk)], padded to 256 bytes, then float
// stats [token, head, split, {max, sum}], then float partial outputs [token, head, split, head_dim].
struct Workspace {
  int* counters;
  float* stats;
  float* partial;
};

static __device__ __forceinline__ Workspace workspace_layout(const Params& p, const Plan& plan) {
  const unsigned long long counter_bytes =
      ((unsigned long long)p.n_tokens * p.n_kv_heads * plan.n_chunks * 4 + 255) & ~255ull;
  unsigned char* base = static_cast<unsigned char*>(p.workspace);
  float* stats = reinterpret_cast<float*>(base + counter_bytes);
  return {reinterpret_cast<int*>(base), stats,
          stats + (unsigned long long)p.n_tokens * p.n_heads * plan.split_stride * 2};
}

// The K and V rows of keys first .. last - 1 (at most `budget` of them) of one KV head fetched into L2, a
// 128-byte line a thread at a time. Issued before the workgroup waits for the kernel ahead (the q|k|v
// product, whose epilogue stores this step's own K and V row): a decode step's layers stream their weights
// through L2 between two reads of a layer's cache, so otherwise every key's first load waits on DRAM after
// that wait. A prefetch reads no data and a line the kernel ahead then writes is updated in L2 (the point
// of coherence), so it may come before the wait; block numbers outside the pool are skipped. A token's
// workgroups prefetch kPrefetchKeys keys in all, shared among its splits: at short contexts that is every
// key, and the wait for the first rows is what it saves; a long context's keys stream at full bandwidth
// anyway, and prefetching all of them (an 8B's 16 MB a layer at 4,096 keys) while the kernel ahead streams
// its weights cost more than it saved (measured on an H200: tg128 after 4,096 tokens 329 -> 322 t/s).
constexpr int kPrefetchKeys = 512;

template <class KV>
__device__ __forceinline__ void prefetch_rows(const Params& p, const int* __restrict__ table, int kv_head, int first,
                                              int last, int budget) {
  const unsigned int row_bytes = KV::row_bytes(p.head_dim);
  const unsigned int lines = (row_bytes + 127u) / 128u;
  const unsigned long long head_stride = (unsigned long long)p.block_size * row_bytes;
  const unsigned long long block_stride = head_stride * (unsigned int)p.n_kv_heads;
  const int keys = min(last - first, budget);
  int block_shift = 0;
  while ((1 << block_shift) < p.block_size) ++block_shift;
  for (int i = (int)threadIdx.x; i < keys * (int)lines; i += (int)blockDim.x) {
    const int key = first + i / (int)lines;
    const unsigned int line = (unsigned int)(i % (int)lines);
    const unsigned int block = (unsigned int)table[key >> block_shift];
    if (block >= (unsigned int)p.num_blocks) continue;
    const unsigned long long at = block * block_stride + kv_head * head_stride +
                                  (unsigned long long)(key & (p.block_size - 1)) * row_bytes + 128u * line;
    rf_prefetch_l2(p.k_pool + at);
    rf_prefetch_l2(p.v_pool + at);
  }
}

}  // namespace rf_paged_attention
