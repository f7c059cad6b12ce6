"""A tiny llama carrying rope_freqs.weight (Llama 3.1/3.2's per-pair RoPE frequency divisors) against
llama.cpp's own logits.

Golden data: tests/golden/tiny_llama_rope_freqs_llamacpp.json, written by
scripts/golden/record_rope_freqs_llamacpp.py (llama-cpp-python 0.3.36, CPU, F32 weights and F32 KV cache,
so llama.cpp quantizes nothing). The test writes the same model again (checked by its SHA-256) and runs
it on the cpu backend through the paged runner: the first PROMPT tokens in one step (fused matmul), then
one decode step per token (fused matvec, graph replay); the numpy reference runs every position.

LOGIT_TOLERANCE: both sides compute in float32 and differ in summation order and in sin/cos/exp; on these
data the largest difference on llama.cpp's top-16 logits is printed by `-s` (measured: 1.9e-6 for the
runner, 2.4e-6 for the reference, on logits up to 4.2), so 1e-4 is a 40x margin. Without the factors the
same weights miss llama.cpp's logits by 3.4 at worst and by at least 0.38 at every position the runner
computes (checked below): the golden cannot pass a path that ignores rope_freqs.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest

from hipcore.gguf.file import GGUFFile
from support.contiguous_kv_cache import ContiguousKvCache
from support.engine_testing import load_tiny
from support.gguf_factory import write_tiny_llama
from support.llama_reference import LlamaReference
from support.model_steps import step_batch
from support.rope_factors import far_factors

GOLDEN = Path(__file__).parent / "golden" / "tiny_llama_rope_freqs_llamacpp.json"
MODEL_SEED, FACTOR_SEED, HEAD_DIM = 11, 7, 16  # as scripts/golden/record_rope_freqs_llamacpp.py writes it
PROMPT = 32
LOGIT_TOLERANCE = 1e-4


@pytest.fixture(scope="module")
def golden() -> dict:
    data = json.loads(GOLDEN.read_text(encoding="utf-8"))
    assert data["model"] == {"writer": "tests/support/gguf_factory.write_tiny_llama", "seed": MODEL_SEED,
                             "factor_seed": FACTOR_SEED, "head_dim": HEAD_DIM}
    return data


def write_model(folder: Path, with_factors: bool) -> Path:
    factors = far_factors(np.random.default_rng(FACTOR_SEED), HEAD_DIM) if with_factors else None
    return write_tiny_llama(folder / f"tiny-{with_factors}.gguf", seed=MODEL_SEED, rope_freqs=factors)


@pytest.fixture(scope="module")
def model_path(tmp_path_factory, golden) -> Path:
    path = write_model(tmp_path_factory.mktemp("golden-rope"), True)
    assert hashlib.sha256(path.read_bytes()).hexdigest() == golden["model_sha256"], (
        "the tiny model's bytes differ from those the golden data was recorded from (a changed factory or gguf "
        "writer); re-record with scripts/golden/record_rope_freqs_llamacpp.py")
    return path


def reference_logits(path: Path, tokens: list[int]) -> np.ndarray:
    with GGUFFile.open(path) as f:
        reference = LlamaReference.from_gguf(f)
    cfg = reference.config
    cache = ContiguousKvCache(n_layers=cfg.n_layers, n_kv_heads=cfg.n_kv_heads, head_dim=cfg.head_dim,
                              capacity=len(tokens))
    return reference.forward(np.array(tokens), cache, logits_all=True)


def runner_logits(path: Path, tokens: list[int]) -> np.ndarray:
    """Rows PROMPT - 1 .. len(tokens) - 1: the prompt step's last, then each decode step's."""
    with load_tiny(path, max_seqs=4, max_step_tokens=64, kv_blocks=16) as model:
        rows = [model.runner.execute(step_batch(model.cache, [(1, tokens[:PROMPT], 0)]))]
        for pos in range(PROMPT, len(tokens)):
            rows.append(model.runner.execute(step_batch(model.cache, [(1, [tokens[pos]], pos)])))
        assert model.runner.graphs.replays > 0
        model.cache.free_sequence(1)
    return np.concatenate(rows)


def differences(logits: np.ndarray, golden: dict, first: int) -> np.ndarray:
    """Per position first.., the largest |ours - llama.cpp| over llama.cpp's top logits (logits row 0 = position
    first)."""
    ids = np.array(golden["top_ids"])[first:]
    want = np.array(golden["top_logits"])[first:]
    return np.abs(np.take_along_axis(logits, ids, axis=1) - want).max(axis=1)


def test_runner_matches_llamacpp_with_rope_freqs(model_path, golden):
    tokens = golden["token_ids"]
    got = runner_logits(model_path, tokens)
    worst = float(differences(got, golden, PROMPT - 1).max())
    print(f"runner vs llama.cpp: {worst:.2e} on {got.shape[0]} positions")
    assert worst < LOGIT_TOLERANCE
    assert np.array_equal(np.argmax(got, axis=1), np.array(golden["top_ids"])[PROMPT - 1:, 0])


def test_reference_matches_llamacpp_with_rope_freqs(model_path, golden):
    worst = float(differences(reference_logits(model_path, golden["token_ids"]), golden, 0).max())
    print(f"reference vs llama.cpp: {worst:.2e} on every position")
    assert worst < LOGIT_TOLERANCE


def test_the_same_weights_without_rope_freqs_miss_the_golden(tmp_path, golden):
    plain = write_model(tmp_path, False)
    # Position 0 turns by angle 0 either way; every later position must move.
    worst = float(differences(reference_logits(plain, golden["token_ids"])[1:], golden, 1).max())
    least = float(differences(runner_logits(plain, golden["token_ids"]), golden, PROMPT - 1).min())
    print(f"without rope_freqs: reference {worst:.2e}, runner at least {least:.2e} per position")
    assert worst > 1000 * LOGIT_TOLERANCE and least > 100 * LOGIT_TOLERANCE
