// Paged attention: causal grouped-query attention whose K and V are read through block tables, for
// decode (one query token per sequence) and prompt evaluation (many) alike.
//
//   out[t, h, :] = sum_j softmax_j(scale * q[t, h, :] . K[j]) V[j]   over keys j = 0 .. positions[t]
//
// of the sequence token_seq[t], where key j lives in physical block block_tables[seq][j / block_size]
// at offset j % block_size, for KV head h / (n_heads / n_kv_heads). Layouts: q and out float32
// [n_tokens, n_heads, head_dim]; pools [num_blocks, n_kv_heads, block_size, row] in the KV format;
// block_tables int32 [n_seqs, max_blocks]; token_seq and positions int32 [n_tokens]. A negative
// position marks a padding token: its output rows are zero and nothing is read for it.
//
// Work split (1-D grid, see hipcore/ops/paged_attention.py for the sizes):
// - A workgroup serves one token, one KV head and up to four of the query heads that read it (the
//   group's heads come in balanced chunks of at most four), so each K/V row it loads serves them all.
// - Decoding has few tokens and long contexts, so a token's keys are also split among up to
//   `max_splits` workgroups. Each token's split count is chosen in the kernel from its own context
//   length (splits of at least kMinKeysPerSplit keys), so a graph captured with fixed arguments
//   adapts to the context at every replay; workgroups past a token's split count exit at once. With
//   one split the workgroup writes `out` itself; with several, each writes its partial result (max,
//   sum, unnormalized output) to the workspace, and the last to finish, found with a fence and a
//   per-(token, KV head, chunk) counter, combines them and sets the counter back to zero. The
//   workspace's counters must be zero before the first launch (see the launcher).
// - Inside a workgroup each of 4 warps takes tiles of keys in turn. A key's row is spread over
//   lanes_per_key lanes, 8 elements each (16-byte loads for f16/bf16, 32 for f32, q8_0's 2-byte
//   aligned blocks with 2-byte loads); the dot products finish with xor shuffles within those lanes.
//   Every key slot of a warp keeps its own running max and sum (online softmax, float32, base 2 with
//   log2(e) folded into q), then the slots merge with shuffles and the warps through shared memory.
// - Each lane loads kUnroll keys' K and V before it uses the first, to keep loads in flight: decoding
//   at short contexts is bound by the latency of these loads, not by bandwidth.
// Requirements the launcher checks: head_dim a multiple of 8 up to 256, block_size a power of two,
// n_heads a multiple of n_kv_heads, q 16-byte aligned. Block size: 4 warps (the launch bounds).
// `out` may be `q`: every read of q happens before the writes to out of the same rows.
#include "hip_compat.h"

