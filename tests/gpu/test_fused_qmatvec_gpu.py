"""kernels/fused_qmatvec.hip on a real GPU, and a Q4_K_M-typed model decoding through it.

1. Each kernel against hipcore/ops/fused_qmatvec.py's float64 reference on fresh random inputs, poisoned
   outputs, Llama-3.1-8B's shapes and small ones, Q4_K_M's type mix and others.
2. A tiny model typed as Q4_K_M (Q4_K q, k, o, gate, up; Q6_K v, down, output) on the GPU against the cpu
   backend, teacher-forced on the cpu's greedy tokens: the top-10 logits of every step within
   MAX_RELATIVE_LOGIT_DIFF of the largest logit, and the same greedy pick wherever the cpu's top-2 margin
   is wider than twice that. The cpu backend decodes every weight to float32 and multiplies in float32;
   the GPU rounds x to int8 per 32 values before each product (as llama.cpp's decode path does): a rounding
   error of at most half a step of amax / 127, ~0.5% of the product relative (rms), independent between
   products. Nine products lie on the path of a logit in a two-layer model, ~1.5% relative rms: 4e-2 is
   more than twice that, and a wrong kernel (a wrong type, scale or rotation) moves logits by their
   own size. Measured figures go to kquant_model_figures.json in
   $ROCMFORGE_FIGURES, when set.
3. Graph replay equals eager on that model.
4. The q|k|v launch storing k and v into the paged cache (kv_store.EpilogueTarget) writes kv_store's bytes.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

from hipcore.engine.loader import LoadOptions, load_model
from hipcore.model.forward import ModelRunner
from hipcore.kvcache.dtypes import kv_dtype as kv_dtype_named
from hipcore.ops import fused_qmatvec, fused_qmatvec_geometry, kv_store, qmatvec, rope
from hipcore.ops.weight_formats import dequantize_rows, row_bytes
from support.gguf_factory import write_tiny_llama
from support.model_steps import step_batch
from support.rope_factors import far_factors
from support.weight_samples import random_weights

pytestmark = pytest.mark.gpu

EPS = 1e-5
U32 = 2.0**-24  # float32's unit roundoff
MAX_RELATIVE_LOGIT_DIFF = 4e-2
Q4_K_M = {"attn_v": "Q6_K", "ffn_down": "Q6_K", "output": "Q6_K"}


def bound_of(raw, weight_type, xs, s, rows, cols):
    w = dequantize_rows(raw.reshape(rows, row_bytes(weight_type, cols)), weight_type, cols, np.float64)
    magnitude = s[:, None] * (np.abs(qmatvec.quantize_x(xs, weight_type)) @ np.abs(w).T)
    return 2 * s[:, None] * qmatvec.error_bound(raw, weight_type, xs, rows, cols) + 1e-5 * magnitude


def check(got, want, bound, what):
    bad = ~(np.abs(got - want) <= bound)
    assert not bad.any(), (f"{what}: {int(bad.sum())} of {bad.size} off; first at {np.argwhere(bad)[0].tolist()}: "
                           f"got {got[bad][0]!r}, want {want[bad][0]!r}")


@pytest.mark.parametrize("types", [("q4_k", "q4_k", "q6_k"), ("q5_k", "q8_0", "q4_0"), ("q4_1", "q5_0", "q5_1"),
                                   ("mxfp4",) * 3], ids=lambda t: "-".join(t))
@pytest.mark.parametrize("heads,kv_heads,head_dim,cols,batch", [(32, 8, 128, 4096, 1), (32, 8, 128, 4096, 3),
                                                                (4, 2, 64, 512, 1), (4, 2, 64, 256, 7)])
@pytest.mark.parametrize("with_factors", [False, True], ids=["plain", "freq_factors"])
def test_norm_rope(gpu, mem, rng, seed, types, heads, kv_heads, head_dim, cols, batch, with_factors):
    q_rows, kv_rows = heads * head_dim, kv_heads * head_dim
    raws = [random_weights(rng, t, r, cols) for t, r in zip(types, (q_rows, kv_rows, kv_rows))]
    x = (rng.standard_normal((batch, cols)) * 2).astype(np.float32)
    g = (1 + 0.3 * rng.standard_normal(cols)).astype(np.float32)
    pos = rng.integers(0, 8192, batch).astype(np.int32)
    factors = far_factors(rng, head_dim) if with_factors else None  # rope_freqs.weight (Llama 3.1/3.2)
    outs = [mem.poisoned(batch * r * 4) for r in (q_rows, kv_rows, kv_rows)]
    args = (gpu, None, *outs, [(mem.upload(r, "weights"), t) for r, t in zip(raws, types)], mem.upload(x),
            mem.upload(g), mem.upload(pos))
    kwargs = dict(q_rows=q_rows, kv_rows=kv_rows, cols=cols, batch=batch, head_dim=head_dim, rope_dim=head_dim, eps=EPS,
                  theta=500000.0, freq_scale=1.0, freq_factors=mem.upload(factors) if with_factors else None)
    if not fused_qmatvec.supports(*types, tokens=batch):  # the 32-element block types: one token only ("1b" entries)
        with pytest.raises(ValueError, match="no entry reads"):
            fused_qmatvec.launch_norm_rope(*args, **kwargs)
        return
    fused_qmatvec.launch_norm_rope(*args, **kwargs)
    want = fused_qmatvec.reference_norm_rope(list(zip(raws, types)), x, g, EPS, pos, q_rows, kv_rows, cols, head_dim,
                                             head_dim, 500000.0, 1.0, factors)
    xg, s = fused_qmatvec.norm_parts(x, g, EPS, cols)
    # The kernel's angle is position x frequency in float32 (up to 8191 x 4 rad here): its rounding moves a
    # rotated pair by ~|pair| x angle x 2^-24 per operation, as tests/gpu/test_fused_ops_gpu.py bounds it.
    angle = rope.angles(pos, head_dim, 500000.0, 1.0, factors)  # divided by the factors, when given
    for name, out, ref, raw, t, rows in zip("qkv", outs, want, raws, types, (q_rows, kv_rows, kv_rows)):
        bound = bound_of(raw, t, xg, s, rows, cols)
        if name != "v":
            unrotated = fused_qmatvec.reference_norm(raw, t, x, g, EPS, rows, cols)
            size = np.abs(unrotated).reshape(batch, -1, 2).sum(-1).repeat(2, -1)
            bound = (bound.reshape(batch, -1, 2).sum(-1).repeat(2, -1)
                     + size * np.tile((32 * U32 * angle + 8 * U32).repeat(2, -1), rows // head_dim))
        check(out.download(np.float32).reshape(batch, rows), ref, bound, f"seed {seed} {name} factors {with_factors}")


@pytest.mark.parametrize("types", [("q4_k", "q4_k", "q6_k"), ("q8_0", "q8_0", "q8_0")], ids=lambda t: "-".join(t))
@pytest.mark.parametrize("batch", [1, 3])
def test_norm_rope_adds_qwen2s_biases_before_rope(gpu, mem, rng, seed, types, batch):
    """Qwen2.5-7B's attention shapes (28 q heads, 4 kv heads of 128, 3,584 columns) with q, k and v biases: each
    added to its product before the rotation, as the reference does it."""
    heads, kv_heads, head_dim, cols = 28, 4, 128, 3584
    q_rows, kv_rows = heads * head_dim, kv_heads * head_dim
    raws = [random_weights(rng, t, r, cols) for t, r in zip(types, (q_rows, kv_rows, kv_rows))]
    biases = [(rng.standard_normal(r) * 4).astype(np.float32) for r in (q_rows, kv_rows, kv_rows)]
    x = (rng.standard_normal((batch, cols)) * 2).astype(np.float32)
    g = (1 + 0.3 * rng.standard_normal(cols)).astype(np.float32)
    pos = rng.integers(0, 8192, batch).astype(np.int32)
    outs = [mem.poisoned(batch * r * 4) for r in (q_rows, kv_rows, kv_rows)]
    fused_qmatvec.launch_norm_rope(gpu, None, *outs, [(mem.upload(r, "weights"), t) for r, t in zip(raws, types)],
                                   mem.upload(x), mem.upload(g), mem.upload(pos), q_rows=q_rows, kv_rows=kv_rows,
                                   cols=cols, batch=batch, head_dim=head_dim, rope_dim=head_dim, eps=EPS,
                                   theta=1000000.0, freq_scale=1.0, biases=[mem.upload(b) for b in biases])
    want = fused_qmatvec.reference_norm_rope(list(zip(raws, types)), x, g, EPS, pos, q_rows, kv_rows, cols, head_dim,
                                             head_dim, 1000000.0, 1.0, biases=biases)
    xg, s = fused_qmatvec.norm_parts(x, g, EPS, cols)
    angle = rope.angles(pos, head_dim, 1000000.0, 1.0)
    for name, out, ref, raw, t, rows, bias in zip("qkv", outs, want, raws, types, (q_rows, kv_rows, kv_rows), biases):
        bound = bound_of(raw, t, xg, s, rows, cols) + U32 * np.abs(ref)
        if name != "v":
            unrotated = fused_qmatvec.reference_norm(raw, t, x, g, EPS, rows, cols) + bias[None, :]
            size = np.abs(unrotated).reshape(batch, -1, 2).sum(-1).repeat(2, -1)
            bound = (bound.reshape(batch, -1, 2).sum(-1).repeat(2, -1)
                     + size * np.tile((32 * U32 * angle + 8 * U32).repeat(2, -1), rows // head_dim))
        check(out.download(np.float32).reshape(batch, rows), ref, bound, f"seed {seed} {name} biases, batch {batch}")


@pytest.mark.parametrize("kv_dtype", sorted(kv_store.EPILOGUE_FORMATS))
@pytest.mark.parametrize("batch", [1, 5])
def test_norm_rope_stores_kv_into_the_cache(gpu, mem, rng, seed, kv_dtype, batch):
    """With a cache target (Llama-3.1-8B's q|k|v, blocks of 16) the launch writes k and v into the pools at the
    tokens' slots: the bytes kv_store.reference makes of the k and v the same launch writes without one, every
    other byte of the pools untouched, the k and v buffers untouched, q the same."""
    types, heads, kv_heads, head_dim, cols = ("q4_k", "q4_k", "q6_k"), 32, 8, 128, 4096
    q_rows, kv_rows, block_size, num_blocks = heads * head_dim, kv_heads * head_dim, 16, 5
    raws = [random_weights(rng, t, r, cols) for t, r in zip(types, (q_rows, kv_rows, kv_rows))]
    weights = [(mem.upload(r, "weights"), t) for r, t in zip(raws, types)]
    x, g = mem.upload((rng.standard_normal((batch, cols)) * 2).astype(np.float32)), \
        mem.upload((1 + 0.3 * rng.standard_normal(cols)).astype(np.float32))
    pos = mem.upload(rng.integers(0, 8192, batch).astype(np.int32))
    slots = rng.choice(num_blocks * block_size, batch, replace=False).astype(np.int32)
    if batch > 1:
        slots[2] = -1  # a padding row
    fmt = kv_dtype_named(kv_dtype)
    pool_shape = (num_blocks, kv_heads, block_size, fmt.row_bytes(head_dim))
    before = rng.integers(0, 256, (2, *pool_shape), dtype=np.uint8)
    pools = [mem.upload(before[0]), mem.upload(before[1])]
    kwargs = dict(q_rows=q_rows, kv_rows=kv_rows, cols=cols, batch=batch, head_dim=head_dim, rope_dim=head_dim,
                  eps=EPS, theta=500000.0, freq_scale=1.0)
    plain = [mem.poisoned(batch * r * 4) for r in (q_rows, kv_rows, kv_rows)]
    fused_qmatvec.launch_norm_rope(gpu, None, *plain, weights, x, g, pos, **kwargs)
    stored = [mem.poisoned(batch * r * 4) for r in (q_rows, kv_rows, kv_rows)]
    poison = stored[1].download(np.uint8)
    target = kv_store.EpilogueTarget(pools[0], pools[1], mem.upload(slots), block_size, num_blocks, kv_dtype)
    fused_qmatvec.launch_norm_rope(gpu, None, *stored, weights, x, g, pos, kv_target=target, **kwargs)
    assert np.array_equal(stored[0].download(np.uint8), plain[0].download(np.uint8)), "q changed"
    for out in stored[1:]:
        assert np.array_equal(out.download(np.uint8), poison), "a k or v buffer was written with a cache target"
    for i, (pool, out, name) in enumerate(zip(pools, plain[1:], "kv")):
        want = before[i].copy()
        kv_store.reference(want, out.download(np.float32).reshape(batch, kv_heads, head_dim), slots, fmt)
        got = pool.download(np.uint8).reshape(pool_shape)
        assert np.array_equal(got, want), f"seed {seed} {name} pool {kv_dtype} batch {batch}"


# (activation, the bound's slope of the activation (SiLU's peaks at 1.1, GELU's at 1.13), the relative slack of the
# result's roundings): SwiGLU, and Gemma's GeGLU
GATES = {"silu": (1.1, 1e-5), "gelu": (1.13, 4e-5)}


# Llama-3.1-8B's gate|up, small odd shapes, and Gemma-3-4B's (10,240 x 2,560) with GeGLU, at one token and in batches
@pytest.mark.parametrize("types,rows,cols,batch,activation", [
    (("q4_k", "q4_k"), 14336, 4096, 1, "silu"), (("q4_k", "q6_k"), 14336, 4096, 2, "silu"),
    (("q8_0", "q5_k"), 300, 512, 5, "silu"), (("q5_0", "q5_1"), 14336, 4096, 1, "silu"),
    (("q4_1", "q4_1"), 300, 512, 1, "silu"), (("q4_k", "q4_k"), 10240, 2560, 1, "gelu"),
    (("q4_k", "q6_k"), 10240, 2560, 5, "gelu"), (("q5_0", "q5_0"), 10240, 2560, 1, "gelu"),
    (("mxfp4", "mxfp4"), 2880, 2880, 1, "silu"), (("mxfp4", "mxfp4"), 300, 512, 5, "silu")])
def test_norm_swiglu(gpu, mem, rng, seed, types, rows, cols, batch, activation):
    wg, wu = (random_weights(rng, t, rows, cols) for t in types)
    x = (rng.standard_normal((batch, cols)) * 2).astype(np.float32)
    g = (1 + 0.3 * rng.standard_normal(cols)).astype(np.float32)
    y = mem.poisoned(batch * rows * 4)
    fused_qmatvec.launch_norm_swiglu(gpu, None, y, [(mem.upload(wg, "weights"), types[0]), (mem.upload(wu, "weights"),
                                     types[1])], mem.upload(x), mem.upload(g), rows=rows, cols=cols, batch=batch, eps=EPS,
                                     activation=activation)
    xg, s = fused_qmatvec.norm_parts(x, g, EPS, cols)
    gate = fused_qmatvec.reference_norm(wg, types[0], x, g, EPS, rows, cols)
    up = fused_qmatvec.reference_norm(wu, types[1], x, g, EPS, rows, cols)
    want = fused_qmatvec.reference_norm_swiglu([(wg, types[0]), (wu, types[1])], x, g, EPS, rows, cols,
                                               activation=activation)
    tg, tu = bound_of(wg, types[0], xg, s, rows, cols), bound_of(wu, types[1], xg, s, rows, cols)
    slope, slack = GATES[activation]
    bound = slope * np.abs(up) * tg + np.abs(gate) * tu + tg * tu + slack * np.abs(want)
    check(y.download(np.float32).reshape(batch, rows), want, bound, f"seed {seed} {activation}")


@pytest.mark.parametrize("weight_type,rows,cols,batch", [("q6_k", 4096, 14336, 1), ("q4_k", 4096, 4096, 4),
                                                         ("q6_k", 128256, 4096, 1), ("q4_0", 77, 96, 9),
                                                         ("q5_0", 4096, 14336, 1), ("q5_1", 4096, 4096, 1),
                                                         ("q4_1", 77, 96, 1), ("mxfp4", 2880, 4096, 1),
                                                         ("mxfp4", 77, 96, 3)])
def test_add_and_norm(gpu, mem, rng, seed, weight_type, rows, cols, batch):
    raw = random_weights(rng, weight_type, rows, cols)
    x = (rng.standard_normal((batch, cols)) * 2).astype(np.float32)
    g = (1 + 0.3 * rng.standard_normal(cols)).astype(np.float32)
    y0 = rng.standard_normal((batch, rows)).astype(np.float32)
    w, xs = mem.upload(raw, "weights"), mem.upload(x)
    y = mem.upload(y0)
    fused_qmatvec.launch_add(gpu, None, y, w, xs, rows=rows, cols=cols, batch=batch, weight_type=weight_type)
    want = fused_qmatvec.reference_add(raw, weight_type, x, y0, rows, cols)
    bound = bound_of(raw, weight_type, x, np.ones(batch), rows, cols) + 2**-24 * np.abs(want)
    check(y.download(np.float32).reshape(batch, rows), want, bound, f"seed {seed} add")
    stored = mem.poisoned(batch * rows * 4)  # store=True (Gemma's o and down): every row written, nothing added
    fused_qmatvec.launch_add(gpu, None, stored, w, xs, rows=rows, cols=cols, batch=batch, weight_type=weight_type,
                             store=True)
    check(stored.download(np.float32).reshape(batch, rows), want - y0, bound, f"seed {seed} store")
    out = mem.poisoned(batch * rows * 4)
    fused_qmatvec.launch_norm(gpu, None, out, w, xs, mem.upload(g), rows=rows, cols=cols, batch=batch, eps=EPS,
                              weight_type=weight_type)
    xg, s = fused_qmatvec.norm_parts(x, g, EPS, cols)
    check(out.download(np.float32).reshape(batch, rows), fused_qmatvec.reference_norm(raw, weight_type, x, g, EPS, rows,
          cols), bound_of(raw, weight_type, xg, s, rows, cols), f"seed {seed} norm")


@pytest.mark.parametrize("k_split", [1, 2, 4])
@pytest.mark.parametrize("weight_type,cols", [("q4_k", 4096), ("q6_k", 14336)])
def test_every_split_of_the_residual(gpu, mem, rng, seed, monkeypatch, k_split, weight_type, cols):
    """The residual product at one token at each k_split (the launcher picks 2 for an 8B's o and down): its
    row groups' warps share the columns, their sums meet in shared memory."""
    monkeypatch.setattr(fused_qmatvec_geometry, "FORCED_K_SPLIT", k_split)
    test_add_and_norm(gpu, mem, rng, seed, weight_type, 4096, cols, 1)


# ---- the whole model ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def kquant_model(tmp_path_factory):
    return str(write_tiny_llama(tmp_path_factory.mktemp("q4km") / "q4_k_m.gguf", hidden=256, ffn=512, n_heads=4,
                                n_kv_heads=2, vocab=384, n_layers=2, tensor_type="Q4_K", tensor_types=Q4_K_M,
                                tied=False, context=256, seed=3))


def test_q4_k_m_model_matches_the_cpu_backend(gpu, kquant_model):
    options = dict(max_seqs=4, ctx_size=256, kv_dtype="f16")
    with load_model(kquant_model, LoadOptions(**options), device=gpu) as on_gpu, \
            load_model(kquant_model, LoadOptions(device="cpu", **options)) as on_cpu:
        layer = on_gpu.weights.layers[0]
        assert (layer.attn_q.fmt, layer.attn_v.fmt, layer.ffn_down.fmt) == ("q4_k", "q6_k", "q6_k")
        prompt, steps, seq = [5, 77, 123, 9, 300, 41], 24, 7
        worst, agree, decided = 0.0, 0, 0
        tokens = list(prompt)
        for step in range(steps):
            new = tokens if step == 0 else tokens[-1:]
            first = 0 if step == 0 else len(tokens) - 1
            got = [loaded.runner.execute(step_batch(loaded.cache, [(seq, new, first)]))[0].astype(np.float64)
                   for loaded in (on_gpu, on_cpu)]
            gpu_logits, cpu_logits = got
            scale = np.max(np.abs(cpu_logits))
            top = np.argsort(cpu_logits)[-10:]
            rel = float(np.max(np.abs(gpu_logits[top] - cpu_logits[top])) / scale)
            worst = max(worst, rel)
            assert rel <= MAX_RELATIVE_LOGIT_DIFF, f"step {step}: top-10 logits differ by {rel:.3e} of the largest"
            top2 = np.sort(cpu_logits)[-2:]
            if top2[1] - top2[0] > 2 * MAX_RELATIVE_LOGIT_DIFF * scale:
                decided += 1
                agree += int(np.argmax(gpu_logits) == np.argmax(cpu_logits))
                assert np.argmax(gpu_logits) == np.argmax(cpu_logits), f"step {step}: greedy pick differs"
            tokens.append(int(np.argmax(cpu_logits)))
        for loaded in (on_gpu, on_cpu):
            loaded.cache.free_sequence(seq)
            loaded.device.synchronize()
            loaded.cache.release_fenced()
        figures = {"steps": steps, "max_rel_top10_logit_diff": worst, "greedy_decided_steps": decided,
                   "greedy_agree": agree}
        print(figures)
        if os.environ.get("ROCMFORGE_FIGURES"):
            out = Path(os.environ["ROCMFORGE_FIGURES"]) / "kquant_model_figures.json"
            out.write_text(json.dumps(figures, indent=2))


def test_q4_k_m_graph_replay_equals_eager(gpu, kquant_model):
    with load_model(kquant_model, LoadOptions(max_seqs=4, ctx_size=256, kv_dtype="f16"), device=gpu) as loaded:
        eager = ModelRunner(loaded.device, loaded.config, loaded.weights, loaded.cache, max_step_tokens=64, max_seqs=4,
                            max_context=256, use_graphs=False)
        cache, graphs = loaded.cache, loaded.runner
        lengths = {11: 5, 12: 9, 13: 1}
        try:
            last, pos = {}, dict(lengths)
            for s, n in lengths.items():
                last[s] = int(np.argmax(graphs.execute(step_batch(cache, [(s, list(range(20, 20 + n)), 0)]))[0]))
            for step in range(8):
                live = [s for s in lengths if step < 4 or s != 11]  # three sequences, then two
                batch = step_batch(cache, [(s, [last[s]], pos[s]) for s in live])
                want, got = eager.execute(batch), graphs.execute(batch)
                assert np.array_equal(got, want), f"step {step}: replay differs from eager"
                for i, s in enumerate(live):
                    last[s], pos[s] = int(np.argmax(got[i])), pos[s] + 1
            assert graphs.graphs.replays > 4
        finally:
            for s in lengths:
                if cache.has_sequence(s):
                    cache.free_sequence(s)
            loaded.device.synchronize()
            cache.release_fenced()
            eager.close()


def test_q4_k_m_prompt_step_with_swiglu_pairs_matches_the_cpu_backend(gpu, kquant_model, monkeypatch):
    """A prompt step in 64-token tiles (matmul.BUSY_WORKGROUPS lowered so that this small model's step tiles
    as a real model's 512-token step does) takes matmul_mma's SwiGLU pairs for gate and up; with
    matmul_mma.WIDE_MIN_TILES lowered, the 128-token tiles (the gate, then the up product with the SwiGLU); the
    last logits of both match the cpu backend's within the model test's tolerance, and the step without pairs."""
    from hipcore.model import projections
    from hipcore.ops import matmul, matmul_mma

    monkeypatch.setattr(matmul, "BUSY_WORKGROUPS", 1)
    prompt = [(7 * i + 3) % 380 for i in range(140)]
    options = dict(max_seqs=4, ctx_size=256, kv_dtype="f16")
    logits = {}
    with_pairs = projections.ProjectionPlanner.ffn_pairs
    for label, pairs, kind in (("pairs", "1", "gate_up+silu"), ("wide", "1", "up_proj+silu"), ("no pairs", "0", None)):
        monkeypatch.setattr(projections.ProjectionPlanner, "ffn_pairs",
                            with_pairs if pairs == "1" else lambda *args, **kwargs: False)
        monkeypatch.setattr(matmul_mma, "WIDE_MIN_TILES", 1 if label == "wide" else 1 << 30)
        # This small model's few tiles would be split; the wide SwiGLU takes unsplit steps only.
        monkeypatch.setattr(matmul_mma, "BUSY_ITEMS", 2 if label == "wide" else 264)
        with load_model(kquant_model, LoadOptions(**options), device=gpu) as loaded:
            names = [name for name, _ in loaded.runner.launch_plan(len(prompt), 1, all_rows=False, with_sampling=False,
                                                                    decode=False)]
            assert all((k in names) == (k == kind) for k in ("gate_up+silu", "up_proj+silu")), names
            logits[label] = loaded.runner.execute(step_batch(loaded.cache, [(1, prompt, 0)]))[0].astype(np.float64)
            loaded.cache.free_sequence(1)
            loaded.device.synchronize()
            loaded.cache.release_fenced()
    with load_model(kquant_model, LoadOptions(device="cpu", **options)) as on_cpu:
        cpu_logits = on_cpu.runner.execute(step_batch(on_cpu.cache, [(1, prompt, 0)]))[0].astype(np.float64)
        on_cpu.cache.free_sequence(1)
        on_cpu.cache.release_fenced()
    scale, top = np.max(np.abs(cpu_logits)), np.argsort(cpu_logits)[-10:]
    for label, got in logits.items():
        rel = float(np.max(np.abs(got[top] - cpu_logits[top])) / scale)
        assert rel <= MAX_RELATIVE_LOGIT_DIFF, f"{label}: top-10 logits differ by {rel:.3e} of the largest"
    for label in ("pairs", "wide"):
        rel = float(np.max(np.abs(logits[label] - logits["no pairs"])) / scale)
        assert rel <= MAX_RELATIVE_LOGIT_DIFF, f"{label} against no pairs: {rel:.3e} of the largest logit"
