"""Sampling on the device (hipcore/ops/sample.py) picks what the host Sampler picks, for the same seeds.

On the cpu backend the sample op runs its host kernel (the same rules as kernels/sample.hip, which
tests/test_kernels_emulated.py holds to them); these tests check the rules against Sampler itself and
the plumbing through the runner and the engine: one uniform per token from the request's own seeded
generator, per-row parameters in the packed step inputs, the host fallbacks.
"""

from __future__ import annotations

import numpy as np
import pytest

from support.engine_testing import load_tiny, prompt_of, tiny_model
from hipcore.ops import sample
from hipcore.ops.sample import SamplingRows
from hipcore.engine.sampler import Sampler, SamplingParams, device_samplable

PARAMS = [
    SamplingParams(temperature=0.8, seed=1),  # llama.cpp's defaults: top_k 40, top_p 0.95, min_p 0.05
    SamplingParams(temperature=1.3, top_k=200, top_p=0.9, min_p=0.0, seed=2),
    SamplingParams(temperature=0.5, top_k=5, top_p=1.0, min_p=0.0, seed=3),
    SamplingParams(temperature=2.0, top_k=1024, top_p=1.0, min_p=0.2, seed=4),
    SamplingParams(temperature=1.0, top_k=64, top_p=0.5, min_p=0.1, seed=5),
    SamplingParams(temperature=0.0, seed=6),
    SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=7),  # OpenAI's defaults: every token
    SamplingParams(temperature=0.7, top_k=0, top_p=1.0, min_p=0.05, seed=8),
]


def test_device_samplable_says_what_stays_on_the_host():
    assert device_samplable(SamplingParams(temperature=0.0))
    assert device_samplable(SamplingParams(temperature=0.7, top_k=40))
    assert device_samplable(SamplingParams(temperature=0.7, top_k=sample.MAX_TOP_K))
    assert not device_samplable(SamplingParams(temperature=0.7, top_k=0, top_p=0.9))  # needs a full sort
    assert device_samplable(SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0))  # the whole vocabulary
    assert device_samplable(SamplingParams(temperature=0.7, top_k=0, top_p=1.0, min_p=0.1))
    assert not device_samplable(SamplingParams(temperature=0.7, top_k=sample.MAX_TOP_K + 1))
    assert not device_samplable(SamplingParams(temperature=0.7, repeat_penalty=1.1))  # needs the history
    assert not device_samplable(SamplingParams(temperature=0.0, presence_penalty=0.5))
    assert device_samplable(SamplingParams(temperature=0.7, repeat_penalty=1.1, repeat_last_n=0))  # penalties off


def test_op_picks_what_sampler_picks_for_many_seeds(cpu_device):
    rng = np.random.default_rng(0)
    vocab, rows = 5000, 24
    out = cpu_device.allocate(rows * 4, "scratch")
    logits_buf = cpu_device.allocate(rows * vocab * 4, "activations")
    params_buf = cpu_device.allocate(rows * sample.PARAMS_PER_ROW * 4, "scratch")
    try:
        agree = total = differs_from_greedy = 0
        for trial in range(8):
            logits = (rng.standard_normal((rows, vocab)) * rng.uniform(1, 6)).astype(np.float32)
            chosen = [PARAMS[(trial + i) % len(PARAMS)] for i in range(rows)]
            chosen = [SamplingParams(**{**p.__dict__, "seed": 1000 * trial + i}) for i, p in enumerate(chosen)]
            host = [Sampler(p) for p in chosen]
            twins = [Sampler(p) for p in chosen]  # the same seeds: the device path's uniforms
            want = [s.sample(row) for s, row in zip(host, logits)]
            rows_in = SamplingRows.build(chosen, [0.0 if p.greedy else t.next_uniform() for p, t in zip(chosen, twins)])
            packed = np.zeros((rows, sample.PARAMS_PER_ROW), dtype=np.float32)
            rows_in.pack_into(packed)
            logits_buf.upload(logits)
            params_buf.upload(packed)
            sample.launch(cpu_device, None, out, logits_buf, params_buf, rows, vocab)
            got = out.download(np.int32)
            agree += int(np.sum(got == np.array(want)))
            total += rows
            differs_from_greedy += int(np.sum(got != logits.argmax(axis=1)))
        assert agree == total
        assert differs_from_greedy > total // 4  # the draws matter: this is not greedy in disguise
    finally:
        for buf in (out, logits_buf, params_buf):
            buf.free()


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    with load_tiny(tiny_model(tmp_path_factory), max_seqs=4, kv_blocks=64) as loaded:
        yield loaded