namespace rf_paged_attention {

constexpr int kChunk = 8;              // row elements per lane
constexpr int kMaxWarps = 4;           // warps per workgroup (the kernel's launch bounds)
constexpr int kMaxGroupHeads = 4;      // query heads served by one workgroup
constexpr int kMaxHeadDim = 256;       // kChunk * 32: a key per 32 lanes at most
constexpr int kMaxSplits = 64;         // the launcher never asks for more
constexpr int kMinKeysPerSplit = 64;   // the launcher sizes max_splits with the same figure
constexpr float kLog2e = 1.4426950408889634f;

// ---- KV formats: the raw words of one lane's 8 elements, loaded apart from decoding them ---------

struct F16Kv {
  typedef uint4 Raw;
  static constexpr int kUnroll = 4;
  static __device__ __forceinline__ unsigned long long row_bytes(int head_dim) { return (unsigned long long)head_dim * 2; }
  static __device__ __forceinline__ Raw load(const unsigned char* __restrict__ row, int chunk) {
    return *reinterpret_cast<const uint4*>(row + 16 * chunk);
  }
  static __device__ __forceinline__ void decode(const Raw r, float v[kChunk]) {
    const unsigned int w[4] = {r.x, r.y, r.z, r.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      v[2 * i] = rf_f16_to_float((unsigned short)(w[i] & 0xffffu));
      v[2 * i + 1] = rf_f16_to_float((unsigned short)(w[i] >> 16));
    }
  }
};

struct BF16Kv {
  typedef uint4 Raw;
  static constexpr int kUnroll = 4;
  static __device__ __forceinline__ unsigned long long row_bytes(int head_dim) { return (unsigned long long)head_dim * 2; }
  static __device__ __forceinline__ Raw load(const unsigned char* __restrict__ row, int chunk) {
    return *reinterpret_cast<const uint4*>(row + 16 * chunk);
  }
  static __device__ __forceinline__ void decode(const Raw r, float v[kChunk]) {
    const unsigned int w[4] = {r.x, r.y, r.z, r.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      v[2 * i] = rf_uint_as_float(w[i] << 16);
      v[2 * i + 1] = rf_uint_as_float(w[i] & 0xffff0000u);
    }
  }
};

struct F32Kv {
  struct Raw {
    float4 a, b;
  };
  static constexpr int kUnroll = 2;  // twice the bytes per key: half the keys in flight, same registers
  static __device__ __forceinline__ unsigned long long row_bytes(int head_dim) { return (unsigned long long)head_dim * 4; }
  static __device__ __forceinline__ Raw load(const unsigned char* __restrict__ row, int chunk) {
    const float4* p = reinterpret_cast<const float4*>(row + 32 * chunk);
    return {p[0], p[1]};
  }
  static __device__ __forceinline__ void decode(const Raw r, float v[kChunk]) {
    v[0] = r.a.x; v[1] = r.a.y; v[2] = r.a.z; v[3] = r.a.w;
    v[4] = r.b.x; v[5] = r.b.y; v[6] = r.b.z; v[7] = r.b.w;
  }
};

// Q8_0 block: {half d; int8 q[32]}, 34 bytes, value d * q; chunk c is q[8(c%4) .. 8(c%4)+7] of block c/4.
struct Q8_0Kv {
  struct Raw {
    unsigned short d, q[4];
  };
  static constexpr int kUnroll = 4;
  static __device__ __forceinline__ unsigned long long row_bytes(int head_dim) { return (unsigned long long)(head_dim / 32) * 34; }
  static __device__ __forceinline__ Raw load(const unsigned char* __restrict__ row, int chunk) {
    const unsigned short* block = reinterpret_cast<const unsigned short*>(row + (chunk >> 2) * 34);
    const unsigned short* q = block + 1 + 4 * (chunk & 3);
    return {block[0], {q[0], q[1], q[2], q[3]}};
  }
  static __device__ __forceinline__ void decode(const Raw r, float v[kChunk]) {
    const float d = rf_f16_to_float(r.d);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      v[2 * i] = d * (float)(signed char)(r.q[i] & 0xffu);
      v[2 * i + 1] = d * (float)(signed char)(r.q[i] >> 8);
    }
  }
};

// ---- the kernel --------------------------------------------------------------------------------

struct Params {
  float* out;
  const float* q;
  const unsigned char* __restrict__ k_pool;
  const unsigned char* __restrict__ v_pool;
  const int* __restrict__ block_tables;
  const int* __restrict__ token_seq;
  const int* __restrict__ positions;
  void* workspace;
  int n_tokens, n_heads, n_kv_heads, head_dim, block_size, max_blocks, num_blocks, max_splits;
  float scale;
};

struct Shared {
  float o[kMaxWarps][kMaxGroupHeads][kMaxHeadDim];  // each warp's unnormalized output
  float m[kMaxWarps][kMaxGroupHeads];               // its running max (base 2)
  float l[kMaxWarps][kMaxGroupHeads];               // its sum of exponentials
  float split_weight[kMaxGroupHeads][kMaxSplits];   // the combining workgroup's factor per split
  int last;
};

// Workspace: [int counters per (token, KV head, head chunk)], padded to 256 bytes, then float
// stats [token, head, split, {max, sum}], then float partial outputs [token, head, split, head_dim].
struct Workspace {
  int* counters;
  float* stats;
  float* partial;
};

