"""The weights of one layer on the device (hipcore/model/weights.py uploads them): the llama layout's, and what each
family adds (hipcore/gguf/architectures.py), None where the family has none."""

from __future__ import annotations

from dataclasses import dataclass

from hipcore.model.weight_handle import Weight


@dataclass
class LayerWeights:
    attn_norm: Weight
    attn_q: Weight
    attn_k: Weight
    attn_v: Weight
    attn_output: Weight
    ffn_norm: Weight
    ffn_gate: Weight | None  # None in a mixture of experts' layer (its experts below)
    ffn_up: Weight | None
    ffn_down: Weight | None
    attn_qkv: Weight | None = None  # q, k, v rows back to back in one buffer (same format), else None
    ffn_gate_up: Weight | None = None  # gate rows then up rows in one buffer (same format), else None
    attn_q_bias: Weight | None = None  # qwen2: added to each product (FAMILY_VECTORS)
    attn_k_bias: Weight | None = None
    attn_v_bias: Weight | None = None
    attn_q_norm: Weight | None = None  # qwen3: RMSNorm weight of every q head, [head_dim]
    attn_k_norm: Weight | None = None
    attn_post_norm: Weight | None = None  # gemma3: RMSNorm of the attention output before the residual add, [hidden]
    ffn_post_norm: Weight | None = None  # gemma3: RMSNorm of the feed-forward output before the residual add
    attn_output_bias: Weight | None = None  # gpt-oss: added after the o product, [hidden]
    attn_sinks: Weight | None = None  # gpt-oss: a logit per head in every attention softmax, [n_heads]
    ffn_gate_inp: Weight | None = None  # MoE: the router, [experts, hidden]
    ffn_gate_exps: Weight | None = None  # MoE: [experts, expert_ffn, hidden]
    ffn_up_exps: Weight | None = None  # MoE: [experts, expert_ffn, hidden]
    ffn_down_exps: Weight | None = None  # MoE: [experts, hidden, expert_ffn]
    ffn_gate_inp_bias: Weight | None = None  # gpt-oss: [experts]
    ffn_gate_exps_bias: Weight | None = None  # gpt-oss: [experts, expert_ffn]
    ffn_up_exps_bias: Weight | None = None  # gpt-oss: [experts, expert_ffn]
    ffn_down_exps_bias: Weight | None = None  # gpt-oss: [experts, hidden]
    ffn_gate_shexp: Weight | None = None  # qwen2moe's shared expert: [shared_ffn, hidden]
    ffn_up_shexp: Weight | None = None
    ffn_down_shexp: Weight | None = None  # [hidden, shared_ffn]
    ffn_gate_inp_shexp: Weight | None = None  # its gate: [hidden], one logit a token
