"""Building StepBatches straight from a KvCache, for tests that drive a runner without the engine."""

from __future__ import annotations

import numpy as np

from hipcore.model.batch import StepBatch


def step_batch(cache, items: list[tuple[int, list[int], int]]) -> StepBatch:
    """A StepBatch for (seq_id, tokens, first) items: each computes tokens at positions first.. (reserving)."""
    tokens, positions, slots, starts, ctx, seq_ids = [], [], [], [0], [], []
    for seq_id, toks, first in items:
        if not cache.has_sequence(seq_id):
            cache.add_sequence(seq_id)
        assert cache.reserve(seq_id, len(toks))
        tokens += toks
        positions += range(first, first + len(toks))
        slots.append(cache.slot_mapping(seq_id, first, len(toks)))
        starts.append(starts[-1] + len(toks))
        ctx.append(first + len(toks))
        seq_ids.append(seq_id)
    return StepBatch(np.array(tokens, np.int32), np.array(positions, np.int32), np.concatenate(slots),
                     np.array(starts, np.int32), np.array(ctx, np.int32), cache.block_tables(seq_ids),
                     np.array(starts[1:], np.int32) - 1)
