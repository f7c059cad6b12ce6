"""How a sequence takes its tokens and how sequences and requests end: the Engine's one release path (mixed into
Engine, which provides the attributes declared here). Every ending of a request goes through `_end_request`, and
`_release_sequence` is the only code that gives a sequence's KV blocks back."""

from __future__ import annotations

import collections
import threading
import time

from hipcore.engine.hooks import EngineStats
from hipcore.engine.request import Ending, Event, FinishedRecord, Phase, Request, Sequence
from hipcore.engine.sampler import StopReason
from hipcore.engine.scheduler import Scheduler
from hipcore.kvcache.cache import KvCache

_ENDING_OF = {StopReason.EOS: Ending.EOS, StopReason.STOP_STRING: Ending.STOP, StopReason.MAX_TOKENS: Ending.LENGTH}


class SequenceEndings:
    """The Engine's token acceptance and endings."""

    cache: KvCache
    scheduler: Scheduler
    stats: EngineStats
    max_context: int
    finished_bound: int
    _lock: threading.Lock
    _active: dict[int, Request]
    _finished: collections.OrderedDict[int, FinishedRecord]

    def _accept_token(self, seq: Sequence, token: int, events: list[Event]) -> None:
        request = seq.request
        checker = seq.stop_checker
        self.stats.generated_tokens += 1
        end_of_generation = token in checker.eos_ids
        if end_of_generation:  # an end-of-generation token is neither kept nor printed
            delta = checker.push(token, "")
        else:
            seq.tokens.append(token)
            delta = checker.push(token, seq.decoder.feed(token))
        if delta or not end_of_generation:  # (the checker put delta in seq.output)
            logprobs = seq.sampler.logprobs if seq.sampler.params.logprobs is not None and not end_of_generation else None
            event = Event(request.request_id, request.seqs.index(seq), () if end_of_generation else (token,), delta,
                          logprobs=logprobs)
            events.append(event)
            request.events.put(event)
        if checker.reason is not None:
            events += self._end_sequence(seq, _ENDING_OF[checker.reason])
        elif len(seq.tokens) >= self.max_context:
            events += self._end_sequence(seq, Ending.LENGTH)

    def _end_sequence(self, seq: Sequence, ending: Ending) -> list[Event]:
        """One sample is done; the request ends when its last sample ends."""
        request = seq.request
        # Text the decoder still holds (an incomplete UTF-8 sequence) or the stop checker held back
        # (a partial stop string) belongs to the output unless a stop string matched.
        tail = ""
        if ending != Ending.STOP:
            tail = seq.stop_checker.flush()  # (into seq.output, as everything the checker releases)
            undecoded = seq.decoder.flush()
            if undecoded:
                seq.output.append(undecoded)
                tail += undecoded
        events: list[Event] = []
        if tail:
            events.append(Event(request.request_id, request.seqs.index(seq), (), tail))
            request.events.put(events[-1])
        self._release_sequence(seq, ending)
        if not request.live_seqs:
            events += self._end_request(request, ending)
        return events

    def _release_sequence(self, seq: Sequence, ending: Ending) -> None:
        """THE place a sequence's KV blocks are given back (fenced until the step's work is done). With prefix
        caching, the full blocks of its computed tokens are kept, hashed, unless it failed (a failed step's K/V
        may be wrong; blocks it took from the cache were only read and stay cached)."""
        if self.cache.has_sequence(seq.seq_id):
            if self.cache.prefix is not None and ending is not Ending.FAILED:
                self.cache.free_sequence(seq.seq_id, computed=seq.tokens[:seq.num_cached], keys=seq.block_keys)
            else:
                self.cache.free_sequence(seq.seq_id)
        seq.finished = True
        seq.ending = seq.ending or ending

    def _end_request(self, request: Request, ending: Ending, error: str | None = None) -> list[Event]:
        """Every ending of every request comes here exactly once; a second call is a no-op."""
        if request.phase == Phase.FINISHED:
            return []
        phase_at_end = request.phase
        for seq in request.seqs:
            self._release_sequence(seq, ending)
        self.scheduler.remove(request)
        request.phase, request.ending, request.error = Phase.FINISHED, ending, error
        request.finished_at = time.perf_counter()
        record = FinishedRecord(
            request_id=request.request_id, ending=ending, phase_at_end=phase_at_end,
            seq_ids=tuple(s.seq_id for s in request.seqs), prompt_tokens=len(request.prompt_ids),
            generated_tokens=tuple(tuple(s.generated) for s in request.seqs),
            texts=tuple(s.text for s in request.seqs), error=error, preemptions=request.preemptions,
            tag=request.tag, seconds=request.finished_at - request.submitted_at,
            time_to_first_token=None if request.first_token_at is None else request.first_token_at - request.submitted_at,
            cached_tokens=request.cached_tokens,
        )
        with self._lock:
            self._active.pop(request.request_id, None)
            self._finished[request.request_id] = record
            while len(self._finished) > self.finished_bound:
                self._finished.popitem(last=False)
        self.stats.endings[ending.value] += 1
        event = Event(request.request_id, 0, (), "", finished=True, ending=ending, error=error,
                      cached_tokens=request.cached_tokens)
        request.events.put(event)
        return [event]
