"""Cancel at every point of a request's life, through the engine's one release path.

Each test counts the KV cache's free_sequence calls per sequence: every sequence of a cancelled
request is released exactly once (never twice: the bug of a second release is what makes reference
counts underflow), the cache ends quiescent, and a request running beside it is unaffected.
"""

from __future__ import annotations

import pytest

from support.engine_testing import (
    assert_quiescent, count_releases, drain_events, greedy, kv_bytes, load_tiny, prompt_of, run_alone, tiny_model,
)

from hipcore.engine.engine import EngineHooks
from hipcore.engine.request import CancelResult, Ending, Phase

BESIDE = (prompt_of(21, salt=70), 12)  # a request that runs next to the cancelled one


@pytest.fixture(scope="module")
def path(tmp_path_factory):
    return tiny_model(tmp_path_factory)


@pytest.fixture(scope="module")
def beside_alone(path):
    with load_tiny(path, kv_blocks=64) as model:
        return run_alone(model, BESIDE[0], greedy(BESIDE[1])).generated_tokens


@pytest.fixture
def model(path):
    """max_step_tokens 16 so that prompts are chunked; releases counted per sequence id."""
    with load_tiny(path, max_seqs=4, max_step_tokens=16, kv_blocks=48) as loaded:
        loaded.releases = count_releases(loaded)
        loaded.baseline = kv_bytes(loaded)
        yield loaded


def finish(model, rid: int, beside_id: int, beside_alone) -> None:
    """Run to the end; check the cancelled request was released once and the other is unharmed."""
    model.engine.run_until_idle()
    record = model.engine.finished_record(rid)
    assert all(model.releases[s] <= 1 for s in record.seq_ids)
    assert all(model.releases[s] == 1 for s in record.seq_ids if record.phase_at_end != Phase.WAITING)
    assert model.engine.finished_record(beside_id).generated_tokens == beside_alone
    assert_quiescent(model, model.baseline)


def test_cancel_before_the_first_step(model, beside_alone):
    beside = model.engine.submit(BESIDE[0], greedy(BESIDE[1]))
    rid = model.engine.submit(prompt_of(9), greedy(5))
    assert model.engine.cancel(rid) == CancelResult.CANCELLED
    model.engine.step()
    record = model.engine.finished_record(rid)
    assert (record.ending, record.phase_at_end, record.generated_tokens) == (Ending.CANCELLED, Phase.WAITING, ((),))
    finish(model, rid, beside, beside_alone)


def test_cancel_while_waiting_for_room(model, beside_alone):
    """max_seqs 4: the fifth request waits while four run; cancelled there, it never took a block."""
    beside = model.engine.submit(BESIDE[0], greedy(BESIDE[1]))
    others = [model.engine.submit(prompt_of(3, salt=i), greedy(12)) for i in range(3)]
    rid = model.engine.submit(prompt_of(4), greedy(5))
    for _ in range(4):
        model.engine.step()
    assert len(model.engine.scheduler.running) == 4
    assert model.engine.request(rid).phase == Phase.WAITING
    assert model.engine.cancel(rid) == CancelResult.CANCELLED
    model.engine.step()
    record = model.engine.finished_record(rid)
    assert (record.ending, record.phase_at_end) == (Ending.CANCELLED, Phase.WAITING)
    assert all(model.releases[s] == 0 for s in record.seq_ids)  # it never held blocks
    finish(model, rid, beside, beside_alone)
    assert all(model.engine.finished_record(o).ending == Ending.LENGTH for o in others)


def test_cancel_mid_prompt(model, beside_alone):
    rid = model.engine.submit(prompt_of(50), greedy(5))
    beside = model.engine.submit(BESIDE[0], greedy(BESIDE[1]))
    model.engine.step()
    model.engine.step()
    request = model.engine.request(rid)
    assert request.phase == Phase.PROMPT and 0 < request.seqs[0].num_cached < 50  # part of the prompt is cached
    assert model.cache.has_sequence(request.seqs[0].seq_id)
    assert model.engine.cancel(rid) == CancelResult.CANCELLED
    model.engine.step()
    record = model.engine.finished_record(rid)
    assert (record.ending, record.phase_at_end) == (Ending.CANCELLED, Phase.PROMPT)
    assert not model.cache.has_sequence(record.seq_ids[0])
    finish(model, rid, beside, beside_alone)


def test_cancel_mid_decode(model, beside_alone):
    rid = model.engine.submit(prompt_of(7), greedy(20))
    beside = model.engine.submit(BESIDE[0], greedy(BESIDE[1]))
    for _ in range(4):
        model.engine.step()
    assert model.engine.request(rid).phase == Phase.DECODE
    assert model.engine.cancel(rid) == CancelResult.CANCELLED
    model.engine.step()
    record = model.engine.finished_record(rid)
    assert (record.ending, record.phase_at_end) == (Ending.CANCELLED, Phase.DECODE)
    assert len(record.generated_tokens[0]) == 4  # one token per step, none after the cancel
    finish(model, rid, beside, beside_alone)


def test_cancel_just_before_the_step_that_would_finish_it(model, beside_alone):
    rid = model.engine.submit(prompt_of(7), greedy(3))
    beside = model.engine.submit(BESIDE[0], greedy(BESIDE[1]))
    model.engine.step()
    model.engine.step()
    assert len(model.engine.request(rid).seqs[0].generated) == 2
    assert model.engine.cancel(rid) == CancelResult.CANCELLED
    model.engine.step()
    record = model.engine.finished_record(rid)
    assert record.ending == Ending.CANCELLED and len(record.generated_tokens[0]) == 2
    finish(model, rid, beside, beside_alone)


