"""llama (and mistral-style llama files): the reference layer. q, k and v come from one fused launch (norm,
products and NORM-mode RoPE) where the weights allow it (projections.py)."""

from hipcore.model.blocks import Family, fused_attention_input, pre_norm_layer

FAMILY = Family("llama", pre_norm_layer(fused_attention_input))