class HostSamplingRunner:
    """The same runner without execute_sampled: the engine then samples every token on the host."""

    def __init__(self, runner):
        self._runner = runner

    def __getattr__(self, name):
        if name == "execute_sampled":
            raise AttributeError(name)
        return getattr(self._runner, name)


class CountingRunner:
    """Counts the steps sampled on the host (logits) and on the device. Every runner method is defined here:
    from Python 3.12 on, isinstance() against a Protocol does not look through __getattr__."""

    def __init__(self, runner):
        self._runner, self.sampled_steps, self.logit_steps = runner, 0, 0
        self.config = runner.config

    def __getattr__(self, name):
        return getattr(self._runner, name)

    def execute(self, batch):
        self.logit_steps += 1
        return self._runner.execute(batch)

    def execute_sampled(self, batch, sampling):
        self.sampled_steps += 1
        return self._runner.execute_sampled(batch, sampling)

    def launch_sampled(self, batch, sampling, follows=None):  # the engine's overlapped steps sample here
        self.sampled_steps += 1
        return self._runner.launch_sampled(batch, sampling, follows)

    def collect(self, pending):
        return self._runner.collect(pending)


def generate_all(model, runner, requests) -> list[tuple[int, ...]]:
    engine = model.engine
    saved = engine.runner
    engine.runner = runner
    try:
        ids = [engine.submit(prompt, params) for prompt, params in requests]
        engine.run_until_idle()
        return [engine.finished_record(i).generated_tokens[0] for i in ids]
    finally:
        engine.runner = saved


def test_engine_tokens_equal_host_sampling_for_the_same_seeds(model):
    requests = [(prompt_of(5 + 3 * i, salt=i), SamplingParams(**{**PARAMS[i % len(PARAMS)].__dict__, "max_tokens": 12}))
                for i in range(8)]
    counting = CountingRunner(model.runner)
    on_device = generate_all(model, counting, requests)
    on_host = generate_all(model, HostSamplingRunner(model.runner), requests)
    assert on_device == on_host
    assert counting.sampled_steps > 10 and counting.logit_steps == 0
    assert len({t for tokens in on_device for t in tokens}) > 20  # varied sampled output, not a fixed point


def test_engine_falls_back_to_host_sampling_where_the_device_cannot(model):
    counting = CountingRunner(model.runner)
    penalized = SamplingParams(temperature=0.9, repeat_penalty=1.3, seed=11, max_tokens=6)
    full_sort = SamplingParams(temperature=0.9, top_k=0, top_p=0.8, seed=12, max_tokens=6)
    forked = SamplingParams(temperature=0.9, seed=13, max_tokens=6, n=2)
    tokens = generate_all(model, counting, [(prompt_of(6), penalized), (prompt_of(7, 1), full_sort)])
    assert counting.logit_steps > 0 and counting.sampled_steps == 0
    assert tokens == generate_all(model, HostSamplingRunner(model.runner), [(prompt_of(6), penalized),
                                                                           (prompt_of(7, 1), full_sort)])
    # A prompt that forks into parallel samples draws them all from its logits on the host; their later
    # tokens come from the device.
    counting = CountingRunner(model.runner)
    engine = model.engine
    engine.runner = counting
    try:
        rid = engine.submit(prompt_of(9, 2), forked)
        engine.run_until_idle()
    finally:
        engine.runner = model.runner
    record = engine.finished_record(rid)
    assert len(record.generated_tokens) == 2 and all(len(t) == 6 for t in record.generated_tokens)
    assert counting.logit_steps == 1 and counting.sampled_steps == 5
