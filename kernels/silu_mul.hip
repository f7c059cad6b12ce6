// SwiGLU's gate: out[i] = silu(gate[i]) * up[i], silu(g) = g / (1 + exp(-g)) as in llama.cpp (gated_activation.h).
// `out` may alias `gate` or `up`, so no pointer is __restrict__. Grid-stride loop: any grid covers any n.
#include "hip_compat.h"
#include "gated_activation.h"

extern "C" __global__ __launch_bounds__(256) void silu_mul_f32(float* out, const float* gate, const float* up, int n) {
  rf_grid_dependency_sync();  // a programmatic launch (hipcore/ops/silu_mul.py)
  const unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
  for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; i < (unsigned long long)n;
       i += stride) {
    out[i] = rf_silu_gated(gate[i], up[i]);
  }
}
