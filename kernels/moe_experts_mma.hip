// The experts' products of a mixture-of-experts layer on the matrix cores, for prompts and batches whose pairs
// average enough an expert (hipcore/ops/moe_experts_mma.py pays: 4, 8 for MXFP4): the (token, slot) pairs of a
// step grouped by expert and each expert's pairs multiplied as a matrix, TN (32 or 64) pairs at a time, as
// matmul_mma.hip multiplies a prompt (its step shapes and block-format decoders, matmul_mma_formats.h; its warp tiling).
// The per-pair and grouped paths of moe_experts.hip decode a slice of an expert's weights for one or two pairs; here
// each decoded 128 x step tile of weights feeds up to TN pairs on the matrix instructions. On NVIDIA the
// moe_mma_<mode>_<type>_direct entries take the same arguments with tiles of at most 8 pairs, the weights decoded
// straight into mma.sync's fragments (decode batches of a few pairs an expert: below, "Few pairs an expert").
//
//   moe_mma_sort(sorted, tiles, ids, pairs, n_expert, tile_tokens): one workgroup. A counting sort of the pairs
//     (p = t * k + j, ids[p] its expert) by expert into sorted[pairs], and the list of token tiles:
//     tiles[0] = their count n, tiles[1 + 3 i ..] = (expert, first position in sorted, pairs in it <= tile_tokens).
//     The order of one expert's pairs within sorted follows the atomics: nothing depends on it (each pair's result
//     is its own column of the product, computed with the same arithmetic wherever it sits in a tile).
//   moe_mma_<mode>_<type>(out, g, W, x, sorted, tiles, bias, weights, rows, cols, pairs, x_per, n_expert,
//     tile_tokens, max_tiles, activation): for every listed tile and every 128-row tile of W's experts
//     [n_expert, rows, cols], y = W_e . x_row(p) + bias_e for its pairs p, x_row(p) = x[p / x_per] (x_per = k for
//     gate and up, whose input is the token's; 1 for down, whose input h is the pair's), and:
//       gate: out[p, r] = y                                  (float32 [pairs, rows] scratch)
//       up:   out[p, r] = act(g[p, r], y)                     act: silu(g) * u, or gpt-oss's swiglu_oai (activation 1);
//                                                             out is f16 (raw bits) [pairs, rows]: h
//       down: out[p, r] = weights[p] * y                      the weighted terms; moe_experts' moe_sum_slots_f32 adds
//                                                             them into the residual stream in slot order
//     x is f16 (raw bits) in every mode: for gate and up the token's normalized input (the feed-forward's norm writes
//     an f16 copy beside the router's float32 rows: hipcore/ops/rmsnorm.py's also_f16), for down up's h. The products
//     round their input to f16 whichever way it comes, so f16 rows give the same bits as float32 rows rounded at the
//     load, in half the bytes: a float32 x was four times an MXFP4 expert's weight bytes a step.
//     The grid is an upper bound (row tiles x max_tiles); workgroups past the listed tiles have nothing to do.
// Precision as matmul_mma's: W and x rounded to f16 (|w|, |x| below 65504), products exact, sums in f32.
// Requirements the launcher checks: blockDim 256; cols a multiple of the step (32; 64 for the K-quants and the `_s64`
// entries) and of the format's block; W aligned as matmul_mma's; n_expert <= kMaxExperts; the ids valid (a pair whose
// id is out of range is never sorted and its output row is not written).
#include "hip_compat.h"
#include "matrix_cores.h"        // rf_mma: one warp's 16x16x16 f16 tile on the matrix cores
#include "matmul_mma_formats.h"  // the block formats and the step shapes that read them into f16 tiles
#include "matmul_mma_fragment_formats.h"  // NVIDIA: the formats read straight into mma.sync's A fragments
#include "gated_activation.h"    // rf_silu_gated, rf_swiglu_oai_gated

