// Matrix-vector product on GGUF weights with the activations quantized to int8 on the fly, the decode
// path for the K-quants (and Q8_0, Q4_0, MXFP4):
//   y[b, r] = sum_c W[r, c] * xq[b, c]   for r < rows, b < batch
// where xq is x quantized per slice of 32 columns (see below) to int8 codes times one float scale:
// d = amax / 127, q = rint(x * (127 / amax)) (0 when amax is 0). The products are integer dot products of
// the weight codes with the x codes (rf_dp4a: four byte products per instruction), scaled once per
// sub-block: this is how llama.cpp's MMVQ path computes decode products, and it is what lets a kernel
// keep up with the memory: the float path (matvec.hip) spends about four instructions per weight
// (unpack, convert, scale, FMA) and an H100 issues about five per weight at full bandwidth.
//
// Layout of the work:
// - A "slice" is 32 weights of one row, taken as two runs of 16 columns that the format stores side by
//   side (the low and the high nibbles of the same 16 bytes). A row has cols / 32 slices. Lane l of a
//   warp takes slices l, l + WARP_SIZE, ...: consecutive lanes read consecutive bytes of the row.
// - x is quantized per slice by the lane that uses it (its 32 values: eight 16-byte loads, one scale),
//   in registers: no shared memory, no barrier. The cost is shared by the rows a warp walks together
//   (two in decoding) and x, a few KiB shared by every warp, stays in L1/L2.
// - In decoding a warp walks four rows together, issuing the loads of all four before the first is used,
//   so that enough bytes are in flight to cover the memory latency. Batches of 2..4 tokens take one
//   row and one slice per step and apply the decoded weights to every token.
// - The partial sums are floats per lane; one shuffle reduction per row and token at the end.
// Formats and their loads: Q4_K (144-byte super-blocks) and Q5_K (176) are 16-byte aligned, so a lane
// reads its 16 code bytes and the 16-byte header with two 16-byte loads (Q5_K: one more for the fifth
// bits). Q6_K (210), Q8_0 (34) and Q4_0 (18) are only 2-byte aligned: their runs of bytes are read as
// aligned 4-byte words and shifted into place (one word more than the run); MXFP4 (17, byte aligned) likewise
// (mxfp4_q8_format.h, moe_experts.hip's reading).
// Requirements the launcher checks: cols % 256 == 0 for the K-quants, % 32 otherwise; W 16-byte aligned
// (Q4_K, Q5_K), 2-byte (the others) or any (MXFP4); x 16-byte aligned. Block size: a multiple of 64 up to 256.
#include "hip_compat.h"
#include "qmatvec_formats.h"  // XSlice and the weight formats (Q4_K .. Q4_0)
#include "mxfp4_q8_format.h"  // MXFP4, as moe_experts.hip reads it (any dense tensor of the type too)

