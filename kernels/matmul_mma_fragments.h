// Part of the matmul_mma op (kernels/matmul_mma.hip includes it after its launch, split-K and shared-tile
// definitions, which this part uses; built and hashed with it: hipcore/runtime/kernels.py source_files):
// NVIDIA's fragment path for the K-quants' decode batches.
#pragma once
#include "hip_compat.h"
#include "matrix_cores.h"  // rf_mma: one warp's 16x16x16 f16 tile on the matrix cores
#include "matmul_mma_fragment_formats.h"  // each format's lane loads and decodes, the lanes' k order

namespace {
namespace mmq {

#if RF_MMA_KIND == RF_MMA_NV_M16N8K16
// Whether F loads whole super-blocks for the direct items (superblock_item): Q4_K's and Q5_K's formats, on sm_90
// (and in the emulation). On sm_80 nvcc 13 spilled 4 bytes of the SwiGLU pair's direct entries at 128 registers with
// them, and no sm_80 GPU has measured either form: sm_80 keeps fragment_item's steps.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
constexpr bool kSuperblockLoads = false;
#else
constexpr bool kSuperblockLoads = true;
#endif
template <class F>
struct HasBlockLoads {
  static constexpr bool value = false;
};
template <bool kFiveBit>
struct HasBlockLoads<WideFragments<kFiveBit>> {
  static constexpr bool value = kSuperblockLoads;
};

// fragment_item's direct (8-token) item for Q4_K and Q5_K: its weights loaded a super-block at a time, two in
// registers (one decoded while the next loads), where fragment_item keeps kDepth steps in flight, each step's loads
// issued on their own one step apart. A row's 144 (176) bytes are asked for together: on an NVIDIA H200 the 8B's
// batch of 8 went 1,613-1,620 -> 1,715-1,720 t/s, the 1B's 5,973 -> 6,242-6,252
// (docs/history/2026-12-02-superblock-loads.md). A super-block only partly in the split's columns is loaded whole and
// its other steps skipped.
template <class F, bool kPair>
__device__ __forceinline__ void superblock_item(const Launch& a, int tile, int split, int key, int* last, bool& waited,
                                                const Launch* pair, int pair_key) {
  typedef typename F::Step Step;
  constexpr int kStepCols = Step::kStepCols;
  const float* __restrict__ x = static_cast<const float*>(a.x);
  const int rows = a.rows, cols = a.cols, n_tokens = a.n_tokens, splits = a.splits;
  const int tid = (int)threadIdx.x, lane = tid % WARP_SIZE, warp = tid / WARP_SIZE, g = lane >> 2, t = lane & 3;
  const unsigned long long row_bytes = Step::row_bytes(cols);
  const int row_tiles = (rows + kTileRows - 1) / kTileRows;
  const int steps = cols / kStepCols;
  const int c_begin = (int)((long long)split * steps / splits) * kStepCols;
  const int c_end = (int)((long long)(split + 1) * steps / splits) * kStepCols;
  const int r0 = (tile % row_tiles) * kTileRows, t0 = (tile / row_tiles) * kDirectTokens;
  const unsigned char* w_src[2];
#pragma unroll
  for (int e = 0; e < 2; ++e) w_src[e] = a.W + (unsigned long long)lesser_of(r0 + 16 * warp + g + 8 * e, rows - 1) * row_bytes;
  const float* x_src = x + (unsigned long long)lesser_of(t0 + g, n_tokens - 1) * cols;
  float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  const int sb_begin = c_begin & ~255, sb_last = (c_end - 1) & ~255;
  typename F::Block blk[2][2];  // [buffer][row]
#pragma unroll
  for (int e = 0; e < 2; ++e) blk[0][e] = F::load_block(w_src[e], sb_begin, t);
  if (!waited) {  // uniform
    rf_grid_dependency_sync();
    waited = true;
  }
  auto run = [&](const typename F::Block (&k)[2], int sb) {
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int c0 = sb + j * kStepCols;
      if (c0 < c_begin || c0 >= c_end) continue;  // uniform
      float4 xd[4];
#pragma unroll
      for (int s = 0; s < 4; ++s) xd[s] = *reinterpret_cast<const float4*>(x_src + Step::column(c0, frag_column(s, t)));
      unsigned int pairs[2][8];
#pragma unroll
      for (int e = 0; e < 2; ++e) F::decode(typename F::Raw{k[e].head, k[e].q[j], k[e].h}, c0, pairs[e]);
#pragma unroll
      for (int s = 0; s < 4; ++s) {
        const unsigned int fa[4] = {pairs[0][2 * s], pairs[1][2 * s], pairs[0][2 * s + 1], pairs[1][2 * s + 1]};
        const unsigned int fb[2] = {pack_f16(xd[s].x, xd[s].y), pack_f16(xd[s].z, xd[s].w)};
        rf_mma_m16n8k16_f16(acc, fa, fb);
      }
    }
  };
  for (int sb = sb_begin; sb <= sb_last; sb += 512) {
#pragma unroll
    for (int e = 0; e < 2; ++e) blk[1][e] = F::load_block(w_src[e], lesser_of(sb + 256, sb_last), t);
    run(blk[0], sb);
    if (sb + 256 > sb_last) break;  // uniform
#pragma unroll
    for (int e = 0; e < 2; ++e) blk[0][e] = F::load_block(w_src[e], lesser_of(sb + 512, sb_last), t);
    run(blk[1], sb + 256);
  }
  constexpr int kCombineBatch = F::kCombineFloats / 4;
  if (splits > 1 && !combine_splits<kCombineBatch>(acc, a, key, split, tid, last)) return;  // uniform
#pragma unroll
  for (int e = 0; e < 4; ++e) store_result(a, r0 + 16 * warp + g + 8 * (e >> 1), t0 + 2 * t + (e & 1), acc[e]);
  if constexpr (kPair) swiglu_pair<kDirectTokens, true>(*pair, pair_key, r0, t0, tid, last);
}

// One item of the tiles of 128 rows x TN tokens (kStreamTokens: x staged; kDirectTokens: x from memory) with the
// weights' fragments from registers (see above): split `split` of tile `tile` of a's product, its partials and
// counter at workspace tile `key` (tile itself in a launch of one product; the tile's place among all three in
// qkv_fragment_tiles'). waited: whether this workgroup has waited for the kernel ahead (the first item waits
// once its weights are loading).
// kPair: the item is one product of a SwiGLU pair (swiglu_fragment_tiles): its whole tile stored, it counts itself in
// the pair's counter pair_key and the second of the two writes silu(gate) * up over pair's gate tile. Q4_K's and Q5_K's direct items
// are superblock_item's.
template <class F, int TN, bool kPair = false>
__device__ __forceinline__ void fragment_item(const Launch& a, int tile, int split, int key, unsigned short* xs,
                                              int* last, bool& waited, const Launch* pair = nullptr,
                                              int pair_key = 0) {
  typedef typename F::Step Step;
  constexpr bool kStaged = TN != kDirectTokens;
  if constexpr (!kStaged && HasBlockLoads<F>::value) {
    superblock_item<F, kPair>(a, tile, split, key, last, waited, pair, pair_key);
    return;
  }
  constexpr int kStepCols = Step::kStepCols, kDepth = F::kDepth;
  constexpr int kXLoads = kStaged ? TN * kStepCols / 4 / kThreads : 1;  // float4s of staged x per thread
  constexpr int kXPerToken = kStepCols / 4;
  constexpr int kTokenTiles = TN / 8;  // 16 x 8 products per k-substep
  constexpr int kAcc = kTokenTiles * 4;
  static_assert(kWarps * 16 == kTileRows && kXLoads >= 1, "eight warps of 16 rows");
  static_assert(TN == kStreamTokens || TN == kDirectTokens, "the two tile shapes");
  const float* __restrict__ x = static_cast<const float*>(a.x);
  const int rows = a.rows, cols = a.cols, n_tokens = a.n_tokens, splits = a.splits;
  const int tid = (int)threadIdx.x, lane = tid % WARP_SIZE, warp = tid / WARP_SIZE, g = lane >> 2, t = lane & 3;
  const unsigned long long row_bytes = Step::row_bytes(cols);
  const int row_tiles = (rows + kTileRows - 1) / kTileRows;
  const int steps = cols / kStepCols;
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
  }
  // A programmatic launch (the K-quant entries defer their wait to here): the first item's weight loads, which
  // no kernel writes, are in flight while the kernel ahead finishes; x, y and the workspace only after it.
  if (!waited) {  // uniform
    rf_grid_dependency_sync();
    waited = true;
  }
  if constexpr (kStaged) {
#pragma unroll
    for (int d = 0; d < kDepth; ++d) {
      const int c = lesser_of(c_begin + d * kStepCols, c_end - kStepCols);
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

  constexpr int kCombineBatch = F::kCombineFloats > kAcc ? F::kCombineFloats / kAcc : 1;
  if (splits > 1 && !combine_splits<kCombineBatch>(acc, a, key, split, tid, last)) return;  // uniform

  // c0, c1: row g, tokens 2t, 2t + 1 of token tile j; c2, c3: row g + 8.
#pragma unroll
  for (int j = 0; j < kTokenTiles; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e)
      store_result(a, r0 + 16 * warp + g + 8 * (e >> 1), t0 + 8 * j + 2 * t + (e & 1), acc[4 * j + e]);
  if constexpr (kPair) swiglu_pair<TN, true>(*pair, pair_key, r0, t0, tid, last);
}

// The tiles of 128 rows x TN tokens of a's product, one item (tile, split) after another; the same items, split
// ranges, workspace and results as mma_tiles<Step, 32, ...> (a direct tile's partials are a quarter of the
// workspace slot's size).
template <class F, int TN>
__device__ __forceinline__ void fragment_tiles(const Launch& a, unsigned short* xs, int* last) {
  const int tiles = ((a.rows + kTileRows - 1) / kTileRows) * ((a.n_tokens + TN - 1) / TN);
  const int items = tiles * a.splits;
  // For the kernel ahead: the first item waits (fragment_item). The 32-element formats' entries wait first (a
  // wait there raised their registers: Q8_0's direct entry 79 -> 86, past three workgroups an SM).
  bool waited = !F::kWeightsBeforeWait;
  for (int item = (int)blockIdx.x; item < items; item += (int)gridDim.x) {  // uniform across the workgroup
    const int tile = item / a.splits;
    fragment_item<F, TN>(a, tile, item - tile * a.splits, tile, xs, last, waited);
  }
}

// A decode batch's feed-forward input in one launch: h = silu(x W_gate^T) * (x W_up^T), both of a's format, into a.y
// (float32, the gate's scratch first; the down product's x), a.y_up the up product's scratch. Each tile's gate and
// up are two items side by side (pair item 2 tile + product), each split into a.splits column ranges whose partials
// and counters are the pair item's (combine_splits); the whole tiles then meet through the pair's counter, 2 tiles
// + tile (swiglu_pair). One launch instead of gate, up and silu_mul: the two products share their waves and the
// activation needs no launch of its own.
template <class F, int TN>
__device__ __forceinline__ void swiglu_fragment_tiles(const Launch& a, unsigned short* xs, int* last) {
  const int tiles = ((a.rows + kTileRows - 1) / kTileRows) * ((a.n_tokens + TN - 1) / TN);
  const int items = 2 * tiles * a.splits;
  bool waited = !F::kWeightsBeforeWait;
  for (int item = (int)blockIdx.x; item < items; item += (int)gridDim.x) {  // uniform across the workgroup
    const int pair_item = item / a.splits, split = item - pair_item * a.splits;
    const int tile = pair_item >> 1, product = pair_item & 1;
    const Launch own = {product ? a.y_up : a.y, product ? a.W_up : a.W, a.x, a.workspace, a.rows, a.cols, a.n_tokens,
                        a.splits, 0};
    fragment_item<F, TN, true>(own, tile, split, pair_item, xs, last, waited, &a, 2 * tiles + tile);
  }
}

// The attention input's three products of one x (q, k and v: K-quants, each of its own type) in one launch, so
// that k's and v's few row tiles share the q tiles' waves instead of paying a launch and a tail each. Their tiles
// are numbered q's, then k's, then v's (the workspace's counters and partials follow that numbering), each split
// into q.splits column ranges; types: Q4_K 0, Q5_K 1, Q6_K 2 (hipcore/ops/matmul_mma_qkv.py QKV_TYPE_CODES), or one
// 32-element format for all three (Single).
struct QkvLaunch {
  float* y[3];
  const unsigned char* W[3];
  int rows[3], type[3];
  const void* x;
  unsigned char* workspace;
  int cols, n_tokens, splits;
};

template <class T>
static __device__ __forceinline__ T of_three(const T (&v)[3], int m) {
  return m == 0 ? v[0] : m == 1 ? v[1] : v[2];
}

// Single: the one fragment format of all three products (the 32-element formats' entries, whose q, k and v share a
// type; they wait first, as fragment_tiles says), or void: each product's K-quant by its type code.
template <class T>
struct IsVoid {
  static constexpr bool value = false;
};
template <>
struct IsVoid<void> {
  static constexpr bool value = true;
};

template <int TN, class Single = void>
__device__ __forceinline__ void qkv_fragment_tiles(const QkvLaunch& q, unsigned short* xs, int* last) {
  const int token_tiles = (q.n_tokens + TN - 1) / TN;
  const int first_k = ((q.rows[0] + kTileRows - 1) / kTileRows) * token_tiles;
  const int first_v = first_k + ((q.rows[1] + kTileRows - 1) / kTileRows) * token_tiles;
  const int items = (first_v + ((q.rows[2] + kTileRows - 1) / kTileRows) * token_tiles) * q.splits;
  bool waited = false;
  if constexpr (!IsVoid<Single>::value) waited = !Single::kWeightsBeforeWait;
  for (int item = (int)blockIdx.x; item < items; item += (int)gridDim.x) {  // uniform across the workgroup
    const int key = item / q.splits, split = item - key * q.splits;
    const int m = key < first_k ? 0 : key < first_v ? 1 : 2;
    // Selected, not indexed: an index into the parameters put the whole struct on the stack.
    const Launch a = {of_three(q.y, m), of_three(q.W, m), q.x, q.workspace, of_three(q.rows, m), q.cols, q.n_tokens,
                      q.splits, 0};
    const int tile = key - (m == 0 ? 0 : m == 1 ? first_k : first_v);
    if constexpr (!IsVoid<Single>::value) {
      fragment_item<Single, TN>(a, tile, split, key, xs, last, waited);
    } else {
      switch (of_three(q.type, m)) {  // uniform
        case 0: fragment_item<WideFragments<false>, TN>(a, tile, split, key, xs, last, waited); break;
        case 1: fragment_item<WideFragments<true>, TN>(a, tile, split, key, xs, last, waited); break;
        default: fragment_item<Wide6Fragments, TN>(a, tile, split, key, xs, last, waited); break;
      }
    }
  }
}
#endif

}  // namespace mmq
}  // namespace
