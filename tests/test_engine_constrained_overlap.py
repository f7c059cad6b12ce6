"""Constrained decode steps overlapped (hipcore/engine/step_launch.py, StepLauncher.sample_ahead): a decode step with
rows under a grammar is launched before their token masks are known (its launches up to the logits), the masks are
computed once the grammars have taken the step before's tokens, and then its sampling is launched. On the cpu
backend the device work runs at once, so these check what overlap must never change: every request's tokens,
texts and endings exactly those of steps that wait (constrained answers inside their grammar), every block back,
a grammar that gives out, a cancel and a failed launch handled; a mask applied one step late is caught."""

from __future__ import annotations

import dataclasses
import json

import jsonschema
import numpy as np
import pytest

from support.engine_testing import assert_quiescent, greedy, prompt_of
from support.overlap_fixtures import model, path  # noqa: F401 (fixtures)

from hipcore.engine import step_launch
from hipcore.engine.engine import Engine
from hipcore.engine.grammar import GRAMMAR_FAILURE, compile_grammar
from hipcore.engine.hooks import EngineHooks
from hipcore.engine.request import CancelResult, Ending
from hipcore.engine.sampler import SamplingParams
from hipcore.model.batch import SeqSlice, build_decode_batch, build_step_batch
from hipcore.ops.sample import SamplingRows, mask_words

SCHEMA = {"type": "object", "properties": {"ok": {"type": "boolean"}, "n": {"type": "integer", "maximum": 999}},
          "required": ["ok", "n"], "additionalProperties": False}


class DeferringRunner:
    """The model's runner with every method spelled out (isinstance() of a Protocol does not see __getattr__),
    counting the steps launched before their masks; `fail_masked_at`: the sample_under_masks call that raises;
    `late`: each step ahead sampled under the masks given for the one before it (a planted fault)."""

    def __init__(self, runner, fail_masked_at: int | None = None, late: bool = False):
        self._runner, self.fail_masked_at, self.late = runner, fail_masked_at, late
        self.cache, self.config = runner.cache, runner.config
        self.deferred = self.masked = 0
        self._given = None

    def execute(self, batch):
        return self._runner.execute(batch)

    def execute_sampled(self, batch, sampling):
        return self._runner.execute_sampled(batch, sampling)

    def launch_sampled(self, batch, sampling, follows=None):
        return self._runner.launch_sampled(batch, sampling, follows)

    def collect(self, pending):
        return self._runner.collect(pending)

    def sampled_step_logits(self, indices):
        return self._runner.sampled_step_logits(indices)

    def launch_before_masks(self, batch, sampling, follows=None):
        self.deferred += 1
        return self._runner.launch_before_masks(batch, sampling, follows)

    def sample_under_masks(self, pending, mask):
        self.masked += 1
        if self.masked == self.fail_masked_at:
            self._runner._outstanding.remove(pending)  # as the runner drops a step whose launch failed
            raise RuntimeError("planted: the masked sampling's launch failed")
        given, self._given = self._given, mask
        if self.late and given is not None and given.shape == mask.shape:
            mask = given
        return self._runner.sample_under_masks(pending, mask)


def constrained(**kw) -> SamplingParams:
    return SamplingParams(grammar=compile_grammar(json_schema=SCHEMA), max_tokens=40, **kw)


def jobs() -> list[tuple[list[int], SamplingParams]]:
    """Free and constrained requests side by side: greedy, seeded, the whole vocabulary, two samples."""
    params = [
        greedy(30, ignore_eos=True),
        constrained(temperature=0.8, seed=3),
        SamplingParams(temperature=0.9, top_k=40, top_p=0.9, seed=5, max_tokens=24, ignore_eos=True),
        constrained(temperature=0.0),
        constrained(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=7),
        constrained(temperature=0.7, seed=11, n=2),
    ]
    return [(prompt_of(5 + i, salt=i), p) for i, p in enumerate(params)]


def run(model, requests, *, overlap: bool, runner=None):
    """Every request on a fresh engine over the model's runner and cache; (ending, tokens, texts) of each."""
    engine = Engine(runner or model.runner, model.tokenizer, model.cache, max_seqs=8, max_step_tokens=64,
                    overlap=overlap)
    ids = [engine.submit(prompt, params) for prompt, params in requests]
    engine.run_until_idle()
    model.engine = engine
    assert_quiescent(model, model.baseline)
    assert not model.runner._outstanding
    return [(r.ending, r.generated_tokens, r.texts, r.error) for r in map(engine.finished_record, ids)]


