"""The paged forward pass (ModelRunner reading K/V through block tables) against the contiguous
numpy reference (LlamaReference + a contiguous KV cache): the same logits for the same tokens.

The runner is driven with hand-built StepBatches, so each test controls exactly how the tokens are
split over steps and sequences: a whole prompt in one step, one token per step, a prompt in uneven
chunks, and several sequences of different lengths mixed in one step (prompt chunks beside
decodes). Every scenario runs for block sizes 1, 16 and 32 and every KV dtype, and compares the
logits at EVERY position, not just the last.

Tolerances, in units of u x max|logit| where u is the KV dtype's unit roundoff (f32 2^-24, f16
2^-11, bf16 2^-8; q8_0 rounds to 1/127 of its 32-element group's largest value, so u = 1/127) and
max|logit| ~ 4 on this tiny model; figures measured over every scenario, block size and dtype:
* Against a reference whose contiguous cache stores K/V through the same codec as the pool
  (CodecKvCache below), the two sides differ only in float32 accumulation order (BLAS blocking;
  float64 softmax in paged attention, float32 in the reference): K/V differ by ~1e-7 relative
  before storage, so the odd element on a rounding boundary is stored one unit apart. Measured:
  f32 4e-6 absolute, f16 0.09, bf16 0.08, q8_0 1e-4 units. Bound: max(1e-4 absolute, 0.5 units),
  a 5x margin, and 1000x below what a wrong block does (test_a_wrong_block_table_is_caught).
* Against the float32 reference, the storage rounding itself shows: K/V errors of relative size u
  perturb scores and attention outputs by ~u, amplified a little through two layers and the output
  projection. Measured: f16 1.3, bf16 1.0, q8_0 1.9 units. Bound: 8 units (a 4x margin).
The demo-model check states its own figures.
"""

from __future__ import annotations

import numpy as np
import pytest

from support.engine_testing import load_tiny, prompt_of, tiny_model

from hipcore.gguf.file import GGUFFile
from hipcore.kvcache.dtypes import kv_dtype
from hipcore.engine.loader import LoadOptions, load_model
from hipcore.model.batch import NULL_BLOCK, StepBatch
from support.contiguous_kv_cache import ContiguousKvCache
from support.llama_reference import LlamaReference

EXACT_TOLERANCE = 1e-4
UNIT_ROUNDOFF = {"f32": 2.0**-24, "f16": 2.0**-11, "bf16": 2.0**-8, "q8_0": 1.0 / 127}
STORAGE_FACTOR = 8
CODEC_FACTOR = 0.5
BLOCK_SIZES = (1, 16, 32)
DTYPES = ("f32", "f16", "bf16", "q8_0")


class CodecKvCache(ContiguousKvCache):
    """The contiguous reference cache, storing every K/V row through a KV dtype's codec (the same
    bytes the paged pool holds), so the reference sees exactly the values paged attention reads."""

    def __init__(self, fmt, **kwargs):
        super().__init__(**kwargs)
        self.fmt = fmt

    def write(self, layer, start, keys, values):
        hd = self.head_dim
        super().write(layer, start, self.fmt.decode(self.fmt.encode(keys), hd), self.fmt.decode(self.fmt.encode(values), hd))


@pytest.fixture(scope="module")
def path(tmp_path_factory):
    return tiny_model(tmp_path_factory)


@pytest.fixture(scope="module")
def reference(path) -> LlamaReference:
    with GGUFFile.open(path) as f:
        return LlamaReference.from_gguf(f)


_reference_runs: dict[tuple, np.ndarray] = {}


def reference_logits(reference: LlamaReference, tokens: list[int], dtype: str) -> np.ndarray:
    """Logits at every position of `tokens`, contiguous KV stored in `dtype` ("f32": plain float32)."""
    key = (id(reference), tuple(tokens), dtype)
    if key not in _reference_runs:
        _reference_runs[key] = _reference_forward(reference, tokens, dtype)
    return _reference_runs[key]


