// Part of the matmul_mma op (kernels/matmul_mma.hip includes it after its launch, split-K and shared-tile
// definitions, which this part uses; built and hashed with it: hipcore/runtime/kernels.py source_files):
// NVIDIA's fragment path for the K-quants' decode batches.
#pragma once
#include "hip_compat.h"
#include "matrix_cores.h"  // rf_mma: one warp's 16x16x16 f16 tile on the matrix cores

namespace {
namespace mmq {

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
//   its own pace. Measured on an H100 against the staged entry
//   (docs/history/2026-11-27-fragment-path-kquant-batches.md), 8 tokens: gate/up 41.1
//   -> 31.0 us, q/o 16.5 -> 12.2; Q6_K gains only over short splits (v 11.4 -> 9.1, but the 8B's down 45.5
//   -> 51.1: hipcore/ops/matmul_mma.py DIRECT_Q6K_MAX_SPLIT_STEPS); at 32 tokens every warp rounding every
//   x value cost more than the barriers (gate/up 108 us against 42).
// Q4_K, Q5_K and Q6_K here; Q4_0, Q4_1, Q5_0, Q5_1 and Q8_0 in matmul_mma_block32_fragments.h. Prompt tiles
// keep mma_tiles.
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
  static constexpr int kDepth = kFiveBit ? 2 : 3;  // steps of loads in flight per lane, within 128 registers (staged)
  static constexpr int kCombineFloats = 64;        // combine_splits' partial floats a thread loads a round trip
  static constexpr bool kWeightsBeforeWait = true;  // the first steps' loads overlap the kernel ahead
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
    r.h = kFiveBit ? *reinterpret_cast<const uint2*>(b + rf_blocks::Q5_K::kQhAt + 8 * t) : uint2{0u, 0u};
    return r;
  }
  // pairs[2 s + e]: pair e of k-substep s (code bytes 0..3 feed substeps 0 and 2, bytes 4..7 1 and 3).
  static __device__ __forceinline__ void decode(const Raw& r, int c0, unsigned int pairs[8]) {
    const int j = (c0 & 255) >> 6;
    const KPairScales k = k_pair_scales(r.head, j);
    decode_k_word<kFiveBit>(r.q.x, r.h.x, j, k, pairs + 0, pairs + 4);
    decode_k_word<kFiveBit>(r.q.y, r.h.y, j, k, pairs + 2, pairs + 6);
  }
  // A lane's whole super-block at once (the direct entry: superblock_item): the header, Q5_K's fifth bits and the
  // 8 code bytes of each of its four steps, so that a row's 128 code bytes are asked for together.
  struct Block {
    uint4 head;
    uint2 h, q[4];
  };
  static __device__ __forceinline__ Block load_block(const unsigned char* __restrict__ row, int sb, int t) {
    const unsigned char* b = row + (sb >> 8) * Step::kBlockBytes;
    Block k;
    k.head = *reinterpret_cast<const uint4*>(b);
    k.h = kFiveBit ? *reinterpret_cast<const uint2*>(b + rf_blocks::Q5_K::kQhAt + 8 * t) : uint2{0u, 0u};
#pragma unroll
    for (int j = 0; j < 4; ++j) k.q[j] = *reinterpret_cast<const uint2*>(b + Step::kQsOffset + 32 * j + 8 * t);
    return k;
  }
};

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

// Q6_K: a lane's 8 bytes of ql and of qh (l = 8t .. 8t + 7 of both runs), the two runs' scales, d.
struct Wide6Fragments {
  typedef Wide6 Step;
  static constexpr int kDepth = 2;
  static constexpr int kCombineFloats = 64;
  static constexpr bool kWeightsBeforeWait = true;
  struct Raw {
    unsigned int ql[3], qh[3];
    int scale_a, scale_b, shift;
    unsigned short d;
  };
  static __device__ __forceinline__ Raw load(const unsigned char* __restrict__ row, int c0, int t) {
    const int k = c0 >> 6, h = (k >> 1) & 1, u = k & 1;
    typedef rf_blocks::Q6_K B;
    const unsigned char* b = row + (k >> 2) * B::kBytes;
    Raw r;
    r.shift = load_aligned_words<2>(b + 64 * h + 32 * u + 8 * t, r.ql);  // both at even offsets: one shift
    load_aligned_words<2>(b + B::kQhAt + 32 * h + 8 * t, r.qh);
    r.scale_a = (int)(signed char)b[B::kScalesAt + 8 * h + 2 * u + (t >> 1)];  // scales of 16 elements: l / 16
    r.scale_b = (int)(signed char)b[B::kScalesAt + 8 * h + 2 * u + 4 + (t >> 1)];
    r.d = *reinterpret_cast<const unsigned short*>(b + B::kDAt);
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
// into q.splits column ranges; types: Q4_K 0, Q5_K 1, Q6_K 2 (hipcore/ops/matmul_mma_qkv.py QKV_TYPE_CODES).
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

template <int TN>
__device__ __forceinline__ void qkv_fragment_tiles(const QkvLaunch& q, unsigned short* xs, int* last) {
  const int token_tiles = (q.n_tokens + TN - 1) / TN;
  const int first_k = ((q.rows[0] + kTileRows - 1) / kTileRows) * token_tiles;
  const int first_v = first_k + ((q.rows[1] + kTileRows - 1) / kTileRows) * token_tiles;
  const int items = (first_v + ((q.rows[2] + kTileRows - 1) / kTileRows) * token_tiles) * q.splits;
  bool waited = false;
  for (int item = (int)blockIdx.x; item < items; item += (int)gridDim.x) {  // uniform across the workgroup
    const int key = item / q.splits, split = item - key * q.splits;
    const int m = key < first_k ? 0 : key < first_v ? 1 : 2;
    // Selected, not indexed: an index into the parameters put the whole struct on the stack.
    const Launch a = {of_three(q.y, m), of_three(q.W, m), q.x, q.workspace, of_three(q.rows, m), q.cols, q.n_tokens,
                      q.splits, 0};
    const int tile = key - (m == 0 ? 0 : m == 1 ? first_k : first_v);
    switch (of_three(q.type, m)) {  // uniform
      case 0: fragment_item<WideFragments<false>, TN>(a, tile, split, key, xs, last, waited); break;
      case 1: fragment_item<WideFragments<true>, TN>(a, tile, split, key, xs, last, waited); break;
      default: fragment_item<Wide6Fragments, TN>(a, tile, split, key, xs, last, waited); break;
    }
  }
}
#endif

}  // namespace mmq
}  // namespace