def test_overlapped_constrained_steps_give_the_tokens_of_waiting_steps(model):
    reference = run(model, jobs(), overlap=False)
    watching = DeferringRunner(model.runner)
    assert run(model, jobs(), overlap=True, runner=watching) == reference
    assert watching.deferred > 10 and watching.masked == watching.deferred  # most steps went ahead
    for ending, _, texts, _ in (reference[i] for i in (1, 3, 4, 5)):
        assert ending == Ending.EOS, texts
        for text in texts:
            jsonschema.validate(json.loads(text), SCHEMA)
    assert reference[0][0] == Ending.LENGTH  # the free rows ran on after the constrained ones ended


def test_a_mask_applied_one_step_late_is_caught(model):
    """The planted fault: each step ahead sampled under the masks of the step before it. The tokens differ from
    waiting steps' and constrained answers break."""
    reference = run(model, jobs(), overlap=False)
    late = run(model, jobs(), overlap=True, runner=DeferringRunner(model.runner, late=True))
    assert [late[i] for i in (0, 2)] == [reference[i] for i in (0, 2)]
    assert any(late[i][0] != Ending.EOS or late[i][1] != reference[i][1] for i in (1, 3, 4, 5))


def test_masks_computed_before_the_tokens_they_follow_are_refused(model, monkeypatch):
    """The planted fault: the engine computes a step ahead's masks before it reads the running step's tokens (from
    the grammars one token behind). The runner refuses the masked sampling before the step before is collected:
    those requests fail, and nothing is left behind."""
    chain_after = Engine._chain_after

    def masks_too_early(self, running, events):
        ahead = chain_after(self, running, events)
        return self._sample_ahead(ahead, events) if ahead is not None and ahead.awaiting_masks else ahead

    monkeypatch.setattr(Engine, "_chain_after", masks_too_early)
    records = run(model, jobs(), overlap=True, runner=DeferringRunner(model.runner))
    assert all(records[i][0] == Ending.FAILED and "collected" in records[i][3] for i in (1, 3, 4, 5)), records


def test_constrained_rows_without_their_masks_ahead_are_caught(model, monkeypatch):
    """The planted fault: the steps ahead sample unmasked (every row's mask all ones); the first decode step keeps its
    masks. Constrained answers leave their grammar."""
    reference = run(model, jobs(), overlap=False)
    original = step_launch.token_masks
    monkeypatch.setattr(step_launch.StepLauncher, "sample_ahead", lambda self, runner, step: (
        setattr(step, "awaiting_masks", False), runner.sample_under_masks(
            step.pending, original(len(step.scheduled), {}, runner.config.vocab_size)), [])[-1])
    unmasked = run(model, jobs(), overlap=True, runner=DeferringRunner(model.runner))
    assert [unmasked[i] for i in (0, 2)] == [reference[i] for i in (0, 2)]
    assert any(unmasked[i][0] != Ending.EOS for i in (1, 3, 4, 5))


def test_a_grammar_that_gives_out_in_a_step_ahead_fails_its_request_alone(model, monkeypatch):
    reference = run(model, jobs(), overlap=False)
    real_masks, calls = step_launch.packed_masks, []

    def gives_out_at_the_sixth(constraints):  # the first constraint's grammar reported failed at the 6th call
        packed, failures = real_masks(constraints)
        calls.append(len(constraints))
        if len(calls) == 6:
            failures = [f"{GRAMMAR_FAILURE}: planted"] + failures[1:]
        return packed, failures

    monkeypatch.setattr(step_launch, "packed_masks", gives_out_at_the_sixth)
    watching = DeferringRunner(model.runner)
    records = run(model, jobs(), overlap=True, runner=watching)
    assert len(calls) > 6 and watching.deferred >= 5  # the failure came in a step ahead
    failed = [i for i, r in enumerate(records) if r[0] == Ending.FAILED]
    assert len(failed) == 1 and GRAMMAR_FAILURE in records[failed[0]][3] and failed[0] in (1, 3, 4, 5)
    assert [r for i, r in enumerate(records) if i != failed[0]] == \
        [r for i, r in enumerate(reference) if i != failed[0]]


