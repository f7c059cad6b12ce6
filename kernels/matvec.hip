// Matrix-vector product on GGUF weights, the hot kernel of decoding:
//   y[b, r] = sum_c W[r, c] * x[b, c]   for r < rows, b < batch
// W stays in its GGUF block layout, row-major: row r is cols/32 blocks (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0), cols/256
// super-blocks (Q4_K, Q5_K, Q6_K) or cols plain values (F16, BF16, F32), rows back to back (the layouts:
// hipcore/ops/weight_formats.py). x is [batch, cols] and y is [batch, rows], float32.
//
// Decoding reads every weight once per token, so the kernel is bound by memory bandwidth:
// - A warp owns a group of rows at a time (a grid-stride loop over the groups covers any grid); the
//   lanes of a warp walk the rows together, so each load instruction of the warp reads consecutive
//   bytes. With batch 1 (decoding) a group is two rows, so every x value loaded serves two rows.
// - A lane's unit of work ("item") is 8 weights of one row, as two runs of 4 consecutive columns; a row
//   has cols/8 items in every format. Items are placed so that the bytes a lane loads are all used and
//   each format reads naturally aligned words: F16/BF16 one 16-byte load, Q4_1 two 4-byte loads and
//   Q5_1 three (20- and 24-byte blocks keep 4-byte alignment), Q8_0, Q4_0 and Q5_0 2-byte loads (34-,
//   18- and 22-byte blocks are only 2-byte aligned, and a misaligned wider load would fault on
//   NVIDIA), the K-quants 4-byte loads (Q4_K, Q5_K) or 2-byte ones (Q6_K's 210-byte blocks). (The
//   headers and Q5_0/Q5_1's high-bit word are shared by the lanes of a block: one cache line.)
// - x is read with 16-byte loads straight into registers. It is small and shared by every warp, so it
//   stays in L1/L2; staging it in shared memory would cost a block-wide barrier and the same on-chip
//   bandwidth without saving any DRAM traffic.
// - With batch > 1 the weights of an item are decoded once and applied to up to 8 rows of x
//   (kMaxBatchPerPass); larger batches take further passes over W (hipcore/ops/matmul.py hands large
//   batches to the matmul kernel instead). A group is then one row: the batch's accumulators already
//   fill the registers, and all variants share one register budget (measured: 2 rows x 8 batch rows
//   needed 110-230 VGPRs and spilled under a cap; this layout needs 58-64 registers on sm_80 / sm_90 and
//   63-96 VGPRs on the AMD targets).
// - In decoding each lane loads two items before using the first (see matvec_pass).
// - The matvec_split_<type> entries (F16, BF16, F32: the MoE routers' types) are for products of few rows, whose
//   row groups leave most of the GPU idle and walk each row in several round trips to memory (a router of 128
//   rows: 64 warps). A workgroup takes one row and one pass of up to 8 batch rows at a time and its threads split
//   the row's items, so a row is read in one or two round trips; the warps' sums meet in shared memory and are
//   added in warp order (no atomics: the same bits on every run and for any grid). hipcore/ops/matvec.py
//   split_rows says where; hipcore/ops/kernel_choice.py takes it past 8 tokens too (split_takes_batch).
// Requirements the launcher checks: cols % 32 == 0 (% 256 for the K-quants); W 16-byte aligned (F16,
// BF16, F32), 4-byte (Q4_1, Q5_1, Q4_K, Q5_K) or 2-byte (Q8_0, Q4_0, Q5_0, Q6_K); x 16-byte aligned. Block size: a
// multiple of 64 up to 256.
#include "hip_compat.h"
#include "matvec_formats.h"  // the weight formats (Q4_1 .. F32)

