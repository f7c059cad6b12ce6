"""The buffers the ModelRunner allocates for its steps, by name, size and ledger tag: the runner allocates them once,
the memory plan (memory_plan.py) and profile-kv count them before anything is allocated."""

from __future__ import annotations

from hipcore.model.decode_graphs import bucket_capacity
from hipcore.model.moe_blocks import moe_buffer_sizes
from hipcore.model.step_inputs import input_bytes, window_input_bytes
from hipcore.ops import fused_matmul, matmul_mma, paged_attention, sample


def step_capacity(max_tokens: int, max_seqs: int) -> tuple[int, int]:
    """(token rows, logits rows) the buffers hold: a step's tokens, or a decode step padded to its bucket."""
    pad = bucket_capacity(max_seqs)
    return max(max_tokens, pad), max(max_seqs, pad)


def activation_sizes(config, max_tokens: int, max_seqs: int, max_blocks: int,
                     block_size: int = 16, window_group: bool = False) -> dict[str, tuple[int, str]]:
    """name -> (bytes, ledger tag) of every buffer the runner allocates. The memory plan uses this.
    window_group: the KV cache has a sliding-window group (its step inputs have a buffer of their own)."""
    h, v = config.hidden_size, config.vocab_size
    f = config.expert_ffn_size if config.is_moe else config.ffn_size  # a MoE's dense buffers: never wider
    q_width, kv_width = config.n_heads * config.head_dim, config.n_kv_heads * config.head_dim
    t, rows = step_capacity(max_tokens, max_seqs)
    seqs = max(max_seqs, rows)
    sizes = {
        "x": (t * h * 4, "activations"), "xn": (t * h * 4, "activations"), "proj": (t * h * 4, "activations"),
        "q": (t * q_width * 4, "activations"), "k": (t * kv_width * 4, "activations"),
        "v": (t * kv_width * 4, "activations"), "attn": (t * q_width * 4, "activations"),
        "gate": (t * f * 4, "activations"), "up": (t * f * 4, "activations"),
        "ffn_h16": (t * f * 2, "activations"),  # the SwiGLU as f16 where ProjectionPlanner.ffn_pairs (its x16 is in xn)
        "rows": (rows * h * 4, "activations"), "logits": (rows * v * 4, "activations"),
        "tokens": (rows * 4, "scratch"),
        "kept_tokens": (rows * 4, "scratch"),  # a step's tokens, kept while the step after it runs (launch_sampled)
        "step_inputs": (input_bytes(t, rows, seqs, max_blocks), "scratch"),
    }
    sizes.update(moe_buffer_sizes(config, t))
    if window_group:
        sizes["step_inputs_local"] = (window_input_bytes(t, seqs, max_blocks), "scratch")
    workspace = paged_attention.workspace_size(t, config.n_heads, config.n_kv_heads, config.head_dim,
                                               max_blocks * block_size)
    if workspace:
        sizes["attention_workspace"] = (workspace, "scratch")
    # split-column partials (projections.py); steps long enough for matmul_mma's 128-token tiles split those too
    matmul_workspace = fused_matmul.WORKSPACE_BYTES
    if t >= matmul_mma.WIDE_MIN_TOKENS:
        matmul_workspace = max(matmul_workspace, matmul_mma.WIDE_WORKSPACE_BYTES)
    sizes["matmul_workspace"] = (matmul_workspace, "scratch")
    # the constrained rows' packed token masks, uploaded each step that has one (sample.launch's mask)
    sizes["token_mask"] = (rows * sample.mask_words(v) * 4, "scratch")
    sample_workspace = sample.workspace_size(rows, v)  # split rows' figures per chunk of the vocabulary
    if sample_workspace:
        sizes["sample_workspace"] = (sample_workspace, "scratch")
    return sizes
