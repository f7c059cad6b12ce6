"""qwen3: the llama layer with an RMSNorm over every head of q and of k (weights of head_dim, the model's
epsilon) between the products and the NEOX-mode RoPE; no biases (llama.cpp: src/models/qwen3.cpp). The q|k|v
products take the fused kernels without RoPE, then one head_norm_rope launch normalizes and rotates the heads and
stores k and v (blocks.py: head_normed_attention_input)."""

from hipcore.model.blocks import Family, head_normed_attention_input, pre_norm_layer

FAMILY = Family("qwen3", pre_norm_layer(head_normed_attention_input))
