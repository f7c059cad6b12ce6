"""Graph-replayed decode (hipcore/model/decode_graphs.py) on the cpu backend, whose capture and replay
exist too: replay gives exactly what the same launches give eagerly, reads every per-step value from
the step-input buffer (nothing stale frozen into a graph), is captured once per bucket, allocates
nothing, and is destroyed on close."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from support.engine_testing import load_tiny, prompt_of, tiny_model
from hipcore.model.decode_graphs import BUCKETS, DecodeGraphs, bucket_capacity
from hipcore.model.forward import ModelRunner, activation_sizes
from hipcore.ops.sample import SamplingRows, mask_words
from hipcore.engine.sampler import SamplingParams
from support.model_steps import step_batch


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    with load_tiny(tiny_model(tmp_path_factory), max_seqs=8, kv_blocks=80, block_size=4) as loaded:
        yield loaded


@pytest.fixture
def eager(model):
    """A second runner on the same weights and cache that never captures (the same launches, eagerly)."""
    runner = ModelRunner(model.device, model.config, model.weights, model.cache, max_step_tokens=64, max_seqs=8,
                         use_graphs=False)
    yield runner
    runner.close()


def drive(model, eager, lengths: dict[int, int], steps: int, drop_after: dict[int, int]):
    """Prefill each sequence, then decode `steps` steps through both runners, asserting equal logits and
    tokens each step; sequence s leaves the batch after drop_after[s] steps (the batch shrinks)."""
    cache, graph_runner = model.cache, model.runner
    last = {}
    decode_runs = 0  # executions of decode-shaped steps on the graph runner
    for seq_id, n in lengths.items():
        batch = step_batch(cache, [(seq_id, prompt_of(n, seq_id), 0)])
        last[seq_id] = int(np.argmax(graph_runner.execute(batch)[0]))
        decode_runs += batch.is_decode_only
    pos = dict(lengths)
    for step in range(steps):
        live = [s for s in lengths if step < drop_after.get(s, steps)]
        batch = step_batch(cache, [(s, [last[s]], pos[s]) for s in live])
        assert batch.is_decode_only
        want = eager.execute(batch)
        got = graph_runner.execute(batch)
        assert np.array_equal(got, want), f"step {step}: replay differs from eager"
        params = [SamplingParams(temperature=0.9, top_k=20, seed=step * 10 + s) for s in live]
        sampling = SamplingRows.build(params, np.linspace(0.05, 0.95, len(live)))
        assert np.array_equal(graph_runner.execute_sampled(batch, sampling), eager.execute_sampled(batch, sampling))
        decode_runs += 2
        for i, s in enumerate(live):
            last[s] = int(np.argmax(got[i]))
            pos[s] += 1
    for s in lengths:
        cache.free_sequence(s)
    cache.release_fenced()
    return decode_runs


def test_replay_equals_eager_as_the_batch_changes(model, eager):
    graphs = model.runner.graphs
    before = model.device.ledger.total_bytes
    # Five sequences (bucket 8), shrinking to 3 (bucket 4) and 1 (bucket 1); block_size 4 makes the
    # block tables grow every few steps, so a table frozen into a graph would show.
    runs = drive(model, eager, {11: 3, 12: 9, 13: 1, 14: 6, 15: 4}, steps=9, drop_after={11: 3, 12: 3, 13: 6, 14: 6})
    assert {b for b in BUCKETS if graphs.captured(b)} == {1, 4, 8}
    assert graphs.captures == 3 and graphs.replays == runs - 3
    assert model.device.ledger.total_bytes == before  # capture and replay allocate nothing
    captures = graphs.captures
    drive(model, eager, {21: 2, 22: 5}, steps=3, drop_after={})  # bucket 2: one new capture
    assert graphs.captures == captures + 1 and graphs.captured(2)


def test_mixed_and_prompt_steps_run_eagerly_with_the_same_results(model, eager):
    cache = model.cache
    replays = model.runner.graphs.replays
    batch = step_batch(cache, [(31, prompt_of(5, 3), 0), (32, prompt_of(2, 4), 0)])
    assert not batch.is_decode_only
    assert np.array_equal(model.runner.execute(batch), eager.execute(batch))
    assert model.runner.graphs.replays == replays
    for s in (31, 32):
        cache.free_sequence(s)
    cache.release_fenced()


def test_buckets_and_capacity():
    assert bucket_capacity(1) == 1 and bucket_capacity(3) == 4 and bucket_capacity(64) == 64
    assert bucket_capacity(500) == 128
    graphs = DecodeGraphs.__new__(DecodeGraphs)
    graphs.buckets = (1, 2, 4, 8)
    assert [graphs.bucket_for(n) for n in (1, 2, 3, 5, 8, 9)] == [1, 2, 4, 8, 8, None]


def test_runner_memory_is_what_the_plan_counts_and_close_frees_graphs(model):
    cfg, cache = model.config, model.cache
    ledger = model.device.ledger
    before = ledger.total_bytes
    runner = ModelRunner(model.device, cfg, model.weights, cache, max_step_tokens=16, max_seqs=3)
    sizes = activation_sizes(cfg, 16, 3, runner.max_blocks, cache.config.block_size)
    assert ledger.total_bytes - before == sum(n for n, _ in sizes.values())
    assert runner.token_capacity == 16 and runner.row_capacity == 4  # 3 sequences pad to bucket 4
    batch = step_batch(cache, [(41, [5], 0), (42, [6], 0), (43, [7], 0)])
    runner.execute(batch)
    assert runner.graphs.captured(4)
    graph = runner.graphs._graphs[4]
    runner.close()
    assert ledger.total_bytes == before
    with pytest.raises(Exception, match="destroyed graph"):
        graph.launch()
    runner.close()  # idempotent
    for s in (41, 42, 43):
        cache.free_sequence(s)
    cache.release_fenced()


def test_masked_decode_steps_replay_their_own_graphs_as_eager(model, eager):
    """Decode steps whose rows sample under token masks (a grammar's) are padded to their bucket and replay its
    masked graph: each step's tokens equal the eager runner's and lie in their rows' masks, though the masks change
    every step (read from the token_mask buffer, nothing frozen into the graph); one capture per bucket, none of the
    unmasked graphs used."""
    cache, runner = model.cache, model.runner
    vocab = model.config.vocab_size
    masked, plain = runner.forward_graphs, runner.graphs
    captures, plain_replays = masked.captures, plain.replays
    rng = np.random.default_rng(5)
    last, pos = {}, {}
    for seq_id, n in {41: 3, 42: 7, 43: 2}.items():
        runner.execute(step_batch(cache, [(seq_id, prompt_of(n, seq_id), 0)]))
        last[seq_id], pos[seq_id] = 1, n
    for step in range(4):
        batch = step_batch(cache, [(s, [last[s]], pos[s]) for s in last])
        allowed = rng.random((len(last), vocab)) < 0.05  # a few tokens a row, different each step
        allowed[:, 0] = True
        mask = np.packbits(allowed, axis=1, bitorder="little").view(np.uint8)
        words = np.zeros((len(last), mask_words(vocab) * 4), np.uint8)
        words[:, :mask.shape[1]] = mask
        params = [SamplingParams(temperature=0.9, seed=step * 10 + i) for i in range(len(last))]
        sampling = dataclasses.replace(SamplingRows.build(params, np.linspace(0.05, 0.95, len(last))),
                                       mask=words.view(np.uint32))
        got = runner.execute_sampled(batch, sampling)
        assert np.array_equal(got, eager.execute_sampled(batch, sampling)), step
        assert all(allowed[i, t] for i, t in enumerate(got)), (step, got)
        for s, t in zip(last, got):
            last[s], pos[s] = int(t), pos[s] + 1
    assert masked.captures == captures + 1 and masked.captured(4) and plain.replays == plain_replays
    for s in last:
        cache.free_sequence(s)
    cache.release_fenced()
