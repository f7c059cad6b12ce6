// Residual add: out[i] = a[i] + b[i]. `out` may be `a` or `b` (in-place residual update), so no
// pointer is declared __restrict__. Grid-stride loop: any grid covers any n.
#include "hip_compat.h"

extern "C" __global__ __launch_bounds__(256) void add_f32(float* out, const float* a, const float* b, int n) {
  const unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
  for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; i < (unsigned long long)n;
       i += stride) {
    out[i] = a[i] + b[i];
  }
}
