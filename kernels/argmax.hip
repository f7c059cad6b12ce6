// Argmax of each row, one block per row (grid = rows): out[row] = the index of the row's largest
// element, with numpy's rules: the lowest index among equal maxima, and the first NaN if there is one
// (NaN compares above every number). The block's size is any multiple of 64 up to 1024.
#include "hip_compat.h"

// True when (va, ia) wins over (vb, ib).
static __device__ __forceinline__ bool argmax_wins(float va, int ia, float vb, int ib) {
  const bool a_nan = va != va, b_nan = vb != vb;
  if (a_nan || b_nan) return a_nan && (!b_nan || ia < ib);
  return va > vb || (va == vb && ia < ib);
}

extern "C" __global__ __launch_bounds__(1024) void argmax_f32(int* out, const float* x, int n) {
  __shared__ float scratch_value[RF_MAX_WARPS_PER_BLOCK];
  __shared__ int scratch_index[RF_MAX_WARPS_PER_BLOCK];
  rf_check_wave_size();
  x += (unsigned long long)blockIdx.x * (unsigned long long)n;

  // A thread without elements holds (-inf, INT_MAX), which every real element beats.
  const float minus_inf = -RF_INFINITY;
  float best = minus_inf;
  int best_index = 0x7fffffff;
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    const float v = x[i];
    if (argmax_wins(v, i, best, best_index)) {
      best = v;
      best_index = i;
    }
  }

  const int lane = (int)threadIdx.x % WARP_SIZE, warp = (int)threadIdx.x / WARP_SIZE;
#pragma unroll
  for (int offset = WARP_SIZE / 2; offset > 0; offset >>= 1) {
    const float other = __shfl_xor(best, offset);
    const int other_index = __shfl_xor(best_index, offset);
    if (argmax_wins(other, other_index, best, best_index)) {
      best = other;
      best_index = other_index;
    }
  }
  if (lane == 0) {
    scratch_value[warp] = best;
    scratch_index[warp] = best_index;
  }
  __syncthreads();
  if (warp == 0) {
    const int warps = (int)blockDim.x / WARP_SIZE;
    best = lane < warps ? scratch_value[lane] : minus_inf;
    best_index = lane < warps ? scratch_index[lane] : 0x7fffffff;
#pragma unroll
    for (int offset = WARP_SIZE / 2; offset > 0; offset >>= 1) {
      const float other = __shfl_xor(best, offset);
      const int other_index = __shfl_xor(best_index, offset);
      if (argmax_wins(other, other_index, best, best_index)) {
        best = other;
        best_index = other_index;
      }
    }
    if (lane == 0) out[blockIdx.x] = best_index;
  }
}
