"""Gemma 2's soft-capping on the cpu backend: softcap (the final logits) through the launch path against its
reference and known values, and paged_attention's `softcap` against attention computed from its definition
(llama.cpp's: scaled scores, then c tanh(S / c), then the mask and the softmax)."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from hipcore.ops import paged_attention, softcap
from support.forward_pass_samples import make_sample
from test_ops_cpu_forward import poisoned, to_device


def test_softcap_values():
    got = softcap.reference(np.array([0.0, 30.0, -60.0, 1e30, -1e30, 3.0], np.float32), 30.0)
    want = [0.0, 30 * math.tanh(1.0), 30 * math.tanh(-2.0), 30.0, -30.0, 30 * math.tanh(0.1)]
    np.testing.assert_allclose(got, np.array(want, np.float32), rtol=2**-24)


@pytest.mark.parametrize("n", [1, 257, 10_001])
def test_softcap_through_the_launcher(cpu_device, n):
    rng = np.random.default_rng(n)
    x = (rng.standard_normal(n) * 40).astype(np.float32)
    buf, out = to_device(cpu_device, x), poisoned(cpu_device, 4 * n)
    softcap.launch(cpu_device, None, out, buf, n, 30.0)
    np.testing.assert_array_equal(out.download(np.float32), softcap.reference(x, 30.0))
    softcap.launch(cpu_device, None, buf, buf, n, 30.0)  # in place, as the forward pass runs it
    np.testing.assert_array_equal(buf.download(np.float32), softcap.reference(x, 30.0))
    for bad in (0.0, -1.0, float("inf"), float("nan")):
        with pytest.raises(ValueError, match="cap"):
            softcap.launch(cpu_device, None, out, buf, n, bad)


def naive_capped_attention(sample, cap: float) -> np.ndarray:
    """Attention from its definition, one token and head at a time, float64."""
    out = np.zeros(sample.q.shape)
    group = sample.n_heads // sample.n_kv_heads
    for t in range(sample.n_tokens):
        pos = int(sample.positions[t])
        if pos < 0:
            continue
        keys, values = sample.keys_values(int(sample.token_seq[t]), pos + 1)
        for h in range(sample.n_heads):
            s = keys[h // group] @ sample.q[t, h].astype(np.float64) * sample.scale
            s = cap * np.tanh(s / cap)
            p = np.exp(s - s.max())
            out[t, h] = (p / p.sum()) @ values[h // group]
    return out


@pytest.mark.parametrize("kv", ["f16", "q8_0"])
def test_paged_attention_softcap_reference(kv):
    rng = np.random.default_rng(len(kv))
    plain = make_sample(rng, kv, 8, 2, 64, 16, [(1, 1), (45, 1), (60, 9)], padding=1, q_scale=8.0)
    capped = dataclasses.replace(plain, softcap=5.0)
    got = capped.reference()
    np.testing.assert_allclose(got, naive_capped_attention(plain, 5.0), rtol=1e-5, atol=1e-6)
    assert not np.allclose(got, plain.reference(), atol=1e-2), "the cap must reshape these scores"


def test_paged_attention_softcap_through_the_launcher(cpu_device):
    """The host kernel receives the cap; a negative or infinite cap is refused."""
    rng = np.random.default_rng(8)
    sample = dataclasses.replace(make_sample(rng, "f16", 8, 2, 64, 16, [(50, 1), (30, 4)], q_scale=8.0), softcap=5.0)
    args = [to_device(cpu_device, a, t) for a, t in ((sample.q, "activations"), (sample.k_pool, "kv"),
                                                    (sample.v_pool, "kv"), (sample.block_tables, "scratch"),
                                                    (sample.token_seq, "scratch"), (sample.positions, "scratch"))]
    out = poisoned(cpu_device, sample.q.nbytes)
    sizes = dict(n_tokens=sample.n_tokens, n_heads=8, n_kv_heads=2, head_dim=64, block_size=16,
                 max_blocks=sample.max_blocks, num_blocks=sample.num_blocks, scale=sample.scale, kv_dtype="f16")
    paged_attention.launch(cpu_device, None, out, *args, **sizes, softcap=5.0)
    np.testing.assert_array_equal(out.download(np.float32).reshape(sample.q.shape), sample.reference())
    for bad in (-1.0, float("inf")):
        with pytest.raises(ValueError, match="softcap"):
            paged_attention.launch(cpu_device, None, out, *args, **sizes, softcap=bad)
