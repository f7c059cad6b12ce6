"""paged_attention's `_sinks` entries (gpt-oss's attn_sinks) on a real GPU against hipcore/ops/paged_attention.py's
reference with sinks: decodes and a prompt chunk with keys unsplit, a long context split over workgroups (the sink in
the combine), every KV dtype, fresh random inputs (the seed is printed on failure)."""

from __future__ import annotations

import numpy as np
import pytest

from hipcore.kvcache.dtypes import kv_dtype
from hipcore.ops import paged_attention
from support.forward_pass_samples import make_sample

pytestmark = pytest.mark.gpu

CASES = [(64, 8, 64, 16, [(30, 1), (12, 4), (300, 1)]),  # gpt-oss-20b's heads: decodes and a prompt chunk
         (64, 8, 64, 16, [(3000, 1)])]  # one long context: keys split over workgroups


@pytest.mark.parametrize("kv", ["f16", "bf16", "f32", "q8_0"])
@pytest.mark.parametrize("case", range(len(CASES)))
def test_paged_attention_with_sinks(gpu, mem, rng, seed, kv, case):
    n_heads, n_kv_heads, head_dim, block_size, seqs = CASES[case]
    sample = make_sample(rng, kv, n_heads, n_kv_heads, head_dim, block_size, seqs, q_scale=2.0)
    sinks = (rng.standard_normal(n_heads) * 2).astype(np.float32)
    max_keys = sample.max_blocks * block_size
    splits = paged_attention.split_limit(sample.n_tokens, n_heads, n_kv_heads, max_keys)
    slots = paged_attention.slot_count(sample.n_tokens, n_heads, n_kv_heads, splits)
    workspace = mem.poisoned(paged_attention.workspace_bytes(sample.n_tokens, n_heads, n_kv_heads, head_dim, slots))
    workspace.fill(0)
    out = mem.poisoned(sample.q.nbytes)
    paged_attention.launch(gpu, None, out, mem.upload(sample.q), mem.upload(sample.k_pool, "kv"),
                           mem.upload(sample.v_pool, "kv"), mem.upload(sample.block_tables), mem.upload(sample.token_seq),
                           mem.upload(sample.positions), n_tokens=sample.n_tokens, n_heads=n_heads,
                           n_kv_heads=n_kv_heads, head_dim=head_dim, block_size=block_size,
                           max_blocks=sample.max_blocks, num_blocks=sample.num_blocks, scale=sample.scale, kv_dtype=kv,
                           workspace=workspace, sinks=mem.upload(sinks, "weights"))
    gpu.synchronize()
    want = paged_attention.reference(sample.q, sample.k_pool, sample.v_pool, kv_dtype(kv), sample.block_tables,
                                     sample.token_seq, sample.positions, sample.scale, 0, 0.0, sinks)
    tol = sample.tolerance() + 8 * 2.0**-24 * np.abs(want)
    got = out.download(np.float32).reshape(sample.q.shape)
    bad = ~(np.abs(got - want) <= tol)
    assert not bad.any(), f"seed {seed}, {kv}, splits up to {splits}: {int(bad.sum())} of {bad.size} off"
