"""Running one engine step on the runner: its batch, where its tokens are sampled, and, for decode steps, the
overlap of the host's work with the device's (docs/architecture.md, "Overlapped decode steps").

A decode step of a runner that samples on the device (OverlappingRunner) is launched and left running: the
engine takes its tokens in its next step() call. If the next step is the same sequences decoding one more
token (the steady state of generation), the engine launches that step first, its token ids taken on the
device from the running step's, and only then waits for the running step's tokens and handles them
(detokenizing, stop checks, events) while the device computes the next one. The device then goes from step
to step without waiting for the host, whose work per step (~0.1-0.5 ms) would otherwise sit between them.

What the engine checks before it launches a step ahead (Engine._chain_after): nothing waits to be admitted,
no sequence can end by length with the running step's token, and the pool has a block per sequence, so the
step ahead holds exactly the sequences the scheduler would have picked. A sequence that ends with the
running step's token (end of generation, a stop string) was computed once more for nothing; its row of the
step ahead is dropped, and its blocks wait on the cache's step fence until that step is done.

Rows under a grammar follow too, where the runner can launch a step before its token masks (MaskDeferringRunner):
a row's next mask needs the running step's token, so the step ahead's launches up to the logits go first, and its
sampling once the running step's tokens are read and taken by the grammars and the masks computed (sample_ahead).
The host's reading, grammars and masks then overlap the device's forward pass instead of sitting between steps.
"""

from __future__ import annotations

import dataclasses
import operator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from hipcore.engine.grammar import packed_masks
from hipcore.engine.request import Phase, Request, Sequence
from hipcore.engine.sampling_rows import StepSamplingRows
from hipcore.kvcache.cache import KvCache
from hipcore.model.batch import SeqSlice, StepBatch, build_decode_batch, build_step_batch
from hipcore.model.runner import MaskDeferringRunner, OverlappingRunner, Runner, SamplingRunner
from hipcore.ops.sample import SamplingRows, mask_words

if TYPE_CHECKING:
    from hipcore.engine.scheduler import Scheduled, Scheduler

_SEQ, _NUM_TOKENS, _SAMPLES = (operator.itemgetter(i) for i in range(3))  # of a Scheduled
_SEQ_ID, _NUM_CACHED, _TOKENS = (operator.attrgetter(name) for name in ("seq_id", "num_cached", "tokens"))  # of a Sequence


@dataclass(eq=False)
class LaunchedStep:
    """A step handed to the runner. Exactly one of logits / picked / pending is set until its tokens are read, but
    for a step with host_rows: picked for every row, logits for those rows."""

    scheduled: list["Scheduled"]
    fence: int  # the KV cache's step id (KvCache.begin_step)
    logits: np.ndarray | None = None  # sampled on the host: the logits, read at launch
    picked: list[int] | None = None  # sampled on the device and read at launch
    pending: object | None = None  # sampled on the device, still running (OverlappingRunner.launch_sampled)
    # a decode step that the next step may follow on the device: every sequence decoding, each sampled there
    followable: bool = False
    # a step sampled on the device but for these sample rows, whose logits are `logits` (row -> index there)
    host_rows: dict[int, int] | None = None
    # launched ahead with rows under a grammar: its sampling waits for their masks (StepLauncher.sample_ahead)
    awaiting_masks: bool = False


def requests_of(scheduled: list["Scheduled"]) -> list[Request]:
    return list(dict.fromkeys(item.seq.request for item in scheduled))


def following_sequences(running: LaunchedStep, scheduler: "Scheduler", cache: KvCache,
                        max_context: int) -> list[Sequence] | None:
    """The sequences of the decode step after `running` (a followable step whose tokens are not read yet),
    or None where that step might not be the one the scheduler would pick once they are: a request waits
    and might be admitted, a sequence ended already or may end by length with running's token, or the pool
    might not give every sequence its next slot. (A sequence takes at most one block of a layer group for one
    more token, so with that many free in every group each reservation succeeds.)"""
    if scheduler.waiting and \
            scheduler.live_seq_count() + scheduler.seq_demand(scheduler.waiting[0]) <= scheduler.max_seqs:
        return None
    seqs = [seq for request in scheduler.running for seq in request.seqs if not seq.finished]
    if len(seqs) != len(running.scheduled) or any(a is not b for a, b in zip(seqs, map(_SEQ, running.scheduled))):
        return None
    for seq in seqs:
        checker = seq.stop_checker
        # With running's token the sequence holds len(tokens) + 1 tokens and has generated one more.
        if checker.tokens_seen + 2 > checker.max_tokens or len(seq.tokens) + 2 > max_context:
            return None
    if any(cache.num_available_blocks_in(group) < len(seqs) for group in cache.groups):
        return None
    return seqs


