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