def test_cancel_during_the_step_in_which_it_finishes(model, beside_alone):
    """Another thread cancels while the step that computes the request's last token is under way
    (here: from the engine's hook that is asked as the step's tokens are read; a decode step left running
    is read in the next step() call): the request ends by max tokens with that step, and the queued cancel
    finds it gone (no second release)."""
    rid = model.engine.submit(prompt_of(7), greedy(3))
    beside = model.engine.submit(BESIDE[0], greedy(BESIDE[1]))
    model.engine.step()
    model.engine.step()
    assert len(model.engine.request(rid).seqs[0].generated) == 2
    answers = []

    def cancel_mid_step(requests) -> bool:
        answers.append(model.engine.cancel(rid))
        return False  # and let the forward pass run

    model.engine.hooks = EngineHooks(fail_step=cancel_mid_step)
    for _ in range(2):  # the step is launched, and read in this call or the next
        model.engine.step()
        if answers:
            break
    model.engine.hooks = EngineHooks()
    assert answers[:1] == [CancelResult.CANCELLED]  # it was still running when asked
    record = model.engine.finished_record(rid)
    assert record.ending == Ending.LENGTH and len(record.generated_tokens[0]) == 3
    model.engine.step()  # drains the stale cancel: a no-op
    assert model.engine.finished_record(rid) == record
    assert model.engine.cancel(rid) == CancelResult.ALREADY_FINISHED
    finish(model, rid, beside, beside_alone)


def test_cancel_after_finish_unknown_and_twice_are_no_ops(model, beside_alone):
    beside = model.engine.submit(BESIDE[0], greedy(BESIDE[1]))
    done = model.engine.submit(prompt_of(5), greedy(2))
    model.engine.run_until_idle()
    record = model.engine.finished_record(done)
    releases = dict(model.releases)
    assert model.engine.cancel(done) == CancelResult.ALREADY_FINISHED
    assert model.engine.cancel(10_000) == CancelResult.UNKNOWN
    assert model.engine.step() == []
    assert model.engine.finished_record(done) == record and dict(model.releases) == releases

    rid = model.engine.submit(prompt_of(6), greedy(20))
    model.engine.step()
    first, second = model.engine.cancel(rid), model.engine.cancel(rid)
    assert first == CancelResult.CANCELLED and second in (CancelResult.CANCELLED, CancelResult.ALREADY_FINISHED)
    events = model.engine.step()
    assert [e.ending for e in events if e.request_id == rid and e.finished] == [Ending.CANCELLED]  # one final event
    assert model.engine.cancel(rid) == CancelResult.ALREADY_FINISHED
    assert model.engine.finished_record(beside).generated_tokens == beside_alone
    finish(model, rid, beside, beside_alone)


def test_cancelled_stream_ends_with_one_final_event(model, beside_alone):
    rid = model.engine.submit(prompt_of(7), greedy(20))
    beside = model.engine.submit(BESIDE[0], greedy(BESIDE[1]))
    request = model.engine.request(rid)
    for _ in range(3):
        model.engine.step()
    model.engine.cancel(rid)
    model.engine.step()
    events = drain_events(request)
    assert [e.finished for e in events].count(True) == 1 and events[-1].finished
    assert events[-1].ending == Ending.CANCELLED
    streamed = tuple(t for e in events for t in e.token_ids)
    assert streamed == model.engine.finished_record(rid).generated_tokens[0]
    finish(model, rid, beside, beside_alone)


def _stream_one_token(model, max_tokens: int = 40):
    stream = model.engine.generate(prompt_of(9, salt=3), greedy(max_tokens))
    first = next(stream)
    assert first.token_ids and not first.finished
    return stream, first.request_id


def _released_at_once(model, rid: int) -> None:
    """Cancelled, every block back, nothing left running: before another step is taken."""
    record = model.engine.finished_record(rid)
    assert record is not None and record.ending == Ending.CANCELLED
    assert len(record.generated_tokens[0]) < 40  # it did not run on to max_tokens
    assert all(model.releases[s] == 1 for s in record.seq_ids)
    assert not model.engine.has_work()
    assert_quiescent(model, model.baseline)


def test_a_stream_closed_by_its_consumer_cancels_and_frees_at_once(model):
    stream, rid = _stream_one_token(model)
    stream.close()
    _released_at_once(model, rid)


def test_breaking_out_of_a_stream_cancels_and_frees_at_once(model):
    rid = None
    for event in model.engine.generate(prompt_of(9, salt=3), greedy(40)):
        rid = event.request_id
        break  # the loop's generator is dropped here (CPython collects it at once)
    _released_at_once(model, rid)


def test_a_stream_garbage_collected_cancels_and_frees(model):
    import gc

    stream, rid = _stream_one_token(model)
    del stream
    gc.collect()
    _released_at_once(model, rid)


def test_an_exception_in_the_consumer_cancels_the_stream(model):
    rid = None
    with pytest.raises(KeyboardInterrupt):
        for event in model.engine.generate(prompt_of(9, salt=3), greedy(40)):
            rid = event.request_id
            raise KeyboardInterrupt
    _released_at_once(model, rid)


def test_a_stream_read_to_its_end_is_unchanged_by_closing(model):
    stream = model.engine.generate(prompt_of(9, salt=3), greedy(5))
    events = list(stream)
    stream.close()
    assert events[-1].finished and events[-1].ending == Ending.LENGTH
    assert model.engine.finished_record(events[-1].request_id).ending == Ending.LENGTH
    assert_quiescent(model, model.baseline)
