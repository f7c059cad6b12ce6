"""KV capacity arithmetic for `rocmforge profile-kv`: bytes per token, the capacity table for each
KV dtype x block size, and the --plan answer (tokens and sequences that fit beside the weights).

Every size comes from hipcore's own KvCacheConfig, so these are the numbers the cache would
really allocate: a budget holds floor(budget / bytes_per_block) blocks, one of which is the null block.

A model with sliding-window layers (ModelShape.layer_windows, e.g. Gemma 3) is planned window-true: a
sequence keeps every block in its global layers but only about a window in its local layers
(KvCacheConfig.sequence_bytes), and the budget is split between the two pools as the engine's memory
plan splits it (the local pool sized by KvCacheConfig.window_pool_blocks for the sequences that fit).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Iterable


from hipcore.errors import UsageError
from hipcore.kvcache import KV_DTYPES, KvCacheConfig, KvConfigError, kv_dtype
from hipcore.model.activations import activation_sizes
from hipcore.model.memory_plan import MARGIN_CAP, MARGIN_FRACTION
from profiles.presets import ModelShape
from profiles.weight_types import WEIGHT_TYPES, bits_per_weight, weights_as  # noqa: F401 (WEIGHT_TYPES: the CLI's list)

DEFAULT_BLOCK_SIZES = (8, 16, 32, 64)
DEFAULT_MAX_STEP_TOKENS = 512  # the engine's default prompt tokens per step
DEFAULT_MAX_SEQS = 64  # the engine's default number of sequences stepped together


def kv_config(shape: ModelShape, dtype: str, block_size: int, budget: int) -> KvCacheConfig:
    """The largest cache of this model's KV shape that fits in `budget` bytes (KvConfigError if none).
    With sliding windows every global block gets a local twin: see fit_sequences for the window-true split."""
    return KvCacheConfig.for_memory(budget, shape.n_layers, shape.n_kv_heads, shape.head_dim, block_size, dtype,
                                    shape.layer_windows)


def shape_config(shape: ModelShape, dtype: str, block_size: int = 1, num_blocks: int = 2,
                 window_blocks: int = 0) -> KvCacheConfig:
    return KvCacheConfig(shape.n_layers, shape.n_kv_heads, shape.head_dim, num_blocks, block_size, dtype,
                         shape.layer_windows, window_blocks)


def bytes_per_token(shape: ModelShape, dtype: str) -> int:
    """K + V of one token in every layer: 2 x layers x KV heads x row bytes of head_dim elements (what a
    token inside the window costs; GQA-true: KV heads, not query heads)."""
    return shape_config(shape, dtype).bytes_per_token


def window_true_bytes_per_token(shape: ModelShape, dtype: str, block_size: int, seq_len: int) -> int:
    """Device bytes a decoding sequence of seq_len tokens holds, per token, rounded up: every global
    layer keeps all its blocks, every sliding-window layer only its window's (equal to bytes_per_token x
    the last block's padding for a model without windows)."""
    return -(-shape_config(shape, dtype, block_size).sequence_bytes(seq_len) // seq_len)


def fit_sequences(shape: ModelShape, dtype: str, block_size: int, budget: int, seq_len: int,
                  max_step_tokens: int = DEFAULT_MAX_STEP_TOKENS) -> tuple[int, KvCacheConfig | None]:
    """(sequences of seq_len tokens, the cache holding them) for a model with sliding windows: the most
    sequences S whose cache fits in `budget`, with S x ceil(seq_len / block) global blocks and the local
    pool the engine would plan for S sequences (window_pool_blocks)."""
    per_seq = -(-seq_len // block_size)

    def config(seqs: int) -> KvCacheConfig | None:
        try:
            probe = shape_config(shape, dtype, block_size, seqs * per_seq + 1)
            return shape_config(shape, dtype, block_size, seqs * per_seq + 1,
                                probe.window_pool_blocks(seqs, max_step_tokens))
        except KvConfigError:  # past the slot or byte limits
            return None

    low, high = 0, 1
    while (cfg := config(high)) is not None and cfg.cache_bytes <= budget:
        low, high = high, high * 2
    while high - low > 1:
        mid = (low + high) // 2
        cfg = config(mid)
        if cfg is not None and cfg.cache_bytes <= budget:
            low = mid
        else:
            high = mid
    return low, config(low) if low else None


# ---- (a) capacity table ---------------------------------------------------------------------------

@dataclass(frozen=True)
class CapacityRow:
    dtype: str
    block_size: int
    bytes_per_token: int | None  # None when the dtype cannot hold this model's rows (see note)
    bytes_per_block: int | None
    usable_blocks: int  # the null block not counted
    tokens: int  # usable_blocks x block_size
    context_sequences: int  # sequences of `context` tokens that fit: usable_blocks // ceil(context / block_size)
    mean_last_block_waste: int | None  # bytes: a last block is on average (block_size - 1) / 2 slots short
    note: str = ""
    # window-true figures (a model with sliding-window layers; else equal to the above)
    window_true_bytes_per_token: int | None = None  # device bytes per token of a sequence of `context` tokens
    global_bytes_per_token: int | None = None  # K + V of a token in the global layers only
    local_bytes_per_token: int | None = None  # ... in the sliding-window layers (kept for a window only)
    local_blocks: int = 0  # usable blocks of the sliding-window pool


@dataclass(frozen=True)
class CapacityTable:
    model: ModelShape
    memory: int  # the KV budget the table is for
    memory_source: str  # where that figure came from, in words
    context: int
    rows: tuple[CapacityRow, ...]

    def to_dict(self) -> dict[str, object]:
        return {"model": self.model.to_dict(), "memory": self.memory, "memory_source": self.memory_source,
                "context": self.context, "rows": [asdict(r) for r in self.rows]}


def capacity_table(shape: ModelShape, memory: int, *, memory_source: str = "", context: int | None = None,
                   dtypes: Iterable[str] = tuple(KV_DTYPES), block_sizes: Iterable[int] = DEFAULT_BLOCK_SIZES) -> CapacityTable:
    """Bytes per token and what a KV pool of `memory` bytes holds, for each dtype x block size."""
    context = check_context(shape, context)
    dtypes, block_sizes = check_kv_choices(dtypes, block_sizes)
    rows = []
    for dtype in dtypes:
        for bs in block_sizes:
            unfit = row_format_problem(shape, dtype)
            if unfit:
                rows.append(CapacityRow(dtype, bs, None, None, 0, 0, 0, None, note=unfit))
                continue
            bpt = bytes_per_token(shape, dtype)
            cfg = shape_config(shape, dtype, bs)
            true_bpt = window_true_bytes_per_token(shape, dtype, bs, context)
            if shape.layer_windows:
                seqs, fitted = fit_sequences(shape, dtype, bs, memory, context)
                blocks, local = (fitted.usable_blocks, fitted.window_blocks - 1) if fitted else (0, 0)
                rows.append(CapacityRow(dtype, bs, bpt, cfg.bytes_per_block, blocks, blocks * bs, seqs,
                                        (bs - 1) * cfg.global_bytes_per_token // 2,
                                        "" if seqs else f"not one sequence of {context:,} tokens fits", true_bpt,
                                        cfg.global_bytes_per_token, cfg.window_bytes_per_token, local))
                continue
            try:
                blocks, note = kv_config(shape, dtype, bs, memory).usable_blocks, ""
            except KvConfigError:
                blocks, note = 0, "not even one block fits"
            rows.append(CapacityRow(dtype, bs, bpt, bpt * bs, blocks, blocks * bs, blocks // -(-context // bs),
                                    (bs - 1) * bpt // 2, note, true_bpt, bpt, 0, 0))
    return CapacityTable(shape, memory, memory_source, context, tuple(rows))


def check_kv_choices(dtypes: Iterable[str], block_sizes: Iterable[int]) -> tuple[list[str], list[int]]:
    """Normalised dtype names and block sizes; KvConfigError (exit 2) for an unknown one."""
    names = [kv_dtype(d).name for d in dtypes]
    sizes = list(block_sizes)
    for bs in sizes:
        KvCacheConfig(1, 1, 32, 2, bs)
    return names, sizes


def row_format_problem(shape: ModelShape, dtype: str) -> str:
    """Why `dtype` cannot store this model's K/V rows (q8_0 needs head_dim % 32 == 0), or ""."""
    fmt = kv_dtype(dtype)
    if shape.head_dim % fmt.block_elems:
        return f"{fmt.name} needs head_dim to be a multiple of {fmt.block_elems} (it is {shape.head_dim})"
    return ""


def check_context(shape: ModelShape, context: int | None) -> int:
    if context is None:
        return shape.context_length
    if not 1 <= context <= shape.context_length:
        raise UsageError(f"--context must be between 1 and {shape.name}'s context length {shape.context_length:,}, got {context:,}")
    return context


# ---- (d) the plan -----------------------------------------------------------------------------------

@dataclass(frozen=True)
class PlanRow:
    dtype: str
    bytes_per_token: int | None
    kv_bytes: int  # the pool the cache would allocate (null block included)
    usable_blocks: int
    tokens: int  # usable_blocks x block_size
    blocks_per_sequence: int  # ceil(seq_len / block_size)
    sequences: int  # sequences of seq_len tokens that fit at once: usable_blocks // blocks_per_sequence
    note: str = ""
    window_true_bytes_per_token: int | None = None  # device bytes per token of a sequence of seq_len tokens
    global_bytes_per_token: int | None = None
    local_bytes_per_token: int | None = None  # sliding-window layers, kept for a window only
    local_blocks: int = 0  # usable blocks of the sliding-window pool (0 without one)


@dataclass(frozen=True)
class KvPlan:
    model: ModelShape
    memory: int  # the device memory planned for
    weights: int
    weights_source: str
    activations: int  # the runner's activation and step buffers for max_step_tokens / max_seqs
    margin: int  # kept free for the driver and fragmentation (as `generate` keeps)
    kv_budget: int  # memory - weights - activations - margin (may be negative: nothing fits)
    context: int
    seq_len: int
    block_size: int
    max_step_tokens: int
    max_seqs: int
    rows: tuple[PlanRow, ...]

    def to_dict(self) -> dict[str, object]:
        out = {k: getattr(self, k) for k in self.__dataclass_fields__ if k not in ("model", "rows")}
        return {"model": self.model.to_dict(), **out, "rows": [asdict(r) for r in self.rows]}


def weight_bytes(shape: ModelShape, weights_type: str | None) -> tuple[int, str]:
    """(bytes, how they were found): the file's exact tensor bytes, or n_params in `weights_type`
    (for a preset, Q4_K_M unless told: what most published GGUF files are; F16 left only zeros on 80 GiB)."""
    if weights_type is None and shape.weight_bytes is not None:
        return shape.weight_bytes, f"the file's tensors ({shape.weight_type or 'mixed'})"
    if weights_type is None and shape.expert_type:  # gpt-oss as published: MXFP4 experts, the rest at 8 bits
        experts, _ = weights_as(shape.expert_params, shape.expert_type)
        rest, _ = weights_as(shape.n_params - shape.expert_params, "Q8_0")
        return experts + rest, (f"{shape.expert_params:,} expert parameters as {shape.expert_type} "
                                f"({bits_per_weight(shape.expert_type):g} bits/weight), the other "
                                f"{shape.n_params - shape.expert_params:,} as Q8_0 (the published GGUF); "
                                "--weights-type to change")
    return weights_as(shape.n_params, weights_type)


def runner_activation_bytes(shape: ModelShape, max_step_tokens: int, max_seqs: int, context: int, block_size: int) -> int:
    """What the llama runner allocates beside weights and KV (activations + step scratch)."""
    max_blocks = -(-context // block_size)
    return sum(n for n, _tag in activation_sizes(shape, max_step_tokens, max_seqs, max_blocks, block_size,
                                                 bool(shape.layer_windows)).values())


def plan_kv(shape: ModelShape, memory: int, *, context: int | None = None, seq_len: int | None = None,
            block_size: int = 16, weights_type: str | None = None, max_step_tokens: int = DEFAULT_MAX_STEP_TOKENS,
            max_seqs: int = DEFAULT_MAX_SEQS, dtypes: Iterable[str] = tuple(KV_DTYPES)) -> KvPlan:
    """How many tokens, and sequences of seq_len tokens, fit in `memory` beside the weights, the
    runner's buffers and the margin, for each KV dtype."""
    if memory <= 0:
        raise UsageError(f"--memory must be positive, got {memory}")
    context = check_context(shape, context)
    seq_len = context if seq_len is None else seq_len
    if not 1 <= seq_len <= context:
        raise UsageError(f"--seq-len must be between 1 and the context length {context:,}, got {seq_len:,}")
    for name, value in (("--max-step-tokens", max_step_tokens), ("--max-seqs", max_seqs)):
        if not 1 <= value <= 1 << 20:
            raise UsageError(f"{name} must be between 1 and {1 << 20:,}, got {value:,}")
    weights, weights_source = weight_bytes(shape, weights_type)
    activations = runner_activation_bytes(shape, max_step_tokens, max_seqs, context, block_size)
    margin = min(int(memory * MARGIN_FRACTION), MARGIN_CAP)
    budget = memory - weights - activations - margin
    per_seq = -(-seq_len // block_size)
    rows = []
    for dtype in check_kv_choices(dtypes, [block_size])[0]:
        unfit = row_format_problem(shape, dtype)
        if unfit:
            rows.append(PlanRow(dtype, None, 0, 0, 0, per_seq, 0, note=unfit))
            continue
        bpt = bytes_per_token(shape, dtype)
        one = shape_config(shape, dtype, block_size)
        true_bpt = window_true_bytes_per_token(shape, dtype, block_size, seq_len)
        groups = dict(window_true_bytes_per_token=true_bpt, global_bytes_per_token=one.global_bytes_per_token,
                      local_bytes_per_token=one.window_bytes_per_token)
        if shape.layer_windows:
            seqs, cfg = fit_sequences(shape, dtype, block_size, max(budget, 0), seq_len, max_step_tokens)
            if cfg is None:
                rows.append(PlanRow(dtype, bpt, 0, 0, 0, per_seq, 0, note="not one sequence of this length fits", **groups))
            else:
                rows.append(PlanRow(dtype, bpt, cfg.cache_bytes, cfg.usable_blocks, cfg.usable_tokens, per_seq, seqs,
                                    **groups, local_blocks=cfg.window_blocks - 1))
            continue
        try:
            cfg = kv_config(shape, dtype, block_size, max(budget, 0))
            rows.append(PlanRow(dtype, bpt, cfg.cache_bytes, cfg.usable_blocks, cfg.usable_tokens, per_seq,
                                cfg.usable_blocks // per_seq,
                                "" if cfg.usable_blocks >= per_seq else "not one sequence of this length fits", **groups))
        except KvConfigError:
            rows.append(PlanRow(dtype, bpt, 0, 0, 0, per_seq, 0, note="no room for the KV cache", **groups))
    return KvPlan(shape, memory, weights, weights_source, activations, margin, budget, context, seq_len, block_size,
                  max_step_tokens, max_seqs, tuple(rows))
