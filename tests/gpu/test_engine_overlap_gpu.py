"""Overlapped decode steps on a real GPU (run with `pytest -m gpu tests/gpu`): the engine launches the next
decode step before it reads this one's tokens, the token ids copied on the device and the tokens read on a
stream of their own (hipcore/engine/step_launch.py). The cpu backend's tests run that path with the work done
at once; here the device really runs ahead of the host, so a missing ordering between the copies and the
steps would show as different tokens.

The model: $ROCMFORGE_DEMO_MODEL, else the installed demo model (random weights of its shape serve too).
"""

from __future__ import annotations

import pytest

from test_model_gpu import model_path

from hipcore.engine.engine import Engine
from hipcore.engine.loader import LoadOptions, load_model
from hipcore.engine.request import Ending
from hipcore.engine.sampler import SamplingParams

pytestmark = pytest.mark.gpu


class FollowCounter:
    """The model's runner, counting the steps launched to follow another. Every method of the runner protocols
    is defined here: from Python 3.12 on, isinstance() against a Protocol does not look through __getattr__."""

    def __init__(self, runner):
        self._runner, self.followed, self.config = runner, 0, runner.config

    def __getattr__(self, name):
        return getattr(self._runner, name)

    def execute(self, batch):
        return self._runner.execute(batch)

    def execute_sampled(self, batch, sampling):
        return self._runner.execute_sampled(batch, sampling)

    def launch_sampled(self, batch, sampling, follows=None):
        self.followed += follows is not None
        return self._runner.launch_sampled(batch, sampling, follows)

    def collect(self, pending):
        return self._runner.collect(pending)


def test_overlapped_steps_give_the_tokens_of_waiting_steps(gpu):
    requests = [([1, 9690, 198, 200 + i], SamplingParams(temperature=0.0 if i % 2 else 0.9, seed=i, max_tokens=24 + 5 * i,
                                                         ignore_eos=True)) for i in range(12)]
    with load_model(model_path(), LoadOptions(max_seqs=16, ctx_size=512), device=gpu) as loaded:
        results = {}
        for overlap in (False, True, False, True):
            runner = FollowCounter(loaded.runner)
            engine = Engine(runner, loaded.tokenizer, loaded.cache, max_seqs=16, max_step_tokens=256, overlap=overlap)
            ids = [engine.submit(p, params) for p, params in requests]
            engine.run_until_idle()
            records = [engine.finished_record(i) for i in ids]
            assert [r.ending for r in records] == [Ending.LENGTH] * len(records)
            assert loaded.cache.num_free_blocks == loaded.cache.num_usable_blocks
            results.setdefault(overlap, []).append([r.generated_tokens[0] for r in records])
            assert (runner.followed > 50) == overlap, f"overlap {overlap}: {runner.followed} steps followed another"
        runs = [results[False][0], results[True][0], results[False][1], results[True][1]]
        for i, tokens in enumerate(runs[1:], 1):
            differ = [(k, next(j for j, (a, b) in enumerate(zip(x, y)) if a != b))
                      for k, (x, y) in enumerate(zip(runs[0], tokens)) if x != y]
            assert not differ, f"run {i} (overlap {i % 2 == 1}) differs from run 0: (request, first token) {differ}"
        assert len({t for r in runs[1] for t in r}) > 10  # varied output, not one repeated token
