"""A step whose rows sample partly on the host (logprobs) keeps its other rows on the device sampler: only the host
rows' logits come back (ModelRunner.sampled_step_logits), and every row's tokens are the ones the same step gives
when all its rows sample on the host (the engine's rule before: logits of every row). A grammar's rows sample on
the device, under their token masks. On the cpu backend, whose device sampler is the kernel's host entry."""

from __future__ import annotations

import json

import jsonschema
import pytest

from support.engine_testing import load_tiny, prompt_of, tiny_model

from hipcore.engine import step_launch
from hipcore.engine.grammar import GRAMMAR_FAILURE, TokenConstraint, compile_grammar
from hipcore.engine.sampler import Sampler, SamplingParams

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


@pytest.mark.parametrize("host_kind", ["grammar with penalties", "logprobs"])
def test_device_rows_stay_on_the_device_beside_host_rows(model, host_kind):
    runner = model.engine.runner
    read = []
    original = runner.sampled_step_logits
    runner.sampled_step_logits = lambda indices: read.append(list(indices)) or original(indices)
    try:
        host = (SamplingParams(temperature=0.8, seed=3, max_tokens=40, repeat_penalty=1.1,
                               grammar=compile_grammar(json_schema=SCHEMA))
                if host_kind.startswith("grammar") else _free(3).__class__(**{**_free(3).__dict__, "logprobs": 2}))
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
    if host_kind.startswith("grammar"):
        value = json.loads(mixed[1].texts[0])
        assert set(value) == {"ok", "n"}


def _constrained_jobs():
    grammar = compile_grammar(json_schema=SCHEMA)
    return [_free(1), SamplingParams(temperature=0.8, seed=3, max_tokens=40, grammar=grammar), _free(2),
            SamplingParams(temperature=0.0, max_tokens=40, grammar=grammar),
            SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=5, max_tokens=40, grammar=grammar)]


def _host_masking_forbidden(monkeypatch):
    """The host's side of constrained sampling raises: a grammar's row must sample on the device."""
    def refuse(*args, **kwargs):
        raise AssertionError("a constrained row sampled on the host")
    monkeypatch.setattr(TokenConstraint, "mask", refuse)
    original = Sampler.sample
    monkeypatch.setattr(Sampler, "sample", lambda self, *a, **k: refuse() if self.constraint is not None
                        else original(self, *a, **k))


def test_constrained_rows_sample_on_the_device(model, monkeypatch):
    """json_schema requests (seeded, greedy, the whole vocabulary) beside free ones: every constrained row picks on
    the device sampler under its grammar's token mask (the host's masking raises; no logits come back) and ends
    with JSON that validates."""
    _host_masking_forbidden(monkeypatch)
    runner = model.engine.runner
    read = []
    monkeypatch.setattr(runner, "sampled_step_logits", lambda indices: read.append(indices), raising=False)
    masks = []
    original = step_launch.with_token_masks
    monkeypatch.setattr(step_launch, "with_token_masks", lambda *a: masks.append(1) or original(*a))
    records = _run(model, _constrained_jobs())
    assert read == [] and masks
    for i in (1, 3, 4):
        assert records[i].ending.value == "eos", (i, records[i].texts[0])
        jsonschema.validate(json.loads(records[i].texts[0]), SCHEMA)


def test_constrained_rows_without_their_masks_are_caught(model, monkeypatch):
    """The planted fault: the device sampler given no masks (every row's all ones, in the steps that wait for them
    and in those launched before them) picks tokens the grammar refuses, and the requests fail instead of ending
    with JSON."""
    original = step_launch.token_masks
    monkeypatch.setattr(step_launch, "token_masks", lambda rows, masks, vocab: original(rows, {}, vocab))
    records = _run(model, _constrained_jobs())
    assert all(records[i].ending.value != "eos" or not _valid(records[i].texts[0]) for i in (1, 3, 4))


def test_a_grammar_that_gives_out_fails_its_request_alone(model, monkeypatch):
    """A grammar that fails while its step's masks are gathered (llguidance's limits) ends its own request with the
    grammar's failure; the free rows of the same steps finish (the step is not failed as a whole)."""
    def gives_out(self):
        raise RuntimeError(f"{GRAMMAR_FAILURE}: planted")

    def masks_give_out(constraints):  # the step's masks, computed together, each grammar reported failed
        packed, _ = real_masks(constraints)
        return packed, [f"{GRAMMAR_FAILURE}: planted"] * len(constraints)

    real_masks = step_launch.packed_masks
    monkeypatch.setattr(TokenConstraint, "packed", gives_out)
    monkeypatch.setattr(step_launch, "packed_masks", masks_give_out)
    records = _run(model, _constrained_jobs())
    for i in (1, 3, 4):
        assert records[i].ending.value == "failed" and GRAMMAR_FAILURE in records[i].error, records[i]
    for i in (0, 2):
        assert records[i].ending.value == "length" and len(records[i].generated_tokens[0]) == 12, records[i]


def _valid(text: str) -> bool:
    try:
        jsonschema.validate(json.loads(text), SCHEMA)
    except (ValueError, jsonschema.ValidationError):
        return False
    return True
