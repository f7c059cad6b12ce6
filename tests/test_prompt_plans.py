"""The runner keeps the launch plans of prompt steps too (hipcore/model/forward.py: PROMPT_PLAN_CACHE_SIZE), on
the cpu backend with a small Llama-shaped model: a plan reused for a prompt of the same shape gives the logits a
fresh runner gives, a decode step and a prompt step of the same shape get plans of their own, and the kept plans
stay bounded however many shapes come."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from hipcore.engine.loader import LoadOptions, load_model
from hipcore.model import forward
from support.model_steps import step_batch
from test_synthetic_models import write_small, write_tiktoken  # also puts scripts/models/ on sys.path


@pytest.fixture(scope="module")
def model_path(tmp_path_factory) -> Path:
    work = tmp_path_factory.mktemp("prompt_plans")
    return write_small(work, write_tiktoken(work / "tokenizer.model"), "Q8_0", "Llama-3.2-1B")


def prompt_logits(loaded, seq_id: int, tokens: list[int]) -> np.ndarray:
    logits = loaded.runner.execute(step_batch(loaded.cache, [(seq_id, tokens, 0)]))
    loaded.cache.free_sequence(seq_id)
    loaded.cache.release_fenced()
    return logits


def test_a_kept_prompt_plan_gives_a_fresh_runners_logits(model_path):
    options = LoadOptions(device="cpu", max_seqs=2, max_step_tokens=16, ctx_size=64)
    first, second = [260, 259, 32, 104, 101, 108], [301, 77, 9, 500, 5, 42]
    with load_model(str(model_path), options) as loaded:
        prompt_logits(loaded, 1, first)
        kept = dict(loaded.runner._prompt_plans)
        reused = prompt_logits(loaded, 2, second)  # same shape: the plan of the first prompt
        assert dict(loaded.runner._prompt_plans) == kept and len(kept) == 1
    with load_model(str(model_path), options) as fresh:
        np.testing.assert_array_equal(reused, prompt_logits(fresh, 2, second))


def test_decode_and_prompt_plans_of_one_shape_are_apart_and_prompt_plans_are_bounded(model_path):
    with load_model(str(model_path), LoadOptions(device="cpu", max_seqs=2, max_step_tokens=32, ctx_size=64)) as loaded:
        runner = loaded.runner
        prompt = runner.launch_plan(2, 2, all_rows=True, with_sampling=False, decode=False)
        decode = runner.launch_plan(2, 2, all_rows=True, with_sampling=False, decode=True)
        assert prompt is not decode
        assert runner.launch_plan(2, 2, all_rows=True, with_sampling=False, decode=False) is prompt
        for t in range(3, 3 + 2 * forward.PROMPT_PLAN_CACHE_SIZE):
            runner.launch_plan(t, 1, all_rows=False, with_sampling=False, decode=False)
        assert len(runner._prompt_plans) == forward.PROMPT_PLAN_CACHE_SIZE
        assert (2, 2, True, False, False) not in runner._prompt_plans  # the least recently used went first
        assert (2, 2, True, False, True) in runner._plans  # decode plans stay