namespace {
namespace moe_mma {

constexpr int kThreads = 256;
constexpr int kTileRows = 128;
constexpr int kMaxStride = 64 + 8;  // halves per shared row: the widest step (64) + 8, as matmul_mma's
constexpr int kMaxTileTokens = 64;
constexpr int kWarps = kThreads / WARP_SIZE;
constexpr int kWarpsDown = 4;  // warps along the rows, 32 rows each
constexpr int kWarpsAcross = kWarps / kWarpsDown;
constexpr int kRowTilesPerWarp = kTileRows / kWarpsDown / 16;
constexpr int kMaxExperts = 512;
constexpr int kGate = 0, kUp = 1, kDown = 2;

struct Args {
  float* out;
  const float* g;
  const unsigned char* W;
  const float* x;
  const int* sorted;
  const int* tiles;
  const float* bias;
  const float* weights;
  int rows, cols, x_per, activation;
};

static __device__ __forceinline__ int lesser(int a, int b) { return a < b ? a : b; }

// Twice<Narrow<F>>: a Narrow step of 64 columns, 8 groups of 8 a row (Narrow's load, store and column take any group
// number: group g is columns c0 + 8g ..). Half the barriers of 32-column steps, twice the loads in flight a step: the
// 32-column steps of the prompts' experts were latency-bound, 1.8-2.1 us a step on an H100
// (docs/history/2026-12-06-moe-grouped-staged.md). The `_s64` entries; the launcher takes them where cols allows
// (hipcore/ops/moe_experts_mma.py: narrow_step_cols).
template <class S>
struct Twice : S {
  static constexpr int kStepCols = 2 * S::kStepCols, kGroupsPerRow = 2 * S::kGroupsPerRow;
};

// Four f16 values (8 bytes, one load): CUDA's uint2; hip_compat.h's vector types for AMD stop at uint4 / float4.
#if defined(RF_NVIDIA)
typedef uint2 HalfQuad;
#else
struct __attribute__((aligned(8))) HalfQuad {
  unsigned int x, y;
};
#endif

// f16 x four values a load (8 bytes): where a tile's step has too few values for mmq::XF16's eight a thread (32
// pairs x 32 columns: 128 loads of 8 for 256 threads), and a lane's k-substep in the few-pairs entries.
struct XF16Quad {
  static constexpr int kValues = 4, kBytes = 2;
  typedef HalfQuad Raw;
  static __device__ __forceinline__ void load_into(Raw& r, const unsigned char* row, int col) {
    r = *reinterpret_cast<const HalfQuad*>(reinterpret_cast<const unsigned short*>(row) + col);
  }
  static __device__ __forceinline__ void store(const Raw& r, unsigned short* dst) { *reinterpret_cast<HalfQuad*>(dst) = r; }
};

// x's loads: eight f16 values a load where every thread has whole ones (kEights), else four (a 32-pair tile's
// 32-column step).
template <bool kEights>
struct HalfLoads {
  typedef mmq::XF16 type;
};
template <>
struct HalfLoads<false> {
  typedef XF16Quad type;
};

// Pair `pair`'s row r of the mode's output from y = (W_e . x_row(pair))[r] (the module comment's epilogues).
template <int kMode>
__device__ __forceinline__ void store_pair(const Args& a, int e, int pair, int r, float y) {
  const unsigned long long at = (unsigned long long)pair * a.rows + r;
  if (a.bias) y += a.bias[(unsigned long long)e * a.rows + r];
  if (kMode == kGate) a.out[at] = y;
  if (kMode == kUp)
    reinterpret_cast<unsigned short*>(a.out)[at] =
        rf_float_to_f16(a.activation ? rf_swiglu_oai_gated(a.g[at], y) : rf_silu_gated(a.g[at], y));
  if (kMode == kDown) a.out[at] = a.weights[pair] * y;
}

// One listed tile of pairs (expert e, sorted[start .. start + count)) times rows [r0, r0 + 128) of W_e, then the
// mode's epilogue. A step of kStepCols columns at a time: the 128 x step weights decoded once into shared memory
// as f16, the TN x step slice of the pairs' inputs rounded to f16 beside them; the next step's weights and inputs
// are loaded into registers before the current step's products (matmul_mma's one step in flight).
template <class Step, int TN, int kMode>
__device__ __forceinline__ void tile_product(const Args& a, int e, int start, int count, int r0, unsigned short* ws,
                                             unsigned short* xs) {
  typedef typename HalfLoads<TN * Step::kStepCols % (8 * kThreads) == 0>::type XIn;
  constexpr int kStepCols = Step::kStepCols, kStride = kStepCols + 8;
  constexpr int kTokenTilesPerWarp = TN / 16 / kWarpsAcross;
  constexpr int kWLoads = kTileRows * Step::kGroupsPerRow / kThreads;
  constexpr int kXLoads = TN * kStepCols / XIn::kValues / kThreads;
  constexpr int kXPerToken = kStepCols / XIn::kValues;
  static_assert(kWLoads * kThreads == kTileRows * Step::kGroupsPerRow, "every thread loads whole groups");
  static_assert(kXLoads * kThreads * XIn::kValues == TN * kStepCols, "every thread loads whole runs of x");
  static_assert(kTokenTilesPerWarp >= 1 && kXLoads >= 1, "tile too small for the warps");
  constexpr int kAcc = kRowTilesPerWarp * kTokenTilesPerWarp * RF_MMA_ACC;
  const int rows = a.rows, cols = a.cols;
  const int tid = (int)threadIdx.x, lane = tid % WARP_SIZE, warp = tid / WARP_SIZE;
  const int warp_row = 32 * (warp % kWarpsDown), warp_token = 16 * kTokenTilesPerWarp * (warp / kWarpsDown);
  const unsigned long long row_bytes = Step::row_bytes(cols);
  const unsigned char* W = a.W + (unsigned long long)e * rows * row_bytes;
  const unsigned char* w_src[kWLoads];
  int w_dst[kWLoads], w_group[kWLoads];
#pragma unroll
  for (int p = 0; p < kWLoads; ++p) {
    const int v = tid + kThreads * p;  // group v: row v / kGroupsPerRow, group v % kGroupsPerRow of it
    const int row = v / Step::kGroupsPerRow;
    w_src[p] = W + (unsigned long long)lesser(r0 + row, rows - 1) * row_bytes;  // past the last row: read it again
    w_group[p] = v % Step::kGroupsPerRow;
    w_dst[p] = row * kStride;
  }
  const unsigned char* x_src[kXLoads];
  int x_dst[kXLoads], x_col[kXLoads];
#pragma unroll
  for (int p = 0; p < kXLoads; ++p) {
    const int v = tid + kThreads * p;  // load v: token v / kXPerToken of the tile, columns kValues (v % kXPerToken) ..
    const int token = v / kXPerToken;
    const int pair = a.sorted[start + lesser(token, count - 1)];  // past the tile's pairs: its last again, not written
    x_col[p] = XIn::kValues * (v % kXPerToken);
    x_src[p] = reinterpret_cast<const unsigned char*>(a.x) + (unsigned long long)(pair / a.x_per) * cols * XIn::kBytes;
    x_dst[p] = token * kStride + x_col[p];
  }

  float acc[kAcc];  // row tile i, token tile j at (i * kTokenTilesPerWarp + j) * RF_MMA_ACC
#pragma unroll
  for (int i = 0; i < kAcc; ++i) acc[i] = 0.0f;
  typename Step::Raw raw[kWLoads];
  typename XIn::Raw xv[kXLoads];
#pragma unroll
  for (int p = 0; p < kWLoads; ++p) raw[p] = Step::load(w_src[p], 0, w_group[p]);
#pragma unroll
  for (int p = 0; p < kXLoads; ++p) XIn::load_into(xv[p], x_src[p], Step::column(0, x_col[p]));

  for (int c0 = 0; c0 < cols; c0 += kStepCols) {
    __syncthreads();  // every warp is done reading the previous step's tiles
#pragma unroll
    for (int p = 0; p < kWLoads; ++p) Step::store(raw[p], c0, w_group[p], ws + w_dst[p]);
#pragma unroll
    for (int p = 0; p < kXLoads; ++p) XIn::store(xv[p], xs + x_dst[p]);
    __syncthreads();
    const int next = lesser(c0 + kStepCols, cols - kStepCols);  // past the last step: the last again, not used
#pragma unroll
    for (int p = 0; p < kWLoads; ++p) raw[p] = Step::load(w_src[p], next, w_group[p]);
#pragma unroll
    for (int p = 0; p < kXLoads; ++p) XIn::load_into(xv[p], x_src[p], Step::column(next, x_col[p]));
#pragma unroll
    for (int k0 = 0; k0 < kStepCols; k0 += 16) {
      RfMmaA am[kRowTilesPerWarp];
#pragma unroll
      for (int i = 0; i < kRowTilesPerWarp; ++i) rf_mma_load_a(am[i], ws + (warp_row + 16 * i) * kStride + k0, kStride);
#pragma unroll
      for (int j = 0; j < kTokenTilesPerWarp; ++j) {
        RfMmaB bm;
        rf_mma_load_b(bm, xs + (warp_token + 16 * j) * kStride + k0, kStride);
#pragma unroll
        for (int i = 0; i < kRowTilesPerWarp; ++i) rf_mma(acc + (i * kTokenTilesPerWarp + j) * RF_MMA_ACC, am[i], bm);
      }
    }
  }

  // Each accumulator's row and token by the matrix instruction's layout; the pair's row of out.
#pragma unroll
  for (int i = 0; i < kRowTilesPerWarp; ++i)
#pragma unroll
    for (int j = 0; j < kTokenTilesPerWarp; ++j)
#pragma unroll
      for (int q = 0; q < RF_MMA_ACC; ++q) {
        const int r = r0 + warp_row + 16 * i + rf_mma_acc_row(lane, q);
        const int t = warp_token + 16 * j + rf_mma_acc_col(lane, q);
        if (t >= count || r >= rows) continue;
        store_pair<kMode>(a, e, a.sorted[start + t], r, acc[(i * kTokenTilesPerWarp + j) * RF_MMA_ACC + q]);
      }
}

// Every (listed tile, row tile) item of the launch, a workgroup at a time (a grid-stride loop: any grid is correct).
template <class Step, int TN, int kMode>
__device__ __forceinline__ void products(const Args& a, int max_tiles, unsigned short* ws, unsigned short* xs) {
  rf_check_wave_size();
  const int row_tiles = (a.rows + kTileRows - 1) / kTileRows;
  const int listed = lesser(a.tiles[0], max_tiles);
  for (int item = (int)blockIdx.x; item < row_tiles * listed; item += (int)gridDim.x) {  // uniform across the group
    const int tile = item / row_tiles;  // neighbouring workgroups share a tile's pairs (their inputs stay in L2)
    const int* t = a.tiles + 1 + 3 * tile;
    tile_product<Step, TN, kMode>(a, t[0], t[1], t[2], (item % row_tiles) * kTileRows, ws, xs);
  }
}

#if RF_MMA_KIND == RF_MMA_NV_M16N8K16
// ---- Few pairs an expert (NVIDIA): the weights' fragments decoded in registers ---------------------------------
// Where a batch's pairs average a few an expert (gpt-oss-20b at 32 sequences: 4; the launcher's range, 2 to 8 and 4 to
// 16 for MXFP4, is measured: hipcore/ops/moe_experts_mma.py direct_pays), the tiles above are mostly padding (their 32
// pairs hold 4) and the grouped path of moe_experts.hip walks each row once per two pairs. Here a tile is at most 8
// pairs of one expert (the sort's tile_tokens), the n of one mma.sync m16n8k16: each warp owns 16 rows of the
// 128-row tile, each lane decodes the weights of its own A fragments straight from its loads (matmul_mma's direct
// entries for a dense batch of at most 8 tokens: matmul_mma_fragment_formats.h says the lanes' k order) and reads its
// pair's x from memory (lane 4 g + t: pair g of the tile, the last again past count). No shared memory and no barrier:
// each warp runs at its own pace, F::kDepth steps of weights in flight. The same products as the tiles above (W and x
// rounded to f16, exact products, f32 sums), so a pair's result does not depend on the path either. Measured on an
// H100 (docs/history/2026-12-07-moe-few-pairs-tiles.md): 700-870 GB/s of MXFP4 experts, 900-1,070 of K-quants; the
// decode's instructions bound them (each weight decoded for at most 8 pairs), not the loads (staging MXFP4's
// byte-aligned rows through shared memory measured the same).

template <class F, int kMode>
__device__ __forceinline__ void direct_tile_product(const Args& a, int e, int start, int count, int r0) {
  typedef typename F::Step Step;
  constexpr int kStepCols = Step::kStepCols, kDepth = F::kDepth;
  const int rows = a.rows, cols = a.cols;
  const int tid = (int)threadIdx.x, lane = tid % WARP_SIZE, warp = tid / WARP_SIZE, g = lane >> 2, t = lane & 3;
  const unsigned long long row_bytes = Step::row_bytes(cols);
  const unsigned char* W = a.W + (unsigned long long)e * rows * row_bytes;
  const unsigned char* w_src[2];  // rows g and g + 8 of the warp's 16 (past the last row: the last again)
#pragma unroll
  for (int h = 0; h < 2; ++h) w_src[h] = W + (unsigned long long)lesser(r0 + 16 * warp + g + 8 * h, rows - 1) * row_bytes;
  const int pair = a.sorted[start + lesser(g, count - 1)];
  typedef XF16Quad XIn;  // a lane's four x values of a k-substep in one load: its B fragment's two registers
  const unsigned char* x_src =
      reinterpret_cast<const unsigned char*>(a.x) + (unsigned long long)(pair / a.x_per) * cols * XIn::kBytes;
  float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  typename F::Raw raw[kDepth][2];
#pragma unroll
  for (int d = 0; d < kDepth; ++d) {
    const int c = lesser(d * kStepCols, cols - kStepCols);
#pragma unroll
    for (int h = 0; h < 2; ++h) raw[d][h] = F::load(w_src[h], c, t);
  }
  for (int c_base = 0; c_base < cols; c_base += kDepth * kStepCols) {
#pragma unroll
    for (int d = 0; d < kDepth; ++d) {  // unrolled: raw[d] stays registers
      const int c0 = c_base + d * kStepCols;
      if (c0 >= cols) break;  // uniform
      typename XIn::Raw xd[4];  // the lane's x of each k-substep, loaded before the decode hides its latency
#pragma unroll
      for (int s = 0; s < 4; ++s) XIn::load_into(xd[s], x_src, Step::column(c0, mmq::frag_column(s, t)));
      unsigned int pairs[2][8];
#pragma unroll
      for (int h = 0; h < 2; ++h) F::decode(raw[d][h], c0, pairs[h]);
      const int next = lesser(c0 + kDepth * kStepCols, cols - kStepCols);  // past the end: the last step again
#pragma unroll
      for (int h = 0; h < 2; ++h) raw[d][h] = F::load(w_src[h], next, t);
#pragma unroll
      for (int s = 0; s < 4; ++s) {
        const unsigned int fa[4] = {pairs[0][2 * s], pairs[1][2 * s], pairs[0][2 * s + 1], pairs[1][2 * s + 1]};
        const unsigned int fb[2] = {xd[s].x, xd[s].y};
        rf_mma_m16n8k16_f16(acc, fa, fb);
      }
    }
  }
  // acc[q]: row g + 8 (q / 2) of the warp's, pair 2t + q % 2 of the tile.
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    const int r = r0 + 16 * warp + g + 8 * (q >> 1), p = 2 * t + (q & 1);
    if (p < count && r < rows) store_pair<kMode>(a, e, a.sorted[start + p], r, acc[q]);
  }
}

template <class F, int kMode>
__device__ __forceinline__ void direct_products(const Args& a, int max_tiles) {
  const int row_tiles = (a.rows + kTileRows - 1) / kTileRows;
  const int listed = lesser(a.tiles[0], max_tiles);
  for (int item = (int)blockIdx.x; item < row_tiles * listed; item += (int)gridDim.x) {  // uniform across the group
    const int* t = a.tiles + 1 + 3 * (item / row_tiles);
    direct_tile_product<F, kMode>(a, t[0], t[1], t[2], (item % row_tiles) * kTileRows);
  }
}
#endif

}  // namespace moe_mma
}  // namespace

