"""StepInputs: every per-step value the forward pass reads, in one device buffer, uploaded in one copy.

The kernels (and a captured graph's frozen launch arguments) read these at fixed device addresses;
only the contents change from step to step. One host staging array mirrors the buffer, so a step
costs a few numpy slice assignments and a single host-to-device copy of the used prefix.

Layout (int32 words; float32 where noted), each region at a 64-byte boundary:
    slots        [tokens]       KV slot of each token; -1 = padding (kv_store skips it)
    token_ids    [tokens]
    positions    [tokens]       -1 = padding (attention writes zero rows for it)
    token_seq    [tokens]       which sequence (block-table row) each token belongs to
    sample_rows  [rows]         token index of each logits row (select mode; see pack)
    sampling     [rows, 5]      float32: temperature, top_k, top_p, min_p, uniform (hipcore/ops/sample.py)
    block_tables [seqs, max_blocks]
The slots come first so that the buffer itself can be handed to launchers that take a Buffer whose
start is the slot mapping (kv_store).

A cache with sliding-window layers (a local layer group) adds a second, smaller buffer of the same
kind for those layers, uploaded in a second copy of the step:
    slots        [tokens]       KV slot of each token in the local group's pool; -1 = padding
    block_tables [seqs, max_blocks]  the local group's tables
`for_group(LOCAL_GROUP)` is what the forward pass hands those layers as their step inputs: the local
buffer for the slots and tables, the main one for everything else.
"""

from __future__ import annotations

import numpy as np

from hipcore.kvcache.config import GLOBAL_GROUP, LOCAL_GROUP
from hipcore.model.batch import StepBatch
from hipcore.ops.sample import PARAMS_PER_ROW, SamplingRows
from hipcore.runtime.device import Buffer, Device, Stream

ALIGN_WORDS = 16


