"""StepBatch: what one engine step hands the model, in the flattened ("varlen") form of vLLM, and
build_step_batch, its one builder.

The tokens of every scheduled sequence are concatenated; per-token arrays (positions, KV slots)
and per-sequence arrays (where each sequence's tokens start, how long its context is, its block
table) describe them. The same batch drives prompt evaluation, decode, or a mix of both.

A cache with sliding-window layers (a local layer group, hipcore/kvcache/config.py) has its own pool
and block tables for those layers: the batch then also carries their slots and tables
(`window_slot_mapping`, `window_block_tables`); for a cache of one group they are None.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from hipcore.kvcache.cache import KvCache
from hipcore.kvcache.config import LOCAL_GROUP, NULL_BLOCK  # NULL_BLOCK: padding of block tables (never handed out)


@dataclass(frozen=True)
class SeqSlice:
    """The tokens one sequence computes in a step: `tokens` at positions first, first + 1, ... (their KV slots
    reserved in the cache already); `samples` says whether the last one's logits are wanted."""

    seq_id: int
    tokens: Sequence[int]
    first: int
    samples: bool


@dataclass(frozen=True)
class StepBatch:
    token_ids: np.ndarray  # int32 [T]: the tokens whose K/V this step computes
    positions: np.ndarray  # int32 [T]: absolute position of each token in its sequence
    slot_mapping: np.ndarray  # int32 [T]: KV-cache slot (block * block_size + offset) of each token
    seq_starts: np.ndarray  # int32 [S + 1]: tokens of sequence s are [seq_starts[s], seq_starts[s+1])
    context_lens: np.ndarray  # int32 [S]: tokens in the cache for sequence s once this step is done
    block_tables: np.ndarray  # int32 [S, max_blocks]: padded with NULL_BLOCK
    sample_rows: np.ndarray  # int32 [R]: token indices whose logits are wanted (one per sampling sequence)
    # the local (sliding-window) group's, when the cache has one: slots in its pool, its tables (released
    # blocks read as the null block; the attention window never reads them)
    window_slot_mapping: np.ndarray | None = None  # int32 [T]
    window_block_tables: np.ndarray | None = None  # int32 [S, max_blocks], as wide as block_tables

    @property
    def num_tokens(self) -> int:
        return int(self.token_ids.shape[0])

    @property
    def num_seqs(self) -> int:
        return int(self.context_lens.shape[0])

    @property
    def is_decode_only(self) -> bool:
        """Every sequence computes exactly one token (the shape that graph replay serves)."""
        return self.num_tokens == self.num_seqs

    def token_seq_index(self) -> np.ndarray:
        """int32 [T]: which sequence each token belongs to."""
        counts = np.diff(self.seq_starts)
        return np.repeat(np.arange(self.num_seqs, dtype=np.int32), counts)

    def validate(self, block_size: int, num_blocks: int, window_num_blocks: int | None = None) -> None:
        """Cheap structural checks (invariant 10: check before touching the cache). window_num_blocks: the
        local group's pool, when the cache has one (the batch must then carry its slots and tables)."""
        if (window_num_blocks is None) != (self.window_block_tables is None) or \
                (self.window_block_tables is None) != (self.window_slot_mapping is None):
            raise ValueError("step batch: the sliding-window group's slots and tables must come with a cache that "
                             "has one, and only then")
        if window_num_blocks is not None:
            assert self.window_slot_mapping is not None and self.window_block_tables is not None
            local = dataclasses.replace(self, block_tables=self.window_block_tables,
                                        slot_mapping=self.window_slot_mapping, window_slot_mapping=None,
                                        window_block_tables=None)
            if local.block_tables.shape != self.block_tables.shape:
                raise ValueError("step batch: the sliding-window tables must be as wide as the global ones")
            local.validate(block_size, window_num_blocks)
        t, s = self.num_tokens, self.num_seqs
        if self.positions.shape != (t,) or self.slot_mapping.shape != (t,):
            raise ValueError("step batch: per-token arrays disagree in length")
        if self.seq_starts.shape != (s + 1,) or self.seq_starts[0] != 0 or self.seq_starts[-1] != t:
            raise ValueError("step batch: seq_starts must run from 0 to the token count")
        if np.any(np.diff(self.seq_starts) <= 0):
            raise ValueError("step batch: every sequence must compute at least one token")
        if self.block_tables.ndim != 2 or self.block_tables.shape[0] != s:
            raise ValueError("step batch: one block table row per sequence")
        if self.block_tables.size and (self.block_tables.min() < 0 or self.block_tables.max() >= num_blocks):
            raise ValueError("step batch: block id out of range")
        if t and (self.slot_mapping.min() < block_size or self.slot_mapping.max() >= num_blocks * block_size):
            raise ValueError("step batch: KV slot out of range (or in the null block)")
        if np.any(self.context_lens > self.block_tables.shape[1] * block_size):
            raise ValueError("step batch: context longer than its block table")
        if self.sample_rows.size and (self.sample_rows.min() < 0 or self.sample_rows.max() >= t):
            raise ValueError("step batch: sample row out of range")


