"""Random engine workloads (hypothesis): submit / cancel / step in any order on a pool small enough
that preemption happens, with the KV invariants checked after every step and every output checked
against a solo run at the end.

The oracle: a request that ended by LENGTH or EOS produced, for each of its samples, exactly the
tokens of that sample run alone (greedy, or seeded with the sample's seed); a cancelled request
produced a prefix of them; a request is rejected exactly when it could never fit the pool alone.
"""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from support.engine_testing import assert_quiescent, greedy, kv_bytes, load_tiny, prompt_of, run_alone, tiny_model

from hipcore.engine.request import Ending
from hipcore.engine.sampler import SamplingParams

BLOCK_SIZE = 4
KV_BLOCKS = 12  # 48 token slots: a few requests at once, then preemption


@pytest.fixture(scope="module")
def path(tmp_path_factory):
    return tiny_model(tmp_path_factory)


@pytest.fixture(scope="module")
def solo(path):
    cache: dict[tuple, tuple[int, ...]] = {}
    with load_tiny(path, kv_blocks=64) as model:
        def get(prompt: tuple[int, ...], params: SamplingParams) -> tuple[int, ...]:
            key = (prompt, params)
            if key not in cache:
                cache[key] = run_alone(model, list(prompt), params).generated_tokens[0]
            return cache[key]
        yield get


def params_of(max_tokens: int, n: int, seed: int | None) -> SamplingParams:
    if seed is None:
        return greedy(max_tokens, n=n)
    return SamplingParams(n=n, seed=seed, temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, max_tokens=max_tokens)


submit = st.tuples(st.just("submit"), st.integers(1, 24), st.integers(1, 14), st.sampled_from([1, 1, 2]),
                   st.one_of(st.none(), st.integers(0, 50)))
cancel = st.tuples(st.just("cancel"), st.integers(0, 40))
step = st.tuples(st.just("step"), st.integers(1, 4))
operations = st.lists(st.one_of(submit, cancel, step), min_size=5, max_size=30)


@pytest.mark.parametrize("prefix_caching", [False, True])
@settings(max_examples=25, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=operations)
def test_random_submit_cancel_step_keeps_every_invariant(path, solo, prefix_caching, ops):
    # With prefix caching every prompt is a prefix of one token sequence: they share all they can.
    with load_tiny(path, max_seqs=4, max_step_tokens=8, block_size=BLOCK_SIZE, kv_blocks=KV_BLOCKS,
                   prefix_caching=prefix_caching) as model:
        engine = model.engine
        baseline = kv_bytes(model)
        submitted: dict[int, tuple[tuple[int, ...], SamplingParams]] = {}
        cancelled: set[int] = set()

        def step_and_check():
            engine.step()
            live = {seq.seq_id: seq.tokens for r in engine.scheduler.running for seq in r.seqs if not seq.finished}
            model.cache.check_invariants(sequence_tokens=live)

        for op in ops:
            if op[0] == "submit":
                _, length, max_tokens, n, seed = op
                prompt = tuple(prompt_of(length, salt=0 if prefix_caching else length * 7 + max_tokens))
                params = params_of(max_tokens, n, seed)
                submitted[engine.submit(list(prompt), params)] = (prompt, params)
            elif op[0] == "cancel":
                ids = sorted(submitted)
                if ids:
                    rid = ids[op[1] % len(ids)]
                    engine.cancel(rid)
                    cancelled.add(rid)
            else:
                for _ in range(op[1]):
                    step_and_check()
        for _ in range(2000):
            if not engine.has_work():
                break
            step_and_check()
        assert not engine.has_work()

        usable = KV_BLOCKS  # kv_blocks counts usable blocks (the loader adds the null block)
        for rid, (prompt, params) in submitted.items():
            record = engine.finished_record(rid)
            assert record is not None
            never_fits = params.n * -(-(len(prompt) + params.max_tokens - 1) // BLOCK_SIZE) > usable
            assert (record.ending == Ending.REJECTED) == never_fits, record
            if never_fits:
                continue
            assert record.ending in (Ending.LENGTH, Ending.EOS, Ending.CANCELLED)
            if record.ending == Ending.CANCELLED:
                assert rid in cancelled
            for index, tokens in enumerate(record.generated_tokens):
                alone = solo(prompt, dataclasses.replace(params.for_sample(index), n=1))
                if record.ending == Ending.CANCELLED:
                    assert alone[:len(tokens)] == tokens
                else:
                    assert tokens == alone, f"request {rid} sample {index}"
        model.cache.check_invariants(quiescent=True)
        model.cache.flush_prefix_cache()  # cached blocks are evictable, not held: then every block is free
        assert_quiescent(model, baseline)
