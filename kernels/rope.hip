// Rotary position embedding, in place on x[n_tokens, n_heads, head_dim], in llama.cpp's two layouts:
//   rope_f32       NORM mode (llama): pair i is (x[2i], x[2i+1])
//   rope_neox_f32  NEOX mode (qwen2, qwen3, gemma ...): pair i is (x[i], x[i + rope_dim/2])
// For every pair i < rope_dim/2,
//   angle = positions[token] * freq_scale * theta_base^(-2i / rope_dim) / freq_factors[i]
//   (a, b) <- (a cos - b sin, a sin + b cos)
// freq_factors (rope_dim / 2 floats, or null for none) are the per-pair divisors of Llama 3's "llama3"
// RoPE scaling, which llama.cpp's converter writes into the file as rope_freqs.weight.
// Elements at and past rope_dim are left alone. One thread per pair, grid-stride: any grid covers all.
#include "hip_compat.h"

// sin and cos of a float32 angle, the same code on every vendor (so both give the same results, and
// AMD needs no device library). The angle is reduced by k * pi/2 in three parts with fused
// multiply-adds (Cody-Waite, exact enough for |angle| up to about 1e5, past every position times
// frequency a context window reaches), then minimax polynomials on [-pi/4, pi/4] (Cephes' sinf / cosf
// coefficients, about 1 ulp).
static __device__ __forceinline__ void rope_sincos(float angle, float* sin_out, float* cos_out) {
  const float k = rintf(angle * 0.636619772f);  // angle / (pi/2), rounded to the nearest quadrant
  float r = fmaf(-k, 1.57079637050628662109375f, angle);
  r = fmaf(-k, -4.37113882867379e-08f, r);
  r = fmaf(-k, -1.71512451e-15f, r);
  const float z = r * r;
  const float s = fmaf(fmaf(fmaf(-1.9515295891e-4f, z, 8.3321608736e-3f), z, -1.6666654611e-1f), z * r, r);
  const float c = fmaf(fmaf(fmaf(fmaf(2.443315711809948e-5f, z, -1.388731625493765e-3f), z, 4.166664568298827e-2f), z,
                            -0.5f),
                       z, 1.0f);
  const int quadrant = (int)k & 3;  // two's complement: right for negative k as well
  const float s_q = (quadrant & 1) ? c : s;
  const float c_q = (quadrant & 1) ? s : c;
  *sin_out = (quadrant & 2) ? -s_q : s_q;
  *cos_out = ((quadrant + 1) & 2) ? -c_q : c_q;
}

// One pair of one head: `second` is the distance from its first element to its second (1 in NORM
// mode, rope_dim/2 in NEOX mode); `pair_start(i)` the offset of pair i's first element in the head.
template <typename PairStart>
static __device__ __forceinline__ void rope_pairs(float* x, const int* positions, const float* freq_factors,
                                                  int n_tokens, int n_heads, int head_dim, int rope_dim,
                                                  float theta_base, float freq_scale, int second,
                                                  PairStart pair_start) {
  const int pairs_per_head = rope_dim / 2;
  const unsigned long long total = (unsigned long long)n_tokens * (unsigned long long)n_heads * pairs_per_head;
  const unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
  // theta_base^(-2i/rope_dim) = exp2(i * (-2 log2(theta_base) / rope_dim)).
  const float log2_step = -2.0f * log2f(theta_base) / (float)rope_dim;
  for (unsigned long long k = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; k < total; k += stride) {
    const int i = (int)(k % pairs_per_head);
    const unsigned long long token_head = k / pairs_per_head;
    const int token = (int)(token_head / n_heads);
    float freq = freq_scale * exp2f((float)i * log2_step);
    if (freq_factors) freq = freq / freq_factors[i];
    const float angle = (float)positions[token] * freq;
    float s, c;
    rope_sincos(angle, &s, &c);
    float* p = x + token_head * head_dim + pair_start(i);
    const float a = p[0], b = p[second];
    p[0] = a * c - b * s;
    p[second] = a * s + b * c;
  }
}

// Functors, not lambdas: nvrtc compiles no lambda in device code without -default-device.
struct RopeAdjacentPairs {
  __device__ int operator()(int i) const { return 2 * i; }
};
struct RopeHalvesPairs {
  __device__ int operator()(int i) const { return i; }
};

extern "C" __global__ __launch_bounds__(256) void rope_f32(float* x, const int* positions, const float* freq_factors,
                                                           int n_tokens, int n_heads, int head_dim, int rope_dim,
                                                           float theta_base, float freq_scale) {
  rf_grid_dependency_sync();  // a programmatic launch (hipcore/ops/rope.py)
  rope_pairs(x, positions, freq_factors, n_tokens, n_heads, head_dim, rope_dim, theta_base, freq_scale, 1,
             RopeAdjacentPairs());
}

extern "C" __global__ __launch_bounds__(256) void rope_neox_f32(float* x, const int* positions,
                                                                const float* freq_factors, int n_tokens, int n_heads,
                                                                int head_dim, int rope_dim, float theta_base,
                                                                float freq_scale) {
  rf_grid_dependency_sync();  // a programmatic launch (hipcore/ops/rope.py)
  rope_pairs(x, positions, freq_factors, n_tokens, n_heads, head_dim, rope_dim, theta_base, freq_scale, rope_dim / 2,
             RopeHalvesPairs());
}
