"""Engine bugs the leak check found, pinned down on their own (tiny model, a few requests each).

1. A preempted request with parallel samples came back with less step budget than its samples had
   pending tokens: the samples that got none were never added to the KV cache, and the next step
   raised "unknown sequence" out of Engine.step(), leaving tables and blocks behind.
2. A step made only of prompt chunks samples nothing; the runner still launched the logits tail
   with zero rows, which failed the step and every request in it.
"""

from __future__ import annotations

import pytest

from support.gguf_factory import write_tiny_llama
from hipcore.engine.loader import LoadOptions, load_model
from hipcore.engine.request import Ending
from hipcore.engine.sampler import SamplingParams


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> str:
    return str(write_tiny_llama(tmp_path_factory.mktemp("regressions") / "tiny.gguf", tokenizer="gpt2"))


def assert_quiescent(model) -> None:
    cache = model.cache
    cache.check_invariants(quiescent=True)
    assert cache.num_free_blocks == cache.num_usable_blocks and model.engine.active_count == 0


def test_a_preempted_fork_readmitted_with_a_short_budget_finishes(tiny):
    # 9 blocks of 4 tokens: the 3-sample request B is preempted (newest first) as A and B grow; on
    # re-admission its three samples have 9 tokens each to recompute but the step budget is 8.
    with load_model(tiny, LoadOptions(device="cpu", max_seqs=4, max_step_tokens=8, kv_blocks=9, block_size=4)) as model:
        engine = model.engine
        a = engine.submit(list(range(1, 6)), SamplingParams(temperature=0, max_tokens=14))
        b = engine.submit(list(range(1, 6)), SamplingParams(temperature=0.8, seed=1, max_tokens=8, n=3))
        engine.run_until_idle(500)
        ra, rb = engine.finished_record(a), engine.finished_record(b)
        assert (ra.ending, rb.ending) == (Ending.LENGTH, Ending.LENGTH), (ra.error, rb.error)
        assert rb.preemptions > 0 and all(len(g) == 8 for g in rb.generated_tokens)
        assert_quiescent(model)


def test_a_step_of_prompt_chunks_only_samples_nothing_and_fails_nothing(tiny):
    prompt = list(range(3, 23))  # 20 tokens at 8 per step: the first two steps sample nothing
    outputs = {}
    for step_tokens in (8, 64):
        with load_model(tiny, LoadOptions(device="cpu", max_seqs=2, max_step_tokens=step_tokens)) as model:
            rid = model.engine.submit(prompt, SamplingParams(temperature=0, max_tokens=3))
            model.engine.run_until_idle(100)
            record = model.engine.finished_record(rid)
            assert record.ending == Ending.LENGTH, record.error
            outputs[step_tokens] = record.generated_tokens
            assert_quiescent(model)
    assert outputs[8] == outputs[64]
