// Matrix-matrix product on GGUF weights on the matrix cores, for prompt evaluation and large batches:
//   y[t, r] = sum_c W[r, c] * x[t, c]   for r < rows, t < n_tokens
// Same layouts and results as matmul.hip (W [rows, cols] in its GGUF block format, x float32
// [n_tokens, cols], y float32 [n_tokens, rows]), but the products run as f16 x f16 -> f32 matrix
// instructions (matrix_cores.h's rf_mma: mma.sync on NVIDIA, MFMA on CDNA, WMMA on RDNA3/4, FMA elsewhere):
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
// The format decoders are matmul.hip's (copied: each op's sources are built and hashed on their own); they
// and the step shapes live in matmul_mma_formats.h, the tiles' epilogues (the residual add, split-K, SwiGLU
// pairs) in matmul_mma_epilogues.h, NVIDIA's fragment path of decode batches in matmul_mma_fragments.h and its entry
// points (each product, q|k|v in one launch, gate|up with the SwiGLU in one launch) in matmul_mma_fragment_entries.h
// (all hashed with this file: hipcore/runtime/kernels.py source_files).
// Requirements the launcher checks: cols % 32 == 0 (% 256 for the K-quants); W aligned as for matmul, Q4_K
// and Q5_K to 16 bytes; x 16-byte aligned; blockDim 256; splits <= the steps (cols / step); tiles * splits < 2^31; with splits > 1, at most
// kCounterBytes / 4 tiles and a workspace of kCounterBytes (zeroed once, left zeroed by every launch) +
// tiles * splits * 128 * tile_tokens floats.
#include "hip_compat.h"
#include "matrix_cores.h"  // rf_mma: one warp's 16x16x16 f16 tile on the matrix cores
#include "matmul_mma_formats.h"  // the block formats, the step shapes that read them, x's forms

namespace {
namespace mmq {

constexpr int kThreads = 256;
constexpr int kTileRows = 128;
constexpr int kMaxStepCols = 64;                 // the widest step of a format (Wide K-quants)
constexpr int kMaxStride = kMaxStepCols + 8;       // halves per shared row, at most
constexpr int kMaxTileTokens = 64;
constexpr int kWideTileTokens = 128;               // the x16_128 and silu_up entries' tiles
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

static __device__ __forceinline__ int lesser_of(int a, int b) { return a < b ? a : b; }

}  // namespace mmq
}  // namespace

#include "matmul_mma_epilogues.h"  // Launch, store_result, combine_splits (split-K), swiglu_pair (uses the above)

