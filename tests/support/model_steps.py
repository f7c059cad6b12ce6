"""Building StepBatches straight from a KvCache, for tests that drive a runner without the engine."""

from __future__ import annotations

from hipcore.model.batch import SeqSlice, StepBatch, build_step_batch


def step_batch(cache, items: list[tuple[int, list[int], int]]) -> StepBatch:
    """A StepBatch for (seq_id, tokens, first) items: each computes tokens at positions first.. (reserving),
    built as the engine builds it (both layer groups' slots and tables when the cache has a window group)."""
    for seq_id, toks, first in items:
        if not cache.has_sequence(seq_id):
            cache.add_sequence(seq_id)
        assert cache.reserve(seq_id, len(toks))
    return build_step_batch(cache, [SeqSlice(seq_id, list(toks), first, True) for seq_id, toks, first in items])