def build_step_batch(cache: KvCache, items: Sequence[SeqSlice]) -> StepBatch:
    """The StepBatch of one step: the sequences' slices concatenated in order."""
    if all(len(item.tokens) == 1 for item in items):
        return build_decode_batch(cache, [item.seq_id for item in items], [item.tokens[0] for item in items],
                                  [item.first for item in items], [item.samples for item in items])
    batch = _mixed_batch(cache, items)
    if LOCAL_GROUP not in cache.groups:
        return batch
    tables = cache.block_tables([item.seq_id for item in items], width=batch.block_tables.shape[1], group=LOCAL_GROUP)
    slots = np.concatenate([cache.slot_mapping(item.seq_id, item.first, len(item.tokens), LOCAL_GROUP) for item in items])
    return dataclasses.replace(batch, window_slot_mapping=slots.astype(np.int32, copy=False), window_block_tables=tables)


def _mixed_batch(cache: KvCache, items: Sequence[SeqSlice]) -> StepBatch:
    tokens, positions, slots, starts, ctx, tables, sample_rows = [], [], [], [0], [], [], []
    for item in items:
        n, first = len(item.tokens), item.first
        tokens.extend(item.tokens)
        positions.extend(range(first, first + n))
        slots.append(cache.slot_mapping(item.seq_id, first, n))
        starts.append(starts[-1] + n)
        ctx.append(first + n)
        tables.append(cache.block_table(item.seq_id))
        if item.samples:
            sample_rows.append(starts[-1] - 1)
    width = max(len(t) for t in tables)
    table_arr = np.full((len(tables), width), NULL_BLOCK, dtype=np.int32)
    for i, t in enumerate(tables):
        table_arr[i, :len(t)] = t
    return StepBatch(
        token_ids=np.asarray(tokens, dtype=np.int32), positions=np.asarray(positions, dtype=np.int32),
        slot_mapping=np.concatenate(slots).astype(np.int32), seq_starts=np.asarray(starts, dtype=np.int32),
        context_lens=np.asarray(ctx, dtype=np.int32), block_tables=table_arr,
        sample_rows=np.asarray(sample_rows, dtype=np.int32),
    )


def build_decode_batch(cache: KvCache, seq_ids: list[int], token_ids: list[int], positions: list[int],
                       samples: list[bool]) -> StepBatch:
    """The StepBatch of a decode step: sequence i computes the one token token_ids[i] at positions[i] (its KV
    slot reserved already), and samples its next token where samples[i]. What build_step_batch builds from
    one-token slices, without the slices: the engine calls it straight from its sequences.

    Decode steps are where host time per step matters (a replayed graph takes a few hundred microseconds
    on a GPU): building the batch one sequence at a time through KvCache.slot_mapping and block_table
    cost ~20 us per sequence, 1.3 ms for 64 sequences. Here the block tables come from one
    KvCache.block_tables call and every slot is read out of them at once: slot = table[pos // block_size]
    * block_size + pos % block_size.
    """
    n = len(seq_ids)
    tables = cache.block_tables(seq_ids)
    pos = np.array(positions, dtype=np.int32)
    bs = cache.config.block_size
    starts = np.arange(n + 1, dtype=np.int32)  # sequence i's token is token i
    rows = starts[:n]
    column, offset = np.divmod(pos, bs)
    slots = tables[rows, column] * bs + offset
    window_slots = window_tables = None
    if LOCAL_GROUP in cache.groups:  # the sliding-window group's tables, as wide, and its slots read the same way
        window_tables = cache.block_tables(seq_ids, width=tables.shape[1], group=LOCAL_GROUP)
        window_slots = window_tables[rows, column] * bs + offset
    return StepBatch(
        token_ids=np.array(token_ids, dtype=np.int32), positions=pos,
        slot_mapping=slots.astype(np.int32, copy=False), seq_starts=starts,
        context_lens=pos + 1, block_tables=tables, sample_rows=rows if all(samples) else rows[np.array(samples, dtype=bool)],
        window_slot_mapping=None if window_slots is None else window_slots.astype(np.int32, copy=False),
        window_block_tables=window_tables,
    )