extern "C" __global__ __launch_bounds__(256) void moe_mma_sort(int* __restrict__ sorted, int* __restrict__ tiles,
                                                               const int* __restrict__ ids, int pairs, int n_expert,
                                                               int tile_tokens) {
  __shared__ int count[moe_mma::kMaxExperts], first[moe_mma::kMaxExperts], first_tile[moe_mma::kMaxExperts];
  __shared__ int fill[moe_mma::kMaxExperts];
  rf_grid_dependency_sync(); /* a programmatic launch */
  const int tid = (int)threadIdx.x, threads = (int)blockDim.x;
  for (int e = tid; e < n_expert; e += threads) count[e] = 0, fill[e] = 0;
  __syncthreads();
  for (int p = tid; p < pairs; p += threads) {
    const int e = ids[p];
    if (e >= 0 && e < n_expert) atomicAdd(&count[e], 1);
  }
  __syncthreads();
  if (tid == 0) {  // the experts' first positions and first tiles: a few hundred additions, not worth a parallel scan
    int at = 0, tile = 0;
    for (int e = 0; e < n_expert; ++e) {
      first[e] = at, first_tile[e] = tile;
      at += count[e];
      tile += (count[e] + tile_tokens - 1) / tile_tokens;
    }
    tiles[0] = tile;
  }
  __syncthreads();
  for (int e = tid; e < n_expert; e += threads)
    for (int j = 0; j * tile_tokens < count[e]; ++j) {
      int* t = tiles + 1 + 3 * (first_tile[e] + j);
      t[0] = e, t[1] = first[e] + j * tile_tokens, t[2] = moe_mma::lesser(tile_tokens, count[e] - j * tile_tokens);
    }
  for (int p = tid; p < pairs; p += threads) {
    const int e = ids[p];
    if (e >= 0 && e < n_expert) sorted[first[e] + atomicAdd(&fill[e], 1)] = p;
  }
}