static __device__ __forceinline__ Workspace workspace_layout(const Params& p, int n_chunks) {
  const unsigned long long counter_bytes = ((unsigned long long)p.n_tokens * p.n_kv_heads * n_chunks * 4 + 255) & ~255ull;
  unsigned char* base = static_cast<unsigned char*>(p.workspace);
  float* stats = reinterpret_cast<float*>(base + counter_bytes);
  return {reinterpret_cast<int*>(base), stats, stats + (unsigned long long)p.n_tokens * p.n_heads * p.max_splits * 2};
}

static __device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int offset = WARP_SIZE / 2; offset > 0; offset >>= 1) v = fmaxf(v, __shfl_xor(v, offset));
  return v;
}

// exp2 of (x - reference) where an all -inf reference counts as 0, so that -inf - -inf never occurs:
// a key slot that has seen no key yet has max -inf, and everything it holds is zero.
static __device__ __forceinline__ float safe_reference(float max_value) {
  return max_value == -RF_INFINITY ? 0.0f : max_value;
}

template <class KV, int NG>
__device__ __forceinline__ void attend(const Params& p, Shared& sh, int token, int kv_head, int first_head, int split,
                                       int counter_index, int n_chunks) {
  const int hd = p.head_dim;
  const int tid = (int)threadIdx.x, threads = (int)blockDim.x;
  const int lane = tid % WARP_SIZE, warp = tid / WARP_SIZE;
  const int all_warps = threads / WARP_SIZE;
  const int key_warps = min(all_warps, kMaxWarps);
  float* out_rows = p.out + ((unsigned long long)token * p.n_heads + first_head) * hd;  // NG heads, contiguous

  const long long capacity = (long long)p.max_blocks * p.block_size;
  const long long wanted_ctx = (long long)p.positions[token] + 1;
  const int ctx = (int)(wanted_ctx < capacity ? wanted_ctx : capacity);
  if (ctx <= 0) {  // a padding token
    if (split == 0)
      for (int i = tid; i < NG * hd; i += threads) out_rows[i] = 0.0f;
    return;
  }
  // Lane roles: lanes_per_key consecutive lanes hold one key's row, 8 elements each.
  int lanes_per_key = 1;
  while (lanes_per_key * kChunk < hd) lanes_per_key <<= 1;
  const int keys_per_warp = WARP_SIZE / lanes_per_key;
  constexpr int U = KV::kUnroll;
  const int tile = keys_per_warp * U;  // keys of one warp's step

  // Splits: as many as allowed with at least kMinKeysPerSplit keys each, their length rounded up to
  // whole steps of the workgroup (no step half empty), and every split non-empty.
  const int step_keys = key_warps * tile;
  int n_split = min(min(p.max_splits, kMaxSplits), (ctx + kMinKeysPerSplit - 1) / kMinKeysPerSplit);
  n_split = max(n_split, 1);
  int keys_per_split = (ctx + n_split - 1) / n_split;
  keys_per_split = (keys_per_split + step_keys - 1) / step_keys * step_keys;
  n_split = (ctx + keys_per_split - 1) / keys_per_split;
  if (split >= n_split) return;
  const int k_begin = split * keys_per_split;
  const int k_end = min(ctx, k_begin + keys_per_split);

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

  const int* __restrict__ table = p.block_tables + (unsigned long long)p.token_seq[token] * p.max_blocks;
  int block_shift = 0;
  while ((1 << block_shift) < p.block_size) ++block_shift;
  const unsigned long long row_bytes = KV::row_bytes(hd);
  const unsigned long long head_stride = (unsigned long long)p.block_size * row_bytes;
  const unsigned long long block_stride = head_stride * p.n_kv_heads;
  const unsigned char* __restrict__ k_base = p.k_pool + kv_head * head_stride;
  const unsigned char* __restrict__ v_base = p.v_pool + kv_head * head_stride;

  float m[NG], l[NG], acc[NG][kChunk];
#pragma unroll
  for (int g = 0; g < NG; ++g) {
    m[g] = -RF_INFINITY;
    l[g] = 0.0f;
#pragma unroll
    for (int j = 0; j < kChunk; ++j) acc[g][j] = 0.0f;
  }

  // Warps past kMaxWarps start past the end and take no keys. The trip count is uniform per warp.
  for (int base = warp < kMaxWarps ? k_begin + warp * tile : k_end; base < k_end; base += key_warps * tile) {
    typename KV::Raw k_raw[U], v_raw[U];
    bool live[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int wanted = base + u * keys_per_warp + key_slot;
      live[u] = wanted < k_end;
      const int key = live[u] ? wanted : k_begin;  // a dead slot loads a real row and is masked below
      int block = table[key >> block_shift];
      block = (unsigned int)block < (unsigned int)p.num_blocks ? block : 0;  // never outside the pool
      const unsigned long long at = (unsigned long long)block * block_stride + (unsigned long long)(key & (p.block_size - 1)) * row_bytes;
      k_raw[u] = KV::load(k_base + at, load_chunk);
      v_raw[u] = KV::load(v_base + at, load_chunk);
    }
    float s[U][NG];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      float kf[kChunk];
      KV::decode(k_raw[u], kf);
#pragma unroll
      for (int g = 0; g < NG; ++g) {
        float d = 0.0f;
#pragma unroll
        for (int j = 0; j < kChunk; ++j) d = fmaf(qv[g][j], kf[j], d);
        for (int o = 1; o < lanes_per_key; o <<= 1) d += __shfl_xor(d, o);
        s[u][g] = live[u] ? d : -RF_INFINITY;
      }
    }
    float ref[NG];
#pragma unroll
    for (int g = 0; g < NG; ++g) {
      float mx = m[g];
#pragma unroll
      for (int u = 0; u < U; ++u) mx = fmaxf(mx, s[u][g]);
      ref[g] = safe_reference(mx);
      const float correction = exp2f(m[g] - ref[g]);
      l[g] *= correction;
#pragma unroll
      for (int j = 0; j < kChunk; ++j) acc[g][j] *= correction;
      m[g] = mx;
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      float vf[kChunk];
      KV::decode(v_raw[u], vf);
#pragma unroll
      for (int g = 0; g < NG; ++g) {
        const float weight = exp2f(s[u][g] - ref[g]);
        l[g] += weight;
#pragma unroll
        for (int j = 0; j < kChunk; ++j) acc[g][j] = fmaf(weight, vf[j], acc[g][j]);
      }
    }
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
  const Workspace ws = n_split > 1 ? workspace_layout(p, n_chunks) : Workspace{nullptr, nullptr, nullptr};
  const unsigned long long first_partial = ((unsigned long long)token * p.n_heads + first_head) * p.max_splits;
  for (int i = tid; i < NG * hd; i += threads) {
    const int g = i / hd, dim = i - g * hd;
    float mx = sh.m[0][g];
    for (int w = 1; w < key_warps; ++w) mx = fmaxf(mx, sh.m[w][g]);
    float sum = 0.0f, o = 0.0f;
    for (int w = 0; w < key_warps; ++w) {
      const float f = exp2f(sh.m[w][g] - mx);
      sum = fmaf(sh.l[w][g], f, sum);
      o = fmaf(sh.o[w][g][dim], f, o);
    }
    if (n_split == 1) {
      out_rows[i] = o / sum;
    } else {
      const unsigned long long at = first_partial + (unsigned long long)g * p.max_splits + split;
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
    const volatile float* stats = ws.stats + 2 * (first_partial + (unsigned long long)g * p.max_splits);
    float mx = -RF_INFINITY;
    for (int s0 = 0; s0 < n_split; s0 += WARP_SIZE)
      if (s0 + lane < n_split) mx = fmaxf(mx, stats[2 * (s0 + lane)]);
    mx = warp_max(mx);
    float sum = 0.0f;
    for (int s0 = 0; s0 < n_split; s0 += WARP_SIZE)
      if (s0 + lane < n_split) sum += stats[2 * (s0 + lane) + 1] * exp2f(stats[2 * (s0 + lane)] - mx);
    sum = rf_warp_sum(sum);
    for (int s0 = 0; s0 < n_split; s0 += WARP_SIZE)
      if (s0 + lane < n_split) sh.split_weight[g][s0 + lane] = exp2f(stats[2 * (s0 + lane)] - mx) / sum;
  }
  __syncthreads();
  for (int i = tid; i < NG * hd; i += threads) {
    const int g = i / hd, dim = i - g * hd;
    const volatile float* partial = ws.partial + (first_partial + (unsigned long long)g * p.max_splits) * hd + dim;
    float o = 0.0f;
    for (int s = 0; s < n_split; ++s) o = fmaf(sh.split_weight[g][s], partial[(unsigned long long)s * hd], o);
    out_rows[i] = o;
  }
  if (tid == 0) ws.counters[counter_index] = 0;  // ready for the next launch
}

template <class KV>
__device__ __forceinline__ void run(const Params& p) {
  __shared__ Shared sh;  // one instance for every head count: the switch below picks one per workgroup
  rf_check_wave_size();
  const int group = p.n_heads / p.n_kv_heads;
  const int n_chunks = (group + kMaxGroupHeads - 1) / kMaxGroupHeads;
  const int chunk_heads = (group + n_chunks - 1) / n_chunks;
  int rest = (int)blockIdx.x;
  const int split = rest % p.max_splits;
  rest /= p.max_splits;
  const int head_chunk = rest % n_chunks;
  rest /= n_chunks;
  const int kv_head = rest % p.n_kv_heads;
  const int token = rest / p.n_kv_heads;
  if (token >= p.n_tokens) return;
  const int first_head = kv_head * group + head_chunk * chunk_heads;
  const int counter_index = (token * p.n_kv_heads + kv_head) * n_chunks + head_chunk;
  switch (min(chunk_heads, group - head_chunk * chunk_heads)) {
    case 1: attend<KV, 1>(p, sh, token, kv_head, first_head, split, counter_index, n_chunks); break;
    case 2: attend<KV, 2>(p, sh, token, kv_head, first_head, split, counter_index, n_chunks); break;
    case 3: attend<KV, 3>(p, sh, token, kv_head, first_head, split, counter_index, n_chunks); break;
    case 4: attend<KV, 4>(p, sh, token, kv_head, first_head, split, counter_index, n_chunks); break;
    default: break;
  }
}

}  // namespace rf_paged_attention

