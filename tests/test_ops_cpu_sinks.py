"""paged_attention's sinks (gpt-oss's attn_sinks): a logit per query head in every softmax's denominator and nothing in
its sum of values (ggml's soft_max with sinks), against attention computed from that definition, through the host
kernel, and refused on a backend without them (paged_attention.takes_sinks: none so far)."""

from __future__ import annotations

import numpy as np
import pytest

from hipcore.kvcache.dtypes import kv_dtype
from hipcore.ops import paged_attention
from support.forward_pass_samples import make_sample
from test_ops_cpu_forward import poisoned, to_device


def naive_sink_attention(sample, sinks: np.ndarray) -> np.ndarray:
    out = np.zeros(sample.q.shape)
    group = sample.n_heads // sample.n_kv_heads
    for t in range(sample.n_tokens):
        pos = int(sample.positions[t])
        if pos < 0:
            continue
        keys, values = sample.keys_values(int(sample.token_seq[t]), pos + 1)
        for h in range(sample.n_heads):
            s = keys[h // group] @ sample.q[t, h].astype(np.float64) * sample.scale
            top = max(s.max(), float(sinks[h]))
            p = np.exp(s - top)
            out[t, h] = p @ values[h // group] / (p.sum() + np.exp(sinks[h] - top))
    return out


def _sample(seed=3):
    return make_sample(np.random.default_rng(seed), "f16", 8, 2, 64, 16, [(1, 1), (45, 1), (30, 6)], padding=1,
                       q_scale=4.0)


def _reference(sample, sinks):
    return paged_attention.reference(sample.q, sample.k_pool, sample.v_pool, kv_dtype(sample.kv_dtype), sample.block_tables,
                                     sample.token_seq, sample.positions, sample.scale, sample.window, sample.softcap,
                                     sinks)


def test_sinks_are_a_term_of_the_denominator():
    sample = _sample()
    sinks = np.random.default_rng(1).standard_normal(8).astype(np.float32) + 1.0
    got = _reference(sample, sinks)
    np.testing.assert_allclose(got, naive_sink_attention(sample, sinks), rtol=1e-5, atol=1e-6)
    assert not np.allclose(got, sample.reference(), atol=1e-2), "sinks of this size must change the output"
    np.testing.assert_allclose(_reference(sample, np.full(8, -1e30, np.float32)), sample.reference(), rtol=1e-6)


def test_sinks_through_the_host_kernel_and_refused_elsewhere(cpu_device):
    sample = _sample(4)
    sinks = np.linspace(-2, 3, 8, dtype=np.float32)
    args = [to_device(cpu_device, a, t) for a, t in ((sample.q, "activations"), (sample.k_pool, "kv"),
                                                    (sample.v_pool, "kv"), (sample.block_tables, "scratch"),
                                                    (sample.token_seq, "scratch"), (sample.positions, "scratch"))]
    out = poisoned(cpu_device, sample.q.nbytes)
    sizes = dict(n_tokens=sample.n_tokens, n_heads=8, n_kv_heads=2, head_dim=64, block_size=16,
                 max_blocks=sample.max_blocks, num_blocks=sample.num_blocks, scale=sample.scale, kv_dtype="f16")
    paged_attention.launch(cpu_device, None, out, *args, **sizes, sinks=to_device(cpu_device, sinks, "weights"))
    np.testing.assert_array_equal(out.download(np.float32).reshape(sample.q.shape), _reference(sample, sinks))
    with pytest.raises(ValueError, match="sinks"):  # a sink for every query head, or none
        paged_attention.launch(cpu_device, None, out, *args, **sizes, sinks=to_device(cpu_device, sinks[:4], "weights"))


def test_devices_without_sink_kernels_are_refused(cpu_device, monkeypatch):
    sample = _sample(5)
    monkeypatch.setattr(cpu_device, "backend", "hip")  # as a GPU's device reads: kernels/paged_attention.hip has sinks
    assert paged_attention.takes_sinks(cpu_device)
    monkeypatch.setattr(paged_attention, "takes_sinks", lambda device: False)  # a backend without them
    with pytest.raises(ValueError, match="attention sinks have no kernel on hip"):
        paged_attention.launch(cpu_device, None, to_device(cpu_device, sample.q, "activations"), *[None] * 6,
                               n_tokens=1, n_heads=8, n_kv_heads=2, head_dim=64, block_size=16, max_blocks=4,
                               num_blocks=4, scale=1.0, kv_dtype="f16", sinks=to_device(cpu_device, sample.q, "weights"))
