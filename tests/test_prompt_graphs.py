"""Prompt and mixed steps padded to recurring shapes and replayed from graphs (hipcore/model/prompt_graphs.py), on
the cpu backend, whose capture and replay exist too: a replay gives what the same padded launches give eagerly,
bit for bit, and what the unpadded step gives within float rounding; it reads every per-step value from the step
inputs (a second batch of the same shape); a shape is captured at its third step and replayed from its fourth;
graphs are bounded with their plans; and the padding steps leak-check's warm-up runs store nothing."""

from __future__ import annotations

import numpy as np
import pytest

from support.engine_testing import load_tiny, prompt_of, tiny_model
from support.model_steps import step_batch
from hipcore.engine.sampler import SamplingParams
from hipcore.model import forward
from hipcore.model.forward import ModelRunner
from hipcore.model.prompt_graphs import PROMPT_GRAPH_MAX_TOKENS, padded_shape, padded_shapes
from hipcore.model.step_inputs import StepInputs
from hipcore.ops.sample import SamplingRows


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    with load_tiny(tiny_model(tmp_path_factory), max_seqs=8, kv_blocks=80, block_size=4, max_step_tokens=64) as loaded:
        yield loaded


def runner_of(model, *, graphs: bool, pad: bool) -> ModelRunner:
    """Another runner on the model's weights and cache (the fixture's own keeps the graphs it made)."""
    runner = ModelRunner(model.device, model.config, model.weights, model.cache, max_step_tokens=64, max_seqs=8,
                         use_graphs=graphs)
    runner.pad_prompt_steps = pad
    return runner


def free_all(cache, seq_ids) -> None:
    for seq_id in seq_ids:
        if cache.has_sequence(seq_id):
            cache.free_sequence(seq_id)
    cache.release_fenced()


def test_shapes_pad_tokens_to_sixteen_and_rows_to_a_decode_bucket():
    assert padded_shape(31, 1, 512, 64) == (32, 1)
    assert padded_shape(55, 25, 512, 64) == (64, 32)
    assert padded_shape(40, 0, 512, 64) == (48, 0)  # prompt chunks alone: no logits rows
    assert padded_shape(PROMPT_GRAPH_MAX_TOKENS + 1, 1, 512, 64) is None  # larger steps keep their own shape
    assert padded_shape(60, 1, 48, 64) is None and padded_shape(20, 20, 512, 16) is None  # past the buffers
    shapes = padded_shapes(64, 8)
    assert len(shapes) == len(set(shapes))
    reachable = {padded_shape(t, r, 64, 8) for t in range(1, 65) for r in range(0, min(t, 8) + 1)}
    assert set(shapes) == reachable


def mixed_batch(cache, salt: int):
    """Sequence 1 (prefilled with 5 tokens) decodes one token while sequences 2 and 3 bring 9- and 7-token
    prompts: 17 tokens, 3 logits rows, padded to (32, 4)."""
    step_batch(cache, [(1, prompt_of(5, salt), 0)])
    return step_batch(cache, [(1, [7 + salt], 5), (2, prompt_of(9, salt + 1), 0), (3, prompt_of(7, salt + 2), 0)])


def sampling_rows(salt: int) -> SamplingRows:
    params = [SamplingParams(temperature=0.8, top_k=20, seed=salt + i) for i in range(3)]
    return SamplingRows.build(params, np.array([0.1, 0.5, 0.9]))


def test_a_replayed_mixed_step_equals_the_eager_one(model):
    cache = model.cache
    graph_runner = runner_of(model, graphs=True, pad=True)
    padded_eager = runner_of(model, graphs=False, pad=True)
    unpadded = runner_of(model, graphs=False, pad=False)
    try:
        for salt in (0, 40):  # the second batch: the same shape, other tokens (replayed, nothing frozen in)
            batch = mixed_batch(cache, salt)
            assert graph_runner.padded_prompt_shape(batch.num_tokens, len(batch.sample_rows)) == (32, 4)
            want = padded_eager.execute(batch)
            for _ in range(3):  # (each run writes the same K/V to the same slots)
                np.testing.assert_array_equal(graph_runner.execute(batch), want)
            np.testing.assert_allclose(unpadded.execute(batch), want, rtol=1e-4, atol=1e-4)
            tokens = padded_eager.execute_sampled(batch, sampling_rows(salt))
            for _ in range(3):
                np.testing.assert_array_equal(graph_runner.execute_sampled(batch, sampling_rows(salt)), tokens)
            free_all(cache, (1, 2, 3))
        # per flavour (logits, tokens): eager at the first two steps, captured at the third, replayed after
        assert graph_runner.prompt_graphs.captures == 2 and graph_runner.prompt_graphs.replays == 6
        assert padded_eager.prompt_graphs.captures == 0 and len(padded_eager.prompt_graphs) == 0
    finally:
        for runner in (graph_runner, padded_eager, unpadded):
            runner.close()


def test_graphs_are_bounded_with_their_plans_and_destroyed_with_the_runner(model):
    device = model.device
    before = device.handle_counts()["graphs"]
    runner = runner_of(model, graphs=True, pad=True)
    try:
        shapes = runner.fill_prompt_caches()
        assert shapes == forward.PROMPT_PLAN_CACHE_SIZE + 1
        assert len(runner._prompt_plans) == len(runner.prompt_graphs) == forward.PROMPT_PLAN_CACHE_SIZE
        assert set(runner.prompt_graphs._graphs) == set(runner._prompt_plans)  # a dropped plan took its graph
        assert device.handle_counts()["graphs"] == before + forward.PROMPT_PLAN_CACHE_SIZE
        runner.fill_prompt_caches()  # again: shapes turn over, nothing grows
        assert device.handle_counts()["graphs"] == before + forward.PROMPT_PLAN_CACHE_SIZE
    finally:
        runner.close()
    assert device.handle_counts()["graphs"] == before


def pools(model) -> list[bytes]:
    out = []
    for buf in [*model.cache.k_pools, *model.cache.v_pools]:
        host = np.empty(buf.nbytes, dtype=np.uint8)
        model.device.copy_device_to_host(host, buf)
        out.append(host.tobytes())
    return out


def test_steps_of_padding_alone_store_nothing_in_the_cache(model, monkeypatch):
    cache = model.cache
    step_batch(cache, [(9, prompt_of(12, 3), 0)])
    runner = runner_of(model, graphs=True, pad=True)
    try:
        runner.execute(step_batch(cache, [(9, prompt_of(12, 3), 0)]))
        held = pools(model)
        runner.fill_prompt_caches()
        assert pools(model) == held
        # planted: padding rows that store into a block of the pool (block 1's first slot) instead of skipping
        original = StepInputs.pack_padding

        def storing(self, tokens, rows, *, stream):
            original(self, tokens, rows, stream=stream)
            self.slots[:tokens] = cache.config.block_size
            self.buffer.upload(self.words[:self.offsets["block_tables"]], stream=stream)

        monkeypatch.setattr(StepInputs, "pack_padding", storing)
        runner.close()
        runner = runner_of(model, graphs=True, pad=True)
        runner.fill_prompt_caches()
        assert pools(model) != held
    finally:
        runner.close()
        free_all(cache, (9,))
