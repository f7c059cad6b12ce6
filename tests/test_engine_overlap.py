"""Overlapped decode steps (hipcore/engine/step_launch.py): the engine launches the next decode step before it
reads this one's tokens, the next step's token ids taken on the device. On the cpu backend the device work
runs at once, so these tests check what overlap must never change: the same tokens, texts and endings as
steps that wait, no token computed past a length limit, every block back, cancels and shutdowns at any point;
and that the runner refuses to be driven out of order."""

from __future__ import annotations

import numpy as np
import pytest

from support.engine_testing import TINY_EOS, assert_quiescent, greedy, prompt_of
from support.overlap_fixtures import model, path  # noqa: F401 (fixtures)

from hipcore.engine.engine import Engine
from hipcore.ops.kernel_choice import Switches
from hipcore.engine.request import CancelResult, Ending
from hipcore.engine.sampler import SamplingParams
from hipcore.model.batch import SeqSlice, build_decode_batch, build_step_batch
from hipcore.ops.sample import SamplingRows


class WatchingRunner:
    """The model's runner, counting the steps launched ahead and the tokens computed, and checking that every
    step writes K/V only into blocks a live sequence holds; `ends` plants an end-of-generation token:
    (sequence row, step number) -> the token read instead."""

    def __init__(self, runner, ends: dict[tuple[int, int], int] | None = None):
        self._runner, self.ends = runner, ends or {}
        self.cache, self.config = runner.cache, runner.config  # (Python 3.12's isinstance() skips __getattr__)
        self.followed = self.launched = self.tokens_computed = self.collected = 0

    def __getattr__(self, name):
        return getattr(self._runner, name)

    def execute(self, batch):
        self.launched += 1
        self.tokens_computed += batch.num_tokens
        return self._runner.execute(batch)

    def execute_sampled(self, batch, sampling):
        return self.collect(self.launch_sampled(batch, sampling))

    def launch_sampled(self, batch, sampling, follows=None):
        block_size = self.cache.config.block_size
        held = [self.cache.refcount(int(slot) // block_size) for slot in batch.slot_mapping]
        assert min(held) >= 1, "a step writes K/V into a block no live sequence holds"
        self.launched += 1
        self.followed += follows is not None
        self.tokens_computed += batch.num_tokens
        return self._runner.launch_sampled(batch, sampling, follows)

    def collect(self, pending):
        tokens = np.array(self._runner.collect(pending))
        self.collected += 1
        for (row, step), token in self.ends.items():
            if step == self.collected and row < tokens.shape[0]:
                tokens[row] = token
        return tokens


def run_mix(model, requests, *, overlap: bool, runner=None):
    """Run every request on a fresh engine over the model's runner, cache and tokenizer; their records."""
    engine = Engine(runner or model.runner, model.tokenizer, model.cache, max_seqs=8, max_step_tokens=64, overlap=overlap)
    ids = [engine.submit(prompt, params) for prompt, params in requests]
    engine.run_until_idle()
    model.engine = engine  # (assert_quiescent looks at it)
    assert_quiescent(model, model.baseline)
    records = [engine.finished_record(i) for i in ids]
    return [(r.ending, r.generated_tokens, r.texts) for r in records]


def sampled(seed: int, max_tokens: int, **kw) -> SamplingParams:
    return SamplingParams(temperature=0.9, top_k=40, top_p=0.9, seed=seed, max_tokens=max_tokens, **kw)


def test_overlap_gives_the_same_tokens_texts_and_endings(model):
    plain = run_mix(model, [(prompt_of(9), greedy(24, ignore_eos=True))], overlap=False)
    text = plain[0][2][0]
    stop = text[len(text) // 2:len(text) // 2 + 3]  # a piece of the greedy text: a stop string that matches
    assert stop.strip()
    requests = [
        (prompt_of(9), greedy(24, ignore_eos=True)),
        (prompt_of(9), greedy(24, stop=(stop,))),
        (prompt_of(5, salt=1), greedy(7)),
        (prompt_of(12, salt=2), sampled(5, 19)),
        (prompt_of(3, salt=3), sampled(6, 11, n=2)),
        (prompt_of(30, salt=4), greedy(2)),
        (prompt_of(7, salt=5), sampled(7, 30, min_p=0.1)),
    ]
    watching = WatchingRunner(model.runner)
    overlapped = run_mix(model, requests, overlap=True, runner=watching)
    assert overlapped == run_mix(model, requests, overlap=False)
    assert overlapped[1][0] == Ending.STOP
    assert watching.followed > 10  # most decode steps went ahead


def test_no_token_is_computed_past_a_length_limit(model):
    """Requests that end by length compute exactly the tokens they would with waiting steps: a step ahead is
    launched only when no sequence can end by length with the running step's token."""
    requests = [(prompt_of(4 + i, salt=i), greedy(1 + 3 * i, ignore_eos=True)) for i in range(6)]
    requests.append((prompt_of(250, salt=9), greedy(40, ignore_eos=True)))  # ends at the 256-token context
    counts = {}
    for overlap in (False, True):
        watching = WatchingRunner(model.runner)
        records = run_mix(model, requests, overlap=overlap, runner=watching)
        counts[overlap] = watching.tokens_computed
    assert records[-1][0] == Ending.LENGTH and len(records[-1][1][0]) == 6
    assert counts[True] == counts[False]


def test_a_sequence_that_ends_while_a_step_runs_ahead_gives_back_every_block(model):
    """An end-of-generation token read while the next step runs: that step computed the sequence once more for
    nothing; its token is dropped, the request ends EOS with the tokens before, and its blocks come back."""
    requests = [(prompt_of(6, salt=s), greedy(30)) for s in range(3)]
    reference = run_mix(model, requests, overlap=True, runner=WatchingRunner(model.runner))
    watching = WatchingRunner(model.runner, ends={(1, 6): TINY_EOS})  # row 1 at the 6th read
    records = run_mix(model, requests, overlap=True, runner=watching)
    assert watching.followed > 3
    ended = [r for r in records if r[0] == Ending.EOS]
    assert len(ended) == 1
    (tokens,) = ended[0][1]
    whole = next(r for r in reference if r[1][0][:len(tokens)] == tokens)[1][0]
    assert len(tokens) < len(whole)  # it ended early, with the tokens it had
    assert [r for r in records if r[0] != Ending.EOS] == [r for r in reference if r[1][0] != whole]


def test_a_request_that_arrives_is_admitted_at_the_next_step(model):
    engine = Engine(model.runner, model.tokenizer, model.cache, max_seqs=8, max_step_tokens=64, overlap=True)
    model.engine = engine
    first = engine.submit(prompt_of(5), greedy(40, ignore_eos=True))
    for _ in range(6):
        engine.step()
    second = engine.submit(prompt_of(6, salt=1), greedy(3, ignore_eos=True))
    for calls in range(1, 4):
        engine.step()
        if engine.request(second) is None or engine.request(second).seqs[0].generated:
            break
    assert calls <= 2  # the running step is read, then the new request's prompt runs
    engine.run_until_idle()
    assert engine.finished_record(first).ending == engine.finished_record(second).ending == Ending.LENGTH
    assert_quiescent(model, model.baseline)


@pytest.mark.parametrize("when", range(1, 7))
def test_cancel_at_any_call_while_steps_run_ahead(model, when):
    engine = Engine(model.runner, model.tokenizer, model.cache, max_seqs=8, max_step_tokens=64, overlap=True)
    model.engine = engine
    beside_params = greedy(12, ignore_eos=True)
    alone = run_mix(model, [(prompt_of(8, salt=2), beside_params)], overlap=False)[0]
    engine = model.engine = Engine(model.runner, model.tokenizer, model.cache, max_seqs=8, max_step_tokens=64, overlap=True)
    rid = engine.submit(prompt_of(5), greedy(10, ignore_eos=True))
    beside = engine.submit(prompt_of(8, salt=2), beside_params)
    for _ in range(when):
        engine.step()
    assert engine.cancel(rid) == CancelResult.CANCELLED
    engine.step()
    record = engine.finished_record(rid)
    assert record.ending == Ending.CANCELLED and len(record.generated_tokens[0]) <= when
    engine.run_until_idle()
    other = engine.finished_record(beside)
    assert (other.ending, other.generated_tokens, other.texts) == alone
    assert_quiescent(model, model.baseline)


def test_shutdown_and_an_abandoned_stream_wait_for_the_step_running_ahead(model):
    engine = model.engine = Engine(model.runner, model.tokenizer, model.cache, max_seqs=8, max_step_tokens=64, overlap=True)
    engine.submit(prompt_of(5), greedy(30, ignore_eos=True))
    for _ in range(4):
        engine.step()
    assert engine._running_step is not None  # a step is left running
    engine.shutdown()
    assert engine._running_step is None
    assert_quiescent(model, model.baseline)

    engine = model.engine = Engine(model.runner, model.tokenizer, model.cache, max_seqs=8, max_step_tokens=64, overlap=True)
    stream = engine.generate(prompt_of(5), greedy(30, ignore_eos=True))
    for _ in range(4):
        next(stream)
    assert engine._running_step is not None
    stream.close()  # the consumer goes away: its request is cancelled and its blocks are back before close() returns
    assert engine._running_step is None
    assert_quiescent(model, model.baseline)


def test_overlap_can_be_turned_off(monkeypatch, model):
    assert not Switches.read({"ROCMFORGE_STEP_OVERLAP": "0"}).step_overlap
    assert Switches.read({"ROCMFORGE_STEP_OVERLAP": "1"}).step_overlap and Switches.read({}).step_overlap
    watching = WatchingRunner(model.runner)
    run_mix(model, [(prompt_of(5), greedy(12, ignore_eos=True))], overlap=False, runner=watching)
    assert watching.followed == 0 and watching.launched == 12


# ---- the runner's side ------------------------------------------------------------------------------


def decode_batch(model, seq_ids, tokens, positions):
    return build_decode_batch(model.cache, seq_ids, tokens, positions, [True] * len(seq_ids))


def greedy_rows(n: int) -> SamplingRows:
    return SamplingRows.from_rows([(0.0, 0, 1.0, 0.0, 0.0)] * n)


@pytest.fixture
def two_sequences(model):
    """Two sequences with 5 prompt tokens cached and room for 3 more tokens each."""
    cache = model.cache
    ids = [901, 902]
    for seq_id in ids:
        cache.add_sequence(seq_id)
        assert cache.reserve(seq_id, 8)
    prompt = prompt_of(5)
    model.runner.execute(build_step_batch(cache, [SeqSlice(s, prompt, 0, True) for s in ids]))
    yield ids
    for seq_id in ids:
        cache.free_sequence(seq_id)
    cache.release_fenced()


def test_a_following_step_takes_its_token_ids_from_the_step_before(model, two_sequences):
    runner, ids = model.runner, two_sequences
    first = runner.execute_sampled(decode_batch(model, ids, [11, 12], [5, 5]), greedy_rows(2))
    waited = runner.execute_sampled(decode_batch(model, ids, list(first), [6, 6]), greedy_rows(2))
    # the same two steps again, the second launched before the first's tokens are read
    before = runner.launch_sampled(decode_batch(model, ids, [11, 12], [5, 5]), greedy_rows(2))
    ahead = runner.launch_sampled(decode_batch(model, ids, [0, 0], [6, 6]), greedy_rows(2), follows=before)
    assert list(runner.collect(before)) == list(first)
    assert list(runner.collect(ahead)) == list(waited)


def test_the_runner_refuses_steps_out_of_order(model, two_sequences):
    runner, ids = model.runner, two_sequences
    one = runner.launch_sampled(decode_batch(model, ids, [11, 12], [5, 5]), greedy_rows(2))
    with pytest.raises(ValueError, match="overwrite"):
        runner.launch_sampled(decode_batch(model, ids, [11, 12], [6, 6]), greedy_rows(2))
    with pytest.raises(ValueError, match="overwrite"):
        runner.execute(decode_batch(model, ids, [11, 12], [6, 6]))
    with pytest.raises(ValueError, match="one position earlier"):
        runner.launch_sampled(decode_batch(model, ids, [0, 0], [7, 7]), greedy_rows(2), follows=one)
    two = runner.launch_sampled(decode_batch(model, ids, [0, 0], [6, 6]), greedy_rows(2), follows=one)
    with pytest.raises(ValueError, match="oldest"):
        runner.collect(two)
    with pytest.raises(ValueError, match="only one not yet collected"):
        runner.launch_sampled(decode_batch(model, ids, [0, 0], [7, 7]), greedy_rows(2), follows=one)
    runner.collect(one)
    runner.collect(two)
    with pytest.raises(ValueError, match="oldest"):
        runner.collect(two)  # each once


class SlowRunner(WatchingRunner):
    """Each step's tokens come `delay` seconds after they are asked for, as from a device still computing; each
    launch takes `host_delay` seconds of host work (building the batch, queueing kernels)."""

    def __init__(self, runner, delay: float, host_delay: float = 0.0):
        super().__init__(runner)
        self.delay, self.host_delay = delay, host_delay

    def launch_sampled(self, batch, sampling, follows=None):
        import time

        time.sleep(self.host_delay)
        return super().launch_sampled(batch, sampling, follows)

    def collect(self, pending):
        import time

        time.sleep(self.delay)
        return super().collect(pending)


@pytest.mark.parametrize("delay", [0.0, 0.004])
def test_the_engine_counts_its_prompt_steps_and_its_waits_for_the_device(model, delay):
    """EngineStats.device_wait_seconds is the time spent reading launched steps' tokens (what serve's /metrics
    reports to tell a device-bound engine from a host-bound one), prompt_steps the steps with prompt tokens.
    The bounds hold however slow the host is: every wait is counted, and no launch's host work is."""
    host_delay = 0.003
    runner = SlowRunner(model.runner, delay, host_delay)
    engine = Engine(runner, model.tokenizer, model.cache, max_seqs=8, max_step_tokens=8, overlap=True)
    engine.submit(prompt_of(20), greedy(12, ignore_eos=True))  # its prompt in steps of 8, 8 and 4 tokens
    engine.run_until_idle()
    model.engine = engine
    assert_quiescent(model, model.baseline)
    stats = engine.stats
    assert stats.prompt_steps == 3 and stats.prompt_tokens == 20
    assert runner.collected == stats.steps
    # The launches' host work is inside Engine.step but not a wait for the device.
    assert stats.device_wait_seconds <= stats.step_seconds - host_delay * runner.launched
    if delay:
        assert stats.device_wait_seconds >= delay * runner.collected  # the engine waited on the "device"
    else:
        assert stats.device_wait_seconds < 0.004 * runner.collected
