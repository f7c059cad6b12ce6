"""The mixture-of-experts layers of synthetic_models.py's shapes: which tensors a layer holds, as llama.cpp loads them
(src/models/qwen3moe.cpp, src/models/openai-moe.cpp), their metadata keys, and their random contents.

qwen3moe (Qwen3-30B-A3B): qwen3's attention (per-head q/k norms) and, instead of the dense feed-forward, a router
ffn_gate_inp [experts, hidden] (F32: llama.cpp never quantizes it) and 3-D expert tensors ffn_gate_exps and
ffn_up_exps [experts, expert_ffn, hidden], ffn_down_exps [experts, hidden, expert_ffn].
gpt-oss (gpt-oss-20b): the same experts plus q/k/v/o biases, a sink logit per head (attn_sinks), the pre-feed-forward
norm named post_attention_norm, a router bias and a bias per expert row (F32, [experts, rows]), a sliding window on
every other layer and YaRN RoPE (the published file's keys: window 128, factor 32 over 4,096, base 150,000).
Expert weights are random blocks (synthetic_models.random_blocks) written one whole tensor at a time; MXFP4 blocks
(ggml's block_mxfp4: one E8M0 exponent byte, then 16 bytes of 32 e2m1 codes) get an exponent that puts the decoded
weights near WEIGHT_STD.
"""

from __future__ import annotations

import numpy as np

# ggml's MXFP4 values (kvalues_mxfp4, e2m1 doubled) times 2^(e - 128): over random codes their standard deviation
# is 5.85, so e = 120 gives 5.85 / 256 = 0.023 (WEIGHT_STD 0.02).
MXFP4_EXPONENT = 120


def is_moe_tensor(name: str) -> bool:
    """A router or expert tensor (or its bias): the ones a dense layer has not."""
    return any(part in name for part in (".ffn_gate_inp.", "_exps."))


def moe_layer_tensors(shape, i: int) -> list[tuple[str, tuple[int, ...]]]:
    """(name, dims) of layer i of a mixture-of-experts shape, dims in numpy order (3-D experts: [experts, rows,
    cols]); 1-D for norms, biases and sinks."""
    h, kv, q = shape.hidden, shape.kv_heads * shape.head_dim, shape.q_size
    e, f = shape.experts, shape.expert_ffn
    p = f"blk.{i}."
    out = [(p + "attn_norm.weight", (h,)), (p + "attn_q.weight", (q, h)), (p + "attn_k.weight", (kv, h)),
           (p + "attn_v.weight", (kv, h)), (p + "attn_output.weight", (h, q))]
    if shape.oss:
        out += [(p + "attn_q.bias", (q,)), (p + "attn_k.bias", (kv,)), (p + "attn_v.bias", (kv,)),
                (p + "attn_output.bias", (h,)), (p + "attn_sinks.weight", (shape.heads,))]
    if shape.qk_norm:
        out += [(p + "attn_k_norm.weight", (shape.head_dim,)), (p + "attn_q_norm.weight", (shape.head_dim,))]
    out.append((p + ("post_attention_norm.weight" if shape.oss else "ffn_norm.weight"), (h,)))
    out.append((p + "ffn_gate_inp.weight", (e, h)))
    if shape.oss:
        out.append((p + "ffn_gate_inp.bias", (e,)))
    for part, rows, cols in (("ffn_gate_exps", f, h), ("ffn_up_exps", f, h), ("ffn_down_exps", h, f)):
        out.append((p + part + ".weight", (e, rows, cols)))
        if shape.oss:
            out.append((p + part + ".bias", (e, rows)))
    return out


def add_moe_keys(writer, shape) -> None:
    """The keys llama.cpp's qwen3moe and gpt-oss loaders read beyond a dense model's."""
    import gguf  # as synthetic_models.write_model: only where a file is written

    writer.add_expert_count(shape.experts)
    writer.add_expert_used_count(shape.experts_used)
    writer.add_expert_feed_forward_length(shape.expert_ffn)
    if shape.yarn_factor:
        writer.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        writer.add_rope_scaling_factor(shape.yarn_factor)
        writer.add_rope_scaling_orig_ctx_len(shape.yarn_original_context)


def mxfp4_blocks(blocks: np.ndarray) -> np.ndarray:
    """Random 17-byte MXFP4 blocks given their exponent byte (in place; returns them)."""
    blocks[:, 0] = MXFP4_EXPONENT
    return blocks


def random_bytes(rng: np.random.Generator, n: int) -> np.ndarray:
    """n random bytes as uint8, from the generator's raw 64-bit words (about four times Generator.bytes' speed)."""
    words = rng.bit_generator.random_raw(-(-n // 8))
    return words.view(np.uint8)[:n]
