"""The engine on a tiny model (cpu backend): concurrency, preemption, rejection, parallel samples,
seeded sampling and the bound on finished records.

The output oracle (KV cache invariant 11, docs/architecture.md) is a solo run: the same request alone in the engine.
Greedy tokens must be equal under concurrency, chunked prompts and preemption.
"""

from __future__ import annotations

import pytest

from support.engine_testing import (
    assert_quiescent, greedy, kv_bytes, load_tiny, prompt_of, run_alone, tiny_model,
)

from hipcore.engine.request import Ending
from hipcore.engine.sampler import SamplingParams


@pytest.fixture(scope="module")
def path(tmp_path_factory):
    return tiny_model(tmp_path_factory)


@pytest.fixture(scope="module")
def solo(path):
    """Tokens of a request alone in a roomy engine: solo(prompt, params) -> tokens (cached)."""
    cache: dict[tuple, tuple[int, ...]] = {}
    with load_tiny(path, kv_blocks=64) as model:
        def get(prompt: list[int], params: SamplingParams) -> tuple[int, ...]:
            key = (tuple(prompt), params)
            if key not in cache:
                record = run_alone(model, prompt, params)
                assert record.ending in (Ending.LENGTH, Ending.EOS), record
                cache[key] = record.generated_tokens[0]
            return cache[key]
        yield get


def seeded(seed: int, max_tokens: int) -> SamplingParams:
    """Sampling from the whole distribution: every token depends on how many draws came before, so a
    token lost or computed twice changes everything after it (a sharper oracle than greedy on a
    tiny random model, whose greedy output soon repeats one token)."""
    return SamplingParams(seed=seed, temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, max_tokens=max_tokens)


# 24 requests: prompt lengths 1..50 (most longer than a step's 16 tokens, so chunked) and
# max_tokens 8..24 (long enough for eight of them to be decoding together); greedy, and every
# third one seeded sampling.
WORKLOAD = [(prompt_of(1 + (i * 29) % 50, salt=i), seeded(i, 8 + (i * 5) % 17) if i % 3 == 2 else greedy(8 + (i * 5) % 17))
            for i in range(24)]


def submit_all(engine, workload) -> list[int]:
    return [engine.submit(prompt, params) for prompt, params in workload]


def test_concurrent_requests_equal_solo_runs(path, solo):
    with load_tiny(path, max_seqs=8, max_step_tokens=16, kv_blocks=80) as model:
        baseline = kv_bytes(model)
        ids = submit_all(model.engine, WORKLOAD)
        batch_sizes = []
        while model.engine.has_work():
            model.engine.step()
            batch_sizes.append(len(model.engine.scheduler.running))
            model.cache.check_invariants()
        assert max(batch_sizes) == 8  # max_seqs reached: the requests really ran together
        assert model.engine.stats.preemptions == 0
        for rid, (prompt, params) in zip(ids, WORKLOAD):
            record = model.engine.finished_record(rid)
            assert record.generated_tokens == (solo(prompt, params),), f"request {rid}"
        assert_quiescent(model, baseline)


def test_preemption_recomputes_and_changes_no_output(path, solo):
    """A pool far too small for everyone at once: the newest running request is preempted (its
    blocks freed, re-queued, recomputed) and every output still equals its solo run."""
    workload = [(prompt_of(20 + 3 * i, salt=40 + i), greedy(24) if i % 2 else seeded(100 + i, 24)) for i in range(6)]
    with load_tiny(path, max_seqs=6, max_step_tokens=64, block_size=4, kv_blocks=24) as model:
        baseline = kv_bytes(model)
        ids = submit_all(model.engine, workload)
        preempted_seen: set[int] = set()
        while model.engine.has_work():
            model.engine.step()
            model.cache.check_invariants()
            for request in model.engine.scheduler.waiting:
                if request.preemptions:
                    preempted_seen.add(request.request_id)
                    # Every block of a preempted request is back (invariant 8).
                    assert all(not model.cache.has_sequence(s.seq_id) for s in request.seqs)
                    assert all(s.num_cached == 0 for s in request.seqs)
        assert model.engine.stats.preemptions >= 2 and preempted_seen
        for rid, (prompt, params) in zip(ids, workload):
            record = model.engine.finished_record(rid)
            assert record.generated_tokens == (solo(prompt, params),), f"request {rid} ({record.preemptions} preemptions)"
            if record.ending == Ending.LENGTH:
                assert len(record.generated_tokens[0]) == params.max_tokens  # nothing lost, nothing doubled
        assert sum(model.engine.finished_record(r).preemptions for r in ids) == model.engine.stats.preemptions
        assert_quiescent(model, baseline)


