"""The scheduler's policy on a real KV cache, without a model: token budget and chunking, FIFO
admission within max_seqs and the free-block reserve, newest-first preemption by recompute."""

from __future__ import annotations

import itertools

import pytest

from hipcore.kvcache import KvCache, KvCacheConfig
from hipcore.engine.request import Phase, Request, Sequence
from hipcore.runtime.cpu import CpuDevice
from hipcore.engine.sampler import SamplingParams
from hipcore.engine.scheduler import Scheduler


@pytest.fixture
def make():
    """make(num_blocks, block_size, **scheduler options) -> (scheduler, cache); a request factory."""
    device = CpuDevice(capacity=64 << 20)
    caches = []
    ids = itertools.count(1)

    def scheduler(usable_blocks: int, block_size: int = 4, **options) -> Scheduler:
        cache = KvCache(device, KvCacheConfig(1, 1, 32, usable_blocks + 1, block_size, "f32"))
        caches.append(cache)
        return Scheduler(cache, **options)

    def request(prompt_len: int, n: int = 1) -> Request:
        rid = next(ids)
        req = Request(rid, list(range(prompt_len)), SamplingParams(n=n, max_tokens=8), arrival=rid)
        req.seqs.append(Sequence(rid * 100, req, list(range(prompt_len)), num_prompt=prompt_len))
        return req

    yield scheduler, request
    for cache in caches:
        cache.close()
    device.close()


def advance(out) -> None:
    """What the engine does after a step: the scheduled tokens are cached; sampling appends one."""
    for item in out.scheduled:
        samples = item.samples
        item.seq.num_cached += item.num_tokens
        if samples:
            item.seq.tokens.append(7)
            item.seq.request.phase = Phase.DECODE


def plan(out) -> list[tuple[int, int]]:
    return [(item.seq.request.request_id, item.num_tokens) for item in out.scheduled]


def test_prompts_are_chunked_within_the_token_budget_and_decodes_mix_in(make):
    scheduler, request = make
    s = scheduler(50, max_step_tokens=10, max_seqs=8)
    a, b = request(4), request(23)
    s.add(a)
    s.add(b)
    out = s.schedule()
    assert plan(out) == [(1, 4), (2, 6)]  # a's whole prompt, then as much of b's as the budget allows
    advance(out)
    out = s.schedule()
    assert plan(out) == [(1, 1), (2, 9)]  # a decodes one token, b's next chunk takes the rest
    assert [item.samples for item in out.scheduled] == [True, False]
    advance(out)
    out = s.schedule()
    assert plan(out) == [(1, 1), (2, 8)] and out.scheduled[1].samples  # b's prompt ends: it samples
    s.cache.check_invariants()


def test_admission_is_first_come_first_served_within_max_seqs(make):
    scheduler, request = make
    s = scheduler(50, max_step_tokens=100, max_seqs=2)
    reqs = [request(3) for _ in range(3)]
    for r in reqs:
        s.add(r)
    out = s.schedule()
    assert plan(out) == [(1, 3), (2, 3)] and list(s.waiting) == [reqs[2]]
    advance(out)
    s.remove(reqs[0])  # the engine ended it (its release path frees its blocks)
    s.cache.free_sequence(reqs[0].seqs[0].seq_id)
    assert plan(s.schedule()) == [(2, 1), (3, 3)]


def test_parallel_samples_count_against_max_seqs_before_they_fork(make):
    scheduler, request = make
    s = scheduler(50, max_step_tokens=100, max_seqs=3)
    s.add(request(3))
    s.add(request(3, n=3))  # one sequence now, three after its prompt: no room beside the first
    assert plan(s.schedule()) == [(1, 3)]
    assert len(s.waiting) == 1


def test_the_free_block_reserve_applies_only_beside_running_requests(make):
    scheduler, request = make
    s = scheduler(4, max_step_tokens=100, max_seqs=4, watermark_blocks=1)
    whole_pool = request(16)  # 4 blocks of 4: all of the pool
    s.add(whole_pool)
    assert plan(s.schedule()) == [(1, 16)]  # idle engine: admitted without the reserve
    assert s.cache.num_free_blocks == 0

    t = scheduler(4, max_step_tokens=100, max_seqs=4, watermark_blocks=1)
    t.add(request(4))
    advance(t.schedule())
    t.add(request(12))  # 3 blocks would leave 0 free < the reserve of 1 beside a running request
    assert plan(t.schedule()) == [(2, 1)] and len(t.waiting) == 1


def test_the_newest_running_request_is_preempted_and_requeued_first(make):
    scheduler, request = make
    s = scheduler(6, max_step_tokens=100, max_seqs=4, watermark_blocks=0)
    old, mid, new = request(8), request(8), request(8)  # 2 full blocks each: the pool is full
    for r in (old, mid, new):
        s.add(r)
    advance(s.schedule())
    assert s.cache.num_free_blocks == 0
    late = request(2)
    s.add(late)
    # Each running sequence has 8 tokens cached in 2 full blocks: its sampled token needs a third.
    out = s.schedule()
    assert out.preempted == [new]
    assert plan(out) == [(1, 1), (2, 1)]  # new's blocks went to old and mid; no admission this step
    assert list(s.waiting) == [new, late] and s.running == [old, mid]
    assert new.phase == Phase.WAITING and new.preemptions == 1
    assert new.seqs[0].num_cached == 0 and not s.cache.has_sequence(new.seqs[0].seq_id)
    assert new.seqs[0].tokens == list(range(8)) + [7]  # recomputed later: prompt and its sampled token
    s.cache.check_invariants()


