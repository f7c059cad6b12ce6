"""What each supported model family's GGUF files hold beyond the llama layout, as data.

One entry per `general.architecture` value. The gguf layer validates a file against its entry (every
tensor present with its shape, nothing else) before a byte goes to the device; the model layer
(hipcore/model/families/) composes the forward pass from the same traits. The math of each family is
llama.cpp's (src/models/<family>.cpp; the RoPE layout from llama_model_rope_type in src/llama-model.cpp).

  llama  the reference layout: pre-norm attention and SwiGLU feed-forward, RoPE in NORM mode (adjacent
         pairs). Mistral-style llama files use it too.
  qwen2  llama plus a bias on each of the q, k and v products (attn_q.bias ...); RoPE in NEOX mode
         (the two halves of a head rotate together).
  qwen3  llama plus an RMSNorm on every head of q and of k (attn_q_norm / attn_k_norm, head_dim
         weights, the model's rms epsilon) between the product and RoPE; no biases; NEOX RoPE; its head
         size (attention.key_length) need not be embedding_length / head_count.
  gemma3 qwen3's per-head q/k norms and NEOX RoPE, plus (llama.cpp: src/models/gemma3.cpp and its
         hparams loading in src/llama-model.cpp): token embeddings times sqrt(embedding_length); an RMSNorm
         after attention and after the feed-forward, before each residual add (post_attention_norm,
         post_ffw_norm); a GeGLU feed-forward (gelu(gate) * up, GELU's tanh form); interleaved local and
         global layers: layer i is local unless i % 6 == 5 (llama.cpp's fixed pattern for gemma3, which
         reads no pattern key), a local layer sees only the last attention.sliding_window positions
         (required, as in llama.cpp) and rotates with RoPE base 10000 and no scaling; a global layer sees
         everything and uses rope.freq_base with the file's RoPE scaling. Attention scale
         1/sqrt(head_dim), except 1/sqrt(embedding_length / head_count) for the 62-layer 27B, as llama.cpp
         decides it. The norm weights in the file already hold Gemma's "1 +" (the converter adds it).
  gemma2 gemma3 without the per-head q/k norms (llama.cpp: src/models/gemma2.cpp and its hparams): the scaled
         embedding, the post-attention and post-feed-forward norms, the GeGLU feed-forward; local and global
         layers alternating, layer i local when i % 2 == 0 (set_swa_pattern(2), dense last; a uint
         attention.sliding_window_pattern overrides the period), the window attention.sliding_window (4096
         when absent); local layers rotate like the global ones (rope.freq_base unless rope.freq_base_swa,
         the same scaling). Attention logit soft-capping: every scaled score S becomes c tanh(S / c) before
         the softmax, c = attn_logit_softcapping (50 when absent); final logit soft-capping: the output
         logits become f tanh(logits / f), f = final_logit_softcapping (30). Attention scale 1/sqrt(head_dim),
         except 1/sqrt(embedding_length / head_count) for the 46-layer 27B. The output is always the token
         embedding (llama.cpp reads no output.weight for gemma2: a file with one is refused).
  phi3   the llama layer with NEOX RoPE whose files hold q, k and v as one matrix (blk.N.attn_qkv: q rows,
         then k, then v) and the feed-forward's gate and up as one (blk.N.ffn_up of 2 * feed_forward_length
         rows: gate first, as llama.cpp's swiglu takes the first half as the gate; llama.cpp:
         src/models/phi3.cpp). An attention.sliding_window key is read by llama.cpp and then switched off
         ("Phi SWA is currently disabled"): every layer attends to the whole context, as there. The 128k
         variants' LongRoPE (rope_factors_long / rope_factors_short) is not implemented and refused (exit 4).
  qwen3moe  qwen3's attention (per-head q/k norms, NEOX RoPE) with a mixture-of-experts feed-forward in every layer
         (llama.cpp: src/models/qwen3moe.cpp, build_moe_ffn in src/llama-graph.cpp): a router (ffn_gate_inp,
         [expert_count, hidden]), a softmax over all experts, the expert_used_count largest kept and renormalized
         to sum 1 (llama.cpp passes norm_w = true for qwen3moe whatever the file says), and for each kept expert
         e: down_e(silu(gate_e x) * up_e x), weighted and summed. The experts are 3-D tensors [expert_count, rows,
         cols] (ffn_gate_exps / ffn_up_exps of expert_feed_forward_length rows, ffn_down_exps of hidden rows).
  qwen2moe  (Qwen1.5-MoE, Qwen2-57B-A14B; llama.cpp: src/models/qwen2moe.cpp) qwen2's attention (q/k/v biases, NEOX
         RoPE) with qwen3moe's routed experts, their weights not renormalized (norm_w = false), and a shared expert
         beside them: down_s(silu(gate_s x) * up_s x) (ffn_*_shexp, expert_shared_feed_forward_length rows, else
         feed_forward_length) scaled by sigmoid(ffn_gate_inp_shexp . x), added with the routed experts' sum.
  gpt-oss   (llama.cpp: src/models/openai-moe.cpp) q, k, v and o products with biases, a learned per-head sink
         logit in every attention softmax (attn_sinks), NEOX RoPE (YaRN-scaled in the published files: factor 32
         over an original context of 4096), even layers attending through a sliding window (attention.sliding_window,
         required; llama.cpp's set_swa_pattern(2)) with the model's RoPE, the pre-feed-forward norm stored as
         post_attention_norm, and a mixture of experts whose router and experts carry biases: top-k of the router
         logits, a softmax over the k kept, and gpt-oss's clamped SwiGLU (x = min(gate, 7), y = clamp(up, -7, 7),
         x sigmoid(1.702 x) (y + 1)).
"""

