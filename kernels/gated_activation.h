// The gated activations of a feed-forward, as llama.cpp computes them, for every kernel that forms one (silu_mul,
// gelu_mul, fused_qmatvec's gate|up, matmul_mma's SwiGLU pairs and its up product with the activation in the
// epilogue), so that the fused kernels round as the single ops do:
//   SwiGLU (llama, qwen, phi3): silu(g) * u, silu(g) = g / (1 + exp(-g));
//   GeGLU (Gemma):              gelu(g) * u, GELU in its tanh approximation 0.5 g (1 + tanh(sqrt(2/pi) (g +
//                               0.044715 g^3))), written as g / (1 + exp(-2w)), w = sqrt(2/pi) (g + 0.044715 g^3):
//                               the same function (0.5 (1 + tanh w) is the logistic function of 2w) with only expf,
//                               which every vendor has without a device library.
//   gpt-oss's clamped SwiGLU (ggml's swiglu_oai, alpha 1.702, limit 7): g' = min(g, 7), u' = clamp(u, -7, 7),
//                               g' / (1 + exp(-1.702 g')) * (u' + 1) (moe_experts' gate|up).
// For g -> -inf, the exponential overflows to inf and the quotient is -0, the right limit; for g -> +inf it is g.
#pragma once

static __device__ __forceinline__ float rf_silu_gated(float g, float u) { return g / (1.0f + expf(-g)) * u; }

static __device__ __forceinline__ float rf_gelu_gated(float g, float u) {
  return g / (1.0f + expf(-2.0f * (0.7978845608028654f * fmaf(0.044715f * g, g * g, g)))) * u;
}

static __device__ __forceinline__ float rf_swiglu_oai_gated(float g, float u) {
  const float gc = fminf(g, 7.0f), uc = fminf(fmaxf(u, -7.0f), 7.0f);
  return gc / (1.0f + expf(-1.702f * gc)) * (uc + 1.0f);
}

// gelu: GeGLU's, else SwiGLU's (uniform where a kernel argument sets it; a constant where a template does).
static __device__ __forceinline__ float rf_gated(float g, float u, bool gelu) {
  if (gelu) return rf_gelu_gated(g, u);
  return rf_silu_gated(g, u);
}
