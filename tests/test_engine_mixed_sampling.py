"""A step whose rows sample partly on the host (a grammar's mask, logprobs) keeps its other rows on the device
sampler: only the host rows' logits come back (ModelRunner.sampled_step_logits), and every row's tokens are the
ones the same step gives when all its rows sample on the host (the engine's rule before: logits of every row). On the cpu backend, whose device sampler is the kernel's host entry."""

from __future__ import annotations

import json

import pytest

from support.engine_testing import load_tiny, prompt_of, tiny_model

from hipcore.engine.grammar import compile_grammar
from hipcore.engine.sampler import SamplingParams

SCHEMA = {"type": "object", "properties": {"ok": {"type": "boolean"}, "n": {"type": "integer", "maximum": 999}},
          "required": ["ok", "n"], "additionalProperties": False}


def _free(seed: int) -> SamplingParams:
    return SamplingParams(temperature=0.9, top_k=0, top_p=1.0, min_p=0.0, seed=seed, max_tokens=12, ignore_eos=True)


def _run(model, jobs):
    ids = [model.engine.submit(prompt_of(6, salt=i), params) for i, params in enumerate(jobs)]
    model.engine.run_until_idle()
    return [model.engine.finished_record(rid) for rid in ids]


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    with load_tiny(tiny_model(tmp_path_factory), kv_blocks=64) as loaded:
        yield loaded


@pytest.mark.parametrize("host_kind", ["grammar", "logprobs"])
def test_device_rows_stay_on_the_device_beside_host_rows(model, host_kind):
    runner = model.engine.runner
    read = []
    original = runner.sampled_step_logits
    runner.sampled_step_logits = lambda indices: read.append(list(indices)) or original(indices)
    try:
        host = (SamplingParams(temperature=0.8, seed=3, max_tokens=40, grammar=compile_grammar(json_schema=SCHEMA))
                if host_kind == "grammar" else _free(3).__class__(**{**_free(3).__dict__, "logprobs": 2}))
        mixed = _run(model, [_free(1), host, _free(2)])
    finally:
        runner.sampled_step_logits = original
    runner.sampled_step_logits = None  # every row on the host, as before
    try:
        all_host = _run(model, [_free(1), host, _free(2)])
    finally:
        del runner.sampled_step_logits
    assert [r.generated_tokens for r in mixed] == [r.generated_tokens for r in all_host]
    assert read and all(indices == [1] for indices in read), read  # only the host row's logits came back
    if host_kind == "grammar":
        value = json.loads(mixed[1].texts[0])
        assert set(value) == {"ok", "n"}