def test_a_failed_masked_sampling_launch_fails_its_step_and_the_engine_serves_on(model):
    alone = run(model, [(prompt_of(9, salt=9), constrained(temperature=0.0))], overlap=False)
    watching = DeferringRunner(model.runner, fail_masked_at=3)
    engine = model.engine = Engine(watching, model.tokenizer, model.cache, max_seqs=8, max_step_tokens=64,
                                   overlap=True)
    ids = [engine.submit(prompt, params) for prompt, params in jobs()[:4]]
    engine.run_until_idle()
    records = [engine.finished_record(i) for i in ids]
    assert all(r.ending == Ending.FAILED and "planted" in r.error for r in records), records
    assert_quiescent(model, model.baseline)
    rid = engine.submit(prompt_of(9, salt=9), constrained(temperature=0.0))
    engine.run_until_idle()
    record = engine.finished_record(rid)
    assert [(record.ending, record.generated_tokens, record.texts, record.error)] == alone
    assert watching.masked > 3
    assert_quiescent(model, model.baseline)


def test_a_step_read_failing_while_the_next_waits_for_its_masks(model):
    """The running step's read fails (the fault-injection hook) while the step after it, launched ahead, waits for
    its masks: their requests fail, that step's sampling is still launched and read, nothing is left behind, and a
    request after them runs as it runs alone."""
    alone = run(model, [(prompt_of(9, salt=9), constrained(temperature=0.0))], overlap=False)
    waiting = []

    def fail_the_fifth(requests):
        waiting.append(engine._running_step is not None and engine._running_step.awaiting_masks)
        return len(waiting) == 5

    engine = model.engine = Engine(DeferringRunner(model.runner), model.tokenizer, model.cache, max_seqs=8,
                                   max_step_tokens=64, overlap=True, hooks=EngineHooks(fail_step=fail_the_fifth))
    ids = [engine.submit(prompt, params) for prompt, params in jobs()[:4]]
    engine.run_until_idle()
    assert waiting[4]  # the failed read came while a step ahead waited for its masks
    assert all(engine.finished_record(i).ending == Ending.FAILED for i in ids)
    assert_quiescent(model, model.baseline)
    assert not model.runner._outstanding
    engine.hooks.fail_step = None
    rid = engine.submit(prompt_of(9, salt=9), constrained(temperature=0.0))
    engine.run_until_idle()
    record = engine.finished_record(rid)
    assert [(record.ending, record.generated_tokens, record.texts, record.error)] == alone


def test_a_constrained_row_whose_sampling_fails_ahead_fails_alone(model):
    reference = run(model, jobs(), overlap=False)
    tokens_of_3 = []
    hooks = EngineHooks(fail_sampling=lambda request: request.request_id == 4 and (
        tokens_of_3.append(1) or len(tokens_of_3) == 6))  # jobs()[3]'s 6th token
    engine = model.engine = Engine(DeferringRunner(model.runner), model.tokenizer, model.cache, max_seqs=8,
                                   max_step_tokens=64, overlap=True, hooks=hooks)
    ids = [engine.submit(prompt, params) for prompt, params in jobs()]
    engine.run_until_idle()
    assert_quiescent(model, model.baseline)
    records = [(r.ending, r.generated_tokens, r.texts, r.error) for r in map(engine.finished_record, ids)]
    assert records[3][0] == Ending.FAILED and "injected" in records[3][3]
    assert records[:3] + records[4:] == reference[:3] + reference[4:]


@pytest.mark.parametrize("when", range(1, 6))
def test_cancel_at_any_call_while_constrained_steps_run_ahead(model, when):
    beside = (prompt_of(8, salt=2), constrained(temperature=0.8, seed=3))
    alone = run(model, [beside], overlap=False)[0]
    watching = DeferringRunner(model.runner)
    engine = model.engine = Engine(watching, model.tokenizer, model.cache, max_seqs=8, max_step_tokens=64,
                                   overlap=True)
    rid = engine.submit(prompt_of(5), constrained(temperature=0.0))
    other = engine.submit(*beside)
    for _ in range(when):
        engine.step()
    assert engine.cancel(rid) == CancelResult.CANCELLED
    engine.step()
    record = engine.finished_record(rid)
    assert record.ending == Ending.CANCELLED and len(record.generated_tokens[0]) <= when
    engine.run_until_idle()
    kept = engine.finished_record(other)
    assert (kept.ending, kept.generated_tokens, kept.texts, kept.error) == alone
    assert watching.deferred > 3
    assert_quiescent(model, model.baseline)


# ---- the runner's side ------------------------------------------------------------------------------


def random_masks(rng, rows: int, vocab: int) -> tuple[np.ndarray, np.ndarray]:
    """(allowed bool [rows, vocab], their packed uint32 masks): a few tokens a row."""
    allowed = rng.random((rows, vocab)) < 0.05
    allowed[:, 3] = True
    packed = np.zeros((rows, mask_words(vocab) * 4), np.uint8)
    bits = np.packbits(allowed, axis=1, bitorder="little")
    packed[:, :bits.shape[1]] = bits
    return allowed, packed.view(np.uint32)


