"""phi3 (Phi-3 mini / medium, 4k context): the llama layer with NEOX-mode RoPE (llama.cpp: src/models/phi3.cpp).
Its files hold q|k|v and gate|up each as one matrix, which model/weights.py uploads as they are and splits
into row views: the feed-forward then takes the fused gate|up path as llama's does (silu of the first
half times the second), and q, k and v take the unfused path (the fused attention input rotates in NORM
mode): norm, three products over the views, two NEOX RoPEs."""

from hipcore.model.blocks import Family, compose, pre_norm_layer, qkv_products, rope_qk

FAMILY = Family("phi3", pre_norm_layer(compose(qkv_products, rope_qk)))