namespace {

static __device__ __forceinline__ float dot8(const float w[8], const float4 a, const float4 b, float acc) {
  acc = fmaf(w[0], a.x, acc);
  acc = fmaf(w[1], a.y, acc);
  acc = fmaf(w[2], a.z, acc);
  acc = fmaf(w[3], a.w, acc);
  acc = fmaf(w[4], b.x, acc);
  acc = fmaf(w[5], b.y, acc);
  acc = fmaf(w[6], b.z, acc);
  return fmaf(w[7], b.w, acc);
}

// acc0/acc1[b] += the item's weights of row 0 / row 1 times x[b], when `live` (a select, not a branch,
// so that the loads feeding it are not sunk into a branch by the compiler).
template <class Format, int NB, int ROWS>
__device__ __forceinline__ void accumulate(const typename Format::Raw raw0, const typename Format::Raw raw1, int item,
                                           const float* __restrict__ x, int cols, float acc0[NB], float acc1[NB],
                                           bool live = true) {
  float wa[8], wb[8];
  int col_a, col_b;
  Format::decode(raw0, item, wa, col_a, col_b);
  if (ROWS == 2) Format::decode(raw1, item, wb, col_a, col_b);
#pragma unroll
  for (int b = 0; b < NB; ++b) {
    const float* xb = x + (unsigned long long)b * cols;
    const float4 xa = *reinterpret_cast<const float4*>(xb + col_a);
    const float4 xc = *reinterpret_cast<const float4*>(xb + col_b);
    const float sum0 = dot8(wa, xa, xc, acc0[b]);
    acc0[b] = live ? sum0 : acc0[b];
    if (ROWS == 2) {
      const float sum1 = dot8(wb, xa, xc, acc1[b]);
      acc1[b] = live ? sum1 : acc1[b];
    }
  }
}

// One pass over W for the NB batch rows starting at x / y (NB <= kMaxBatchPerPass), ROWS (1 or 2)
// rows of W per warp at a time.
template <class Format, int NB, int ROWS>
__device__ __forceinline__ void matvec_pass(float* __restrict__ y, const unsigned char* __restrict__ W,
                                            const float* __restrict__ x, int rows, int cols) {
  const int lane = (int)threadIdx.x % WARP_SIZE;
  const int warps_per_block = (int)blockDim.x / WARP_SIZE;
  const int first_group = (int)blockIdx.x * warps_per_block + (int)threadIdx.x / WARP_SIZE;
  const int group_stride = (int)gridDim.x * warps_per_block;
  const int groups = (rows + ROWS - 1) / ROWS;
  const int items = cols / 8;
  const unsigned long long row_bytes = Format::row_bytes(cols);

  for (int group = first_group; group < groups; group += group_stride) {  // uniform across the warp
    const int r0 = ROWS * group;
    const bool has_second = ROWS == 2 && r0 + 1 < rows;
    const unsigned char* w0 = W + (unsigned long long)r0 * row_bytes;
    const unsigned char* w1 = has_second ? w0 + row_bytes : w0;  // an odd last row is read twice, written once

    float acc0[NB], acc1[NB];
#pragma unroll
    for (int b = 0; b < NB; ++b) acc0[b] = acc1[b] = 0.0f;

    // Decoding (NB == 1) takes two items per lane and step: both items' loads are in flight before the
    // first is used, which halves the round trips to memory on short rows (576 columns are 72 items:
    // 3 steps of one item on a 32-lane warp, 2 of two). Batches already have NB rows of x to load per
    // item, and the registers a second item would take there lower every path's occupancy.
    constexpr int kItemsPerStep = NB == 1 ? 2 : 1;
    for (int item = lane; item < items; item += kItemsPerStep * WARP_SIZE) {
      // Past the end of the row the second item repeats the first and is not added: its loads stay
      // unconditional, so the compilers issue them together with the first item's.
      const bool has_item2 = kItemsPerStep == 2 && item + WARP_SIZE < items;
      const int item2 = has_item2 ? item + WARP_SIZE : item;
      const typename Format::Raw raw0 = Format::load(w0, item);
      const typename Format::Raw raw1 = ROWS == 2 ? Format::load(w1, item) : raw0;
      const typename Format::Raw next0 = kItemsPerStep == 2 ? Format::load(w0, item2) : raw0;
      const typename Format::Raw next1 = kItemsPerStep == 2 && ROWS == 2 ? Format::load(w1, item2) : raw1;
      accumulate<Format, NB, ROWS>(raw0, raw1, item, x, cols, acc0, acc1);
      if (kItemsPerStep == 2) accumulate<Format, NB, ROWS>(next0, next1, item2, x, cols, acc0, acc1, has_item2);
    }

#pragma unroll
    for (int b = 0; b < NB; ++b) {
      const float s0 = rf_warp_sum(acc0[b]);
      const float s1 = ROWS == 2 ? rf_warp_sum(acc1[b]) : 0.0f;
      if (lane == 0) {
        float* yb = y + (unsigned long long)b * rows;
        yb[r0] = s0;
        if (has_second) yb[r0 + 1] = s1;
      }
    }
  }
}

template <class Format>
__device__ __forceinline__ void matvec(float* __restrict__ y, const void* __restrict__ W_, const float* __restrict__ x,
                                       int rows, int cols, int batch) {
  rf_check_wave_size();
  const unsigned char* W = static_cast<const unsigned char*>(W_);
  for (int b0 = 0; b0 < batch; b0 += kMaxBatchPerPass) {
    float* yp = y + (unsigned long long)b0 * rows;
    const float* xp = x + (unsigned long long)b0 * cols;
    const int left = batch - b0;
    switch (left < kMaxBatchPerPass ? left : kMaxBatchPerPass) {
      case 1: matvec_pass<Format, 1, 2>(yp, W, xp, rows, cols); break;
      case 2: matvec_pass<Format, 2, 1>(yp, W, xp, rows, cols); break;
      case 3: matvec_pass<Format, 3, 1>(yp, W, xp, rows, cols); break;
      case 4: matvec_pass<Format, 4, 1>(yp, W, xp, rows, cols); break;
      case 5: matvec_pass<Format, 5, 1>(yp, W, xp, rows, cols); break;
      case 6: matvec_pass<Format, 6, 1>(yp, W, xp, rows, cols); break;
      case 7: matvec_pass<Format, 7, 1>(yp, W, xp, rows, cols); break;
      default: matvec_pass<Format, 8, 1>(yp, W, xp, rows, cols); break;
    }
  }
}

constexpr int kSplitMaxThreads = 256;  // the entries' launch bounds
constexpr int kSplitMaxWarps = kSplitMaxThreads / WARP_SIZE;

// Row r of W times batch rows x[0 .. NB) in the split layout (every thread of the workgroup calls it: it holds
// barriers); thread t takes items t, t + blockDim.x, ... of the row.
template <class Format, int NB>
__device__ __forceinline__ void matvec_split_row(float* __restrict__ y, const unsigned char* __restrict__ W,
                                                 const float* __restrict__ x, int r, int rows, int cols,
                                                 float* partial) {
  const int lane = (int)threadIdx.x % WARP_SIZE, warp = (int)threadIdx.x / WARP_SIZE;
  const int threads = (int)blockDim.x, warps = threads / WARP_SIZE;
  const int items = cols / 8;
  const unsigned long long row_bytes = Format::row_bytes(cols);
  constexpr int kItemsPerStep = NB == 1 ? 2 : 1;  // as matvec_pass: two items' loads in flight when decoding

  const unsigned char* w = W + (unsigned long long)r * row_bytes;
  float acc[NB], unused[NB];
#pragma unroll
  for (int b = 0; b < NB; ++b) acc[b] = unused[b] = 0.0f;
  for (int item = (int)threadIdx.x; item < items; item += kItemsPerStep * threads) {
    const bool has_item2 = kItemsPerStep == 2 && item + threads < items;
    const int item2 = has_item2 ? item + threads : item;
    const typename Format::Raw raw = Format::load(w, item);
    const typename Format::Raw next = kItemsPerStep == 2 ? Format::load(w, item2) : raw;
    accumulate<Format, NB, 1>(raw, raw, item, x, cols, acc, unused);
    if (kItemsPerStep == 2) accumulate<Format, NB, 1>(next, next, item2, x, cols, acc, unused, has_item2);
  }
#pragma unroll
  for (int b = 0; b < NB; ++b) {
    const float s = rf_warp_sum(acc[b]);
    if (lane == 0) partial[warp * kMaxBatchPerPass + b] = s;
  }
  __syncthreads();
  if ((int)threadIdx.x < NB) {
    const int b = (int)threadIdx.x;
    float s = 0.0f;
    for (int i = 0; i < warps; ++i) s += partial[i * kMaxBatchPerPass + b];
    y[(unsigned long long)b * rows + r] = s;
  }
  __syncthreads();  // partial is written again for the next item
}

// Items (row r, pass p: batch rows 8p .. 8p + 7) r + rows * p = blockIdx.x, + gridDim.x, ... (uniform across the
// workgroup): a batch's passes spread over workgroups as its rows do, so a router's product over 32 tokens runs
// rows x 4 workgroups, not rows workgroups passing over their row four times.
template <class Format>
__device__ __forceinline__ void matvec_split(float* __restrict__ y, const void* __restrict__ W_,
                                             const float* __restrict__ x, int rows, int cols, int batch) {
  rf_check_wave_size();
  __shared__ float partial[kSplitMaxWarps * kMaxBatchPerPass];
  const unsigned char* W = static_cast<const unsigned char*>(W_);
  const int passes = (batch + kMaxBatchPerPass - 1) / kMaxBatchPerPass;
  for (int item = (int)blockIdx.x; item < rows * passes; item += (int)gridDim.x) {  // the launcher keeps it < 2^31
    const int r = item % rows, b0 = (item / rows) * kMaxBatchPerPass;
    float* yp = y + (unsigned long long)b0 * rows;
    const float* xp = x + (unsigned long long)b0 * cols;
    const int left = batch - b0;
    switch (left < kMaxBatchPerPass ? left : kMaxBatchPerPass) {
      case 1: matvec_split_row<Format, 1>(yp, W, xp, r, rows, cols, partial); break;
      case 2: matvec_split_row<Format, 2>(yp, W, xp, r, rows, cols, partial); break;
      case 3: matvec_split_row<Format, 3>(yp, W, xp, r, rows, cols, partial); break;
      case 4: matvec_split_row<Format, 4>(yp, W, xp, r, rows, cols, partial); break;
      case 5: matvec_split_row<Format, 5>(yp, W, xp, r, rows, cols, partial); break;
      case 6: matvec_split_row<Format, 6>(yp, W, xp, r, rows, cols, partial); break;
      case 7: matvec_split_row<Format, 7>(yp, W, xp, r, rows, cols, partial); break;
      default: matvec_split_row<Format, 8>(yp, W, xp, r, rows, cols, partial); break;
    }
  }
}

}  // namespace

