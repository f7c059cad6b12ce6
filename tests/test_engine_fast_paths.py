"""The engine's per-step fast paths give what the general paths give (scripts/bench/engine_host_cost.py measures
what they save): the decode batch built straight from the sequences (build_decode_batch) against the general
batch of the same one-token slices; SamplingRows.from_rows against build(); StopChecker without stop strings
against the general path; Event's own __init__ against the dataclass it still is; TextBuffer against plain
concatenation."""

from __future__ import annotations

import dataclasses
import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hipcore.engine.request import Ending, Event, Sequence
from hipcore.engine.sampling_rows import StepSamplingRows
from hipcore.engine.sampler import UNIFORM_BATCH, Sampler, SamplingParams, StopChecker, StopReason
from hipcore.engine.text_buffer import COMPACT_AT, TextBuffer
from hipcore.kvcache.cache import KvCache
from hipcore.kvcache.config import KvCacheConfig
from hipcore.model.batch import SeqSlice, _mixed_batch, build_decode_batch, build_step_batch
from hipcore.ops.sample import SamplingRows
from hipcore.runtime.cpu import CpuDevice

PLAIN = KvCacheConfig(n_layers=2, n_kv_heads=1, head_dim=32, num_blocks=400, block_size=4, dtype="f32")
WINDOWED = KvCacheConfig(n_layers=3, n_kv_heads=1, head_dim=32, num_blocks=400, block_size=4, dtype="f32",
                         layer_windows=(6, 0, 3), window_blocks=300)


# ---- the decode batch -----------------------------------------------------------------------------

def general_batch(cache: KvCache, items: list[SeqSlice]) -> dict:
    """The batch of one-token slices as the general (prompt and mixed) path builds it, slot by slot."""
    batch = _mixed_batch(cache, items)
    out = {f.name: getattr(batch, f.name) for f in dataclasses.fields(batch)}
    if len(cache.groups) > 1:
        out["window_block_tables"] = cache.block_tables([i.seq_id for i in items], width=batch.block_tables.shape[1],
                                                        group="local")
        out["window_slot_mapping"] = np.concatenate([cache.slot_mapping(i.seq_id, i.first, 1, "local") for i in items])
    return out


@pytest.mark.parametrize("config", [PLAIN, WINDOWED], ids=["one group", "sliding window"])
@pytest.mark.parametrize("seed", range(8))
def test_decode_batch_equals_the_general_batch(config, seed):
    rng = random.Random(seed)
    device = CpuDevice(capacity=64 << 20)
    cache = KvCache(device, config)
    items = []
    lengths = {seq: 0 for seq in range(rng.randint(1, 20))}
    for seq in lengths:
        cache.add_sequence(seq)
    for _ in range(60):  # in chunks, interleaved: the window group releases blocks and its tables part from the global
        seq = rng.choice(list(lengths))
        n = rng.randint(1, 6)
        assert cache.reserve(seq, n)
        lengths[seq] += n
        cache.release_fenced()
    for seq, length in lengths.items():
        if not length:
            assert cache.reserve(seq, 1)
            length = 1
        length -= 1  # the batch computes the last reserved token
        if rng.random() < 0.3:  # a fork in the batch: shared blocks
            cache.fork(seq, 1000 + seq)
            items.append(SeqSlice(1000 + seq, [rng.randint(3, 999)], length, rng.random() < 0.8))
        items.append(SeqSlice(seq, [rng.randint(3, 999)], length, rng.random() < 0.8))
    rng.shuffle(items)
    fast = build_decode_batch(cache, [i.seq_id for i in items], [i.tokens[0] for i in items], [i.first for i in items],
                              [i.samples for i in items])
    for name, want in general_batch(cache, items).items():
        got = getattr(fast, name)
        if want is None:
            assert got is None, name
            continue
        assert got.dtype == np.int32 and got.tolist() == np.asarray(want).astype(np.int32).tolist(), name
    via_slices = build_step_batch(cache, items)
    for f in dataclasses.fields(fast):
        a, b = getattr(fast, f.name), getattr(via_slices, f.name)
        assert (a is None and b is None) or (a.dtype == b.dtype and np.array_equal(a, b)), f.name
    fast.validate(config.block_size, config.num_blocks, config.window_blocks if config.layer_windows else None)
    cache.close()


# ---- sampling rows ---------------------------------------------------------------------------------

params_strategy = st.builds(
    SamplingParams, temperature=st.sampled_from([0.0, 0.3, 0.8, 1, 2.5]), top_k=st.sampled_from([0, 1, 40, 1024]),
    top_p=st.sampled_from([0.1, 0.95, 1, 1.0]), min_p=st.sampled_from([0, 0.0, 0.05, 0.5]), seed=st.integers(0, 9))


@settings(max_examples=100, deadline=None)
@given(params=st.lists(params_strategy, max_size=70))
def test_sampling_rows_from_rows_equal_build(params):
    samplers = [Sampler(p) for p in params]
    uniforms = [0.0 if s.greedy else s.next_uniform() for s in samplers]
    built = SamplingRows.build(params, uniforms)
    rows = SamplingRows.from_rows([s.device_row + (u,) for s, u in zip(samplers, uniforms)])
    for name in ("temperature", "top_k", "top_p", "min_p", "uniform"):
        a, b = getattr(rows, name), getattr(built, name)
        assert a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b), name


