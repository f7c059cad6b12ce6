"""phi3 (Phi-3 mini / medium, 4k context): the llama layer with NEOX-mode RoPE (llama.cpp: src/models/phi3.cpp).
Its files hold q|k|v and gate|up each as one matrix, which model/weights.py uploads as they are and splits
into row views: the feed-forward then takes the fused gate|up path as llama's does (silu of the first
half times the second). The q and k rows of its q|k|v are uploaded with each NEOX pair side by side
(model/weights.py: NEOX_AS_NORM), so RoPE runs in NORM mode and q, k and v take llama's fused attention input."""

from hipcore.model.blocks import Family, fused_attention_input, pre_norm_layer

FAMILY = Family("phi3", pre_norm_layer(fused_attention_input))