namespace {
namespace q8 {

// acc[r][b] += the slice's products for every row r and token b, when `live` (a select, not a branch,
// so that the loads feeding it stay where they were issued).
template <class Format, int NB, int ROWS>
__device__ __forceinline__ void accumulate(const typename Format::Raw raw[ROWS], int slice, const float* __restrict__ x,
                                           int cols, float acc[ROWS][NB], bool live) {
  int col_a, col_b;
  Format::columns(slice, col_a, col_b);
  typename Format::Decoded dec[ROWS];  // decoded once, applied to every token
#pragma unroll
  for (int r = 0; r < ROWS; ++r) dec[r] = Format::decode(raw[r], slice);
#pragma unroll
  for (int b = 0; b < NB; ++b) {
    const XSlice xs = quantize_x(x + (unsigned long long)b * cols, col_a, col_b);
#pragma unroll
    for (int r = 0; r < ROWS; ++r) {
      const float sum = fmaf(xs.d, Format::apply(dec[r], xs), acc[r][b]);
      acc[r][b] = live ? sum : acc[r][b];
    }
  }
}

// One pass over W for the NB tokens starting at x / y, ROWS rows of W per warp at a time.
template <class Format, int NB, int ROWS>
__device__ __forceinline__ void qmatvec_pass(float* __restrict__ y, const unsigned char* __restrict__ W,
                                             const float* __restrict__ x, int rows, int cols) {
  const int lane = (int)threadIdx.x % WARP_SIZE;
  const int warps_per_block = (int)blockDim.x / WARP_SIZE;
  const int first_group = (int)blockIdx.x * warps_per_block + (int)threadIdx.x / WARP_SIZE;
  const int group_stride = (int)gridDim.x * warps_per_block;
  const int groups = (rows + ROWS - 1) / ROWS;
  const int slices = cols / 32;
  const unsigned long long row_bytes = Format::row_bytes(cols);

  for (int group = first_group; group < groups; group += group_stride) {  // uniform across the warp
    const int r0 = ROWS * group;
    const unsigned char* w[ROWS];
#pragma unroll
    for (int r = 0; r < ROWS; ++r)  // rows past the end read the first row again and are not written
      w[r] = W + (unsigned long long)(r0 + r < rows ? r0 + r : r0) * row_bytes;

    float acc[ROWS][NB];
#pragma unroll
    for (int r = 0; r < ROWS; ++r)
#pragma unroll
      for (int b = 0; b < NB; ++b) acc[r][b] = 0.0f;

    // One slice per step: in decoding the four rows' loads already put enough bytes in flight (measured
    // on an H100: two rows with two slices per step reached 1,440 GB/s on 14336 x 4096 Q4_K, four rows
    // with one slice 2,008), and x is quantized once for four rows. The second-slice path is kept for
    // variants that walk fewer rows.
    constexpr int kSlicesPerStep = 1;
    for (int slice = lane; slice < slices; slice += kSlicesPerStep * WARP_SIZE) {
      const bool has_second = kSlicesPerStep == 2 && slice + WARP_SIZE < slices;
      const int slice2 = has_second ? slice + WARP_SIZE : slice;
      typename Format::Raw raw[ROWS], next[ROWS];
#pragma unroll
      for (int r = 0; r < ROWS; ++r) raw[r] = Format::load(w[r], slice);
      if (kSlicesPerStep == 2) {
#pragma unroll
        for (int r = 0; r < ROWS; ++r) next[r] = Format::load(w[r], slice2);
      }
      accumulate<Format, NB, ROWS>(raw, slice, x, cols, acc, true);
      if (kSlicesPerStep == 2) accumulate<Format, NB, ROWS>(next, slice2, x, cols, acc, has_second);
    }

#pragma unroll
    for (int b = 0; b < NB; ++b)
#pragma unroll
      for (int r = 0; r < ROWS; ++r) {
        const float s = rf_warp_sum(acc[r][b]);
        if (lane == 0 && r0 + r < rows) y[(unsigned long long)b * rows + r0 + r] = s;
      }
  }
}

template <class Format>
__device__ __forceinline__ void qmatvec(float* __restrict__ y, const void* __restrict__ W_, const float* __restrict__ x,
                                        int rows, int cols, int batch) {
  rf_check_wave_size();
  const unsigned char* W = static_cast<const unsigned char*>(W_);
  for (int b0 = 0; b0 < batch; b0 += kMaxBatchPerPass) {
    float* yp = y + (unsigned long long)b0 * rows;
    const float* xp = x + (unsigned long long)b0 * cols;
    const int left = batch - b0;
    switch (left < kMaxBatchPerPass ? left : kMaxBatchPerPass) {
      case 1: qmatvec_pass<Format, 1, 4>(yp, W, xp, rows, cols); break;
      case 2: qmatvec_pass<Format, 2, 1>(yp, W, xp, rows, cols); break;
      case 3: qmatvec_pass<Format, 3, 1>(yp, W, xp, rows, cols); break;
      default: qmatvec_pass<Format, 4, 1>(yp, W, xp, rows, cols); break;
    }
  }
}

}  // namespace q8
}  // namespace

// One entry point per format: qmatvec_<format>(y, W, x, rows, cols, batch).
#define RF_QMATVEC_ENTRY(name, Format)                                                                          \
  extern "C" __global__ __launch_bounds__(256) void name(float* __restrict__ y, const void* __restrict__ W,       \
                                                         const float* __restrict__ x, int rows, int cols, int batch) { \
    q8::qmatvec<Format>(y, W, x, rows, cols, batch);                                                            \
  }

RF_QMATVEC_ENTRY(qmatvec_q4_k, q8::Q4_KFormat)
RF_QMATVEC_ENTRY(qmatvec_q5_k, q8::Q5_KFormat)
RF_QMATVEC_ENTRY(qmatvec_q6_k, q8::Q6_KFormat)
RF_QMATVEC_ENTRY(qmatvec_q8_0, q8::Q8_0Format)
RF_QMATVEC_ENTRY(qmatvec_q4_0, q8::Q4_0Format)
RF_QMATVEC_ENTRY(qmatvec_mxfp4, q8::MXFP4Format)