def test_a_request_preempts_itself_when_it_is_the_newest(make):
    """old's next token fits in its last block; new needs a fresh block and is itself the newest."""
    scheduler, request = make
    s = scheduler(4, max_step_tokens=100, max_seqs=4, watermark_blocks=0)
    old, new = request(7), request(8)  # 2 blocks each: the pool is full
    s.add(old)
    s.add(new)
    advance(s.schedule())
    out = s.schedule()
    assert out.preempted == [new] and plan(out) == [(1, 1)]
    assert s.running == [old] and list(s.waiting) == [new]
    s.cache.check_invariants()


def test_blocks_needed_alone_counts_each_sample_and_not_the_last_token(make):
    scheduler, request = make
    s = scheduler(50, block_size=16)
    assert s.blocks_needed_alone(request(63), 2) == 4  # 63 + 2 - 1 = 64 tokens cached
    assert s.blocks_needed_alone(request(63), 3) == 5
    assert s.blocks_needed_alone(request(20, n=3), 5) == 3 * 2


# ---- the running requests' reservations in one call (KvCache.reserve_each) ----------------------------------

class World:
    """A scheduler over its own small cache, driven as the engine drives it (prompt chunks, sampled tokens,
    forks of parallel samples, endings through the release path), with every random choice given from outside
    so that two worlds can be driven alike."""

    def __init__(self, one_at_a_time: bool, max_step_tokens: int):
        self.device = CpuDevice(capacity=64 << 20)
        self.cache = KvCache(self.device, KvCacheConfig(1, 1, 32, 21, 4, "f32"))  # 20 usable blocks of 4 tokens
        if one_at_a_time:  # the reference: every reservation through the per-sequence loop, as before the batch
            each = self.cache.reserve_each
            self.cache.reserve = lambda seq_id, n, stream=None: each(((seq_id, n),), stream) == 1
            self.cache.reserve_each = lambda items, stream=None: 0  # "nothing fitted": the loop takes over at once
        self.scheduler = Scheduler(self.cache, max_step_tokens=max_step_tokens, max_seqs=6, watermark_blocks=1)
        self.requests: list[Request] = []
        self.seq_ids = itertools.count(1)

    def add(self, prompt_len: int, n: int) -> None:
        rid = len(self.requests) + 1
        req = Request(rid, list(range(prompt_len)), SamplingParams(n=n, max_tokens=30), arrival=rid)
        req.seqs.append(Sequence(next(self.seq_ids), req, list(range(prompt_len)), num_prompt=prompt_len))
        self.requests.append(req)
        self.scheduler.add(req)

    def step(self, ending: int | None) -> tuple:
        out = self.scheduler.schedule()
        for item in out.scheduled:
            seq, request = item.seq, item.seq.request
            seq.num_cached += item.num_tokens
            if not item.samples:
                continue
            if request.params.n > 1 and len(request.seqs) == 1:  # the prompt forks into its samples
                for _ in range(request.params.n - 1):
                    child = Sequence(next(self.seq_ids), request, list(seq.tokens), num_prompt=seq.num_prompt,
                                     num_cached=seq.num_cached)
                    self.cache.fork(seq.seq_id, child.seq_id)
                    request.seqs.append(child)
            request.phase = Phase.DECODE
            for target in list(request.seqs) if len(request.seqs) > 1 and seq is request.seqs[0] else [seq]:
                target.tokens.append(7)
        running = [s for r in self.scheduler.running for s in r.live_seqs]
        if ending is not None and running:  # one sequence ends (any reason: the release path is the same)
            seq = running[ending % len(running)]
            seq.finished = True
            self.cache.free_sequence(seq.seq_id)
            if not seq.request.live_seqs:
                self.scheduler.remove(seq.request)
        self.cache.release_fenced()
        self.cache.check_invariants()
        return ([(i.seq.seq_id, i.num_tokens, i.samples) for i in out.scheduled],
                [r.request_id for r in out.preempted], [r.request_id for r in self.scheduler.running],
                [r.request_id for r in self.scheduler.waiting],
                {s: self.cache.block_table(s) for s in self.cache.sequences()})


@pytest.mark.parametrize("budget", [5, 12])
@pytest.mark.parametrize("seed", range(30))
def test_reserving_the_running_sequences_at_once_schedules_as_one_at_a_time(seed, budget):
    """Under a pool small enough to preempt often: the same plans, preemptions, queues and block tables."""
    import random

    rng = random.Random(seed)
    batched, reference = World(False, budget), World(True, budget)
    preemptions = 0
    for _ in range(60):
        if rng.random() < 0.35:
            prompt_len, n = rng.randint(1, 14), rng.choice([1, 1, 1, 2, 3])
            batched.add(prompt_len, n)
            reference.add(prompt_len, n)
        ending = rng.randint(0, 99) if rng.random() < 0.15 else None
        got, want = batched.step(ending), reference.step(ending)
        assert got == want
        preemptions += len(got[1])
    if seed == 0:
        assert preemptions, "the workload should preempt"
