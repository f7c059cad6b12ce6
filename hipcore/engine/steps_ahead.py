"""The decode steps the Engine launches ahead (mixed into Engine, which provides the attributes declared here): the
step after a running one, launched before that one's tokens are read, and, for rows under a grammar, its sampling
launched once their masks are computed (hipcore/engine/step_launch.py says when and why)."""

from __future__ import annotations

from hipcore.engine.hooks import EngineStats
from hipcore.engine.request import Ending, Event, Phase
from hipcore.engine.scheduler import Scheduler
from hipcore.engine.step_launch import LaunchedStep, StepLauncher, following_sequences, requests_of
from hipcore.kvcache.cache import KvCache
from hipcore.model.runner import Runner


class StepsAhead:
    """The Engine's steps launched ahead of their predecessors' tokens."""

    runner: Runner
    cache: KvCache
    scheduler: Scheduler
    stats: EngineStats
    max_context: int
    _launcher: StepLauncher
    # and Engine's _fail and SequenceEndings' _end_request

    def _chain_after(self, running: LaunchedStep, events: list[Event]) -> LaunchedStep | None:
        """Launch the decode step after `running` before its tokens are read, or None where that step might
        not be the one the scheduler would pick (step_launch.following_sequences)."""
        if not running.followable or not self._launcher.can_follow(self.runner):
            return None
        seqs = following_sequences(running, self.scheduler, self.cache, self.max_context)
        if seqs is None:
            return None
        scheduled = running.scheduled
        if self.cache.reserve_each([(seq.seq_id, 1) for seq in seqs]) != len(seqs):  # (cannot happen: see there)
            self._fail(requests_of(scheduled), "the KV cache refused a reservation it had room for", events)
            return None
        try:
            ahead = self._launcher.launch_following(self.runner, scheduled, running)
        except Exception as exc:
            self._fail(requests_of(scheduled), f"the forward pass failed: {exc}", events)
            return None
        for seq in seqs:
            seq.num_cached += 1
        self.stats.steps += 1
        return ahead

    def _sample_ahead(self, ahead: LaunchedStep, events: list[Event]) -> LaunchedStep | None:
        """Launch the sampling of the step ahead under its rows' token masks (the device computes its logits
        meanwhile); a sequence whose grammar gave out fails its request alone. None (its requests failed, with
        events) if the launch failed."""
        try:
            gave_out = self._launcher.sample_ahead(self.runner, ahead)
        except Exception as exc:
            live = [r for r in requests_of(ahead.scheduled) if r.phase is not Phase.FINISHED]
            self._fail(live, f"the forward pass failed: {exc}", events)
            return None
        for seq, why in gave_out:
            events += self._end_request(seq.request, Ending.FAILED, f"sampling failed: {why}")
        return ahead