from __future__ import annotations

from dataclasses import dataclass

ROPE_TYPES = ("norm", "neox")


@dataclass(frozen=True)
class Architecture:
    name: str
    rope_type: str             # "norm": pairs (2i, 2i+1); "neox": pairs (i, i + rope_dim/2)
    qkv_bias: bool = False     # blk.N.attn_{q,k,v}.bias: added after each product
    qk_norm: bool = False      # blk.N.attn_{q,k}_norm.weight: RMSNorm per head before RoPE
    rope_freq_factors: bool = False  # rope_freqs.weight may be present (llama 3.1-style long context)
    post_norms: bool = False   # blk.N.post_attention_norm / post_ffw_norm: RMSNorm before each residual add
    activation: str = "silu"   # the feed-forward's gate: "silu" (SwiGLU) or "gelu" (GeGLU, tanh form)
    scaled_embedding: bool = False  # token embeddings times sqrt(embedding_length)
    swa_period: int = 0        # local (sliding-window) layers: i % period < period - 1; 0: none
    swa_rope_theta: float = 0.0  # the local layers' RoPE base (no scaling)
    swa_rope_scaled: bool = False  # local layers keep the model's RoPE scaling (and swa_rope_theta 0: its base)
    swa_pattern_key: bool = False  # attention.sliding_window_pattern (a period) may override swa_period
    default_sliding_window: int = 0  # the window when the file has no attention.sliding_window; 0: required
    attn_softcap: float = 0.0  # attn_logit_softcapping's default; 0: the family caps no attention scores
    final_softcap: float = 0.0  # final_logit_softcapping's default; 0: the family caps no output logits
    tied_output: bool = False  # the output projection is always token_embd (output.weight is refused)
    fused_qkv: bool = False    # blk.N.attn_qkv.weight holds q, k, v rows back to back (no attn_q/k/v)
    fused_gate_up: bool = False  # blk.N.ffn_up.weight holds gate rows then up rows (no ffn_gate)
    moe: bool = False          # a mixture-of-experts feed-forward (router + 3-D expert tensors) in every layer
    expert_gating: str = ""    # "softmax_topk" (softmax over all, top-k) or "topk_softmax" (top-k, softmax over k)
    expert_weights_norm: bool = False  # the k kept weights renormalized to sum 1 (after softmax_topk)
    expert_activation: str = "swiglu"  # "swiglu", or "swiglu_oai" (gpt-oss's clamped form)
    moe_biases: bool = False   # the router and every expert product add a bias (gpt-oss)
    o_bias: bool = False       # blk.N.attn_output.bias: added after the o product
    attn_sinks: bool = False   # blk.N.attn_sinks.weight: a learned logit per head in every attention softmax
    ffn_norm_name: str = "ffn_norm"  # the pre-feed-forward norm's tensor (gpt-oss: post_attention_norm)
    yarn: bool = False         # rope.scaling.type "yarn" accepted (gpt-oss's files)
    shared_expert: bool = False  # a shared expert beside the routed ones, its output scaled by a sigmoid gate (qwen2moe)

    def layer_matrices(self, q_size: int, kv_size: int, hidden: int, ffn: int, experts: int = 0,
                       expert_ffn: int = 0, shared_ffn: int = 0) -> dict[str, tuple[int, ...]]:
        """The per-layer matrices (name without blk.N. and .weight -> numpy-order shape) as the file holds them;
        a mixture of experts' are its router and its 3-D expert tensors (experts, rows, cols)."""
        qkv = ({"attn_qkv": (q_size + 2 * kv_size, hidden)} if self.fused_qkv else
               {"attn_q": (q_size, hidden), "attn_k": (kv_size, hidden), "attn_v": (kv_size, hidden)})
        if self.moe:
            shared = ({"ffn_gate_shexp": (shared_ffn, hidden), "ffn_up_shexp": (shared_ffn, hidden),
                       "ffn_down_shexp": (hidden, shared_ffn)} if self.shared_expert else {})
            return {**qkv, "attn_output": (hidden, q_size), "ffn_gate_inp": (experts, hidden),
                    "ffn_gate_exps": (experts, expert_ffn, hidden), "ffn_up_exps": (experts, expert_ffn, hidden),
                    "ffn_down_exps": (experts, hidden, expert_ffn), **shared}
        ffn_in = {"ffn_up": (2 * ffn, hidden)} if self.fused_gate_up else {"ffn_gate": (ffn, hidden), "ffn_up": (ffn, hidden)}
        return {**qkv, "attn_output": (hidden, q_size), **ffn_in, "ffn_down": (hidden, ffn)}

    def layer_vectors(self, q_size: int, kv_size: int, head_dim: int, hidden: int = 0, n_heads: int = 0,
                      experts: int = 0, expert_ffn: int = 0) -> dict[str, tuple[int, ...]]:
        """Per-layer tensors beyond the llama layout's matrices and norms: name (without blk.N.) -> shape (the expert
        biases are 2-D: one row per expert)."""
        extra: dict[str, tuple[int, ...]] = {}
        if self.shared_expert:
            extra["ffn_gate_inp_shexp.weight"] = (hidden,)  # the shared expert's gate: one logit a token
        if self.o_bias:
            extra["attn_output.bias"] = (hidden,)
        if self.attn_sinks:
            extra["attn_sinks.weight"] = (n_heads,)
        if self.moe_biases:
            extra.update({"ffn_gate_inp.bias": (experts,), "ffn_gate_exps.bias": (experts, expert_ffn),
                          "ffn_up_exps.bias": (experts, expert_ffn), "ffn_down_exps.bias": (experts, hidden)})
        if self.post_norms:
            extra.update({"post_attention_norm.weight": (hidden,), "post_ffw_norm.weight": (hidden,)})
        if self.qkv_bias:
            extra.update({"attn_q.bias": (q_size,), "attn_k.bias": (kv_size,), "attn_v.bias": (kv_size,)})
        if self.qk_norm:
            extra.update({"attn_q_norm.weight": (head_dim,), "attn_k_norm.weight": (head_dim,)})
        return extra