// The launcher's block: 4 warps, 128 threads on NVIDIA and RDNA, 256 on CDNA. Bounding the kernel to it,
// with one workgroup per multiprocessor as the least occupancy asked for (on AMD: one wave per SIMD),
// lets the compilers give a thread all the registers it needs (4 query heads' q and outputs, and the
// rows in flight) instead of spilling: ptxas otherwise stops at 168 and spills a few bytes for q8_0.
#define RF_ATTENTION_THREADS (rf_paged_attention::kMaxWarps * WARP_SIZE)

#define RF_PAGED_ATTENTION_KERNEL(name, KV)                                                                         \
  extern "C" __global__ __launch_bounds__(RF_ATTENTION_THREADS, 1) void name(                                       \
      float* out, const float* q, const void* __restrict__ k_pool, const void* __restrict__ v_pool,                   \
      const int* __restrict__ block_tables, const int* __restrict__ token_seq, const int* __restrict__ positions,     \
      void* workspace, int n_tokens, int n_heads, int n_kv_heads, int head_dim, int block_size, int max_blocks,       \
      int num_blocks, int max_splits, float scale) {                                                                  \
    const rf_paged_attention::Params p = {out, q, static_cast<const unsigned char*>(k_pool),                         \
                                          static_cast<const unsigned char*>(v_pool), block_tables, token_seq,         \
                                          positions, workspace, n_tokens, n_heads, n_kv_heads, head_dim, block_size,  \
                                          max_blocks, num_blocks, max_splits, scale};                                 \
    rf_paged_attention::run<rf_paged_attention::KV>(p);                                                               \
  }

RF_PAGED_ATTENTION_KERNEL(paged_attention_f16, F16Kv)
RF_PAGED_ATTENTION_KERNEL(paged_attention_bf16, BF16Kv)
RF_PAGED_ATTENTION_KERNEL(paged_attention_f32, F32Kv)
RF_PAGED_ATTENTION_KERNEL(paged_attention_q8_0, Q8_0Kv)