def _reference_forward(reference: LlamaReference, tokens: list[int], dtype: str) -> np.ndarray:
    cfg = reference.config
    shape = dict(n_layers=cfg.n_layers, n_kv_heads=cfg.n_kv_heads, head_dim=cfg.head_dim, capacity=len(tokens))
    cache = ContiguousKvCache(**shape) if dtype == "f32" else CodecKvCache(kv_dtype(dtype), **shape)
    return reference.forward(np.array(tokens), cache, logits_all=True)


class PagedDriver:
    """Runs hand-made steps on a loaded model's runner and collects each sequence's logits."""

    def __init__(self, model):
        self.model = model
        self.cache = model.cache
        self.logits: dict[int, list[np.ndarray]] = {}
        self.cached: dict[int, int] = {}

    def step(self, parts: list[tuple[int, list[int]]], corrupt=None) -> None:
        """parts: (sequence id, its next tokens) for each sequence in the step; logits of every token.
        corrupt: table -> table, applied to the block tables the step reads (to test the test)."""
        tokens, positions, slots, starts, ctx, tables = [], [], [], [0], [], []
        for seq_id, new in parts:
            if not self.cache.has_sequence(seq_id):
                self.cache.add_sequence(seq_id)
                self.cached[seq_id] = 0
            first = self.cached[seq_id]
            assert self.cache.reserve(seq_id, len(new))
            tokens += new
            positions += range(first, first + len(new))
            slots.append(self.cache.slot_mapping(seq_id, first, len(new)))
            starts.append(starts[-1] + len(new))
            ctx.append(first + len(new))
            tables.append(corrupt(self.cache.block_table(seq_id)) if corrupt else self.cache.block_table(seq_id))
            self.cached[seq_id] = first + len(new)
        width = max(len(t) for t in tables)
        table = np.full((len(tables), width), NULL_BLOCK, dtype=np.int32)
        for row, t in zip(table, tables):
            row[:len(t)] = t
        batch = StepBatch(
            token_ids=np.array(tokens, dtype=np.int32), positions=np.array(positions, dtype=np.int32),
            slot_mapping=np.concatenate(slots).astype(np.int32), seq_starts=np.array(starts, dtype=np.int32),
            context_lens=np.array(ctx, dtype=np.int32), block_tables=table,
            sample_rows=np.arange(len(tokens), dtype=np.int32),
        )
        out = self.model.runner.execute(batch)
        for (seq_id, _), lo, hi in zip(parts, starts, starts[1:]):
            self.logits.setdefault(seq_id, []).append(out[lo:hi])

    def all_logits(self, seq_id: int) -> np.ndarray:
        return np.concatenate(self.logits[seq_id])


def paged_model(path, dtype: str, block_size: int):
    # max_seqs 64: the runner returns logits for up to max_seqs rows, and these tests ask for every row.
    return load_tiny(path, kv_dtype=dtype, block_size=block_size, kv_blocks=256 // block_size + 8,
                     max_seqs=64, max_step_tokens=64)


def check(reference, tokens, paged: np.ndarray, dtype: str) -> None:
    assert paged.shape == (len(tokens), reference.vocab_size)
    exact = reference_logits(reference, tokens, dtype)
    plain = reference_logits(reference, tokens, "f32")
    scale = np.abs(plain).max()
    assert np.abs(paged - exact).max() < max(EXACT_TOLERANCE, CODEC_FACTOR * UNIT_ROUNDOFF[dtype] * scale)
    assert np.abs(paged - plain).max() < max(EXACT_TOLERANCE, STORAGE_FACTOR * UNIT_ROUNDOFF[dtype] * scale)


