"""The runner's launched steps (mixed into ModelRunner, hipcore/model/forward.py, which provides the attributes
declared here): a step launched and its tokens read later (launch_sampled / collect), a decode step following the
one before it on the device, its token ids that step's tokens (`follows`), and a decode step launched before its
rows' token masks are known (launch_before_masks / sample_under_masks). Steps run in launch order on one stream;
each is collected once, in that order."""

from __future__ import annotations

import dataclasses

import numpy as np

from hipcore.gguf.config import ModelConfig
from hipcore.model.batch import StepBatch
from hipcore.ops.sample import SamplingRows
from hipcore.runtime.device import Buffer, Device, Event, Stream


@dataclasses.dataclass(eq=False)
class PendingStep:
    """A step launched by ModelRunner.launch_sampled whose tokens have not been read yet."""

    batch: StepBatch
    rows: int  # logits rows computed
    all_rows: bool  # whether they are all the token rows
    kept: bool = False  # a following step's launch copied the tokens to the kept buffer: collect reads them there
    awaiting_masks: bool = False  # launch_before_masks: its sampling waits for sample_under_masks


class LaunchedSteps:
    """ModelRunner's steps between launch and collect (ModelRunner provides _run, _upload_mask, _sample_launch)."""

    config: ModelConfig
    device: Device
    stream: Stream
    buffers: dict[str, Buffer]
    _outstanding: list[PendingStep]  # launched, not collected, in launch order
    _read_stream: Stream | None
    _kept_event: Event | None

    def execute_sampled(self, batch: StepBatch, sampling: SamplingRows) -> np.ndarray:
        """int32 token ids [len(batch.sample_rows)], picked on the device by hipcore/ops/sample.py's rules
        with `sampling` (one entry per sample row, in order)."""
        return self.collect(self.launch_sampled(batch, sampling))

    def launch_sampled(self, batch: StepBatch, sampling: SamplingRows, follows: object | None = None) -> PendingStep:
        """execute_sampled without the wait: collect() reads the tokens. With `follows` (the decode step just
        launched and not collected, whose every row sampled), this decode step of the same sequences in the
        same order takes its token ids from that step's tokens on the device (see OverlappingRunner)."""
        return self._launch(batch, sampling, follows, masks_later=False)

    def launch_before_masks(self, batch: StepBatch, sampling: SamplingRows,
                            follows: object | None = None) -> PendingStep:
        """launch_sampled for a decode step whose token masks (a grammar's, for some of its rows) are not known
        yet: its launches up to the logits run now, its sampling once sample_under_masks gives the masks (after
        the step before is collected). The masks need the tokens of the step before; the host reads those and
        computes the masks while the device computes this step's logits. collect() and a following step only
        after sample_under_masks."""
        if not batch.is_decode_only or sampling.mask is not None:
            raise ValueError("launch_before_masks: a decode step, its masks given later (none in its sampling rows)")
        pending = self._launch(batch, sampling, follows, masks_later=True)
        pending.awaiting_masks = True
        return pending

    def sample_under_masks(self, pending: object, mask: np.ndarray) -> None:
        """Launch the sampling of the step of launch_before_masks under `mask` (uint32 [sample rows,
        mask_words(vocab)]; all ones for a row without a grammar). A failed launch drops the step (no collect)."""
        if not (isinstance(pending, PendingStep) and pending.awaiting_masks and self._outstanding
                and self._outstanding[-1] is pending):
            raise ValueError("sample_under_masks: the step launched last by launch_before_masks, once")
        try:
            if len(self._outstanding) > 1:
                raise ValueError("sample_under_masks: once the step before it is collected")
            # The step before has run (collected), so nothing reads the mask buffer: the masks go up on a stream
            # of their own, not behind this step's forward pass (a copy from pageable memory may wait for the
            # stream's work), and the sampling is launched once they are there.
            assert self._read_stream is not None
            self._upload_mask(pending.batch, mask, pending.rows, stream=self._read_stream)
            self._read_stream.synchronize()
            self._sample_launch(pending.rows, masked=True)[1]()
        except BaseException:
            self._outstanding.remove(pending)
            raise
        pending.awaiting_masks = False

    def _launch(self, batch: StepBatch, sampling: SamplingRows, follows: object | None, *,
                masks_later: bool) -> PendingStep:
        if len(sampling) != batch.sample_rows.shape[0]:
            raise ValueError(f"{len(sampling)} sampling rows for {batch.sample_rows.shape[0]} sample rows")
        if follows is None:
            self._check_none_outstanding()
            rows, all_rows = self._run(batch, sampling, want_tokens=True, masks_later=masks_later)
        else:
            before = self._check_follows(batch, follows)
            b, n = self.buffers, batch.num_tokens
            # That step's tokens leave the tokens buffer before this step's sampling overwrites it: collect()
            # reads them from the kept buffer, and this step's embedding takes its ids from there.
            self.device.copy_device_to_device(b["kept_tokens"], b["tokens"], 4 * n, stream=self.stream)
            assert self._kept_event is not None
            self._kept_event.record(self.stream)
            before.kept = True
            rows, all_rows = self._run(batch, sampling, want_tokens=True, token_ids_from=b["kept_tokens"],
                                       masks_later=masks_later)
        pending = PendingStep(batch, rows, all_rows)
        self._outstanding.append(pending)
        return pending

    def collect(self, pending: object) -> np.ndarray:
        """Wait for a step of launch_sampled; int32 token ids [len(batch.sample_rows)]. In launch order."""
        if not self._outstanding or pending is not self._outstanding[0]:
            raise ValueError("collect: not the oldest step launched and not yet collected on this runner")
        assert isinstance(pending, PendingStep)
        if pending.awaiting_masks:
            raise ValueError("collect: the step's token masks were never given (sample_under_masks)")
        self._outstanding.pop(0)
        batch = pending.batch
        self._last_collected = pending
        if not pending.kept:
            return self._download_rows(self.buffers["tokens"], batch, pending.rows, pending.all_rows, 1, np.int32).reshape(-1)
        assert self._kept_event is not None
        self._kept_event.synchronize()  # the step and the copy of its tokens are done (the next step may run on)
        out = np.empty(batch.num_tokens, dtype=np.int32)
        self.device.copy_device_to_host(out, self.buffers["kept_tokens"], stream=self._read_stream)
        return out

    def sampled_step_logits(self, indices: list[int]) -> np.ndarray:
        """float32 logits [len(indices), vocab] of those sample rows of the step collected last, read from the device
        row by row (the tokens the device picked for them are the caller's to ignore): a step whose other rows
        sample on the device while these sample on the host (a grammar's mask, logprobs, penalties). Before the
        next step is launched, which overwrites them."""
        pending = getattr(self, "_last_collected", None)
        if pending is None or self._outstanding:
            raise ValueError("sampled_step_logits: after collect() and before the next step only")
        batch, vocab = pending.batch, self.config.vocab_size
        out = np.empty((len(indices), vocab), dtype=np.float32)
        self.stream.synchronize()
        for k, index in enumerate(indices):
            row = int(batch.sample_rows[index]) if pending.all_rows else index
            self.device.copy_device_to_host(out[k], self.buffers["logits"], offset=row * vocab * 4)
        return out

    def _check_none_outstanding(self) -> None:
        if self._outstanding:
            raise ValueError("a launched step's tokens have not been collected: collect() it first (a new step "
                             "would overwrite them)")

    def _check_follows(self, batch: StepBatch, follows: object) -> PendingStep:
        """The step `batch` may follow on the device: the only one outstanding, a decode step whose every row
        sampled, of as many sequences each one position on."""
        if not isinstance(follows, PendingStep) or self._outstanding != [follows]:
            raise ValueError("follows: the step launched last on this runner, the only one not yet collected")
        if follows.awaiting_masks:
            raise ValueError("follows: a step whose token masks were never given (sample_under_masks)")
        before = follows.batch
        n = batch.num_tokens
        if not (batch.is_decode_only and before.is_decode_only and before.num_tokens == n and follows.all_rows
                and before.sample_rows.shape[0] == n and np.array_equal(batch.positions, before.positions + 1)):
            raise ValueError("follows: a step can follow only a decode step of the same sequences, each sampled, "
                             "one position earlier")
        return follows

    def _download_rows(self, buf: Buffer, batch: StepBatch, rows: int, all_rows: bool, width: int, dtype) -> np.ndarray:
        """The rows of `buf` belonging to batch.sample_rows, in order (waits for the step)."""
        r = int(batch.sample_rows.shape[0])
        if r == 0:
            self.stream.synchronize()
            return np.empty((0, width), dtype=dtype)
        if not all_rows:  # the computed rows are the sample rows, in order
            out = np.empty((r, width), dtype=dtype)
            self.device.copy_device_to_host(out, buf)
            return out
        wanted = batch.sample_rows
        first, last = int(wanted[0]), int(wanted[-1])
        if last - first + 1 == r:  # consecutive rows (every decode step where each sequence samples)
            out = np.empty((r, width), dtype=dtype)
            self.device.copy_device_to_host(out, buf, offset=first * width * np.dtype(dtype).itemsize)
            return out
        block = np.empty((rows, width), dtype=dtype)
        self.device.copy_device_to_host(block, buf)
        return block[wanted]
