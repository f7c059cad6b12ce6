"""A cache with a sliding-window group under the model and the engine (cpu backend): each layer reads and
writes the pool, slots and block table of its own group, and the engine's release path gives back both
groups' blocks for every ending.

Until the attention kernel takes a window (the gemma3 work), paged attention refuses a table that reads
the null block, which is what a released local block becomes; so the model runs here only where the
window covers every position, and the shorter windows drive the engine with the KV-only runner of
`profile-kv` (which checks each StepBatch against the cache): the accounting, not the numbers.
"""

from __future__ import annotations

import numpy as np
import pytest

from support.engine_testing import greedy, load_tiny, prompt_of, tiny_model

from hipcore.engine.engine import Engine
from hipcore.kvcache.cache import KvCache
from hipcore.kvcache.config import GLOBAL_GROUP, LOCAL_GROUP, NULL_BLOCK, KvCacheConfig
from hipcore.model.batch import SeqSlice, build_step_batch
from hipcore.model.forward import ModelRunner
from hipcore.ops.kv_gather import gather_kv
from profiles.kv_workloads import KvOnlyRunner

BS = 16


@pytest.fixture(scope="module")
def path(tmp_path_factory):
    return tiny_model(tmp_path_factory)


def windowed_cache(loaded, windows: tuple[int, ...], window_blocks: int = 0, num_blocks: int = 64) -> KvCache:
    cfg = loaded.config
    return KvCache(loaded.device, KvCacheConfig(cfg.n_layers, cfg.n_kv_heads, cfg.head_dim, num_blocks, BS, "f32",
                                                windows, window_blocks))


def run_steps(runner: ModelRunner, cache: KvCache, prompt: list[int], decode: list[int]) -> list[np.ndarray]:
    """A prompt in two chunks, then one token a step; the logits of every step."""
    cache.add_sequence(0)
    out, at = [], 0
    for chunk in (prompt[:23], prompt[23:], *([t] for t in decode)):
        assert cache.reserve(0, len(chunk))
        out.append(runner.execute(build_step_batch(cache, [SeqSlice(0, chunk, at, True)])))
        at += len(chunk)
        cache.release_fenced()
    return out


def test_a_window_covering_every_position_gives_the_same_logits_bit_for_bit(path):
    loaded = load_tiny(path)
    cache = windowed_cache(loaded, (256, 0), window_blocks=20)
    runner = ModelRunner(loaded.device, loaded.config, loaded.weights, cache, max_step_tokens=64, max_seqs=8,
                         max_context=256)
    try:
        prompt, decode = prompt_of(40), prompt_of(12, salt=3)
        plain = run_steps(loaded.runner, loaded.cache, prompt, decode)
        windowed = run_steps(runner, cache, prompt, decode)
        for a, b in zip(plain, windowed):
            assert np.array_equal(a, b)
        # The local layer's K/V went to the local pool, through the local table: not a copy of the global one.
        assert cache.block_table(0, LOCAL_GROUP) != cache.block_table(0) or \
            cache.k_pools[0].nbytes != cache.k_pools[1].nbytes
        for layer in (0, 1):
            for mine, theirs in zip(gather_kv(cache, 0, layer), gather_kv(loaded.cache, 0, layer)):
                assert np.array_equal(mine, theirs) and np.abs(mine).max() > 0
        assert cache.k_pools[0].label == "kv.local.layer0.k" and cache.k_pools[0].nbytes == 20 * BS * 2 * 32 * 4
    finally:
        runner.close()
        cache.close()
        loaded.close()


