// Soft-capping: out[i] = cap * tanh(x[i] / cap) (Gemma 2 caps its output logits at 30 this way). tanh is
// written with expf only, 1 - 2 / (1 + exp(2 x / cap)), as every vendor has expf: at the far ends expf gives
// inf or 0 and the result is +-cap exactly, never NaN. `out` may be `x`. Grid-stride loop: any grid covers
// any n.
#include "hip_compat.h"

extern "C" __global__ __launch_bounds__(256) void softcap_f32(float* out, const float* x, int n, float cap) {
  const float two_over_cap = 2.0f / cap;
  const unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
  for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; i < (unsigned long long)n;
       i += stride) {
    out[i] = cap * (1.0f - 2.0f / (1.0f + expf(x[i] * two_over_cap)));
  }
}
