// Attention's logit soft cap (Gemma 2) for the kernels that compute scores in base 2 (paged_attention,
// prompt_attention: q carries log2(e), so exp2 gives the softmax's exponentials): a natural score S becomes
// softcap * tanh(S / softcap) before the softmax, as llama.cpp caps the scaled scores. For x = S log2(e), in the
// same units: cap = softcap * log2(e), two_over_cap = 2 / softcap, and
//   tanh(y) = 1 - 2 / (1 + exp(2y)),  exp(2 S / softcap) = exp2(x * 2 / softcap).
// Only expf-class functions (every vendor has exp2f without a device library; tanhf needs one on AMD); at the far
// ends exp2f gives inf or 0 and the result +-cap exactly.
#pragma once

static __device__ __forceinline__ float rf_attention_soft_cap(float x, float cap, float two_over_cap) {
  return cap * (1.0f - 2.0f / (1.0f + exp2f(x * two_over_cap)));
}