// One entry point per format: matvec_<format>(y, W, x, rows, cols, batch).
#define RF_MATVEC_ENTRY(name, Format)                                                                          \
  extern "C" __global__ __launch_bounds__(256) void name(float* __restrict__ y, const void* __restrict__ W,      \
                                                         const float* __restrict__ x, int rows, int cols, int batch) { \
    matvec<Format>(y, W, x, rows, cols, batch);                                                                \
  }

RF_MATVEC_ENTRY(matvec_q4_0, Q4_0Format)
RF_MATVEC_ENTRY(matvec_q4_1, Q4_1Format)
RF_MATVEC_ENTRY(matvec_q5_0, Q5_0Format)
RF_MATVEC_ENTRY(matvec_q5_1, Q5_1Format)
RF_MATVEC_ENTRY(matvec_q8_0, Q8_0Format)
RF_MATVEC_ENTRY(matvec_q4_k, Q4_KFormat)
RF_MATVEC_ENTRY(matvec_q5_k, Q5_KFormat)
RF_MATVEC_ENTRY(matvec_q6_k, Q6_KFormat)
RF_MATVEC_ENTRY(matvec_f16, F16Format)
RF_MATVEC_ENTRY(matvec_bf16, BF16Format)
RF_MATVEC_ENTRY(matvec_f32, F32Format)

// The split entries (see the top), same arguments; block: a multiple of 64 up to kSplitMaxThreads.
#define RF_MATVEC_SPLIT_ENTRY(name, Format)                                                                     \
  extern "C" __global__ __launch_bounds__(256) void name(float* __restrict__ y, const void* __restrict__ W,      \
                                                         const float* __restrict__ x, int rows, int cols, int batch) { \
    matvec_split<Format>(y, W, x, rows, cols, batch);                                                          \
  }

RF_MATVEC_SPLIT_ENTRY(matvec_split_f16, F16Format)
RF_MATVEC_SPLIT_ENTRY(matvec_split_bf16, BF16Format)
RF_MATVEC_SPLIT_ENTRY(matvec_split_f32, F32Format)