def test_a_greedy_row_may_hold_any_top_k():
    sampler = Sampler(SamplingParams(temperature=0.0, top_k=1 << 31))
    assert sampler.device_samplable and sampler.device_row[1] == 2**31 - 1
    assert SamplingRows.from_rows([sampler.device_row + (0.0,)]).top_k.tolist() == [2**31 - 1]


# ---- stop checks -----------------------------------------------------------------------------------

@settings(max_examples=200, deadline=None)
@given(pieces=st.lists(st.tuples(st.sampled_from([5, 6, 7, 0]), st.text(max_size=4)), min_size=1, max_size=30),
       max_tokens=st.integers(1, 40))
def test_no_stop_strings_releases_as_the_general_path_does(pieces, max_tokens):
    fast = StopChecker(eos_ids=[0], max_tokens=max_tokens)
    general = StopChecker(eos_ids=[0], stop_strings=["\x00\x00"], max_tokens=max_tokens)  # (never in the texts)
    for token, text in pieces:
        text = text.replace("\x00", "")
        assert fast.push(token, text) == general.push(token, text)
        assert fast.reason == general.reason and fast.tokens_seen == general.tokens_seen
        if fast.finished:
            break
    assert fast.flush() == general.flush() and fast.output == general.output


def test_output_is_everything_released():
    checker = StopChecker(eos_ids=[0], stop_strings=["##"], max_tokens=10)
    assert checker.push(5, "a#") == "a" and checker.output == "a"
    assert checker.push(5, "b") == "#b" and checker.output == "a#b"
    assert checker.push(5, "##c") == "" and checker.reason == StopReason.STOP_STRING and checker.output == "a#b"


# ---- events ----------------------------------------------------------------------------------------

def test_event_is_still_a_frozen_dataclass():
    event = Event(3, 1, (7,), "hi")
    assert event == Event(request_id=3, seq_index=1, token_ids=(7,), text="hi", finished=False, ending=None)
    assert hash(event) == hash(Event(3, 1, (7,), "hi")) and event != Event(3, 1, (7,), "ho")
    assert repr(event) == "Event(request_id=3, seq_index=1, token_ids=(7,), text='hi', finished=False, ending=None, error=None, cached_tokens=0, logprobs=None)"
    assert [f.name for f in dataclasses.fields(Event)] == list(vars(event))
    assert dataclasses.asdict(event)["text"] == "hi"
    assert dataclasses.replace(event, finished=True, ending=Ending.EOS).ending is Ending.EOS
    last = Event(3, 0, finished=True, ending=Ending.LENGTH, error="x")
    assert (last.token_ids, last.text, last.finished, last.ending, last.error) == ((), "", True, Ending.LENGTH, "x")
    with pytest.raises(dataclasses.FrozenInstanceError):
        event.text = "changed"
    with pytest.raises(TypeError):
        Event(3)


# ---- text buffers ----------------------------------------------------------------------------------

@settings(max_examples=50, deadline=None)
@given(pieces=st.lists(st.text(max_size=5), max_size=700), reads=st.sets(st.integers(0, 700), max_size=5))
def test_text_buffer_is_the_concatenation_and_stays_compact(pieces, reads):
    buffer = TextBuffer()
    for i, piece in enumerate(pieces):
        buffer.append(piece)
        assert len(buffer._parts) < COMPACT_AT
        if i in reads:
            assert buffer.value() == "".join(pieces[:i + 1])
    assert buffer.value() == "".join(pieces) and TextBuffer("ab").value() == "ab"


def test_a_sequence_text_is_its_output_so_far():
    seq = Sequence(1, None, [5], num_prompt=1)
    assert seq.text == ""
    for piece in ("a", "bc", "", "d"):
        seq.output.append(piece)
    assert seq.text == "abcd"


# ---- draws -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("seed", [0, 1, 12345, 2**64 - 1])
def test_uniforms_drawn_in_batches_are_the_single_draws_of_the_seed(seed):
    sampler = Sampler(SamplingParams(temperature=0.8, seed=seed))
    single = np.random.Generator(np.random.PCG64(seed))
    for _ in range(3 * UNIFORM_BATCH + 5):
        assert sampler.next_uniform() == float(single.random())


def test_step_sampling_rows_keep_the_columns_and_draw_the_uniforms():
    """Consecutive steps of the same samplers share the parameter columns; the uniforms are each step's draws,
    exactly what SamplingRows.build gives with the same draws; a change of samplers builds anew."""
    params = [SamplingParams(temperature=0.0), SamplingParams(temperature=0.7, top_k=5, seed=3),
              SamplingParams(temperature=1.2, top_p=0.5, min_p=0.1, seed=4)]
    samplers = [Sampler(p) for p in params]
    twins = [Sampler(p) for p in params]
    keep = StepSamplingRows()
    first = keep.rows(list(samplers))
    for step in range(5):
        rows = keep.rows(list(samplers)) if step else first
        want = SamplingRows.build(params, [0.0 if t.greedy else t.next_uniform() for t in twins])
        for name in ("temperature", "top_k", "top_p", "min_p", "uniform"):
            assert getattr(rows, name).dtype == getattr(want, name).dtype
            assert np.array_equal(getattr(rows, name), getattr(want, name)), name
        assert rows.temperature is first.temperature and not rows.temperature.flags.writeable
    fewer = keep.rows(samplers[:1])  # a request left: built anew, and only greedy rows: no draws
    assert fewer.temperature.tolist() == [0.0] and fewer.uniform.tolist() == [0.0]
    assert keep.rows(samplers[:1]).uniform is fewer.uniform
    keep.clear()
    assert keep.rows([]).uniform.shape == (0,)