def test_a_request_that_can_never_fit_is_rejected_with_the_numbers(path):
    with load_tiny(path, block_size=16, kv_blocks=4) as model:
        baseline = kv_bytes(model)
        rid = model.engine.submit(prompt_of(60), greedy(20))  # 60 + 19 tokens = 5 blocks of 16 > 4
        events = model.engine.step()
        record = model.engine.finished_record(rid)
        assert record.ending == Ending.REJECTED and record.phase_at_end.value == "waiting"
        assert "needs 5 KV blocks" in record.error and "only 4" in record.error
        assert any(e.finished and e.ending == Ending.REJECTED and e.error == record.error for e in events)
        assert_quiescent(model, baseline)


def test_a_request_that_exactly_fits_the_pool_is_served(path, solo):
    """prompt + max_tokens - 1 tokens (the last sampled token is never computed) fill the pool
    exactly: admitted alone, never left waiting (no watermark applies to an idle engine)."""
    prompt = prompt_of(63, salt=5)
    with load_tiny(path, block_size=16, kv_blocks=4) as model:
        baseline = kv_bytes(model)
        record = run_alone(model, prompt, greedy(2))  # 63 + 1 = 64 tokens = 4 blocks
        assert record.ending == Ending.LENGTH
        assert record.generated_tokens == (solo(prompt, greedy(2)),)
        assert_quiescent(model, baseline)


def test_more_parallel_samples_than_max_seqs_is_rejected(path):
    with load_tiny(path, max_seqs=2, kv_blocks=64) as model:
        baseline = kv_bytes(model)
        rid = model.engine.submit(prompt_of(5), SamplingParams(n=3, max_tokens=4, seed=1))
        model.engine.run_until_idle(max_steps=5)
        record = model.engine.finished_record(rid)
        assert record.ending == Ending.REJECTED and "3 parallel samples" in record.error and "at most 2" in record.error
        assert_quiescent(model, baseline)


def test_parallel_samples_share_the_prompt_and_copy_on_write(path):
    """n = 4 samples fork from the prompt: every full prompt block is held by all four (MemoryProfile
    counts the sharing), the partly filled last block is copied by each sample that appends to it,
    and each sample's tokens equal a solo run with that sample's seed."""
    prompt = prompt_of(37, salt=9)  # 2 full blocks of 16 + 5 tokens
    params = SamplingParams(n=4, seed=1234, temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, max_tokens=6)
    with load_tiny(path, max_seqs=8, kv_blocks=40) as model:
        baseline = kv_bytes(model)
        engine = model.engine
        rid = engine.submit(prompt, params)
        engine.step()  # the prompt: one sequence, then the fork at its first sample
        request = engine.request(rid)
        assert len(request.seqs) == 4
        profile = model.cache.memory_profile()
        assert profile.active_sequences == 4
        assert profile.physical_blocks == 3 and profile.logical_blocks == 12 and profile.shared_blocks == 3
        assert profile.sharing_saved_bytes == 9 * profile.bytes_per_block
        engine.step()  # each sample appends its first token: the shared last block is copied (3 copies + the last holder keeps it)
        profile = model.cache.memory_profile()
        assert profile.shared_blocks == 2 and profile.physical_blocks == 2 + 4
        tables = [model.cache.block_table(s.seq_id) for s in request.seqs]
        assert len({t[:2] for t in tables}) == 1 and len({t[2] for t in tables}) == 4
        engine.run_until_idle()
        record = engine.finished_record(rid)
        assert record.ending == Ending.LENGTH and len(record.generated_tokens) == 4
        assert_quiescent(model, baseline)
        for i, tokens in enumerate(record.generated_tokens):
            solo_params = SamplingParams(n=1, seed=1234 + i, temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, max_tokens=6)
            assert run_alone(model, prompt, solo_params).generated_tokens == (tokens,), f"sample {i}"
        assert len(set(record.generated_tokens)) > 1  # the samples really differ
        assert_quiescent(model, baseline)


def test_seeded_sampling_is_reproducible_and_the_seed_matters(path):
    params = SamplingParams(seed=99, temperature=1.2, top_k=0, top_p=1.0, min_p=0.0, max_tokens=12)
    with load_tiny(path, kv_blocks=32) as model:
        first = run_alone(model, prompt_of(9), params).generated_tokens
        again = run_alone(model, prompt_of(9), params).generated_tokens
        other = run_alone(model, prompt_of(9), SamplingParams(**{**params.__dict__, "seed": 100})).generated_tokens
        assert first == again
        assert first != other


def test_finished_records_are_bounded(path):
    with load_tiny(path, kv_blocks=32, finished_bound=5) as model:
        ids = [model.engine.submit(prompt_of(3, salt=i), greedy(1)) for i in range(12)]
        model.engine.run_until_idle()
        kept = [r.request_id for r in model.engine.finished_records()]
        assert kept == ids[-5:]  # the newest five, oldest dropped first
        assert model.engine.finished_record(ids[0]) is None
        assert model.engine.stats.endings["length"] == 12
