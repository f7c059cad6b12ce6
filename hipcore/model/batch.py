"""StepBatch: what one engine step hands the model, in the flattened ("varlen") form of vLLM.

The tokens of every scheduled sequence are concatenated; per-token arrays (positions, KV slots)
and per-sequence arrays (where each sequence's tokens start, how long its context is, its block
table) describe them. The same batch drives prompt evaluation, decode, or a mix of both.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

NULL_BLOCK = 0  # padding of block tables; the KV cache never hands this block out


@dataclass(frozen=True)
class StepBatch:
    token_ids: np.ndarray  # int32 [T]: the tokens whose K/V this step computes
    positions: np.ndarray  # int32 [T]: absolute position of each token in its sequence
    slot_mapping: np.ndarray  # int32 [T]: KV-cache slot (block * block_size + offset) of each token
    seq_starts: np.ndarray  # int32 [S + 1]: tokens of sequence s are [seq_starts[s], seq_starts[s+1])
    context_lens: np.ndarray  # int32 [S]: tokens in the cache for sequence s once this step is done
    block_tables: np.ndarray  # int32 [S, max_blocks]: padded with NULL_BLOCK
    sample_rows: np.ndarray  # int32 [R]: token indices whose logits are wanted (one per sampling sequence)

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

    def validate(self, block_size: int, num_blocks: int) -> None:
        """Cheap structural checks (invariant 10: check before touching the cache)."""
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
