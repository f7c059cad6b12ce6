// Scale by a constant: out[i] = x[i] * factor (Gemma multiplies its token embeddings by
// sqrt(hidden_size) before the first layer). One float32 product, correctly rounded on every device.
// `out` may be `x`. Grid-stride loop: any grid covers any n.
#include "hip_compat.h"

extern "C" __global__ __launch_bounds__(256) void scale_f32(float* out, const float* x, int n, float factor) {
  const unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
  for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; i < (unsigned long long)n;
       i += stride) {
    out[i] = x[i] * factor;
  }
}
