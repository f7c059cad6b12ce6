"""Llama 3.1/3.2-style files: rope_freqs.weight (per-pair RoPE frequency divisors, the "llama3" scaling that
llama.cpp's converter bakes into the file) reaches every RoPE of the forward pass.

A tiny llama written with factors far from 1 runs on the cpu backend through the paged runner (a prompt
step on the fused matmul path, then decode steps on the fused matvec path, replayed from captured decode
graphs) and gives the logits of the numpy reference (tests/support/llama_reference.py, which divides each
angle by its factor); the same weights without the tensor give logits far from those, so a runner that
ignored the factors could not pass. Also: the factors are uploaded and counted in the memory plan, a file
whose factors are not finite and positive is refused as invalid (exit 3), and the RoPE scaling types
that change more than the angle (yarn, longrope) are refused by name (exit 4) while "none" loads.
"""

from __future__ import annotations

import numpy as np
import pytest

from hipcore.errors import EXIT_INVALID_MODEL, EXIT_UNSUPPORTED
from hipcore.gguf.errors import GGUFError
from hipcore.gguf.file import GGUFFile
from hipcore.model.weights import planned_weight_bytes
from support.contiguous_kv_cache import ContiguousKvCache
from support.engine_testing import TINY_SHAPE, load_tiny, prompt_of, tiny_model
from support.llama_reference import LlamaReference
from support.model_steps import step_batch
from support.rope_factors import far_factors

ROPE_FREQS = "rope_freqs.weight"
HEAD_DIM = TINY_SHAPE["hidden"] // TINY_SHAPE["n_heads"]
FACTORS = far_factors(np.random.default_rng(31), HEAD_DIM)
TOLERANCE = 1e-4  # f32 KV: the paged runner and the reference differ by float32 accumulation order (~4e-6)
PROMPT, DECODES = prompt_of(21, salt=5), 6


@pytest.fixture(scope="module")
def with_factors(tmp_path_factory):
    return tiny_model(tmp_path_factory, "tiny-rope-freqs.gguf", rope_freqs=FACTORS)


@pytest.fixture(scope="module")
def without_factors(tmp_path_factory):
    return tiny_model(tmp_path_factory)  # the same seed: the same weights, no rope_freqs


def runner_logits(path) -> np.ndarray:
    """Logits of the prompt's last token (the prompt in one step), then of each teacher-forced decode step."""
    tokens = PROMPT + prompt_of(DECODES, salt=6)
    with load_tiny(path, max_seqs=4, max_step_tokens=64, kv_blocks=16) as model:
        rows = [model.runner.execute(step_batch(model.cache, [(1, PROMPT, 0)]))]
        for i, token in enumerate(tokens[len(PROMPT):]):
            rows.append(model.runner.execute(step_batch(model.cache, [(1, [token], len(PROMPT) + i)])))
        assert model.runner.graphs.captures >= 1, "the decode steps did not run from a captured graph"
        model.cache.free_sequence(1)
    return np.concatenate(rows)


def reference_logits(path) -> np.ndarray:
    """The reference's logits at the positions runner_logits returns (the prompt's last, then each decode)."""
    tokens = PROMPT + prompt_of(DECODES, salt=6)
    with GGUFFile.open(path) as f:
        reference = LlamaReference.from_gguf(f)
    cfg = reference.config
    cache = ContiguousKvCache(n_layers=cfg.n_layers, n_kv_heads=cfg.n_kv_heads, head_dim=cfg.head_dim,
                              capacity=len(tokens))
    every = reference.forward(np.array(tokens), cache, logits_all=True)
    # The runner's rows: the prompt step samples its last token; each decode step its one token, which
    # predicts from position len(PROMPT) + i, i.e. row len(PROMPT) + i of `every`.
    return every[len(PROMPT) - 1:len(tokens)]


def test_factors_reach_every_rope_of_the_forward_pass(with_factors, without_factors):
    got = runner_logits(with_factors)
    want = reference_logits(with_factors)
    assert got.shape == want.shape == (1 + DECODES, TINY_SHAPE["vocab"])
    assert np.abs(got - want).max() < TOLERANCE
    # The factors matter: the same weights without them give logits far outside the tolerance, on the
    # prompt's last row (fused matmul) and on every decode row (fused matvec).
    plain = runner_logits(without_factors)
    assert np.abs(plain - want).max(axis=1).min() > 1000 * TOLERANCE


def test_factors_are_uploaded_and_planned(with_factors, without_factors):
    with load_tiny(with_factors) as model:
        rope_freqs = model.weights.rope_freqs
        assert rope_freqs is not None and rope_freqs.fmt == "f32" and rope_freqs.shape == (HEAD_DIM // 2,)
        np.testing.assert_array_equal(rope_freqs.buffer.download(np.float32, HEAD_DIM // 2), FACTORS)
        with GGUFFile.open(with_factors) as f:
            assert planned_weight_bytes(model.device, f.plan) == model.weights.nbytes
    with load_tiny(without_factors) as model:
        assert model.weights.rope_freqs is None


@pytest.mark.parametrize("bad", [0.0, -2.0, np.inf, np.nan])
def test_factors_that_are_not_finite_and_positive_are_an_invalid_file(tmp_path_factory, bad):
    factors = FACTORS.copy()
    factors[3] = bad
    path = tiny_model(tmp_path_factory, f"tiny-rope-freqs-{bad}.gguf", rope_freqs=factors)
    with pytest.raises(GGUFError) as err:
        load_tiny(path)
    assert err.value.exit_code == EXIT_INVALID_MODEL
    message = str(err.value)
    assert ROPE_FREQS in message and "factor 3" in message and "\n" not in message


@pytest.mark.parametrize("kind", ["yarn", "longrope"])
def test_scaling_types_that_change_more_than_the_angle_are_refused_by_name(tmp_path_factory, kind):
    path = tiny_model(tmp_path_factory, f"tiny-rope-{kind}.gguf", rope_freqs=FACTORS,
                      extra_metadata={"llama.rope.scaling.type": kind, "llama.rope.scaling.factor": 8.0})
    with pytest.raises(GGUFError) as err:
        load_tiny(path)
    assert err.value.exit_code == EXIT_UNSUPPORTED and kind in str(err.value)


def test_llama3_files_declaring_no_scaling_type_or_none_load(tmp_path_factory):
    path = tiny_model(tmp_path_factory, "tiny-rope-none.gguf", rope_freqs=FACTORS,
                      extra_metadata={"llama.rope.scaling.type": "none"})
    with load_tiny(path) as model:
        assert model.config.rope_scaling == "none" and model.weights.rope_freqs is not None