def test_the_local_slots_and_tables_reach_the_step_inputs(path):
    loaded = load_tiny(path)
    cache = windowed_cache(loaded, (20, 0), window_blocks=20)
    runner = ModelRunner(loaded.device, loaded.config, loaded.weights, cache, max_step_tokens=64, max_seqs=8,
                         max_context=256)
    try:
        cache.add_sequence(0)
        assert cache.reserve(0, 50) and cache.reserve(0, 1)
        batch = build_step_batch(cache, [SeqSlice(0, [5], 50, True)])
        assert batch.window_block_tables.tolist() == [list(cache.block_table(0, LOCAL_GROUP))]
        assert batch.window_block_tables[0, 0] == NULL_BLOCK != batch.block_tables[0, 0]
        assert batch.window_slot_mapping.tolist() == cache.slot_mapping(0, 50, 1, LOCAL_GROUP).tolist()
        runner.inputs.pack(batch, padded_tokens=4, all_rows=True, sampling=None, stream=runner.stream)
        local = runner.inputs.for_group(LOCAL_GROUP)
        assert local.buffer.download(np.int32, 4).tolist() == batch.window_slot_mapping.tolist() + [-1] * 3
        assert local.addr("block_tables") != runner.inputs.addr("block_tables")
        assert local.addr("positions") == runner.inputs.addr("positions")
        assert runner.inputs.for_group(GLOBAL_GROUP) is runner.inputs
        with pytest.raises(ValueError, match="sliding-window group's slots and tables must come with a cache"):
            batch.validate(BS, 64)
    finally:
        runner.close()
        cache.close()
        loaded.close()


@pytest.mark.parametrize("max_tokens", [30, 60])
def test_the_engine_frees_out_of_window_blocks_and_every_ending_returns_both_groups(path, max_tokens):
    loaded = load_tiny(path)
    windows, window = (24, 0), 24
    cache = windowed_cache(loaded, windows, num_blocks=80)
    cap = -(-window // BS) + 1
    runner = KvOnlyRunner(loaded.config, cache)
    engine = Engine(runner, loaded.tokenizer, cache, max_seqs=4, max_step_tokens=32, max_context=256)
    kv_bytes = loaded.device.ledger.bytes_by_tag()["kv"]
    try:
        ids = [engine.submit(prompt_of(20 + 9 * i, salt=i), greedy(max_tokens, ignore_eos=True)) for i in range(3)]
        most_local, steps = 0, 0
        while engine.has_work():
            engine.step()
            steps += 1
            cache.check_invariants()
            for seq in cache.sequences():
                length = cache.seq_len(seq)
                local = [b for b in cache.block_table(seq, LOCAL_GROUP) if b != NULL_BLOCK]
                assert len([b for b in cache.block_table(seq) if b != NULL_BLOCK]) == -(-length // BS)
                # after a decode step the window of the next query is all a sequence keeps
                most_local = max(most_local, len(local))
            if steps == 5:
                engine.cancel(ids[2])
        assert cap - 1 <= most_local <= cap + -(-32 // BS)  # a window, plus a prompt chunk while it is computed
        assert cache.memory_profile().groups[1].released_blocks == 0  # nothing live any more
        cache.check_invariants(quiescent=True)
        assert cache.num_free_blocks == 79 and cache.num_free_blocks_in(LOCAL_GROUP) == cache.config.window_blocks - 1
        assert loaded.device.ledger.bytes_by_tag()["kv"] == kv_bytes
    finally:
        engine.shutdown()
        cache.close()
        loaded.close()


def test_a_long_decode_keeps_its_local_group_at_a_window(path):
    loaded = load_tiny(path)
    cache = windowed_cache(loaded, (24, 0), num_blocks=80)
    runner = KvOnlyRunner(loaded.config, cache)
    engine = Engine(runner, loaded.tokenizer, cache, max_seqs=4, max_step_tokens=32, max_context=256)
    try:
        engine.submit(prompt_of(10), greedy(150, ignore_eos=True))
        local_held, global_held = [], []
        while engine.has_work():
            engine.step()
            for seq in cache.sequences():
                local_held.append(sum(b != NULL_BLOCK for b in cache.block_table(seq, LOCAL_GROUP)))
                global_held.append(len(cache.block_table(seq)))
        assert max(local_held) == -(-24 // BS) + 1 and local_held[-1] <= 3
        assert global_held[-1] == -(-(10 + 149) // BS)  # the global group kept every block
        cache.check_invariants(quiescent=True)
    finally:
        engine.shutdown()
        cache.close()
        loaded.close()
