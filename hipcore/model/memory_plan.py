"""The memory plan: weights + KV pool + activations + scratch, checked before anything is allocated.

If the plan does not fit the device's free memory (minus a margin), loading stops with exit code 5
and a table of the components, the device's total and free memory, and the largest context /
block count that would fit, with nothing allocated (docs/architecture.md, "Out of memory", rule 1).
"""

from __future__ import annotations

import textwrap
from dataclasses import dataclass

from hipcore.kvcache.config import KvCacheConfig
from hipcore.model.activations import activation_sizes
from hipcore.model.weights import planned_weight_bytes, weight_growth
from hipcore.runtime.device import Device
from hipcore.runtime.errors import DeviceOutOfMemory, UsageError
from hipcore.runtime.ledger import format_bytes

MARGIN_FRACTION = 0.03  # what we leave free for the driver, other processes and fragmentation
MARGIN_CAP = 512 << 20
MAX_PLANNED_BLOCKS = 2**24
ACTIVATION_TAGS = ("activations", "moe_router", "moe_experts")  # a mixture of experts' buffers count as activations  # a probe's global pool, only so that window_pool_blocks is not capped by it


@dataclass(frozen=True)
class MemoryPlan:
    device: str
    backend: str
    weights: int
    kv: int
    activations: int
    scratch: int
    free: int
    total: int
    margin: int
    kv_config: KvCacheConfig
    ctx_size: int
    max_seqs: int
    max_step_tokens: int = 0  # prompt tokens a step: what the activations are sized for
    weights_in_file: int = 0  # the same tensors' bytes in the file
    weights_converted: int = 0  # of those, the bytes stored in another format on this device (weights_format)
    weights_format: str = ""

    @property
    def weights_grow(self) -> bool:
        return self.weights > self.weights_in_file and self.weights_converted > 0

    def weights_note(self) -> str:
        """Why the weights take more than the file: a plan that says 513.1 MiB for a 92 MiB file says why."""
        if not self.weights_grow:
            return ""
        why = ("the cpu backend computes on dequantized copies" if self.backend == "cpu"
               else "types this GPU's kernels do not read are converted")
        return (f"weights grow on load: {why} ({format_bytes(self.weights_converted)} of the file's "
                f"{format_bytes(self.weights_in_file)} stored as {self.weights_format})")

    @property
    def needed(self) -> int:
        return self.weights + self.kv + self.activations + self.scratch

    @property
    def fits(self) -> bool:
        return self.needed <= self.free - self.margin

    def rows(self) -> list[tuple[str, int]]:
        kv = self.kv_config
        local = (f"; sliding-window layers: {kv.window_blocks - 1} blocks of {len(kv.window_layers)} layers"
                 if kv.layer_windows else "")
        kv_row = f"kv cache ({kv.num_blocks - 1} blocks x {kv.block_size} tokens, {kv.dtype}{local})"
        if kv.window_only:  # the global group counts positions only: the local pool is the cache
            kv_row = (f"kv cache ({kv.window_blocks - 1} blocks x {kv.block_size} tokens, {kv.dtype}; every layer "
                      f"slides: a window of {kv.window}, {kv.window_blocks_per_sequence()} blocks a sequence)")
        return [
            (f"weights ({format_bytes(self.weights_in_file)} in the file)" if self.weights_grow else "weights",
             self.weights),
            (kv_row, self.kv),
            ("activations", self.activations),
            ("scratch (step inputs, attention workspace)", self.scratch),
            ("total needed", self.needed),
            (f"free on {self.device}", self.free),
            ("margin kept free", self.margin),
        ]

    def table(self) -> str:
        width = max(len(name) for name, _ in self.rows())
        note = self.weights_note()
        return "\n".join([f"  {name:<{width}}  {format_bytes(n):>10}" for name, n in self.rows()]
                         + textwrap.wrap(note, 78, initial_indent="  ", subsequent_indent="  "))

    def largest_kv_that_fits(self) -> tuple[int, int]:
        """(usable blocks, tokens) the KV pool could have beside everything else."""
        kv = self.kv_config
        # A sliding-window group's pool is sized by sequences, not by context: it stays as planned.
        room = self.free - self.margin - self.weights - self.activations - self.scratch
        if kv.window_only:  # the local pool is the whole cache
            blocks = max(0, room // kv.window_bytes_per_block - 1)
            return blocks, blocks * kv.block_size
        room -= kv.window_blocks * kv.window_bytes_per_block
        blocks = max(0, room // kv.bytes_per_block - 1)
        return blocks, blocks * self.kv_config.block_size

    def check(self) -> None:
        """Raise DeviceOutOfMemory (exit 5) with the plan and what to change when it does not fit."""
        if self.fits:
            return
        blocks, tokens = self.largest_kv_that_fits()
        step = self.activations + self.scratch
        fewer_step_tokens = (f"fewer prompt tokens a step (serve's --step-tokens; steps of {self.max_step_tokens} tokens "
                             f"for {self.max_seqs} sequences take {format_bytes(step)})")
        if blocks > 0 and self.kv_config.window_only:
            advice = (f"the KV cache of sliding-window layers could hold {blocks} blocks: use --kv-blocks {blocks}, "
                      "fewer --parallel sequences or a smaller --kv-dtype (q8_0)")
        elif blocks > 0:
            advice = (f"the KV cache could hold {tokens} tokens ({blocks} blocks): use --ctx-size {tokens} "
                      f"or --kv-blocks {blocks}, or a smaller --kv-dtype (q8_0)")
            if step * 4 > self.needed:  # the activations are a large share: shrinking them is an answer too
                advice += f", or {fewer_step_tokens}"
        elif self.weights <= self.free - self.margin:
            advice = f"the weights fit but not with a step's activations: use {fewer_step_tokens} or fewer --parallel sequences"
        else:
            advice = "the weights alone do not fit: use a smaller or more quantized model, or another device"
        raise DeviceOutOfMemory(
            f"{'HIP' if self.backend == 'hip' else 'CUDA' if self.backend == 'cuda' else 'CPU backend'} out of memory "
            f"on {self.device}: the model needs {format_bytes(self.needed)} but {format_bytes(self.free)} is free "
            f"of {format_bytes(self.total)} (keeping {format_bytes(self.margin)} spare); {advice}.\n{self.table()}",
            requested=self.needed, free=self.free, tag="plan",
        )


def parse_memory_size(text: str, free: int) -> int:
    """'8GiB', '512MB', '1.5G', '70%' (of free memory), or plain bytes."""
    s = text.strip().lower().replace(" ", "")
    try:
        if s.endswith("%"):
            value = float(s[:-1])
            if not 0 < value <= 100:
                raise ValueError
            if int(free * value / 100) < 1:
                raise UsageError(f"memory size {text!r} of {free} free bytes is less than one byte")
            return int(free * value / 100)
        units = {"tib": 1 << 40, "gib": 1 << 30, "mib": 1 << 20, "kib": 1 << 10, "tb": 10**12, "gb": 10**9,
                 "mb": 10**6, "kb": 10**3, "t": 1 << 40, "g": 1 << 30, "m": 1 << 20, "k": 1 << 10, "b": 1}
        for suffix, mult in units.items():
            if s.endswith(suffix):
                number = float(s[: -len(suffix)])
                break
        else:
            number, mult = float(s), 1
        if not number > 0 or number * mult > 2**62:
            raise ValueError
    except ValueError:
        raise UsageError(f"cannot read memory size {text!r}: use e.g. 8GiB, 512MiB, 1.5G or 70% (of free memory)") from None
    if mult == 1 and not number.is_integer():  # '0.4' is 0.4 bytes, almost surely a forgotten unit
        raise UsageError(f"memory size {text!r} is a fraction of a byte: a size without a unit is in bytes; "
                         f"add the unit, e.g. {s.rstrip('b')}GiB")
    if number * mult < 1:
        raise UsageError(f"memory size {text!r} is less than one byte")
    return int(number * mult)


def _window_only_kv(shape: dict, ctx_size: int, max_seqs: int, max_step_tokens: int, kv_blocks: int | None,
                    kv_memory: str | None, free: int) -> KvCacheConfig:
    """The cache of a model whose every layer has a window: the local pool is the whole cache (--kv-blocks or
    --kv-memory size it, else about a window and a step per sequence: window_pool_blocks); the global group holds no
    layer and costs nothing, so it counts positions for max_seqs full contexts."""
    positions = max_seqs * -(-ctx_size // shape["block_size"]) + 1
    if kv_blocks is not None:
        local = kv_blocks + 1
    elif kv_memory is not None:
        local = KvCacheConfig.for_memory(parse_memory_size(kv_memory, free), **shape).window_blocks
    else:
        local = KvCacheConfig(num_blocks=positions, **shape).window_pool_blocks(max_seqs, max_step_tokens)
    return KvCacheConfig(num_blocks=max(positions, local), **shape, window_blocks=local)


def make_plan(device: Device, model_plan, *, ctx_size: int, max_seqs: int, max_step_tokens: int,
              kv_dtype: str = "f16", block_size: int = 16, kv_blocks: int | None = None,
              kv_memory: str | None = None, layer_windows: tuple[int, ...] = ()) -> MemoryPlan:
    """Size every component for this model on this device; does not allocate anything.

    layer_windows: the model's sliding window per layer (0 = global; KvCacheConfig.layer_windows), set by
    the loader from the model's config. The local group's pool is then sized for max_seqs sequences
    (KvCacheConfig.window_pool_blocks): a local layer holds about a window per sequence, not a context."""
    cfg = model_plan.config
    if not 1 <= ctx_size <= cfg.context_length:
        raise UsageError(f"--ctx-size must be between 1 and the model's context length {cfg.context_length}, got {ctx_size}")
    info = device.memory_info()
    margin = min(int(info.total * MARGIN_FRACTION), MARGIN_CAP)
    shape = dict(n_layers=cfg.n_layers, n_kv_heads=cfg.n_kv_heads, head_dim=cfg.head_dim, block_size=block_size,
                 dtype=kv_dtype, layer_windows=layer_windows)
    if kv_blocks is not None and kv_memory is not None:
        raise UsageError("give either --kv-blocks or --kv-memory, not both")
    if layer_windows and all(layer_windows):
        kv_config = _window_only_kv(shape, ctx_size, max_seqs, max_step_tokens, kv_blocks, kv_memory, info.free)
    elif kv_blocks is not None:
        kv_config = KvCacheConfig(num_blocks=kv_blocks + 1, **shape)
    elif kv_memory is not None:
        budget = parse_memory_size(kv_memory, info.free)
        kv_config = KvCacheConfig.for_memory(budget, **shape)
        if kv_config.layer_windows:  # the local pool first, as much as max_seqs sequences need; the rest global
            wanted = KvCacheConfig(num_blocks=MAX_PLANNED_BLOCKS, **shape).window_pool_blocks(max_seqs, max_step_tokens)
            kv_config = KvCacheConfig.for_memory(budget, **shape, window_blocks=min(wanted, kv_config.num_blocks))
    else:  # room for max_seqs full contexts, plus the null block
        kv_config = KvCacheConfig(num_blocks=max_seqs * -(-ctx_size // block_size) + 1, **shape)
    if kv_config.layer_windows and kv_memory is None and not kv_config.window_only:
        kv_config = KvCacheConfig(num_blocks=kv_config.num_blocks, **shape,
                                  window_blocks=kv_config.window_pool_blocks(max_seqs, max_step_tokens))
    max_blocks = -(-ctx_size // block_size)  # the runner's block tables are as wide as the context
    sizes = activation_sizes(cfg, max_step_tokens, max_seqs, max_blocks, block_size, bool(kv_config.layer_windows))
    in_file, converted, fmt = weight_growth(device, model_plan)
    return MemoryPlan(
        device=f"{device.name} ({device.arch})", backend=device.backend,
        weights_in_file=in_file, weights_converted=converted, weights_format=fmt,
        weights=planned_weight_bytes(device, model_plan), kv=kv_config.cache_bytes,
        activations=sum(n for n, tag in sizes.values() if tag in ACTIVATION_TAGS),
        scratch=sum(n for n, tag in sizes.values() if tag == "scratch"),
        free=info.free, total=info.total, margin=margin, kv_config=kv_config, ctx_size=ctx_size, max_seqs=max_seqs,
        max_step_tokens=max_step_tokens,
    )
