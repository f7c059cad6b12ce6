"""Iteration-level (continuous) batching: which sequences compute how many tokens in the next step.

Policy, as in vLLM's default scheduler:
- Running requests go first, oldest first; each sequence asks for its pending tokens (one while
  decoding, a chunk of its prompt while prompt evaluation is under way), within a token budget
  per step, so prompt evaluation and decoding mix across requests.
- When the KV pool cannot give a running sequence its next block, the newest running request is
  preempted: all its blocks are freed and it goes back to the front of the queue, to be recomputed
  (its prompt plus what it generated) when there is room. Its output is unchanged by this.
- Waiting requests are admitted first-come first-served while the budget, the sequence limit and a
  small reserve of free blocks allow. No admission in a step that had to preempt.
- A request that could never fit (its prompt plus max tokens need more blocks than the pool has,
  or it has more parallel samples than a step may hold) is rejected with the numbers, never left
  waiting forever. "Could fit" is judged as if each sample held its own blocks: a preempted request
  recomputes each sample separately (their generated tokens differ), so the prompt blocks its
  samples shared may not be shared again, and a request that fits only through sharing could
  otherwise wait forever after a preemption.
- An engine with nothing running admits the queue's head whenever its first chunk fits, without
  the reserve: the reserve keeps running requests from being preempted at once, and an idle engine
  has none (a request that needs the whole pool would otherwise never start).
- With prefix caching (hipcore/kvcache/prefix_cache.py) a sequence admitted starts with the blocks of
  the longest cached prefix of its tokens, and its first chunk starts after them. A preempted request's
  computed blocks are hashed as it is freed, so that its recomputation finds them unless evicted.
  "Free blocks" here are the available ones: free, or cached and evictable.

schedule() must only run while no device work of an earlier step is in flight: blocks freed by a
preemption are then safe to hand out again at once (the step fence of the KV cache).
"""

from __future__ import annotations

import collections
from dataclasses import dataclass, field
from typing import NamedTuple

from hipcore.engine.request import Phase, Request, Sequence
from hipcore.kvcache.cache import KvCache
from hipcore.kvcache.config import LOCAL_GROUP


class Scheduled(NamedTuple):
    """One sequence's share of a step. A tuple, not a dataclass: the scheduler makes one per sequence per step."""

    seq: Sequence
    num_tokens: int  # how many of its pending tokens this step computes
    # True when this step reaches the end of what the sequence has (num_cached + num_tokens == len(tokens) when
    # it was scheduled), so its next token is sampled
    samples: bool


@dataclass
class SchedulerOutput:
    scheduled: list[Scheduled] = field(default_factory=list)
    preempted: list[Request] = field(default_factory=list)
    rejected: list[tuple[Request, str]] = field(default_factory=list)
    admitted: list[Request] = field(default_factory=list)  # taken from the queue in this step