// moe_mma_<mode>_<type>: the module comment's arguments; blockDim 256. BOUNDS: the launch bounds, (256) or (256, 2).
// nvcc 13 holds the (256) entries to 128 registers (two workgroups an SM) of itself, but gave the `_s64` entries'
// doubled loads up to 174 (gpt-oss' up: one workgroup an SM); (256, 2) asks for two workgroups an SM (on AMD: two
// waves a SIMD) explicitly. (An explicit (256, 1) lets nvcc take 140-166 registers in the 32-column entries too.)
#define RF_MOE_MMA_ENTRY(name, Step, kMode, BOUNDS)                                                                \
  extern "C" __global__ __launch_bounds__ BOUNDS void name(                                                        \
      float* __restrict__ out, const float* __restrict__ g, const void* __restrict__ W, const float* __restrict__ x, \
      const int* __restrict__ sorted, const int* __restrict__ tiles, const float* __restrict__ bias,              \
      const float* __restrict__ weights, int rows, int cols, int pairs, int x_per, int n_expert, int tile_tokens,   \
      int max_tiles, int activation) {                                                                             \
    __shared__ __attribute__((aligned(16))) unsigned short ws[moe_mma::kTileRows * moe_mma::kMaxStride];           \
    __shared__ __attribute__((aligned(16))) unsigned short xs[moe_mma::kMaxTileTokens * moe_mma::kMaxStride];      \
    rf_grid_dependency_sync(); /* a programmatic launch */                                                         \
    (void)pairs, (void)n_expert; /* the launcher's checks */                                                       \
    const moe_mma::Args a = {out, g, static_cast<const unsigned char*>(W), x, sorted, tiles, bias, weights,         \
                             rows, cols, x_per, activation};                                                       \
    if (tile_tokens == 32) /* uniform: a kernel argument */                                                        \
      moe_mma::products<Step, 32, kMode>(a, max_tiles, ws, xs);                                                    \
    else                                                                                                           \
      moe_mma::products<Step, 64, kMode>(a, max_tiles, ws, xs);                                                    \
  }

