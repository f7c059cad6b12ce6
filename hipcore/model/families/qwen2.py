"""qwen2 (Qwen2, Qwen2.5): the llama layer with a bias on each of the q, k and v products and NEOX-mode RoPE
(llama.cpp: src/models/qwen2.cpp). Its q and k rows are uploaded with each NEOX pair side by side
(hipcore/model/weights.py: NEOX_AS_NORM), so RoPE runs in NORM mode and q, k and v take the llama layer's fused
attention input, biases added in the kernel's epilogue (hipcore/model/projections.py: attention_input)."""

from hipcore.model.blocks import Family, fused_attention_input, pre_norm_layer

FAMILY = Family("qwen2", pre_norm_layer(fused_attention_input))
