// RMSNorm, one block per row (grid = rows): out = x * (1 / sqrt(mean(x^2) + eps)) * weight, in the
// order llama.cpp computes it (scale first, then the weight). The block's size is any multiple of 64
// up to 256. `out` may be `x`: every read of x in the first pass happens before the block-wide sum,
// and the second pass reads and writes the same element in the same thread.
// rmsnorm_f32 writes float32; rmsnorm_f32_f16 writes f16 (raw bits), the x of matmul_mma's x16 entries, which
// would round it to f16 anyway (out must not be x there); rmsnorm_add_f32 adds the normalized row to out (Gemma's
// norm after attention and after the feed-forward, before the residual add: out is the residual stream, x the
// product; out must not be x). The compilers may fuse the weight's product and the add into one FMA: within an
// ulp of a norm launch then an add launch, one rounding fewer. rmsnorm_bias_f32 first adds a bias to x in place
// (x[i] += bias[i], add_bias.hip's sum: gpt-oss's o bias on the residual stream) and normalizes the sum: the same
// bits as an add_bias launch then a norm launch; out must not be x. rmsnorm_f32_and_f16 and rmsnorm_bias_f32_and_f16
// write the float32 rows and, from the same values, an f16 copy (out16): a mixture's router reads the float32 rows,
// its experts' products on the matrix cores the f16 ones, which they would round to f16 anyway; out16 must not
// overlap out or x.
#include "hip_compat.h"

// A value of the output: float32, or f16 bits.
template <bool ADD>
static __device__ __forceinline__ void put(unsigned short* out, int i, float v) { out[i] = rf_float_to_f16(v); }
// ADD (rmsnorm_add_f32): the normalized value added to what out holds, the residual stream.
template <bool ADD>
static __device__ __forceinline__ void put(float* out, int i, float v) {
  if (ADD) v += out[i];
  out[i] = v;
}
template <bool ADD>
static __device__ __forceinline__ void put4(float* out, int i, float4 r) {
  if (ADD) {
    const float4 y = reinterpret_cast<const float4*>(out)[i];
    r.x += y.x, r.y += y.y, r.z += y.z, r.w += y.w;
  }
  reinterpret_cast<float4*>(out)[i] = r;
}
template <bool ADD>
static __device__ __forceinline__ void put4(unsigned short* out, int i, float4 r) {
  const unsigned int lo = (unsigned int)rf_float_to_f16(r.x) | ((unsigned int)rf_float_to_f16(r.y) << 16);
  const unsigned int hi = (unsigned int)rf_float_to_f16(r.z) | ((unsigned int)rf_float_to_f16(r.w) << 16);
  reinterpret_cast<unsigned long long*>(out)[i] = (unsigned long long)lo | ((unsigned long long)hi << 32);
}

// x + bias where there is one, stored back into x (the same thread reads it again in the second pass).
static __device__ __forceinline__ float4 biased4(float* x, const float* bias, int i) {
  float4 v = reinterpret_cast<const float4*>(x)[i];
  if (bias) {
    const float4 b = reinterpret_cast<const float4*>(bias)[i];
    v.x += b.x, v.y += b.y, v.z += b.z, v.w += b.w;
    reinterpret_cast<float4*>(x)[i] = v;
  }
  return v;
}
static __device__ __forceinline__ float biased(float* x, const float* bias, int i) {
  if (!bias) return x[i];
  const float v = x[i] + bias[i];
  x[i] = v;
  return v;
}

