"""Building StepBatches straight from a KvCache, for tests that drive a runner without the engine; a short run of
steps on a model file with the launches and cache bytes it leaves."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from hipcore.engine.loader import LoadOptions, load_model
from hipcore.model import weights
from hipcore.model.batch import SeqSlice, StepBatch, build_step_batch


def step_batch(cache, items: list[tuple[int, list[int], int]]) -> StepBatch:
    """A StepBatch for (seq_id, tokens, first) items: each computes tokens at positions first.. (reserving),
    built as the engine builds it (both layer groups' slots and tables when the cache has a window group)."""
    for seq_id, toks, first in items:
        if not cache.has_sequence(seq_id):
            cache.add_sequence(seq_id)
        assert cache.reserve(seq_id, len(toks))
    return build_step_batch(cache, [SeqSlice(seq_id, list(toks), first, True) for seq_id, toks, first in items])


def prompt_then_decode(path: Path, kv_dtype: str, prompt: list[int], change=None):
    """On the cpu backend: the logits of `prompt` as sequence 1 beside sequence 2's one-token prompt, then of three
    greedy decode steps of both; the launch names of that prompt step and of a decode step; both pools' bytes of every
    layer, as one array. change(runner), when given, runs before the first step (a planted family, say)."""
    loaded = load_model(str(path), LoadOptions(device="cpu", max_seqs=2, max_step_tokens=16, ctx_size=64,
                                               kv_dtype=kv_dtype))
    try:
        runner, cache = loaded.runner, loaded.cache
        if change is not None:
            change(runner)
        logits = [runner.execute(step_batch(cache, [(1, prompt, 0), (2, [101], 0)]))]
        names = [name for name, _ in runner.launch_plan(len(prompt) + 1, 2, all_rows=False, with_sampling=False,
                                                        decode=False)]
        for step in range(3):
            nxt = [int(np.argmax(row)) for row in logits[-1]]
            logits.append(runner.execute(step_batch(cache, [(1, [nxt[0]], len(prompt) + step), (2, [nxt[1]], 1 + step)])))
        decode_names = [name for name, _ in runner.launch_plan(2, 2, all_rows=True, with_sampling=False, decode=True)]
        pools = np.concatenate([pool.download(np.uint8) for pool in cache.k_pools + cache.v_pools])
        return logits, names, decode_names, pools
    finally:
        loaded.close()


def keep_gpu_formats(monkeypatch) -> None:
    """The cpu backend dequantizes weights to float32, where no fused_qmatvec runs: keep the formats a GPU holds
    them in (GGUF blocks), so that the cpu backend takes the GPU's fused kernels through their host references."""
    class AsGpu:
        backend = "gpu"

    keep = weights.storage_format
    monkeypatch.setattr(weights, "storage_format", lambda device, type_name, **kw: keep(AsGpu(), type_name, **kw))
