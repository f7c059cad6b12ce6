// Gather rows of a float32 matrix: out[i, :] = x[rows[i], :] for i < n_rows (the rows whose logits
// the step samples). Workgroup-stride over the selected rows, each row copied by the whole workgroup,
// so any grid covers them all. A row index outside [0, n_src_rows) gives a zero row: a kernel cannot
// raise, and reading outside x could fault; the host reference refuses such an index.
#include "hip_compat.h"

extern "C" __global__ __launch_bounds__(256) void select_rows_f32(float* __restrict__ out, const float* __restrict__ x,
                                                                  const int* __restrict__ rows, int n_rows, int width,
                                                                  int n_src_rows) {
  for (int i = (int)blockIdx.x; i < n_rows; i += (int)gridDim.x) {
    const int row = rows[i];
    const bool inside = row >= 0 && row < n_src_rows;
    const float* src = x + (unsigned long long)(inside ? row : 0) * (unsigned long long)width;
    float* dst = out + (unsigned long long)i * (unsigned long long)width;
    for (int c = (int)threadIdx.x; c < width; c += (int)blockDim.x) dst[c] = inside ? src[c] : 0.0f;
  }
}
