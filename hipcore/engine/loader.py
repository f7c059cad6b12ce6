"""Load a model end to end: validate the file, pick the device, plan memory, upload, build the engine.

Every command that runs a model (generate, bench, leak-check, profile-kv workloads) loads it here,
so the order of the checks is the same everywhere: the file is validated and the memory plan is
checked before the first byte goes to the device, and a failure at any point unwinds everything
allocated so far.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import Callable

from hipcore.engine.engine import Engine, EngineHooks
from hipcore.gguf.file import GGUFFile
from hipcore.kvcache.cache import KvCache
from hipcore.model.forward import ModelRunner, check_device
from hipcore.model.memory_plan import MemoryPlan, make_plan
from hipcore.model.weights import ModelWeights, upload_weights
from hipcore.runtime.device import Device
from hipcore.runtime.selection import pick_device
from hipcore.tokenizer.tokenizer import Tokenizer

DEFAULT_CTX_SIZE = 4096  # llama.cpp's default context; the model's own length caps it


@dataclass
class LoadOptions:
    device: str = "auto"
    ctx_size: int | None = None  # None: min(model context, DEFAULT_CTX_SIZE)
    max_seqs: int = 1  # sequences decoded together (parallel requests x samples)
    max_step_tokens: int = 512  # prompt tokens evaluated per step (chunked prompt evaluation beyond it)
    kv_dtype: str = "f16"
    block_size: int = 16
    kv_blocks: int | None = None
    kv_memory: str | None = None
    cpu_capacity: int | None = None  # emulate a card's size on the cpu backend
    finished_bound: int = 1000
    hooks: EngineHooks | None = None
    prefix_caching: bool = False  # keep full KV blocks for prompts that start alike (hipcore/kvcache/prefix_cache.py)


@dataclass
class LoadedModel:
    path: str
    device: Device
    device_reasons: list[str]
    gguf: GGUFFile
    tokenizer: Tokenizer
    memory_plan: MemoryPlan
    weights: ModelWeights
    cache: KvCache
    runner: ModelRunner
    engine: Engine
    load_seconds: float
    closed: bool = field(default=False)

    @property
    def config(self):
        return self.gguf.config

    def close(self) -> None:
        """End every request, then free runner buffers, the KV pools and the weights; idempotent."""
        if self.closed:
            return
        self.closed = True
        try:
            self.engine.shutdown()
        finally:
            self.runner.close()
            self.cache.close()
            self.weights.free()
            self.gguf.close()

    def __enter__(self) -> "LoadedModel":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


StatusFn = Callable[[str], None]
ProgressFn = Callable[[int, int, str], None]


def load_model(path: str, options: LoadOptions | None = None, *, status: StatusFn | None = None,
               progress: ProgressFn | None = None, device: Device | None = None) -> LoadedModel:
    """Validate, plan, upload and assemble. `device` reuses an already opened device."""
    opts = options or LoadOptions()
    say = status or (lambda _msg: None)
    t0 = time.perf_counter()
    gguf = GGUFFile.open(path)
    undo: list[Callable[[], None]] = [gguf.close]
    try:
        tokenizer = Tokenizer.from_metadata(gguf.metadata)
        reasons: list[str] = []
        if device is None:
            choice = pick_device(opts.device, cpu_capacity=opts.cpu_capacity)
            device, reasons = choice.device, list(choice.reasons)
            undo.append(device.close)
        say(f"device: {device.describe()}")
        cfg = gguf.config
        check_device(cfg, device)  # before anything is allocated
        ctx = opts.ctx_size or min(cfg.context_length, DEFAULT_CTX_SIZE)
        plan = make_plan(device, gguf.plan, ctx_size=ctx, max_seqs=opts.max_seqs, max_step_tokens=opts.max_step_tokens,
                         kv_dtype=opts.kv_dtype, block_size=opts.block_size, kv_blocks=opts.kv_blocks,
                         kv_memory=opts.kv_memory,
                         layer_windows=tuple(cfg.layer_window(i) for i in range(cfg.n_layers)))
        plan.check()
        say("memory plan (before anything is allocated):\n" + plan.table())
        weights = upload_weights(device, gguf, progress)
        undo.append(weights.free)
        # The file's name and size stand for the model in every cached block's key: a cache lives with one model, but
        # a key that names it cannot be mistaken for another's.
        cache = KvCache(device, plan.kv_config, prefix_caching=opts.prefix_caching,
                        model_identity=f"{os.path.basename(str(path))}:{os.path.getsize(path)}")
        undo.append(cache.close)
        runner = ModelRunner(device, cfg, weights, cache, max_step_tokens=opts.max_step_tokens, max_seqs=opts.max_seqs,
                             max_context=ctx)
        undo.append(runner.close)
        engine = Engine(runner, tokenizer, cache, max_seqs=opts.max_seqs, max_step_tokens=opts.max_step_tokens,
                        max_context=ctx, finished_bound=opts.finished_bound, hooks=opts.hooks)
    except BaseException:
        for fn in reversed(undo):
            fn()
        raise
    return LoadedModel(str(path), device, reasons, gguf, tokenizer, plan, weights, cache, runner, engine,
                       time.perf_counter() - t0)