namespace {
namespace mmq {

// f(r, t, v) for each of a thread's accumulators v of a warp's tiles (kRowTilesPerWarp x kTokenTiles 16 x 16 tiles
// from row r0 and token t0; acc as mma_tiles holds them): its row and token of y by the matrix instruction's layout.
template <int kTokenTiles, class F>
__device__ __forceinline__ void each_result(const float* acc, int r0, int t0, int lane, F f) {
#pragma unroll
  for (int i = 0; i < kRowTilesPerWarp; ++i)
#pragma unroll
    for (int j = 0; j < kTokenTiles; ++j)
#pragma unroll
      for (int e = 0; e < RF_MMA_ACC; ++e)
        f(r0 + 16 * i + rf_mma_acc_row(lane, e), t0 + 16 * j + rf_mma_acc_col(lane, e), acc[(i * kTokenTiles + j) * RF_MMA_ACC + e]);
}

// The tiles of y with TN tokens (32, 64 or 128), computed by one workgroup in turn.
// Step: a step shape (Narrow<F> or Wide<>); ws, xs: shared [kTileRows][kStride] and [TN][kStride] halves.
// kSiluUp: the product is the up projection of a feed-forward whose gate product a launch before wrote to a.y
// (float32 [n_tokens, rows]); each element leaves as a.h16 = silu(gate) * up in f16 (kGelu: gelu(gate) * up, Gemma's
// GeGLU), no float32 store (no splits).
template <class Step, int TN, int kDepth, bool kSwiglu = false, class XIn = XF32, bool kSiluUp = false,
          bool kGelu = false>
__device__ __forceinline__ void mma_tiles(const Launch& a, unsigned short* ws, unsigned short* xs, int* last) {
  constexpr int kStepCols = Step::kStepCols, kStride = kStepCols + 8;
  constexpr int kTokenTilesPerWarp = TN / 16 / kWarpsAcross;
  constexpr int kWLoads = kTileRows * Step::kGroupsPerRow / kThreads;  // groups of weights per thread
  constexpr int kXLoads = TN * kStepCols / XIn::kValues / kThreads;     // loads of x per thread
  constexpr int kXPerToken = kStepCols / XIn::kValues;                  // loads of a token's step
  static_assert(kWLoads * kThreads == kTileRows * Step::kGroupsPerRow, "every thread loads whole groups");
  static_assert(kXLoads * kThreads * XIn::kValues == TN * kStepCols, "every thread loads whole runs of x");
  static_assert(kTokenTilesPerWarp >= 1 && kXLoads >= 1, "tile too small for the warps");
  constexpr int kAccPerThread = kRowTilesPerWarp * kTokenTilesPerWarp * RF_MMA_ACC;
  const unsigned char* __restrict__ x = static_cast<const unsigned char*>(a.x);
  const int rows = a.rows, cols = a.cols, n_tokens = a.n_tokens, splits = a.splits;
  const int tid = (int)threadIdx.x, lane = tid % WARP_SIZE, warp = tid / WARP_SIZE;
  const int warp_row = 32 * (warp % kWarpsDown), warp_token = 16 * kTokenTilesPerWarp * (warp / kWarpsDown);
  const unsigned long long row_bytes = Step::row_bytes(cols);
  const int row_tiles = (rows + kTileRows - 1) / kTileRows;
  const int tiles = row_tiles * ((n_tokens + TN - 1) / TN);
  const int steps = cols / kStepCols;
  const int items = tiles * splits * (kSwiglu ? 2 : 1);  // the launcher keeps it < 2^31
  for (int item = (int)blockIdx.x; item < items; item += (int)gridDim.x) {  // uniform across the workgroup
    const int product = kSwiglu ? item & 1 : 0;  // a pair's two items run side by side
    const int work = kSwiglu ? item >> 1 : item;
    const unsigned char* W = product ? a.W_up : a.W;
    const int tile = work / splits, split = work - tile * splits;
    const int c_begin = (int)((long long)split * steps / splits) * kStepCols;
    const int c_end = (int)((long long)(split + 1) * steps / splits) * kStepCols;
    const int r0 = (tile % row_tiles) * kTileRows, t0 = (tile / row_tiles) * TN;
    const unsigned char* w_src[kWLoads];
    int w_dst[kWLoads], w_group[kWLoads];
#pragma unroll
    for (int p = 0; p < kWLoads; ++p) {
      const int v = tid + kThreads * p;  // group v: row v / kGroupsPerRow, group v % kGroupsPerRow of it
      const int row = v / Step::kGroupsPerRow;
      w_src[p] = W + (unsigned long long)lesser_of(r0 + row, rows - 1) * row_bytes;
      w_group[p] = v % Step::kGroupsPerRow;
      w_dst[p] = row * kStride;
    }
    const unsigned char* x_src[kXLoads];
    int x_dst[kXLoads], x_col[kXLoads];
#pragma unroll
    for (int p = 0; p < kXLoads; ++p) {
      const int v = tid + kThreads * p;  // load v: token v / kXPerToken, step columns kValues (v % kXPerToken) ..
      const int token = v / kXPerToken;
      x_col[p] = XIn::kValues * (v % kXPerToken);
      x_src[p] = x + (unsigned long long)lesser_of(t0 + token, n_tokens - 1) * cols * XIn::kBytes;
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
    typename XIn::Raw xv[kDepth][kXLoads];
#pragma unroll
    for (int d = 0; d < kDepth; ++d) {
      const int c = lesser_of(c_begin + d * kStepCols, c_end - kStepCols);
#pragma unroll
      for (int p = 0; p < kWLoads; ++p) raw[d][p] = Step::load(w_src[p], c, w_group[p]);
#pragma unroll
      for (int p = 0; p < kXLoads; ++p) XIn::load_into(xv[d][p], x_src[p], Step::column(c, x_col[p]));
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
        for (int p = 0; p < kXLoads; ++p) XIn::store(xv[d][p], xs + x_dst[p]);
        __syncthreads();

        const int next = lesser_of(c0 + kDepth * kStepCols, c_end - kStepCols);
#pragma unroll
        for (int p = 0; p < kWLoads; ++p) raw[d][p] = Step::load(w_src[p], next, w_group[p]);
#pragma unroll
        for (int p = 0; p < kXLoads; ++p) XIn::load_into(xv[d][p], x_src[p], Step::column(next, x_col[p]));

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

    const int warp_r0 = r0 + warp_row, warp_t0 = t0 + warp_token;
    if (kSwiglu) {  // each product's tile to its own output, then the pair's second makes silu(g) * u
      const Launch own = {product ? a.y_up : a.y, nullptr, nullptr, nullptr, rows, cols, n_tokens, 1, 0};
      each_result<kTokenTilesPerWarp>(acc, warp_r0, warp_t0, lane, [&](int r, int t, float v) { store_result(own, r, t, v); });
      swiglu_pair<TN>(a, tile, r0, t0, tid, last);
      continue;
    }
    if (kSiluUp) {
      each_result<kTokenTilesPerWarp>(acc, warp_r0, warp_t0, lane, [&](int r, int t, float up) {
        if (t < n_tokens && r < rows) {
          const unsigned long long at = (unsigned long long)t * rows + r;
          const float g = a.y[at];
          a.h16[at] = rf_float_to_f16(rf_gated(g, up, kGelu));
        }
      });
      continue;
    }
    if (splits > 1 && !combine_splits(acc, a, tile, split, tid, last)) continue;  // uniform
    each_result<kTokenTilesPerWarp>(acc, warp_r0, warp_t0, lane, [&](int r, int t, float v) { store_result(a, r, t, v); });
  }
}


}  // namespace mmq
}  // namespace

#include "matmul_mma_fragments.h"  // NVIDIA's decode batches: fragments decoded in registers (uses the above)

namespace {
namespace mmq {

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
    rf_grid_dependency_sync(); /* a programmatic launch */                                                        \
    const mmq::Launch a = {y, static_cast<const unsigned char*>(W), x, static_cast<unsigned char*>(workspace),     \
                           rows, cols, n_tokens, splits, accumulate};                                             \
    mmq::matmul_mma<Step>(a, tile_tokens, ws, xs, &last);                                                   \
  }

RF_MATMUL_MMA_ENTRY(matmul_mma_q4_0, mmq::Narrow<mmq::Q4_0>)
RF_MATMUL_MMA_ENTRY(matmul_mma_q4_1, mmq::Narrow<mmq::Q4_1>)
RF_MATMUL_MMA_ENTRY(matmul_mma_q5_0, mmq::Narrow<mmq::Q5_0>)
RF_MATMUL_MMA_ENTRY(matmul_mma_q5_1, mmq::Narrow<mmq::Q5_1>)
RF_MATMUL_MMA_ENTRY(matmul_mma_q8_0, mmq::Narrow<mmq::Q8_0>)
RF_MATMUL_MMA_ENTRY(matmul_mma_f16, mmq::Narrow<mmq::F16>)
RF_MATMUL_MMA_ENTRY(matmul_mma_bf16, mmq::Narrow<mmq::BF16>)
RF_MATMUL_MMA_ENTRY(matmul_mma_mxfp4, mmq::Narrow<mmq::MXFP4>)
RF_MATMUL_MMA_ENTRY(matmul_mma_q4_k, mmq::Wide<false>)
RF_MATMUL_MMA_ENTRY(matmul_mma_q5_k, mmq::Wide<true>)
RF_MATMUL_MMA_ENTRY(matmul_mma_q6_k, mmq::Wide6)

// Prompt steps' products of f16 x (the K-quants): matmul_mma_x16_<format>, matmul_mma's arguments with x f16
// [n_tokens, cols]: half the bytes each tile reads (on an NVIDIA H100 the 8B's gate product at 512 tokens
// took 341.5 against 375.2 us). Both tile sizes on the shared tiles (NVIDIA's fragment path reads float32 x);
// the 32-token path also keeps nvcc's sm_90 registers of the 64-token one within 128 without spills (alone,
// Q6_K's spilled 12 bytes).
#define RF_MATMUL_MMA_X16_ENTRY(name, Step)                                                                       \
  extern "C" __global__ __launch_bounds__(256) void name(float* __restrict__ y, const void* __restrict__ W,         \
                                                         const void* __restrict__ x, void* workspace, int rows,     \
                                                         int cols, int n_tokens, int tile_tokens, int splits,       \
                                                         int accumulate) {                                         \
    __shared__ __attribute__((aligned(16))) unsigned short ws[mmq::kTileRows * mmq::kMaxStride];                 \
    __shared__ __attribute__((aligned(16))) unsigned short xs[mmq::kMaxTileTokens * mmq::kMaxStride];            \
    __shared__ int last;                                                                                          \
    rf_grid_dependency_sync(); /* a programmatic launch */                                                        \
    const mmq::Launch a = {y, static_cast<const unsigned char*>(W), x, static_cast<unsigned char*>(workspace),     \
                           rows, cols, n_tokens, splits, accumulate};                                             \
    rf_check_wave_size();                                                                                         \
    if (tile_tokens == 32)                                                                                        \
      mmq::mma_tiles<Step, 32, mmq::DepthTile32<Step>::value, false, mmq::XF16>(a, ws, xs, &last);                \
    else                                                                                                          \
      mmq::mma_tiles<Step, 64, mmq::kDepthTile64, false, mmq::XF16>(a, ws, xs, &last);                            \
  }

RF_MATMUL_MMA_X16_ENTRY(matmul_mma_x16_q4_k, mmq::Wide<false>)
RF_MATMUL_MMA_X16_ENTRY(matmul_mma_x16_q5_k, mmq::Wide<true>)
RF_MATMUL_MMA_X16_ENTRY(matmul_mma_x16_q6_k, mmq::Wide6)

// Two workgroups per SM on sm_90 (at most 128 registers): the SwiGLU pairs and the 128-token tiles. sm_80's nvcc
// spilled the pairs there and keeps its own choice (one workgroup per SM, as its single products).
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
#define RF_TWO_PER_SM_BOUNDS __launch_bounds__(256)
#else
#define RF_TWO_PER_SM_BOUNDS __launch_bounds__(256, 2)
#endif

#if RF_MMA_KIND == RF_MMA_NV_M16N8K16
// Prompt steps' f16-x products in tiles of 128 rows x 128 tokens: matmul_mma_x16_128_<format>, the x16 entries'
// arguments with tile_tokens 128 (split over the columns as the launcher splits the other tiles). Each decoded step of weights feeds twice the tokens, and each warp's 32 x 64
// outputs read a fragment of shared memory per 2,048 multiply-adds instead of 1,024, where the 64-token tiles are
// bound by the SM's shared-memory pipe: on an NVIDIA H100 at 512 tokens, the 8B's gate product took 264 against
// 351 us, down (Q6_K) 445 against 482, q 86 against 102. Entries of their own, so that their registers (64
// accumulators a thread; 128 at two workgroups per SM, no spills on sm_90) are counted apart. NVIDIA's mma only:
// on gfx1030 (FMA at wave 32) and gfx1100 (WMMA) the 128-token tiles spilled, and no AMD GPU measured them.
#define RF_MATMUL_MMA_X16_128_ENTRY(name, Step)                                                                   \
  extern "C" __global__ RF_TWO_PER_SM_BOUNDS void name(float* __restrict__ y, const void* __restrict__ W,         \
                                                       const void* __restrict__ x, void* workspace, int rows,      \
                                                       int cols, int n_tokens, int tile_tokens, int splits,        \
                                                       int accumulate) {                                          \
    __shared__ __attribute__((aligned(16))) unsigned short ws[mmq::kTileRows * mmq::kMaxStride];                 \
    __shared__ __attribute__((aligned(16))) unsigned short xs[mmq::kWideTileTokens * mmq::kMaxStride];           \
    __shared__ int last;                                                                                          \
    rf_grid_dependency_sync(); /* a programmatic launch */                                                        \
    const mmq::Launch a = {y, static_cast<const unsigned char*>(W), x, static_cast<unsigned char*>(workspace),     \
                           rows, cols, n_tokens, splits, accumulate};                                             \
    rf_check_wave_size();                                                                                         \
    (void)tile_tokens; /* 128: the launcher's */                                                                  \
    mmq::mma_tiles<Step, mmq::kWideTileTokens, 1, false, mmq::XF16>(a, ws, xs, &last);                           \
  }

RF_MATMUL_MMA_X16_128_ENTRY(matmul_mma_x16_128_q4_k, mmq::Wide<false>)
RF_MATMUL_MMA_X16_128_ENTRY(matmul_mma_x16_128_q5_k, mmq::Wide<true>)
RF_MATMUL_MMA_X16_128_ENTRY(matmul_mma_x16_128_q6_k, mmq::Wide6)

// A prompt step's up projection with the activation in its epilogue, in 128-token tiles: matmul_mma_silu_up_<format>
// (h16, gate, W_up, x16, rows, cols, n_tokens, splits): h16 = silu(gate) * (x16 W_up^T) as f16, gate float32
// [n_tokens, rows] (the gate product, matmul_mma_x16_128 a launch before), x16 f16 [n_tokens, cols]; splits must be 1
// (an argument: nvcc's sm_90 code spilled more with a constant). matmul_mma_gelu_up_<format>: GeGLU's gelu(gate)
// (Gemma; Q4_K, Q5_K), entries of their own (the activation as an argument raised the SwiGLU's spills: 40 -> 64 B).
// Where the 128-token tiles are many the feed-forward takes it instead of a SwiGLU pair: the two products share no
// launch, so each keeps two workgroups per SM (the pair's 128-token kernel spilled ~100 bytes on sm_90), and gate's
// tile is read back once, from the epilogue, with no float32 up to write and read. nvcc spills 40-56 bytes of it on
// sm_90 at two workgroups per SM, kept: at one (173 registers) the 8B's gate and up took 779.9 against 618.8 us (H100).
#define RF_MATMUL_MMA_GATED_UP_ENTRY(name, Step, GELU)                                                            \
  extern "C" __global__ RF_TWO_PER_SM_BOUNDS void name(unsigned short* __restrict__ h16,                          \
                                                       const float* __restrict__ gate, const void* __restrict__ W, \
                                                       const void* __restrict__ x, int rows, int cols,            \
                                                       int n_tokens, int splits) {                                            \
    __shared__ __attribute__((aligned(16))) unsigned short ws[mmq::kTileRows * mmq::kMaxStride];                 \
    __shared__ __attribute__((aligned(16))) unsigned short xs[mmq::kWideTileTokens * mmq::kMaxStride];           \
    __shared__ int last;                                                                                          \
    rf_grid_dependency_sync(); /* a programmatic launch */                                                        \
    const mmq::Launch a = {const_cast<float*>(gate), static_cast<const unsigned char*>(W), x, nullptr, rows, cols, \
                           n_tokens, splits, 0, nullptr, nullptr, h16};                                                \
    rf_check_wave_size();                                                                                         \
    mmq::mma_tiles<Step, mmq::kWideTileTokens, 1, false, mmq::XF16, true, GELU>(a, ws, xs, &last);               \
  }
RF_MATMUL_MMA_GATED_UP_ENTRY(matmul_mma_silu_up_q4_k, mmq::Wide<false>, false)
RF_MATMUL_MMA_GATED_UP_ENTRY(matmul_mma_silu_up_q5_k, mmq::Wide<true>, false)
RF_MATMUL_MMA_GATED_UP_ENTRY(matmul_mma_gelu_up_q4_k, mmq::Wide<false>, true)
RF_MATMUL_MMA_GATED_UP_ENTRY(matmul_mma_gelu_up_q5_k, mmq::Wide<true>, true)
#endif  // RF_MMA_KIND == RF_MMA_NV_M16N8K16

// SwiGLU pairs of prompt steps (Q4_K and Q5_K: the gate and up matrices of Q4_K_M and Q5_K_M files; a Q6_K
// pair spilled on sm_90 at two workgroups per SM): matmul_mma_swiglu_<format>(h16, gate, up, W_gate, W_up, x16,
// workspace, rows, cols, n_tokens, tile_tokens): h16 = silu(x W_gate^T) * (x W_up^T) as f16, x16 f16
// [n_tokens, cols], gate and up float32 scratch [n_tokens, rows] (the products); tiles of 32 or 64 tokens, no
// splits, the workspace's counters as the split launches use them (hipcore/ops/matmul_mma.py launch_swiglu).
// Two workgroups per SM on sm_90 (RF_TWO_PER_SM_BOUNDS).
#define RF_MATMUL_MMA_SWIGLU_ENTRY(name, Step)                                                                    \
  extern "C" __global__ RF_TWO_PER_SM_BOUNDS void name(                                                               \
      unsigned short* __restrict__ h16, float* __restrict__ gate, float* __restrict__ up,                          \
      const void* __restrict__ W_gate, const void* __restrict__ W_up, const void* __restrict__ x, void* workspace,  \
      int rows, int cols, int n_tokens, int tile_tokens) {                                                         \
    __shared__ __attribute__((aligned(16))) unsigned short ws[mmq::kTileRows * mmq::kMaxStride];                 \
    __shared__ __attribute__((aligned(16))) unsigned short xs[mmq::kMaxTileTokens * mmq::kMaxStride];            \
    __shared__ int last;                                                                                          \
    rf_grid_dependency_sync(); /* a programmatic launch */                                                        \
    const mmq::Launch a = {gate, static_cast<const unsigned char*>(W_gate), x, static_cast<unsigned char*>(workspace), \
                           rows, cols, n_tokens, 1, 0, up, static_cast<const unsigned char*>(W_up), h16};         \
    rf_check_wave_size();                                                                                         \
    if (tile_tokens == 32)                                                                                        \
      mmq::mma_tiles<Step, 32, mmq::DepthTile32<Step>::value, true, mmq::XF16>(a, ws, xs, &last);                 \
    else                                                                                                          \
      mmq::mma_tiles<Step, 64, mmq::kDepthTile64, true, mmq::XF16>(a, ws, xs, &last);                             \
  }

RF_MATMUL_MMA_SWIGLU_ENTRY(matmul_mma_swiglu_q4_k, mmq::Wide<false>)
RF_MATMUL_MMA_SWIGLU_ENTRY(matmul_mma_swiglu_q5_k, mmq::Wide<true>)

#if RF_MMA_KIND == RF_MMA_NV_M16N8K16
#include "matmul_mma_fragment_entries.h"  // the fragment path's entries (decode batches)
// The 32-element block formats, F16 and BF16 (matmul_mma_block32_fragments.h): the fragment path, two runs of 32 a step
// (a lane format for the staged entry, one for the direct), q, k and v of one type in one launch on it
// (matmul_mma_qkv_<fragments|direct>_<type>), and the wide layers' prompts (projections.mma_first) in 128-token tiles
// of f16 x only.
// The direct entries on sm_80 say two workgroups per SM: without it nvcc 13 held Q5_0's and Q5_1's to 80 registers
// there (Q5_0's spilling 4 bytes) once fragment_tiles ran each item through fragment_item; sm_90 keeps its choice.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
#define RF_BLOCK32_DIRECT_BOUNDS __launch_bounds__(256, 2)
#else
#define RF_BLOCK32_DIRECT_BOUNDS __launch_bounds__(256)
#endif
#define RF_BLOCK32_ENTRIES(kind, Block, StagedLane, DirectLane)                                                    \
  RF_MATMUL_MMA_FRAGMENT_ENTRY_WAIT_FIRST(matmul_mma_fragments_##kind, mmq::Pair32<StagedLane>, mmq::kStreamTokens, \
                                          RF_STAGED_X, RF_BOUNDS)                                                 \
  RF_MATMUL_MMA_FRAGMENT_ENTRY_WAIT_FIRST(matmul_mma_direct_##kind, mmq::Pair32<DirectLane>, mmq::kDirectTokens, 8,  \
                                          RF_BLOCK32_DIRECT_BOUNDS)                                               \
  RF_MATMUL_MMA_QKV_SINGLE_ENTRY(matmul_mma_qkv_fragments_##kind, mmq::kStreamTokens, RF_STAGED_X,                \
                                 mmq::Fragments<mmq::Pair32<StagedLane> >::Format, RF_BOUNDS)                    \
  RF_MATMUL_MMA_QKV_SINGLE_ENTRY(matmul_mma_qkv_direct_##kind, mmq::kDirectTokens, 8,                              \
                                 mmq::Fragments<mmq::Pair32<DirectLane> >::Format, RF_BLOCK32_DIRECT_BOUNDS)       \
  RF_MATMUL_MMA_X16_128_ENTRY(matmul_mma_x16_128_##kind, mmq::Narrow<Block>)                                      \
  RF_MATMUL_MMA_GATED_UP_ENTRY(matmul_mma_silu_up_##kind, mmq::Narrow<Block>, false)
RF_BLOCK32_ENTRIES(q4_0, mmq::Q4_0, mmq::Q4_0Lane, mmq::Q4_0Lane)
RF_BLOCK32_ENTRIES(q4_1, mmq::Q4_1, mmq::Q41Lane<false>, mmq::Q41Lane<false>)
RF_BLOCK32_ENTRIES(q5_0, mmq::Q5_0, mmq::Q5_0Lane, mmq::Q5_0Lane)
RF_BLOCK32_ENTRIES(q5_1, mmq::Q5_1, mmq::Q41Lane<true>, mmq::Q41Lane<true>)
RF_BLOCK32_ENTRIES(q8_0, mmq::Q8_0, mmq::Q8_0Lane<1>, mmq::Q8_0Lane<2>)  // staged: one step in flight (no spill)
RF_BLOCK32_ENTRIES(f16, mmq::F16, mmq::F16Lane<1>, mmq::F16Lane<2>)
RF_BLOCK32_ENTRIES(bf16, mmq::BF16, mmq::BF16Lane<2>, mmq::BF16Lane<1>)
#endif
