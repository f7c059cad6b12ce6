"""prompt_attention on a real GPU against paged_attention's numpy reference (run with `pytest -m gpu tests/gpu`):
the prompt steps the forward pass gives it, on fresh random inputs every run (the seed is in each failure
message), out poisoned with 0xFF bytes first, within PagedSample.matrix_core_tolerance (its derivation is in
tests/support/forward_pass_samples.py). On a GPU without matrix cores the kernel's FMA path runs (the forward
pass keeps paged_attention there, but the entry is built for every target and must be right too)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from support.forward_pass_samples import make_sample, windowed
from hipcore.ops import prompt_attention

pytestmark = pytest.mark.gpu

# (n_heads, n_kv_heads, head_dim, block_size, sequences as (context, query tokens), padding, window[, soft cap])
CASES = {
    "llama-3 8B prompt 512": (32, 8, 128, 16, [(512, 512)], 0, 0),
    "llama-3 8B chunk after 1500 + decodes": (32, 8, 128, 16, [(1800, 300), (40, 1), (900, 1)], 3, 0),
    "demo model prompt 512": (9, 3, 64, 16, [(512, 512)], 0, 0),
    "window 100, two prompts": (8, 4, 128, 16, [(400, 333), (70, 70)], 1, 100),
    "no grouping, blocks of 256": (16, 16, 64, 256, [(700, 200)], 0, 0),
    "group of 8, blocks of 8, head 96": (8, 1, 96, 8, [(260, 129)], 2, 0),
    "gemma-2 9B prompt 512, soft cap 50": (16, 8, 256, 16, [(512, 512)], 0, 0, 50.0),
    "gemma-3 4B chunk after 700, window 512": (8, 4, 256, 16, [(1200, 500), (33, 1)], 2, 512),
    "heads of 256, group of 4, soft cap 3": (4, 1, 256, 16, [(300, 300)], 0, 0, 3.0),
    "gemma-2 27B heads of 128, soft cap 2": (32, 16, 128, 16, [(400, 200)], 1, 100, 2.0),
}


@pytest.mark.parametrize("case", list(CASES))
def test_prompt_attention_matches_the_reference(gpu, mem, rng, seed, case):
    n_heads, n_kv_heads, head_dim, block_size, seqs, padding, window, *cap = CASES[case]
    s = make_sample(rng, "f16", n_heads, n_kv_heads, head_dim, block_size, seqs, padding=padding,
                    q_scale=float(rng.uniform(0.5, 3)))
    s = windowed(s, window) if window else s
    s = dataclasses.replace(s, softcap=cap[0]) if cap else s
    inputs = [mem.upload(s.q), mem.upload(s.k_pool, "kv"), mem.upload(s.v_pool, "kv"),
              mem.upload(s.block_tables, "scratch"), mem.upload(s.token_seq, "scratch"), mem.upload(s.positions, "scratch")]
    out = mem.poisoned(s.q.nbytes)
    prompt_attention.launch(gpu, None, out, *inputs, n_tokens=s.n_tokens, n_heads=s.n_heads, n_kv_heads=s.n_kv_heads,
                            head_dim=s.head_dim, block_size=s.block_size, max_blocks=s.max_blocks,
                            num_blocks=s.num_blocks, scale=s.scale, window=s.window, softcap=s.softcap)
    got = out.download(np.float32).reshape(s.q.shape)
    want, tol = s.reference(), s.matrix_core_tolerance()
    err = np.abs(got - want)
    bad = ~(err <= tol)
    assert not bad.any(), (f"seed {seed} {case}: {int(bad.sum())} of {bad.size} outputs off; worst "
                           f"{float(np.nanmax(err / tol)):.2f} x tolerance at {np.argwhere(bad)[0].tolist()}")
    assert not got[s.positions < 0].any(), "padding rows are zero"
    # out_f16 (the o product's f16 x): the same values rounded to f16
    out16 = mem.poisoned(s.q.nbytes // 2)
    prompt_attention.launch(gpu, None, out16, *inputs, n_tokens=s.n_tokens, n_heads=s.n_heads, n_kv_heads=s.n_kv_heads,
                            head_dim=s.head_dim, block_size=s.block_size, max_blocks=s.max_blocks,
                            num_blocks=s.num_blocks, scale=s.scale, window=s.window, softcap=s.softcap, out_f16=True)
    assert np.array_equal(out16.download(np.float16).reshape(s.q.shape), got.astype(np.float16)), \
        f"seed {seed} {case}: the f16 output is not the float32 output rounded"


# gpt-oss's sink entries: (n_heads, n_kv_heads, head_dim, block_size, sequences, padding, window)
SINK_CASES = {
    "gpt-oss-20b prompt 512, window 128": (64, 8, 64, 16, [(512, 512)], 0, 128),
    "gpt-oss-20b chunk after 900 + decodes, no window": (64, 8, 64, 16, [(1400, 500), (40, 1)], 2, 0),
    "tiny gpt-oss heads of 32": (4, 2, 32, 16, [(100, 71)], 1, 16),
}


@pytest.mark.parametrize("case", list(SINK_CASES))
def test_prompt_attention_with_sinks_matches_the_reference(gpu, mem, rng, seed, case):
    """The `_sinks` entries against paged_attention's reference with sinks, within matrix_core_tolerance (a sink only
    lowers each weight, by one factor a row) plus the sink's exp and one more term in each sum."""
    from hipcore.kvcache.dtypes import kv_dtype
    from hipcore.ops import paged_attention

    n_heads, n_kv_heads, head_dim, block_size, seqs, padding, window = SINK_CASES[case]
    s = make_sample(rng, "f16", n_heads, n_kv_heads, head_dim, block_size, seqs, padding=padding,
                    q_scale=float(rng.uniform(0.5, 3)))
    s = windowed(s, window) if window else s
    sinks = (rng.standard_normal(n_heads) * 2 + 1).astype(np.float32)
    inputs = [mem.upload(s.q), mem.upload(s.k_pool, "kv"), mem.upload(s.v_pool, "kv"),
              mem.upload(s.block_tables, "scratch"), mem.upload(s.token_seq, "scratch"), mem.upload(s.positions, "scratch")]
    out = mem.poisoned(s.q.nbytes)
    prompt_attention.launch(gpu, None, out, *inputs, n_tokens=s.n_tokens, n_heads=s.n_heads, n_kv_heads=s.n_kv_heads,
                            head_dim=s.head_dim, block_size=s.block_size, max_blocks=s.max_blocks,
                            num_blocks=s.num_blocks, scale=s.scale, window=s.window,
                            sinks=mem.upload(sinks, "weights"))
    got = out.download(np.float32).reshape(s.q.shape)
    want = paged_attention.reference(s.q, s.k_pool, s.v_pool, kv_dtype("f16"), s.block_tables, s.token_seq,
                                     s.positions, s.scale, s.window, 0.0, sinks)
    tol = s.matrix_core_tolerance() + 8 * np.finfo(np.float32).eps / 2 * np.abs(want)
    bad = ~(np.abs(got - want) <= tol)
    assert not bad.any(), (f"seed {seed} {case}: {int(bad.sum())} of {bad.size} outputs off; worst "
                           f"{float(np.nanmax(np.abs(got - want) / tol)):.2f} x tolerance")
    assert not got[s.positions < 0].any(), "padding rows are zero"
