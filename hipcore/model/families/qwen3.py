"""qwen3: the llama layer with an RMSNorm over every head of q and of k (weights of head_dim, the model's
epsilon) between the products and the NEOX-mode RoPE; no biases (llama.cpp: src/models/qwen3.cpp). The
fused kernels have no per-head norm, so q, k and v take the unfused path."""

from hipcore.model.blocks import Family, compose, pre_norm_layer, qk_head_norm, qkv_products, rope_qk

FAMILY = Family("qwen3", pre_norm_layer(compose(qkv_products, qk_head_norm, rope_qk)))