#define RF_MOE_MMA_ENTRIES_BOUND(type, Step, BOUNDS)                 \
  RF_MOE_MMA_ENTRY(moe_mma_gate_##type, Step, moe_mma::kGate, BOUNDS) \
  RF_MOE_MMA_ENTRY(moe_mma_up_##type, Step, moe_mma::kUp, BOUNDS)     \
  RF_MOE_MMA_ENTRY(moe_mma_down_##type, Step, moe_mma::kDown, BOUNDS)
#define RF_MOE_MMA_ENTRIES(type, Step) RF_MOE_MMA_ENTRIES_BOUND(type, Step, (256))

RF_MOE_MMA_ENTRIES(q4_k, mmq::Wide<false>)
RF_MOE_MMA_ENTRIES(q5_k, mmq::Wide<true>)
RF_MOE_MMA_ENTRIES(q6_k, mmq::Wide6)
RF_MOE_MMA_ENTRIES(q8_0, mmq::Narrow<mmq::Q8_0>)
RF_MOE_MMA_ENTRIES(mxfp4, mmq::Narrow<mmq::MXFP4>)
RF_MOE_MMA_ENTRIES(f16, mmq::Narrow<mmq::F16>)
RF_MOE_MMA_ENTRIES(bf16, mmq::Narrow<mmq::BF16>)
RF_MOE_MMA_ENTRIES_BOUND(q8_0_s64, moe_mma::Twice<mmq::Narrow<mmq::Q8_0>>, (256, 2))
RF_MOE_MMA_ENTRIES_BOUND(mxfp4_s64, moe_mma::Twice<mmq::Narrow<mmq::MXFP4>>, (256, 2))
RF_MOE_MMA_ENTRIES_BOUND(f16_s64, moe_mma::Twice<mmq::Narrow<mmq::F16>>, (256, 2))
RF_MOE_MMA_ENTRIES_BOUND(bf16_s64, moe_mma::Twice<mmq::Narrow<mmq::BF16>>, (256, 2))

#if RF_MMA_KIND == RF_MMA_NV_M16N8K16
// moe_mma_<mode>_<type>_direct: the same arguments, tiles of at most 8 pairs (tile_tokens 8: the launcher's sort),
// NVIDIA only (hipcore/ops/moe_experts_mma.py direct_pays).
#define RF_MOE_MMA_DIRECT_ENTRY(name, Step, kMode)                                                                 \
  extern "C" __global__ __launch_bounds__(256) void name(                                                          \
      float* __restrict__ out, const float* __restrict__ g, const void* __restrict__ W, const float* __restrict__ x, \
      const int* __restrict__ sorted, const int* __restrict__ tiles, const float* __restrict__ bias,              \
      const float* __restrict__ weights, int rows, int cols, int pairs, int x_per, int n_expert, int tile_tokens,   \
      int max_tiles, int activation) {                                                                             \
    rf_grid_dependency_sync(); /* a programmatic launch */                                                         \
    (void)pairs, (void)n_expert, (void)tile_tokens; /* the launcher's checks */                                    \
    const moe_mma::Args a = {out, g, static_cast<const unsigned char*>(W), x, sorted, tiles, bias, weights,         \
                             rows, cols, x_per, activation};                                                       \
    moe_mma::direct_products<typename mmq::Fragments<Step>::Format, kMode>(a, max_tiles);                          \
  }
#define RF_MOE_MMA_DIRECT_ENTRIES(type, Step)                                 \
  RF_MOE_MMA_DIRECT_ENTRY(moe_mma_gate_##type##_direct, Step, moe_mma::kGate) \
  RF_MOE_MMA_DIRECT_ENTRY(moe_mma_up_##type##_direct, Step, moe_mma::kUp)     \
  RF_MOE_MMA_DIRECT_ENTRY(moe_mma_down_##type##_direct, Step, moe_mma::kDown)
RF_MOE_MMA_DIRECT_ENTRIES(q4_k, mmq::Wide<false>)
RF_MOE_MMA_DIRECT_ENTRIES(q5_k, mmq::Wide<true>)
RF_MOE_MMA_DIRECT_ENTRIES(q6_k, mmq::Wide6)
RF_MOE_MMA_DIRECT_ENTRIES(q8_0, mmq::Pair32<mmq::Q8_0Lane<2>>)
RF_MOE_MMA_DIRECT_ENTRIES(mxfp4, mmq::Pair32<mmq::MXFP4Lane<3>>)
RF_MOE_MMA_DIRECT_ENTRIES(f16, mmq::Pair32<mmq::F16Lane<2>>)
RF_MOE_MMA_DIRECT_ENTRIES(bf16, mmq::Pair32<mmq::BF16Lane<1>>)
#endif
