"""A server's warm-up (hipcore/engine/warmup.py) on the cpu backend: a decode step of every batch-size class up to
the parallel sequences, the prompt-step shapes brought to their bound, and nothing of it left in the counters or the
finished records."""

from __future__ import annotations

import collections

import pytest

from support.engine_testing import assert_quiescent, greedy, kv_bytes, load_tiny, prompt_of, tiny_model

from hipcore.engine.warmup import LADDER_NEW_TOKENS, batch_ladder, prompt_ladder, warm_up


@pytest.fixture(scope="module")
def path(tmp_path_factory):
    return tiny_model(tmp_path_factory)


def test_the_ladder_is_every_power_of_two_and_the_parallel_count():
    assert batch_ladder(1) == [1]
    assert batch_ladder(8) == [1, 2, 4, 8]
    assert batch_ladder(6) == [1, 2, 4, 6]
    assert batch_ladder(33) == [1, 2, 4, 8, 16, 32, 33]
    with pytest.raises(ValueError):
        batch_ladder(0)


def test_the_prompt_ladder_reaches_a_whole_step():
    assert prompt_ladder(2048, 4096) == [16, 64, 256, 1024, 2048]
    assert prompt_ladder(512, 300) == [16, 64, 256, 300 - LADDER_NEW_TOKENS]
    assert prompt_ladder(16, 4096) == [16]
    assert prompt_ladder(8, 4096) == [8]


def record_steps(model, monkeypatch) -> tuple[collections.Counter, collections.Counter]:
    """Steps the runner runs from now on (every way the engine runs one): decode steps by their number of
    sequences, the others by their number of tokens."""
    decode: collections.Counter = collections.Counter()
    prompt: collections.Counter = collections.Counter()
    runner = model.engine.runner
    for name in ("execute", "execute_sampled", "launch_sampled"):
        original = getattr(runner, name)

        def recording(batch, *args, _original=original, **kwargs):
            if batch.is_decode_only:
                decode[batch.num_seqs] += 1
            else:
                prompt[batch.num_tokens] += 1
            return _original(batch, *args, **kwargs)
        monkeypatch.setattr(runner, name, recording)
    return decode, prompt


@pytest.mark.parametrize("parallel", [8, 6])
def test_every_batch_class_decodes_together_and_nothing_is_left(path, monkeypatch, parallel):
    with load_tiny(path, max_seqs=parallel, kv_blocks=64) as model:
        before = kv_bytes(model)
        filled = []
        monkeypatch.setattr(model.engine.runner, "fill_prompt_caches", lambda: filled.append(1) or 5)
        steps, prompts = record_steps(model, monkeypatch)
        done = warm_up(model.engine, parallel)
        assert done.batch_sizes == batch_ladder(parallel)
        for size in done.batch_sizes:  # each class's requests decoded together, more than once
            assert steps[size] >= LADDER_NEW_TOKENS - 1, (size, dict(steps))
        engine = model.engine
        assert done.prompt_lengths == prompt_ladder(engine.scheduler.max_step_tokens, engine.max_context) == [16, 64]
        for length in done.prompt_lengths:  # each prompt evaluated in one step of its own
            assert prompts[length] >= 1, (length, dict(prompts))
        assert filled == [1] and done.prompt_shapes == 5
        stats = model.engine.stats
        assert (stats.steps, stats.generated_tokens, stats.prompt_tokens, sum(stats.endings.values())) == (0, 0, 0, 0)
        assert model.engine.finished_records() == []
        assert_quiescent(model, before)
        # and the engine serves as before
        rid = model.engine.submit(prompt_of(5), greedy(3))
        model.engine.run_until_idle()
        assert model.engine.finished_record(rid) is not None and model.engine.stats.generated_tokens == 3


def test_the_ladder_stops_at_the_engines_sequences(path, monkeypatch):
    with load_tiny(path, max_seqs=4, kv_blocks=64) as model:
        steps, _ = record_steps(model, monkeypatch)
        assert warm_up(model.engine, 32).batch_sizes == [1, 2, 4]
        assert max(steps) == 4


def test_a_busy_engine_is_refused(path):
    with load_tiny(path, kv_blocks=64) as model:
        rid = model.engine.submit(prompt_of(4), greedy(2))
        with pytest.raises(ValueError, match="idle"):
            warm_up(model.engine, 4)
        with pytest.raises(ValueError, match="idle"):
            model.engine.forget_history()
        model.engine.run_until_idle()
        assert model.engine.finished_record(rid) is not None
