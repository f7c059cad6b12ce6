"""qwen2moe (Qwen1.5-MoE-A2.7B, Qwen2-57B-A14B; llama.cpp: src/models/qwen2moe.cpp): qwen2's attention (q/k/v biases,
NEOX RoPE run as NORM on rows uploaded pair by pair, weights.py NEOX_AS_NORM: the llama layer's fused attention input),
the routed experts (softmax over all, top-k, the weights not renormalized) and a shared expert whose output a sigmoid
gate scales (hipcore/model/moe_blocks.py: moe_feed_forward, then shared_expert on the same normalized input)."""

from hipcore.model.blocks import Family, attention_after_fused_input_for_output, attention_output, fused_attention_input
from hipcore.model.moe_blocks import moe_feed_forward, shared_expert

FAMILY = Family("qwen2moe", (fused_attention_input, attention_after_fused_input_for_output, attention_output,
                             moe_feed_forward, shared_expert))