# One sequence's tokens (a prompt and a teacher-forced continuation) and how each scenario splits them.
TOKENS = prompt_of(37, salt=1)
SCENARIOS = {
    "whole prompt in one step": [37],
    "one token per step": [1] * 37,
    "prompt in uneven chunks": [5, 11, 1, 17, 3],
}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("block_size", BLOCK_SIZES)
@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_one_sequence_split_over_steps(path, reference, scenario, block_size, dtype):
    with paged_model(path, dtype, block_size) as model:
        driver = PagedDriver(model)
        done = 0
        for n in SCENARIOS[scenario]:
            driver.step([(1, TOKENS[done:done + n])])
            done += n
        check(reference, TOKENS, driver.all_logits(1), dtype)
        model.cache.free_sequence(1)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("block_size", BLOCK_SIZES)
def test_several_sequences_mixed_in_one_step(path, reference, block_size, dtype):
    """Prompt chunks and decodes of sequences of different lengths share each step."""
    a, b, c = prompt_of(15, salt=2), prompt_of(26, salt=3), prompt_of(11, salt=4)
    steps = [
        [(1, a[:12]), (2, b[:7])],  # A's whole prompt, B's first chunk
        [(1, a[12:13]), (2, b[7:20]), (3, c[:9])],  # A decodes, B's next chunk, C's whole prompt
        [(3, c[9:10]), (1, a[13:14]), (2, b[20:21])],  # three decodes (order differs from admission)
        [(2, b[21:26]), (1, a[14:15]), (3, c[10:11])],
    ]
    with paged_model(path, dtype, block_size) as model:
        driver = PagedDriver(model)
        for parts in steps:
            driver.step(parts)
        for seq_id, tokens in ((1, a), (2, b), (3, c)):
            check(reference, tokens, driver.all_logits(seq_id), dtype)


def test_a_wrong_block_table_is_caught(path, reference):
    """The comparison has teeth: a table that reads one block twice (and another not at all) moves the
    logits far beyond the tolerance, so a paging bug cannot hide under it. (Swapping two blocks
    would not do: attention over a set of keys whose positions RoPE already encoded is order-free.)"""
    with paged_model(path, "f32", 16) as model:
        driver = PagedDriver(model)
        driver.step([(1, TOKENS[:36])])
        driver.step([(1, TOKENS[36:37])], corrupt=lambda table: (table[1],) + table[1:])
        last = driver.logits[1][-1][0]
        exact = reference_logits(reference, TOKENS, "f32")[-1]
        assert np.abs(last - exact).max() > 1000 * EXACT_TOLERANCE


def test_demo_model_paged_matches_reference(demo_model_path):
    """The real model (30 layers, Q4_1 weights dequantized on both sides), f32 KV so that only the
    paging and the order of float32 arithmetic differ: the paged runner's last-position logits equal
    the reference's. Measured max |diff| 4.2e-5 on logits up to ~16; the bound 5e-4 is a 12x margin.
    (With f16 KV the odd rounding-boundary flip, amplified over 30 layers, reaches ~3e-3: the tiny
    model's tests cover each reduced dtype against a reference storing through the same codec.)"""
    # max_seqs 8: logits of every row of a 6-token step are returned (see paged_model).
    prompt = [504, 1573, 33059, 40061, 30324, 260, 24224, 897, 9053, 28]  # "The old lighthouse keeper climbed ..."
    with load_model(str(demo_model_path), LoadOptions(device="cpu", ctx_size=64, kv_dtype="f32", max_seqs=8)) as model:
        driver = PagedDriver(model)
        driver.step([(1, prompt[:6])])  # two steps, so the second reads K/V written by the first
        driver.step([(1, prompt[6:])])
        paged = driver.logits[1][-1][-1]
    with GGUFFile.open(demo_model_path) as f:
        demo = LlamaReference.from_gguf(f)
    expected = demo.forward(np.array(prompt), demo.new_cache(len(prompt)))
    assert np.abs(paged - expected).max() < 5e-4
    assert int(paged.argmax()) == int(expected.argmax())
