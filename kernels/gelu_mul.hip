// GeGLU's gate (Gemma): out[i] = gelu(gate[i]) * up[i], with the tanh approximation of GELU that
// llama.cpp's ggml_gelu computes:
//   gelu(g) = 0.5 g (1 + tanh(sqrt(2/pi) (g + 0.044715 g^3)))
// written as g / (1 + exp(-2u)), u = sqrt(2/pi) (g + 0.044715 g^3), which is the same function
// (0.5 (1 + tanh u) is the logistic function of 2u) and needs only expf, which every vendor has
// without a device library. For g -> -inf, exp(-2u) overflows to inf and the quotient is -0, the right
// limit; for g -> +inf it is g. `out` may alias `gate` or `up`, so no pointer is __restrict__.
// Grid-stride loop: any grid covers any n.
#include "hip_compat.h"

extern "C" __global__ __launch_bounds__(256) void gelu_mul_f32(float* out, const float* gate, const float* up, int n) {
  const unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
  for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; i < (unsigned long long)n;
       i += stride) {
    const float g = gate[i];
    const float u = 0.7978845608028654f * fmaf(0.044715f * g, g * g, g);
    out[i] = g / (1.0f + expf(-2.0f * u)) * up[i];
  }
}