def blocks_for(tokens: int, block_size: int) -> int:
    return -(-tokens // block_size)


class Scheduler:
    def __init__(self, cache: KvCache, *, max_seqs: int = 64, max_step_tokens: int = 512, watermark_blocks: int | None = None):
        if max_seqs < 1 or max_step_tokens < 1:
            raise ValueError("max_seqs and max_step_tokens must be at least 1")
        self.cache = cache
        self.max_seqs = max_seqs
        self.max_step_tokens = max_step_tokens
        usable = cache.config.num_blocks - 1
        self.watermark = watermark_blocks if watermark_blocks is not None else max(1, usable // 100)
        self.waiting: collections.deque[Request] = collections.deque()
        self.running: list[Request] = []  # in admission order; the last one is preempted first

    # ---- queue management ---------------------------------------------------------------------

    def add(self, request: Request) -> None:
        self.waiting.append(request)

    def remove(self, request: Request) -> None:
        """Forget a request wherever it is (its blocks are the engine's release path's business)."""
        if request in self.running:
            self.running.remove(request)
        else:
            try:
                self.waiting.remove(request)
            except ValueError:
                pass

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def blocks_needed_alone(self, request: Request, max_new_tokens: int) -> int:
        """Blocks the request needs with the pool to itself, each sample holding its own (see the
        module docstring). The K/V of prompt + max_new_tokens - 1 tokens is cached: the last
        sampled token ends the sequence before it is ever computed."""
        n = max(1, getattr(request.params, "n", 1))
        cached = len(request.prompt_ids) + max_new_tokens - 1
        return n * blocks_for(cached, self.cache.config.block_size)

    def never_fits(self, request: Request, max_new_tokens: int) -> str | None:
        """Why the request could never run, even alone in the engine (None if it can)."""
        n = request.params.n
        if n > self.max_seqs:
            return (
                f"request {request.request_id} asks for {n} parallel samples but a step holds at most "
                f"{self.max_seqs} sequences; lower n or raise max_seqs"
            )
        need = self.blocks_needed_alone(request, max_new_tokens)
        have = self.cache.num_usable_blocks
        if need > have:
            bs = self.cache.config.block_size
            samples = f"{n} samples x " if n > 1 else ""
            return (
                f"request {request.request_id} needs {need} KV blocks ({samples}{len(request.prompt_ids)} prompt tokens "
                f"+ up to {max_new_tokens} new, {bs} tokens per block) but the pool has only {have}; "
                "give the KV cache more memory (--kv-blocks / --kv-memory) or lower --max-tokens"
            )
        return self._never_fits_window(request, max_new_tokens)

    def _never_fits_window(self, request: Request, max_new_tokens: int) -> str | None:
        """Why the request could never run in the sliding-window pool (None if it might): each sample holds at once
        its first prompt chunk's blocks (nothing has left the window yet), and later a window's blocks; a pool smaller
        than that (--kv-blocks of a model whose every layer slides) would keep it waiting forever."""
        if LOCAL_GROUP not in self.cache.groups:
            return None
        config, n = self.cache.config, max(1, request.params.n)
        first_chunk = min(len(request.prompt_ids), self.max_step_tokens)
        held = max(config.blocks_for_tokens(first_chunk), config.window_blocks_per_sequence())
        need = n * min(held, config.blocks_for_tokens(len(request.prompt_ids) + max_new_tokens - 1))
        have = self.cache.num_usable_blocks_in(LOCAL_GROUP)
        if need <= have:
            return None
        return (f"request {request.request_id} needs {need} KV blocks of the sliding-window layers at once (a prompt "
                f"chunk of {first_chunk} tokens, a window of {config.window}, {config.block_size} tokens per block"
                f"{f', {n} samples' if n > 1 else ''}) but their pool has only {have}; give the KV cache more memory "
                "(--kv-blocks / --kv-memory) or fewer prompt tokens a step")

    @staticmethod
    def seq_demand(request: Request) -> int:
        """Sequences the request will step at once: its live samples, or n before its prompt forks."""
        if len(request.seqs) <= 1:
            return max(1, getattr(request.params, "n", 1))
        return len(request.live_seqs)

    # ---- one step -----------------------------------------------------------------------------

    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput()
        budget = self.max_step_tokens

        # 1. running requests, oldest first: each live sequence's pending tokens within the budget, reserved in
        # one call (a decode step reserves a token per sequence: a call each cost more than the work). Where
        # the pool runs out, _schedule_running goes on from that sequence one reservation at a time, preempting.
        wanted: list[Scheduled] = []
        room = budget
        for request in self.running:
            if room <= 0:
                break
            for seq in request.seqs:
                if seq.finished:
                    continue
                pending = len(seq.tokens) - seq.num_cached
                n = pending if pending < room else room
                if n > 0:
                    wanted.append(Scheduled(seq, n, n == pending))
                    room -= n
        done = self.cache.reserve_each([(item.seq.seq_id, item.num_tokens) for item in wanted])
        if done == len(wanted):
            out.scheduled += wanted
            budget = room
        else:
            out.scheduled += wanted[:done]
            budget -= sum(item.num_tokens for item in wanted[:done])
            budget = self._schedule_running(out, wanted[done].seq, budget)

        # 2. admit waiting requests, first come first served
        if out.preempted:
            return out
        while self.waiting and budget > 0:
            request = self.waiting[0]
            seqs = request.live_seqs
            if self.live_seq_count() + self.seq_demand(request) > self.max_seqs:
                break
            chunks = []
            need_blocks = 0
            room = budget
            for seq in seqs:
                # (0, 0) without prefix caching; the keys are hashed once while the request waits, not every step
                cached, evictable = self.cache.cached_prefix(seq.tokens, seq.block_keys)
                n = min(len(seq.tokens) - cached, room)
                if n <= 0:
                    break
                chunks.append((seq, n))
                need_blocks += blocks_for(n, self.cache.config.block_size) + evictable
                room -= n
            floor = self.watermark if self.running else 0
            if not chunks or self.cache.num_available_blocks - need_blocks < floor:
                break
            for seq, n in chunks:
                seq.num_cached = self.cache.add_sequence(seq.seq_id, seq.tokens, seq.block_keys)
                if seq is seqs[0] and not request.preemptions:
                    request.cached_tokens = seq.num_cached
                if not self.cache.reserve(seq.seq_id, n):  # the reserve above makes this rare
                    for s, _ in chunks:
                        if self.cache.has_sequence(s.seq_id):
                            self.cache.free_sequence(s.seq_id)
                        s.num_cached = 0
                    self.cache.release_fenced()
                    return out
            # Samples of a preempted request that got no room in this step's budget join with an
            # empty table; the running loop gives them tokens from the next step on.
            for seq in seqs[len(chunks):]:
                self.cache.add_sequence(seq.seq_id)
            self.waiting.popleft()
            self.running.append(request)
            out.admitted.append(request)
            request.phase = Phase.PROMPT
            for seq, n in chunks:
                out.scheduled.append(Scheduled(seq, n, seq.num_cached + n == len(seq.tokens)))
                budget -= n
        return out

    def _schedule_running(self, out: SchedulerOutput, first: Sequence, budget: int) -> int:
        """Step 1 of schedule() one reservation at a time, from sequence `first` of the running requests on (those
        before it are scheduled), preempting the newest running request while a reservation does not fit.
        Returns the budget left."""
        i = self.running.index(first.request)
        seqs = first.request.seqs
        seqs = seqs[seqs.index(first):]
        while i < len(self.running) and budget > 0:
            request = self.running[i]
            preempted_self = False
            for seq in seqs if request is first.request else request.seqs:
                if seq.finished:
                    continue
                pending = len(seq.tokens) - seq.num_cached
                n = min(pending, budget)
                if n <= 0:
                    continue
                while not self.cache.reserve(seq.seq_id, n):
                    victim = self.running[-1]
                    self._preempt(victim, out)
                    if victim is request:
                        preempted_self = True
                        break
                if preempted_self:
                    break
                out.scheduled.append(Scheduled(seq, n, n == pending))
                budget -= n
            if preempted_self:
                break  # it was the newest: nothing after it is running
            i += 1
        return budget

    def live_seq_count(self) -> int:
        return sum(self.seq_demand(r) for r in self.running)

    def _preempt(self, request: Request, out: SchedulerOutput) -> None:
        """Free all of the request's blocks and queue it first, to be recomputed."""
        for seq in request.live_seqs:
            if self.cache.has_sequence(seq.seq_id) and self.cache.prefix is not None:
                # its computed blocks stay cached for its recomputation (unless evicted meanwhile)
                self.cache.free_sequence(seq.seq_id, computed=seq.tokens[:seq.num_cached], keys=seq.block_keys)
            elif self.cache.has_sequence(seq.seq_id):
                self.cache.free_sequence(seq.seq_id)
            seq.num_cached = 0
        # Safe: no device work is in flight while the scheduler runs (see the module docstring).
        self.cache.release_fenced()
        self.running.remove(request)
        out.scheduled[:] = [s for s in out.scheduled if s.seq.request is not request]
        request.phase = Phase.WAITING
        request.preemptions += 1
        self.waiting.appendleft(request)
        out.preempted.append(request)
