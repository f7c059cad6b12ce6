// Bias add, in place: x[row, col] += bias[col] for x float32 [rows, n] and bias float32 [n] (the q/k/v
// biases of qwen2 after their products). A float32 sum is correctly rounded on every device, so results are
// bit-exact. Grid-stride loop: any grid covers any rows * n.
#include "hip_compat.h"

extern "C" __global__ __launch_bounds__(256) void add_bias_f32(float* x, const float* bias, int rows, int n) {
  const unsigned long long total = (unsigned long long)rows * (unsigned long long)n;
  const unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
  for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += stride) {
    x[i] += bias[i % (unsigned long long)n];
  }
}
