// GeGLU's gate (Gemma): out[i] = gelu(gate[i]) * up[i], with the tanh approximation of GELU that
// llama.cpp's ggml_gelu computes, in gated_activation.h's form. `out` may alias `gate` or `up`, so no pointer
// is __restrict__. Grid-stride loop: any grid covers any n.
#include "hip_compat.h"
#include "gated_activation.h"

extern "C" __global__ __launch_bounds__(256) void gelu_mul_f32(float* out, const float* gate, const float* up, int n) {
  const unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
  for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; i < (unsigned long long)n;
       i += stride) {
    out[i] = rf_gelu_gated(gate[i], up[i]);
  }
}