ARCHITECTURES: dict[str, Architecture] = {
    "llama": Architecture("llama", rope_type="norm", rope_freq_factors=True),
    "qwen2": Architecture("qwen2", rope_type="neox", qkv_bias=True),
    "qwen3": Architecture("qwen3", rope_type="neox", qk_norm=True),
    "gemma3": Architecture("gemma3", rope_type="neox", qk_norm=True, post_norms=True, activation="gelu",
                           scaled_embedding=True, swa_period=6, swa_rope_theta=10000.0),
    "gemma2": Architecture("gemma2", rope_type="neox", post_norms=True, activation="gelu", scaled_embedding=True,
                           swa_period=2, swa_rope_scaled=True, swa_pattern_key=True, default_sliding_window=4096,
                           attn_softcap=50.0, final_softcap=30.0, tied_output=True),
    "phi3": Architecture("phi3", rope_type="neox", fused_qkv=True, fused_gate_up=True),
    "qwen3moe": Architecture("qwen3moe", rope_type="neox", qk_norm=True, moe=True, expert_gating="softmax_topk",
                             expert_weights_norm=True),
    "qwen2moe": Architecture("qwen2moe", rope_type="neox", qkv_bias=True, moe=True, expert_gating="softmax_topk",
                             shared_expert=True),
    "gpt-oss": Architecture("gpt-oss", rope_type="neox", qkv_bias=True, o_bias=True, attn_sinks=True, swa_period=2,
                            swa_rope_scaled=True, moe=True, expert_gating="topk_softmax",
                            expert_activation="swiglu_oai", moe_biases=True, ffn_norm_name="post_attention_norm", yarn=True),
}
# Mixture-of-experts architectures llama.cpp knows and rocmforge does not (yet): named in the refusal.
UNSUPPORTED_MOE = ("mixtral", "deepseek", "deepseek2", "dbrx", "olmoe", "granitemoe", "phimoe", "llama4",
                   "grok", "arctic", "hunyuan-moe", "ernie4_5-moe", "glm4moe", "bailingmoe", "dots1", "jamba")
