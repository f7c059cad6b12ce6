"""gemma2 (Gemma 2): gemma3's layer without the per-head q/k norms (llama.cpp: src/models/gemma2.cpp): norm, q/k/v
products and NEOX RoPE, attention whose scaled scores are soft-capped (ModelConfig.attn_softcap, passed by the
shared attention block to the kernel) and which on every other layer (the even ones) looks through a
sliding window, a norm on the attention output and on the GeGLU feed-forward's output before each residual
add, token embeddings scaled by sqrt(hidden_size), and the output logits soft-capped after the head.
Its q and k rows are uploaded with each NEOX pair side by side (hipcore/model/weights.py: NEOX_AS_NORM), so its
attention input is llama's fused one (norm, products, RoPE in NORM mode and the store of k and v in one launch
where the weights allow; attn left in float32 for the post-normed o product). Its feed-forward and post-norms are
gemma3's blocks (GeGLU fused where the weights allow, each post-norm added to the residual stream in one launch)."""

from hipcore.model.blocks import (Family, attention_after_fused_input, capped_logits, fused_attention_input,
                                  geglu_feed_forward, post_normed_attention_output, post_normed_feed_forward_output,
                                  scaled_embedding)

FAMILY = Family("gemma2", (fused_attention_input, attention_after_fused_input, post_normed_attention_output,
                           geglu_feed_forward, post_normed_feed_forward_output),
                embedding_input=scaled_embedding, logits_output=capped_logits)
