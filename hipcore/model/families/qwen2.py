"""qwen2 (Qwen2, Qwen2.5): the llama layer with a bias on each of the q, k and v products and NEOX-mode RoPE
(llama.cpp: src/models/qwen2.cpp). The fused kernels rotate in NORM mode and add no bias, so q, k and v
take the unfused path: norm, three products, three bias adds, two RoPEs."""

from hipcore.model.blocks import Family, compose, pre_norm_layer, qkv_bias, qkv_products, rope_qk

FAMILY = Family("qwen2", pre_norm_layer(compose(qkv_products, qkv_bias, rope_qk)))
