"""What each supported model family's GGUF files hold beyond the llama layout, as data.

One entry per `general.architecture` value. The gguf layer validates a file against its entry (every
tensor present with its shape, nothing else) before a byte goes to the device; the model layer
(hipcore/model/families/) composes the forward pass from the same traits. The math of each family is
llama.cpp's (src/models/<family>.cpp; the RoPE layout from llama_model_rope_type in src/llama-model.cpp).

  llama  the reference layout: pre-norm attention and SwiGLU feed-forward, RoPE in NORM mode (adjacent
         pairs). Mistral-style llama files use it too.
  qwen2  llama plus a bias on each of the q, k and v products (attn_q.bias ...); RoPE in NEOX mode
         (the two halves of a head rotate together).
  qwen3  llama plus an RMSNorm on every head of q and of k (attn_q_norm / attn_k_norm, head_dim
         weights, the model's rms epsilon) between the product and RoPE; no biases; NEOX RoPE; its head
         size (attention.key_length) need not be embedding_length / head_count.
"""

from __future__ import annotations

from dataclasses import dataclass

ROPE_TYPES = ("norm", "neox")


@dataclass(frozen=True)
class Architecture:
    name: str
    rope_type: str             # "norm": pairs (2i, 2i+1); "neox": pairs (i, i + rope_dim/2)
    qkv_bias: bool = False     # blk.N.attn_{q,k,v}.bias: added after each product
    qk_norm: bool = False      # blk.N.attn_{q,k}_norm.weight: RMSNorm per head before RoPE
    rope_freq_factors: bool = False  # rope_freqs.weight may be present (llama 3.1-style long context)

    def layer_vectors(self, q_size: int, kv_size: int, head_dim: int) -> dict[str, tuple[int]]:
        """Per-layer 1-D tensors beyond the llama layout: name (without blk.N.) -> shape."""
        extra: dict[str, tuple[int]] = {}
        if self.qkv_bias:
            extra.update({"attn_q.bias": (q_size,), "attn_k.bias": (kv_size,), "attn_v.bias": (kv_size,)})
        if self.qk_norm:
            extra.update({"attn_q_norm.weight": (head_dim,), "attn_k_norm.weight": (head_dim,)})
        return extra


ARCHITECTURES: dict[str, Architecture] = {
    "llama": Architecture("llama", rope_type="norm", rope_freq_factors=True),
    "qwen2": Architecture("qwen2", rope_type="neox", qkv_bias=True),
    "qwen3": Architecture("qwen3", rope_type="neox", qk_norm=True),
}
