// RMSNorm, one block per row (grid = rows): out = x * (1 / sqrt(mean(x^2) + eps)) * weight, in the
// order llama.cpp computes it (scale first, then the weight). The block's size is any multiple of 64
// up to 256. `out` may be `x`: every read of x in the first pass happens before the block-wide sum,
// and the second pass reads and writes the same element in the same thread.
#include "hip_compat.h"

extern "C" __global__ __launch_bounds__(256) void rmsnorm_f32(float* out, const float* x, const float* weight, int n,
                                                              float eps) {
  __shared__ float scratch[RF_MAX_WARPS_PER_BLOCK];
  const unsigned long long row_start = (unsigned long long)blockIdx.x * (unsigned long long)n;
  x += row_start;
  out += row_start;

  float sum_sq = 0.0f;
  for (int i = threadIdx.x; i < n; i += blockDim.x) sum_sq = fmaf(x[i], x[i], sum_sq);
  sum_sq = rf_block_sum(sum_sq, scratch);

  const float scale = 1.0f / sqrtf(sum_sq / (float)n + eps);
  for (int i = threadIdx.x; i < n; i += blockDim.x) out[i] = (x[i] * scale) * weight[i];
}
