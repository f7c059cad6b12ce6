"""qwen3moe (Qwen3-30B-A3B, Qwen3-235B-A22B, Qwen3-Coder-30B-A3B): qwen3's attention (per-head q/k RMSNorm, NEOX RoPE,
head_normed_attention_input) with a mixture-of-experts feed-forward in every layer (llama.cpp:
src/models/qwen3moe.cpp): softmax over the router's logits, the top expert_used_count experts' weights renormalized,
their SwiGLU products summed into the residual stream (hipcore/model/moe_blocks.py)."""

from hipcore.model.blocks import Family, attention_after_head_norm_for_output, attention_output, head_normed_attention_input
from hipcore.model.moe_blocks import moe_feed_forward

FAMILY = Family("qwen3moe", (head_normed_attention_input, attention_after_head_norm_for_output, attention_output,
                             moe_feed_forward))
