"""gemma3 (Gemma 3): qwen3's attention input (per-head q/k RMSNorm, NEOX RoPE), then a norm on the attention
output and on the feed-forward output before each residual add, a GeGLU feed-forward, token embeddings
scaled by sqrt(hidden_size), and local layers (five of every six) that attend through a sliding window
with their own RoPE base (llama.cpp: src/models/gemma3.cpp). The window and the per-layer RoPE come from
the config (ModelConfig.layer_window / layer_rope), read by the shared attention and rope_qk blocks.

The fused kernels fold a SwiGLU, NORM RoPE and a plain residual add into their products, none of which
Gemma has, so every launch of its layer is a single op: correctness first.
"""

from hipcore.model.blocks import (Family, attention, compose, geglu_feed_forward, post_normed_attention_output,
                                  post_normed_feed_forward_output, qk_head_norm, qkv_products, rope_qk,
                                  scaled_embedding)

FAMILY = Family("gemma3", (compose(qkv_products, qk_head_norm, rope_qk), attention, post_normed_attention_output,
                           geglu_feed_forward, post_normed_feed_forward_output), embedding_input=scaled_embedding)
