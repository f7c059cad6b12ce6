"""gemma3 (Gemma 3): qwen3's attention input (per-head q/k RMSNorm, NEOX RoPE), then a norm on the attention
output and on the feed-forward output before each residual add, a GeGLU feed-forward, token embeddings
scaled by sqrt(hidden_size), and local layers (five of every six) that attend through a sliding window
with their own RoPE base (llama.cpp: src/models/gemma3.cpp). The window and the per-layer RoPE come from
the config (ModelConfig.layer_window / layer_rope), read by the shared attention and head_norm_rope blocks.

The attention input is qwen3's (the q|k|v products fused where the weights allow, then head_norm_rope); the GeGLU
feed-forward takes fused_qmatvec's gate|up with GELU where the weights allow; the o and down products
(ProjectionPlanner.product: fused_qmatvec storing its product where it takes the weight) are each followed by one
launch of their norm added to the residual stream (rmsnorm.launch_add), since a norm of a product's whole row
cannot sit in the product's epilogue.
"""

from hipcore.model.blocks import (Family, attention_after_head_norm, geglu_feed_forward, head_normed_attention_input,
                                  post_normed_attention_output, post_normed_feed_forward_output, scaled_embedding)

FAMILY = Family("gemma3", (head_normed_attention_input, attention_after_head_norm, post_normed_attention_output,
                           geglu_feed_forward, post_normed_feed_forward_output), embedding_input=scaled_embedding)