@pytest.fixture
def three_sequences(model):
    cache = model.cache
    ids = [901, 902, 903]
    for seq_id in ids:
        cache.add_sequence(seq_id)
        assert cache.reserve(seq_id, 8)
    model.runner.execute(build_step_batch(cache, [SeqSlice(s, prompt_of(5, salt=s), 0, True) for s in ids]))
    yield ids
    for seq_id in ids:
        cache.free_sequence(seq_id)
    cache.release_fenced()


def sampled_rows(n: int, step: int) -> SamplingRows:
    return SamplingRows.build([SamplingParams(temperature=0.9, seed=step * 10 + i) for i in range(n)],
                              np.linspace(0.1, 0.9, n))


def test_a_step_launched_before_its_masks_samples_as_one_given_them(model, three_sequences):
    """Two decode steps, each masked, the second following the first on the device and launched before its masks:
    the tokens of steps that wait, every token inside its row's mask."""
    runner, ids, vocab = model.runner, three_sequences, model.config.vocab_size
    rng = np.random.default_rng(3)
    (allowed1, mask1), (allowed2, mask2) = random_masks(rng, 3, vocab), random_masks(rng, 3, vocab)
    batch1 = build_decode_batch(model.cache, ids, [11, 12, 13], [5, 5, 5], [True] * 3)
    waited1 = runner.execute_sampled(batch1, dataclasses.replace(sampled_rows(3, 1), mask=mask1))
    batch2 = build_decode_batch(model.cache, ids, list(waited1), [6, 6, 6], [True] * 3)
    waited2 = runner.execute_sampled(batch2, dataclasses.replace(sampled_rows(3, 2), mask=mask2))
    assert all(allowed1[i, t] for i, t in enumerate(waited1)) and all(allowed2[i, t] for i, t in enumerate(waited2))

    first = runner.launch_before_masks(batch1, sampled_rows(3, 1))
    runner.sample_under_masks(first, mask1)
    ahead = runner.launch_before_masks(build_decode_batch(model.cache, ids, [0, 0, 0], [6, 6, 6], [True] * 3),
                                       sampled_rows(3, 2), follows=first)
    assert list(runner.collect(first)) == list(waited1)
    runner.sample_under_masks(ahead, mask2)
    assert list(runner.collect(ahead)) == list(waited2)


def test_the_runner_refuses_a_step_whose_masks_were_not_given(model, three_sequences):
    runner, ids, vocab = model.runner, three_sequences, model.config.vocab_size
    _, mask = random_masks(np.random.default_rng(4), 3, vocab)
    batch = build_decode_batch(model.cache, ids, [11, 12, 13], [5, 5, 5], [True] * 3)
    with pytest.raises(ValueError, match="masks given later"):
        runner.launch_before_masks(batch, dataclasses.replace(sampled_rows(3, 1), mask=mask))
    pending = runner.launch_before_masks(batch, sampled_rows(3, 1))
    with pytest.raises(ValueError, match="never given"):
        runner.collect(pending)
    with pytest.raises(ValueError, match="never given"):
        runner.launch_sampled(build_decode_batch(model.cache, ids, [0, 0, 0], [6, 6, 6], [True] * 3),
                              sampled_rows(3, 2), follows=pending)
    with pytest.raises(ValueError, match="overwrite"):
        runner.launch_sampled(batch, sampled_rows(3, 1))
    with pytest.raises(ValueError, match="token mask of shape"):  # a wrong mask drops the step
        runner.sample_under_masks(pending, mask[:2])
    assert not runner._outstanding
    first = runner.launch_sampled(batch, sampled_rows(3, 1))
    ahead = runner.launch_before_masks(build_decode_batch(model.cache, ids, [0, 0, 0], [6, 6, 6], [True] * 3),
                                       sampled_rows(3, 2), follows=first)
    with pytest.raises(ValueError, match="collected"):  # the step before may still read the mask buffer
        runner.sample_under_masks(ahead, mask)
    assert runner._outstanding == [first]  # the refused step is dropped
    runner.collect(first)
    pending = runner.launch_before_masks(batch, sampled_rows(3, 1))
    runner.sample_under_masks(pending, mask)
    with pytest.raises(ValueError, match="once"):
        runner.sample_under_masks(pending, mask)
    runner.collect(pending)
