"""paged_attention's `_sinks` entries (gpt-oss's attn_sinks: a logit per query head in every softmax's denominator)
run on the CPU under the host emulation at wave 32 and 64, against hipcore/ops/paged_attention.py's reference with
sinks: keys unsplit (the sink joins the workgroup's merge) and split over workgroups (it joins the combine, once);
a sink dropped from the combine, planted, is caught."""

from __future__ import annotations

import numpy as np
import pytest

from hipcore.kvcache.dtypes import kv_dtype
from hipcore.ops import paged_attention
from support.emulated_kernels import ARCH_FOR_WARP, U32, build_harnesses, run, write_inputs
from support.forward_pass_samples import make_sample

# (n_heads, n_kv_heads, head_dim, block_size, sequences as (context, query tokens), padding tokens)
CASES = [(9, 3, 64, 16, [(30, 1), (12, 4)], 1),  # decodes and a prompt chunk, keys unsplit
         (8, 2, 64, 16, [(700, 1)], 0)]  # keys split over workgroups, then combined


def run_sinks(harnesses, warp, tmp_path, sample, sinks, entry=None):
    max_keys = sample.max_blocks * sample.block_size
    splits = paged_attention.split_limit(sample.n_tokens, sample.n_heads, sample.n_kv_heads, max_keys)
    slots = paged_attention.slot_count(sample.n_tokens, sample.n_heads, sample.n_kv_heads, splits)
    ws_bytes = (paged_attention.workspace_bytes(sample.n_tokens, sample.n_heads, sample.n_kv_heads, sample.head_dim, slots)
                if splits > 1 else 0)
    grid, block = paged_attention.geometry(ARCH_FOR_WARP[warp], sample.n_tokens, sample.n_heads, sample.n_kv_heads, slots)
    paths = write_inputs(tmp_path, q=sample.q, k_pool=sample.k_pool, v_pool=sample.v_pool, tables=sample.block_tables,
                         token_seq=sample.token_seq, positions=sample.positions, sinks=sinks)
    entry = entry or paged_attention.kernel_name(sample.kv_dtype, sample.softcap > 0, sinks=True)
    run(harnesses, warp, entry, grid, block, sample.n_tokens, sample.n_heads, sample.n_kv_heads, sample.head_dim,
        sample.block_size, sample.max_blocks, sample.num_blocks, slots, sample.window, sample.scale, sample.softcap,
        *paths[:6], ws_bytes, tmp_path / "o", tmp_path / "ws", paths[6])
    return np.fromfile(tmp_path / "o", np.float32).reshape(sample.q.shape), splits


def want_of(sample, sinks):
    want = paged_attention.reference(sample.q, sample.k_pool, sample.v_pool, kv_dtype(sample.kv_dtype),
                                     sample.block_tables, sample.token_seq, sample.positions, sample.scale,
                                     sample.window, sample.softcap, sinks)
    # The sample's bound (its scores' and sums' roundings) with the sink's exp and one more term in each sum.
    return want, sample.tolerance() + 8 * U32 * np.abs(want)


@pytest.mark.parametrize("kv", ["f16", "q8_0"])
def test_paged_attention_with_sinks(harnesses, warp, kv, tmp_path):
    rng = np.random.default_rng([warp, 39, len(kv)])
    for n_heads, n_kv_heads, head_dim, block_size, seqs, padding in CASES:
        sample = make_sample(rng, kv, n_heads, n_kv_heads, head_dim, block_size, seqs, padding=padding, q_scale=2.0)
        sinks = (rng.standard_normal(n_heads) * 2).astype(np.float32)
        sinks[0] = 30.0  # a sink far above every score: that head's output shrinks towards zero
        want, tol = want_of(sample, sinks)
        got, splits = run_sinks(harnesses, warp, tmp_path, sample, sinks)
        assert splits > 1 or len(seqs) > 1
        bad = ~(np.abs(got - want) <= tol)
        assert not bad.any(), f"{kv} {n_heads}/{n_kv_heads} splits {splits}: {int(bad.sum())} off"
        without = want_of(sample, None)[0]
        assert (np.abs(without - want) > tol).any()  # the sinks change the output beyond the bound


def test_softcap_with_sinks(harnesses, tmp_path):
    rng = np.random.default_rng(40)
    sample = make_sample(rng, "f16", 9, 3, 64, 16, [(40, 2)], q_scale=4.0)
    sample.softcap = 5.0
    sinks = rng.standard_normal(9).astype(np.float32)
    want, tol = want_of(sample, sinks)
    got, _ = run_sinks(harnesses, 32, tmp_path, sample, sinks)
    assert np.all(np.abs(got - want) <= tol)


def test_a_sink_dropped_from_the_combine_is_caught(tmp_path):
    old = "    sum = rf_warp_sum(sum);\n    if (kSinks) sum += exp2f(sink - mx);"
    new = "    sum = rf_warp_sum(sum);"
    work = tmp_path / "planted"
    work.mkdir()
    from support import emulated_kernels
    source = emulated_kernels.kernels_dir() / "paged_attention.hip"
    assert old in source.read_text()
    harnesses = build_harnesses(work, edit={"paged_attention.hip": lambda text: text.replace(old, new)}, warps=(32,))
    rng = np.random.default_rng(41)
    sample = make_sample(rng, "f16", *CASES[1][:4], CASES[1][4], q_scale=2.0)
    sinks = (rng.standard_normal(8) * 2 + 3).astype(np.float32)
    want, tol = want_of(sample, sinks)
    got, splits = run_sinks(harnesses, 32, tmp_path, sample, sinks)
    assert splits > 1 and not np.all(np.abs(got - want) <= tol)