// bias: null, or x's bias, added in place first (rmsnorm_bias_f32; x is then the writable residual stream).
// out16: null, or an f16 copy of each value written to out (the `_and_f16` entries; not with ADD).
template <class Out, bool ADD = false>
static __device__ __forceinline__ void rmsnorm_row(Out* out, const float* x_in, const float* weight, int n, float eps,
                                                   const float* bias = nullptr, unsigned short* out16 = nullptr) {
  __shared__ float scratch[RF_MAX_WARPS_PER_BLOCK];
  const unsigned long long row_start = (unsigned long long)blockIdx.x * (unsigned long long)n;
  float* x = const_cast<float*>(x_in) + row_start;  // written only where there is a bias
  out += row_start;
  if (out16) out16 += row_start;
  // Rows of whole float4s at 16-byte addresses (every model's hidden size) move 16 bytes a load: a quarter
  // of the loads, which issue together (a 4096-wide row: four a thread), where a float at a time made each
  // thread wait on sixteen. Uniform across the block.
  const unsigned long long addresses = reinterpret_cast<unsigned long long>(x) | reinterpret_cast<unsigned long long>(out) |
                                       reinterpret_cast<unsigned long long>(weight) |
                                       reinterpret_cast<unsigned long long>(bias);
  const bool whole_float4s = (n & 3) == 0 && (addresses & (sizeof(Out) == 4 ? 15 : 7)) == 0 &&
                             (reinterpret_cast<unsigned long long>(out16) & 7) == 0 &&
                             ((reinterpret_cast<unsigned long long>(x) | reinterpret_cast<unsigned long long>(weight) |
                               reinterpret_cast<unsigned long long>(bias)) & 15) == 0;

  float sum_sq = 0.0f;
  if (whole_float4s) {
    for (int i = threadIdx.x; i < n / 4; i += blockDim.x) {
      const float4 v = biased4(x, bias, i);
      sum_sq = fmaf(v.x, v.x, sum_sq);
      sum_sq = fmaf(v.y, v.y, sum_sq);
      sum_sq = fmaf(v.z, v.z, sum_sq);
      sum_sq = fmaf(v.w, v.w, sum_sq);
    }
  } else {
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
      const float v = biased(x, bias, i);
      sum_sq = fmaf(v, v, sum_sq);
    }
  }
  sum_sq = rf_block_sum(sum_sq, scratch);

  const float scale = 1.0f / sqrtf(sum_sq / (float)n + eps);
  if (whole_float4s) {
    const float4* x4 = reinterpret_cast<const float4*>(x);
    const float4* w4 = reinterpret_cast<const float4*>(weight);
    for (int i = threadIdx.x; i < n / 4; i += blockDim.x) {
      const float4 v = x4[i], w = w4[i];
      float4 r;
      r.x = (v.x * scale) * w.x, r.y = (v.y * scale) * w.y, r.z = (v.z * scale) * w.z, r.w = (v.w * scale) * w.w;
      put4<ADD>(out, i, r);
      if (out16) put4<false>(out16, i, r);
    }
  } else {
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
      if (out16) {  // x read once: out may be x
        const float r = (x[i] * scale) * weight[i];
        put<false>(out, i, r);
        put<false>(out16, i, r);
      } else {
        put<ADD>(out, i, (x[i] * scale) * weight[i]);  // one expression, as before: where ADD, the compiler may fuse
      }
    }
  }
}

extern "C" __global__ __launch_bounds__(256) void rmsnorm_f32(float* out, const float* x, const float* weight, int n,
                                                              float eps) {
  rf_grid_dependency_sync();  // a programmatic launch (hipcore/ops/rmsnorm.py)
  rmsnorm_row(out, x, weight, n, eps);
}

extern "C" __global__ __launch_bounds__(256) void rmsnorm_f32_f16(unsigned short* out, const float* x,
                                                                  const float* weight, int n, float eps) {
  rf_grid_dependency_sync();  // a programmatic launch (hipcore/ops/rmsnorm.py)
  rmsnorm_row(out, x, weight, n, eps);
}

extern "C" __global__ __launch_bounds__(256) void rmsnorm_add_f32(float* out, const float* x, const float* weight, int n,
                                                                  float eps) {
  rf_grid_dependency_sync();  // a programmatic launch (hipcore/ops/rmsnorm.py)
  rmsnorm_row<float, true>(out, x, weight, n, eps);
}

extern "C" __global__ __launch_bounds__(256) void rmsnorm_bias_f32(float* out, float* x, const float* bias,
                                                                   const float* weight, int n, float eps) {
  rf_grid_dependency_sync();  // a programmatic launch (hipcore/ops/rmsnorm.py)
  rmsnorm_row(out, x, weight, n, eps, bias);
}

extern "C" __global__ __launch_bounds__(256) void rmsnorm_f32_and_f16(float* out, unsigned short* out16, const float* x,
                                                                      const float* weight, int n, float eps) {
  rf_grid_dependency_sync();  // a programmatic launch (hipcore/ops/rmsnorm.py)
  rmsnorm_row(out, x, weight, n, eps, nullptr, out16);
}

extern "C" __global__ __launch_bounds__(256) void rmsnorm_bias_f32_and_f16(float* out, unsigned short* out16, float* x,
                                                                           const float* bias, const float* weight, int n,
                                                                           float eps) {
  rf_grid_dependency_sync();  // a programmatic launch (hipcore/ops/rmsnorm.py)
  rmsnorm_row(out, x, weight, n, eps, bias, out16);
}