class StepLauncher:
    """Builds each step's batch and runs it: logits back to the host, tokens picked on the device, or a decode
    step left running (overlap). One per engine; the runner is passed in each call (tests swap runners)."""

    def __init__(self, cache: KvCache, *, overlap: bool = True):
        self.cache = cache
        self.overlap = overlap
        self._sampling_rows = StepSamplingRows()  # keeps the parameter columns while the samplers stay the same
        # isinstance() against a runtime-checkable Protocol inspects the class's attributes on every call (tens
        # of microseconds, each step); the answers are kept for the runner they were given for.
        self._checked_runner: object = None
        self._samples = self._overlaps = self._defers = False

    def clear(self) -> None:
        self._sampling_rows.clear()

    def _capabilities(self, runner: Runner) -> tuple[bool, bool, bool]:
        """(samples on the device, overlaps its steps, launches a step before its token masks)"""
        if runner is not self._checked_runner:
            self._checked_runner = runner
            self._samples = isinstance(runner, SamplingRunner)
            self._overlaps = self._samples and isinstance(runner, OverlappingRunner)
            self._defers = self._overlaps and isinstance(runner, MaskDeferringRunner)
        overlaps = self._overlaps and self.overlap
        return self._samples, overlaps, overlaps and self._defers

    def can_follow(self, runner: Runner) -> bool:
        return self._capabilities(runner)[1]

    def launch(self, runner: Runner, scheduled: list["Scheduled"]) -> LaunchedStep:
        """Run the step; a decode step on an overlapping runner is left running (its `pending`)."""
        samples, overlaps, defers = self._capabilities(runner)
        batch = self._build_batch(scheduled)
        sampling, host_rows = self._device_sampling(runner, scheduled) if samples else (None, None)
        fence = self.cache.begin_step()
        if sampling is None:
            return LaunchedStep(scheduled, fence, logits=runner.execute(batch))
        if host_rows:  # the other rows' tokens from the device, these rows' logits for their samplers
            picked = np.asarray(runner.execute_sampled(batch, sampling)).tolist()  # type: ignore[attr-defined]
            logits = runner.sampled_step_logits(host_rows)  # type: ignore[attr-defined]
            return LaunchedStep(scheduled, fence, logits=logits, picked=picked,
                                host_rows={row: k for k, row in enumerate(host_rows)})
        if not overlaps:
            return LaunchedStep(scheduled, fence, picked=np.asarray(runner.execute_sampled(batch, sampling)).tolist())  # type: ignore[attr-defined]
        pending = runner.launch_sampled(batch, sampling)  # type: ignore[attr-defined]
        # a constrained row's next mask needs this step's token: a step follows it on the device only where its
        # sampling can wait for that mask (launch_following)
        followable = (sampling.mask is None or defers) and batch.is_decode_only and \
            len(sampling) == batch.num_tokens and all(item.seq.request.phase is Phase.DECODE for item in scheduled)
        return LaunchedStep(scheduled, fence, pending=pending, followable=followable)

    def launch_following(self, runner: Runner, scheduled: list["Scheduled"], before: LaunchedStep) -> LaunchedStep:
        """Launch the decode step after `before` (still running) for the same sequences in the same order, each
        one position on (their slots reserved, num_cached advanced by `before`): token ids on the device. Where a
        row is under a grammar, its mask needs `before`'s token: the step's sampling waits (sample_ahead)."""
        seqs = list(map(_SEQ, scheduled))
        batch = build_decode_batch(self.cache, list(map(_SEQ_ID, seqs)), [0] * len(seqs), list(map(_NUM_CACHED, seqs)),
                                   [True] * len(seqs))
        sampling = self._sampling_rows.rows([seq.sampler for seq in seqs])
        fence = self.cache.begin_step()
        if any(seq.sampler.constraint is not None for seq in seqs):
            pending = runner.launch_before_masks(batch, sampling, follows=before.pending)  # type: ignore[attr-defined]
            return LaunchedStep(scheduled, fence, pending=pending, followable=True, awaiting_masks=True)
        pending = runner.launch_sampled(batch, sampling, follows=before.pending)  # type: ignore[attr-defined]
        return LaunchedStep(scheduled, fence, pending=pending, followable=True)

    def sample_ahead(self, runner: Runner, step: LaunchedStep) -> list[tuple[Sequence, str]]:
        """Launch the sampling of `step` (launch_following's, awaiting its masks) under its rows' token masks,
        computed now: the step before's tokens are read and taken by the grammars, while the device computes
        `step`'s logits. Returns the sequences whose grammar gave out, with why (the caller fails them); their rows,
        and those of sequences that ended meanwhile, sample unmasked, their tokens dropped when read."""
        seqs = list(map(_SEQ, step.scheduled))
        rows = [row for row, seq in enumerate(seqs) if seq.sampler.constraint is not None and not seq.finished
                and seq.request.phase is not Phase.FINISHED]
        masks: dict[int, np.ndarray] = {}
        gave_out: list[tuple[Sequence, str]] = []
        if rows:
            try:
                packed, failures = packed_masks([seqs[row].sampler.constraint for row in rows])
            except Exception as exc:  # the step's sampling must still be launched: its rows fail alone
                packed, failures = [None] * len(rows), [str(exc)] * len(rows)
            for row, words, failure in zip(rows, packed, failures):
                if failure is None:
                    masks[row] = words
                else:
                    gave_out.append((seqs[row], failure))
        step.awaiting_masks = False
        runner.sample_under_masks(step.pending, token_masks(len(seqs), masks, runner.config.vocab_size))  # type: ignore[attr-defined]
        return gave_out

    @staticmethod
    def read(runner: Runner, step: LaunchedStep) -> None:
        """Wait for a running step and take its tokens into `picked`."""
        if step.pending is not None:
            pending, step.pending = step.pending, None
            step.picked = np.asarray(runner.collect(pending)).tolist()  # type: ignore[attr-defined]

    # ---- the batch and where it samples ---------------------------------------------------------

    def _build_batch(self, scheduled: list["Scheduled"]) -> StepBatch:
        # A decode step (every sequence computes one token; none computes fewer): the batch straight from the
        # sequences, each column read by one map of a C getter rather than a Python loop.
        if sum(map(_NUM_TOKENS, scheduled)) == len(scheduled):
            seqs = list(map(_SEQ, scheduled))
            positions = list(map(_NUM_CACHED, seqs))
            return build_decode_batch(self.cache, list(map(_SEQ_ID, seqs)),
                                      list(map(operator.getitem, map(_TOKENS, seqs), positions)), positions,
                                      list(map(_SAMPLES, scheduled)))
        slices = []
        for item in scheduled:
            seq, first = item.seq, item.seq.num_cached
            slices.append(SeqSlice(seq.seq_id, seq.tokens[first:first + item.num_tokens], first, item.samples))
        return build_step_batch(self.cache, slices)

    def _device_sampling(self, runner: Runner, scheduled: list["Scheduled"]) -> tuple[SamplingRows | None,
                                                                                       list[int] | None]:
        """(the sampling inputs with which the runner picks this step's tokens on the device, the sample rows
        that sample on the host instead), or (None, None) to sample every row on the host: a prompt about to fork
        into parallel samples (they all draw from its logits), or no row the device can sample. A row the device
        cannot sample (a grammar's mask, logprobs, penalties: device_samplable) samples on the host from its own
        logits, read back alone, while the others stay on the device (a runner with sampled_step_logits). Each
        device row's uniform comes from its sampler now, as Sampler.sample would draw it (and only once the step
        is known to sample on the device); a host row draws its own in Sampler.sample."""
        seqs = [item.seq for item in scheduled if item.samples]
        host_rows = []
        constrained = []  # the rows the device samples under a grammar's token mask
        for row, seq in enumerate(seqs):
            sampler = seq.sampler
            if not sampler.device_samplable:
                host_rows.append(row)
            elif sampler.constraint is not None:
                constrained.append(row)
            request = seq.request
            if request.phase is Phase.PROMPT and request.params.n > 1 and len(request.seqs) == 1:
                return None, None
        masks: dict[int, np.ndarray] = {}  # a constrained device row's packed token mask, all computed at once
        if constrained:
            packed, failures = packed_masks([seqs[row].sampler.constraint for row in constrained])
            for row, words, failure in zip(constrained, packed, failures):
                if failure is None:
                    masks[row] = words
                else:  # the grammar gave out: on the host its sampler raises it, failing this row alone
                    host_rows.append(row)
            host_rows.sort()
        vocab = runner.config.vocab_size
        if not host_rows:
            return with_token_masks(self._sampling_rows.rows([seq.sampler for seq in seqs]), masks, vocab), None
        if len(host_rows) == len(seqs) or getattr(runner, "sampled_step_logits", None) is None:
            return None, None
        host = set(host_rows)
        sampling = SamplingRows.from_rows([
            (0.0, 0, 1.0, 0.0, 0.0) if row in host else  # greedy, no draw: a token that is not taken
            seq.sampler.device_row + (0.0 if seq.sampler.greedy else seq.sampler.next_uniform(),)
            for row, seq in enumerate(seqs)])
        return with_token_masks(sampling, masks, vocab), host_rows


def with_token_masks(sampling: SamplingRows, masks: dict[int, np.ndarray], vocab: int) -> SamplingRows:
    """`sampling` with its rows' packed token masks (`masks`: a constrained row's grammar's allowed tokens; all
    ones for the other rows), or as it is when no row is constrained."""
    if not masks:
        return sampling
    return dataclasses.replace(sampling, mask=token_masks(len(sampling), masks, vocab))


def token_masks(rows: int, masks: dict[int, np.ndarray], vocab: int) -> np.ndarray:
    """uint32 [rows, mask_words(vocab)]: each row in `masks` its grammar's packed allowed tokens, every other row
    all ones."""
    words = mask_words(vocab)
    mask = np.full((rows, words), 0xFFFFFFFF, dtype=np.uint32)
    for row, packed in masks.items():
        mask[row] = 0
        mask[row, :min(words, packed.shape[0])] = packed[:words]
    return mask
