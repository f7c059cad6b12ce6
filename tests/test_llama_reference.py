"""The numpy llama forward pass against an independent loop-by-loop float64 implementation, RoPE
against its definition and against Hugging Face's half rotation, and the KV cache's contract."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from support.gguf_factory import write_tiny_llama
from hipcore.errors import UnsupportedModelError, UsageError
from hipcore.gguf.file import GGUFFile
from support.contiguous_kv_cache import ContiguousKvCache
from support.llama_reference import LlamaReference, LlamaWeights
from support.reference_rope import RotaryEmbedding, rope_freq_scale


def open_tiny(tmp_path, name="tiny.gguf", **kwargs):
    path = write_tiny_llama(tmp_path / name, **kwargs)
    return GGUFFile.open(path)


def naive_logits(f: GGUFFile, tokens: list[int], freq_scale: float = 1.0) -> np.ndarray:
    """Every position's logits, one token, head and pair at a time, in float64 (no cache, no batching).

    Written from the definition of the llama block, sharing no code with LlamaReference."""
    c = f.config
    w = {t.name: f.dequantize(t.name).astype(np.float64) for t in f.plan.tensors}
    group = c.n_heads // c.n_kv_heads
    d = c.head_dim

    def norm(x, weight):
        return x / math.sqrt(float(np.mean(x * x)) + c.rms_norm_eps) * weight

    def rotate(vec, pos):
        out = vec.copy()
        for i in range(c.rope_dim // 2):
            angle = pos * freq_scale * c.rope_theta ** (-2.0 * i / c.rope_dim)
            a, b = vec[2 * i], vec[2 * i + 1]
            out[2 * i] = a * math.cos(angle) - b * math.sin(angle)
            out[2 * i + 1] = a * math.sin(angle) + b * math.cos(angle)
        return out

    xs = [w["token_embd.weight"][t].copy() for t in tokens]
    for layer in range(c.n_layers):
        p = f"blk.{layer}."
        keys, values, queries = [], [], []
        for pos, x in enumerate(xs):
            h = norm(x, w[p + "attn_norm.weight"])
            q, k, v = w[p + "attn_q.weight"] @ h, w[p + "attn_k.weight"] @ h, w[p + "attn_v.weight"] @ h
            queries.append([rotate(q[j * d:(j + 1) * d], pos) for j in range(c.n_heads)])
            keys.append([rotate(k[j * d:(j + 1) * d], pos) for j in range(c.n_kv_heads)])
            values.append([v[j * d:(j + 1) * d] for j in range(c.n_kv_heads)])
        new_xs = []
        for pos, x in enumerate(xs):
            heads = []
            for head in range(c.n_heads):
                kv = head // group
                scores = [float(queries[pos][head] @ keys[s][kv]) / math.sqrt(d) for s in range(pos + 1)]
                top = max(scores)
                weights = [math.exp(s - top) for s in scores]
                total = sum(weights)
                heads.append(sum(wt / total * values[s][kv] for s, wt in enumerate(weights)))
            x = x + w[p + "attn_output.weight"] @ np.concatenate(heads)
            h = norm(x, w[p + "ffn_norm.weight"])
            gate, up = w[p + "ffn_gate.weight"] @ h, w[p + "ffn_up.weight"] @ h
            silu = gate / (1.0 + np.exp(-gate))
            new_xs.append(x + w[p + "ffn_down.weight"] @ (silu * up))
        xs = new_xs
    output = w.get("output.weight", w["token_embd.weight"])
    return np.stack([output @ norm(x, w["output_norm.weight"]) for x in xs])


# --- whole forward pass --------------------------------------------------------------------------

@pytest.mark.parametrize("tied, n_kv_heads", [(True, 2), (False, 1), (True, 4)])
def test_forward_matches_the_naive_definition(tmp_path, tied, n_kv_heads):
    with open_tiny(tmp_path, tied=tied, n_kv_heads=n_kv_heads, seed=3) as f:
        model = LlamaReference.from_gguf(f)
        tokens = [5, 17, 300, 42, 42, 7, 99, 1]
        expected = naive_logits(f, tokens)
    got = model.forward(np.array(tokens), model.new_cache(32), logits_all=True)
    assert got.shape == (len(tokens), f.config.vocab_size)
    assert got.dtype == np.float32
    scale = np.abs(expected).max()
    assert scale > 0.1                           # the check is not against all-zero logits
    np.testing.assert_allclose(got, expected, atol=2e-5 * scale + 1e-5, rtol=1e-4)
    assert (model.weights.output is model.weights.token_embd) == tied


def test_quantized_weights_go_through_the_same_path(tmp_path):
    with open_tiny(tmp_path, tensor_type="Q4_1", seed=5) as f:
        model = LlamaReference.from_gguf(f)
        tokens = [3, 1, 4, 1, 5, 9, 2, 6]
        expected = naive_logits(f, tokens)
    got = model.forward(np.array(tokens), model.new_cache(16), logits_all=True)
    np.testing.assert_allclose(got, expected, atol=1e-4 * np.abs(expected).max(), rtol=1e-4)


def test_linear_rope_scaling_divides_positions(tmp_path):
    extra = {"llama.rope.scaling.type": "linear", "llama.rope.scaling.factor": 4.0}
    with open_tiny(tmp_path, extra_metadata=extra, seed=11) as f:
        assert f.config.rope_scaling == "linear"
        model = LlamaReference.from_gguf(f)
        tokens = [10, 20, 30, 40, 50, 60]
        expected = naive_logits(f, tokens, freq_scale=0.25)
        unscaled = naive_logits(f, tokens, freq_scale=1.0)
    got = model.forward(np.array(tokens), model.new_cache(8), logits_all=True)
    np.testing.assert_allclose(got, expected, atol=2e-5 * np.abs(expected).max(), rtol=1e-4)
    assert np.abs(got - unscaled).max() > 1e-3   # the scaling really changed something


def test_batched_prompt_equals_one_token_at_a_time_and_split_prompts(tmp_path):
    with open_tiny(tmp_path, seed=8) as f:
        model = LlamaReference.from_gguf(f)
    tokens = np.array([9, 8, 7, 6, 5, 4, 3, 2, 1, 0, 11, 12])
    batched = model.forward(tokens, model.new_cache(32), logits_all=True)
    cache = model.new_cache(32)
    one_by_one = np.stack([model.forward(tokens[i:i + 1], cache) for i in range(len(tokens))])
    cache = model.new_cache(32)
    split = np.concatenate([model.forward(tokens[:5], cache, logits_all=True),
                            model.forward(tokens[5:], cache, logits_all=True)])
    np.testing.assert_allclose(one_by_one, batched, atol=1e-5, rtol=1e-5)
    np.testing.assert_allclose(split, batched, atol=1e-5, rtol=1e-5)
    assert cache.length == len(tokens)
    last = model.forward(tokens, model.new_cache(32))
    np.testing.assert_allclose(last, batched[-1], atol=1e-6, rtol=1e-6)


def test_float16_cache_stays_close_to_float32(tmp_path):
    with open_tiny(tmp_path, seed=2) as f:
        model = LlamaReference.from_gguf(f)
    tokens = np.arange(1, 20)
    full = model.forward(tokens, model.new_cache(32), logits_all=True)
    half = model.forward(tokens, model.new_cache(32, dtype=np.float16), logits_all=True)
    assert 0 < np.abs(full - half).max() < 1e-2 * np.abs(full).max()


def test_bad_tokens_and_a_full_cache_are_usage_errors_and_change_nothing(tmp_path):
    with open_tiny(tmp_path) as f:
        model = LlamaReference.from_gguf(f)
    cache = model.new_cache(6)
    model.forward(np.array([1, 2, 3, 4]), cache)
    for bad in (np.array([1, 2, 3]), np.array([f.config.vocab_size]), np.array([-1]),
                np.array([], dtype=np.int64), np.array([[1, 2]]), np.array([1.5])):
        with pytest.raises(UsageError) as info:
            model.forward(bad, cache)
        assert "\n" not in str(info.value)
        assert cache.length == 4
    after = model.forward(np.array([5, 6]), cache)
    fresh = model.forward(np.array([1, 2, 3, 4, 5, 6]), model.new_cache(6))
    np.testing.assert_allclose(after, fresh, atol=1e-5)


def test_unsupported_configs_are_named(tmp_path):
    with open_tiny(tmp_path) as f:
        weights = LlamaWeights.from_tensors(f.config, f.dequantize, lambda name: False)
        config = f.config
    with pytest.raises(UnsupportedModelError, match="gpt2"):
        LlamaReference(dataclasses.replace(config, architecture="gpt2"), weights)
    with pytest.raises(UnsupportedModelError, match="yarn"):
        LlamaReference(dataclasses.replace(config, rope_scaling="yarn", rope_scaling_factor=4.0), weights)
    with pytest.raises(UnsupportedModelError, match="shape"):
        LlamaReference(dataclasses.replace(config, ffn_size=config.ffn_size * 2), weights)


# --- RoPE -----------------------------------------------------------------------------------------

def test_rope_rotates_adjacent_pairs_and_passes_the_rest_through():
    rope = RotaryEmbedding(rope_dim=8, theta_base=500.0, freq_scale=0.5)
    x = np.random.default_rng(0).normal(size=(3, 2, 12)).astype(np.float32)
    positions = np.array([0, 7, 300])
    got = rope.apply(x, *rope.tables(positions))
    for t, pos in enumerate(positions):
        for h in range(2):
            for i in range(4):
                angle = pos * 0.5 * 500.0 ** (-2 * i / 8)
                a, b = x[t, h, 2 * i], x[t, h, 2 * i + 1]
                assert got[t, h, 2 * i] == pytest.approx(a * math.cos(angle) - b * math.sin(angle), abs=1e-5)
                assert got[t, h, 2 * i + 1] == pytest.approx(a * math.sin(angle) + b * math.cos(angle), abs=1e-5)
    np.testing.assert_array_equal(got[..., 8:], x[..., 8:])
    np.testing.assert_array_equal(got[0], x[0])           # position 0 is the identity


def test_rope_scores_depend_only_on_relative_position():
    rope = RotaryEmbedding(rope_dim=16, theta_base=10000.0)
    rng = np.random.default_rng(1)
    q, k = rng.normal(size=(1, 1, 16)), rng.normal(size=(1, 1, 16))

    def score(pq, pk):
        return float(rope.apply(q, *rope.tables(np.array([pq])))[0, 0] @ rope.apply(k, *rope.tables(np.array([pk])))[0, 0])

    assert score(10, 3) == pytest.approx(score(107, 100), rel=1e-4)
    assert score(10, 3) != pytest.approx(score(10, 4), rel=1e-3)


def converter_permute(w: np.ndarray, n_heads: int) -> np.ndarray:
    """What llama.cpp's convert_hf_to_gguf does to Hugging Face Q/K rows: within each head, row i of
    the first half and row i of the second half become neighbours (rows 2i and 2i+1)."""
    return w.reshape(n_heads, 2, w.shape[0] // n_heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def test_adjacent_pairs_on_converted_weights_equal_hugging_face_half_rotation():
    n_heads, d, hidden = 3, 8, 10
    rng = np.random.default_rng(4)
    wq, wk = rng.normal(size=(n_heads * d, hidden)), rng.normal(size=(n_heads * d, hidden))
    x = rng.normal(size=(5, hidden))
    positions = np.arange(5) * 13
    inv_freq = 10000.0 ** (-np.arange(0, d, 2) / d)
    angles = positions[:, None] * inv_freq[None, :]
    cos, sin = np.cos(np.concatenate([angles, angles], 1)), np.sin(np.concatenate([angles, angles], 1))

    def hf_rope(v):                                   # transformers' rotate_half formulation
        v = v.reshape(5, n_heads, d)
        rotated = np.concatenate([-v[..., d // 2:], v[..., :d // 2]], axis=-1)
        return v * cos[:, None] + rotated * sin[:, None]

    rope = RotaryEmbedding(rope_dim=d, theta_base=10000.0)
    tables = rope.tables(positions)
    q_gguf = rope.apply((x @ converter_permute(wq, n_heads).T).reshape(5, n_heads, d), *tables)
    k_gguf = rope.apply((x @ converter_permute(wk, n_heads).T).reshape(5, n_heads, d), *tables)
    q_hf, k_hf = hf_rope(x @ wq.T), hf_rope(x @ wk.T)
    scores_gguf = np.einsum("thd,shd->hts", q_gguf, k_gguf)
    scores_hf = np.einsum("thd,shd->hts", q_hf, k_hf)
    np.testing.assert_allclose(scores_gguf, scores_hf, rtol=1e-4, atol=1e-4)


def test_rope_frequency_factors_divide_the_angles():
    plain = RotaryEmbedding(rope_dim=4, theta_base=100.0)
    factors = np.array([1.0, 8.0])
    scaled = RotaryEmbedding(rope_dim=4, theta_base=100.0, freq_factors=factors)
    np.testing.assert_allclose(scaled.inv_freq, plain.inv_freq / factors)
    with pytest.raises(UnsupportedModelError):
        RotaryEmbedding(rope_dim=4, theta_base=100.0, freq_factors=np.ones(3))


def test_rope_scaling_settings():
    assert rope_freq_scale("none", 1.0) == 1.0
    assert rope_freq_scale("linear", 4.0) == 0.25
    assert rope_freq_scale(None, None) == 1.0
    with pytest.raises(UnsupportedModelError, match="yarn"):
        rope_freq_scale("yarn", 4.0)


# --- the cache ------------------------------------------------------------------------------------

def test_cache_contract():
    cache = ContiguousKvCache(n_layers=2, n_kv_heads=2, head_dim=4, capacity=5)
    k = np.arange(3 * 2 * 4, dtype=np.float32).reshape(3, 2, 4)
    cache.write(0, 0, k, -k)
    cache.write(1, 0, k, -k)
    cache.advance(3)
    np.testing.assert_array_equal(cache.keys(0, 3), k.transpose(1, 0, 2))
    np.testing.assert_array_equal(cache.values(1, 3), -k.transpose(1, 0, 2))
    with pytest.raises(UsageError, match="context full"):
        cache.check_room(3)
    with pytest.raises(UsageError):
        cache.write(0, 1, k, k)                       # not at the end of the cached tokens
    cache.truncate(1)
    assert cache.length == 1
    with pytest.raises(UsageError):
        cache.truncate(2)
    with pytest.raises(UsageError):
        ContiguousKvCache(n_layers=1, n_kv_heads=1, head_dim=4, capacity=4, dtype=np.int8)
    with pytest.raises(UsageError):
        ContiguousKvCache(n_layers=1, n_kv_heads=1, head_dim=4, capacity=0)
    assert cache.nbytes == 2 * 2 * 2 * 5 * 4 * 4