def _aligned(words: int) -> int:
    return -(-words // ALIGN_WORDS) * ALIGN_WORDS


def input_bytes(tokens: int, rows: int, seqs: int, max_blocks: int) -> int:
    """Bytes of the buffer for these capacities (what the memory plan counts as scratch)."""
    return 4 * (4 * _aligned(tokens) + _aligned(rows) + _aligned(rows * PARAMS_PER_ROW) + seqs * max_blocks)


def window_input_bytes(tokens: int, seqs: int, max_blocks: int) -> int:
    """Bytes of the sliding-window group's buffer (slots and tables)."""
    return 4 * (_aligned(tokens) + seqs * max_blocks)


class GroupInputs:
    """The step inputs as the layers of the sliding-window group read them (same interface as StepInputs
    where the blocks use it: `addr(name)` and `buffer`, whose start is the slot mapping)."""

    def __init__(self, main: "StepInputs", buffer: Buffer, tables_offset: int):
        self.main, self.buffer, self._tables_offset = main, buffer, tables_offset

    def addr(self, name: str) -> int:
        if name == "slots":
            return self.buffer.addr(0)
        if name == "block_tables":
            return self.buffer.addr(4 * self._tables_offset)
        return self.main.addr(name)


class StepInputs:
    def __init__(self, device: Device, *, tokens: int, rows: int, seqs: int, max_blocks: int,
                 window_group: bool = False):
        self.tokens, self.rows, self.seqs, self.max_blocks = tokens, rows, seqs, max_blocks
        offsets, at = {}, 0
        for name, words in (("slots", tokens), ("token_ids", tokens), ("positions", tokens), ("token_seq", tokens),
                            ("sample_rows", rows), ("sampling", rows * PARAMS_PER_ROW), ("block_tables", seqs * max_blocks)):
            offsets[name] = at
            at += _aligned(words)
        self.offsets = offsets
        self.words = np.zeros(at, dtype=np.int32)
        self.buffer: Buffer = device.allocate(input_bytes(tokens, rows, seqs, max_blocks), tag="scratch",
                                              label="runner.step_inputs")
        try:
            self.buffer.fill(0)
        except BaseException:
            self.buffer.free()
            raise
        w = self.words
        o = offsets
        self.slots = w[o["slots"]:o["slots"] + tokens]
        self.token_ids = w[o["token_ids"]:o["token_ids"] + tokens]
        self.positions = w[o["positions"]:o["positions"] + tokens]
        self.token_seq = w[o["token_seq"]:o["token_seq"] + tokens]
        self.sample_rows = w[o["sample_rows"]:o["sample_rows"] + rows]
        self.sampling = w[o["sampling"]:o["sampling"] + rows * PARAMS_PER_ROW].view(np.float32).reshape(rows, PARAMS_PER_ROW)
        self.block_tables = w[o["block_tables"]:o["block_tables"] + seqs * max_blocks].reshape(seqs, max_blocks)
        self._seq_index = np.arange(max(tokens, seqs), dtype=np.int32)
        self.window: GroupInputs | None = None
        if window_group:
            try:
                self._allocate_window_group(device, tokens, seqs, max_blocks)
            except BaseException:
                self.close()
                raise

    def _allocate_window_group(self, device: Device, tokens: int, seqs: int, max_blocks: int) -> None:
        tables_at = _aligned(tokens)
        self.window_words = np.zeros(tables_at + seqs * max_blocks, dtype=np.int32)
        self.window_slots = self.window_words[:tokens]
        self.window_block_tables = self.window_words[tables_at:].reshape(seqs, max_blocks)
        buffer = device.allocate(window_input_bytes(tokens, seqs, max_blocks), tag="scratch",
                                 label="runner.step_inputs.local")
        self.window = GroupInputs(self, buffer, tables_at)
        buffer.fill(0)

    def for_group(self, group: str) -> "StepInputs | GroupInputs":
        """The step inputs the layers of `group` read ("global": these; "local": the window group's)."""
        if group == GLOBAL_GROUP:
            return self
        if group == LOCAL_GROUP and self.window is not None:
            return self.window
        raise ValueError(f"the step inputs hold no layer group {group!r}")

    def addr(self, name: str) -> int:
        """Device address of a region."""
        return self.buffer.addr(4 * self.offsets[name])

    def pack(self, batch: StepBatch, *, padded_tokens: int, all_rows: bool, sampling: SamplingRows | None,
             stream: Stream | None, padded_rows: int | None = None) -> None:
        """Fill the staging array from `batch` and upload it.

        padded_tokens >= batch.num_tokens: the rows past the batch are padding (token 0, position -1,
        slot -1, sequence 0), so a kernel launched for padded_tokens computes harmless, ignored rows.
        all_rows: logits are computed for every token row (decode: the sampling inputs go to row
        sample_rows[i]); otherwise for the rows listed in sample_rows (sampling input i at row i), and
        padded_rows >= len(sample_rows) of them where given: the rows past the batch's read token row 0
        row, greedily (their logits and tokens are never read).
        """
        n, s, r = batch.num_tokens, batch.num_seqs, int(batch.sample_rows.shape[0])
        self.slots[:n] = batch.slot_mapping
        self.token_ids[:n] = batch.token_ids
        self.positions[:n] = batch.positions
        if batch.is_decode_only:
            self.token_seq[:n] = self._seq_index[:n]
        else:
            self.token_seq[:n] = batch.token_seq_index()
        if padded_tokens > n:
            self.slots[n:padded_tokens] = -1
            self.token_ids[n:padded_tokens] = 0
            self.positions[n:padded_tokens] = -1
            self.token_seq[n:padded_tokens] = 0
        width = batch.block_tables.shape[1]
        self.block_tables[:s, :width] = batch.block_tables  # columns past `width` are never read
        params = self.sampling
        if all_rows:
            params[:padded_tokens, 0] = 0.0  # rows without a sampling input are greedy (ignored)
            if sampling is not None and r:
                self._scatter(sampling, batch.sample_rows)
        else:
            self.sample_rows[:r] = batch.sample_rows
            if sampling is not None:
                sampling.pack_into(params[:r])
            else:
                params[:r, 0] = 0.0
            if padded_rows is not None and padded_rows > r:
                self.sample_rows[r:padded_rows] = 0
                params[r:padded_rows] = 0.0
        end = self.offsets["block_tables"] + s * self.max_blocks
        self.buffer.upload(self.words[:end], stream=stream)
        if self.window is not None:
            self._pack_window_group(batch, padded_tokens, stream)

    def pack_padding(self, tokens: int, rows: int, *, stream: Stream | None) -> None:
        """Inputs of a step of padding alone (tokens rows, rows logits rows): nothing is stored in the cache and
        attention gives zero rows (the runner's fill_prompt_caches runs such steps)."""
        self.slots[:tokens] = -1
        self.token_ids[:tokens] = 0
        self.positions[:tokens] = -1
        self.token_seq[:tokens] = 0
        self.sample_rows[:rows] = 0
        self.sampling[:rows] = 0.0
        self.buffer.upload(self.words[:self.offsets["block_tables"]], stream=stream)
        if self.window is not None:
            self.window_slots[:tokens] = -1
            self.window.buffer.upload(self.window_words[:self.window._tables_offset], stream=stream)

    def _pack_window_group(self, batch: StepBatch, padded_tokens: int, stream: Stream | None) -> None:
        if batch.window_slot_mapping is None or batch.window_block_tables is None:
            raise ValueError("the cache has a sliding-window group but the step batch carries no slots or tables for it")
        n, s = batch.num_tokens, batch.num_seqs
        self.window_slots[:n] = batch.window_slot_mapping
        if padded_tokens > n:
            self.window_slots[n:padded_tokens] = -1
        width = batch.window_block_tables.shape[1]
        self.window_block_tables[:s, :width] = batch.window_block_tables
        assert self.window is not None
        end = self.window._tables_offset + s * self.max_blocks
        self.window.buffer.upload(self.window_words[:end], stream=stream)

    def _scatter(self, sampling: SamplingRows, rows: np.ndarray) -> None:
        params = self.sampling
        params[rows, 0] = sampling.temperature
        params[rows, 1] = sampling.top_k
        params[rows, 2] = sampling.top_p
        params[rows, 3] = sampling.min_p
        params[rows, 4] = sampling.uniform

    def close(self) -> None:
        if self.window is not None and not self.window.buffer.freed:
            self.window.buffer.free()
        if not self.buffer.freed:
            self.buffer.free()
