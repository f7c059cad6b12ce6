"""gemma3 on the GPU (run with `pytest -m gpu tests/gpu/test_gemma3_gpu.py`): its kernels against their
references (gelu_mul, scale, paged_attention's sliding window), each tiny model of
tests/support/gemma3_models.py against the cpu backend (greedy tokens; logits within tolerance) and
against llama.cpp's golden record (tests/golden/gemma3_llamacpp.json, the check of
tests/test_golden_gemma3.py), graph replay equal to eager at contexts past the window, and gemma3 in every
weight type with GPU kernels against the cpu backend (teacher-forced); Gemma 3 270M Q4_K_M (when installed, or
named by $ROCMFORGE_GEMMA3_270M: tests/support/gemma3_270m.py) on the GPU against the cpu backend and
llama.cpp's record, with the long prompt past its 512-key window.

gemma3's layers take the planner's products (fused_qmatvec at decode steps, matmul_mma in prompts), head_norm_rope,
paged_attention with the layer's window and rmsnorm_add for its post-norms (tests/test_gemma_fused_launches.py).
The figures also go to gemma3_gpu_figures.json in $ROCMFORGE_FIGURES, when set.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

from hipcore.engine.loader import LoadOptions, load_model
from hipcore.model.forward import ModelRunner
from hipcore.ops import gelu_mul, scale
from support.family_golden import disagreements, evaluate, gpu_logit_tolerance
from support.forward_pass_samples import make_sample, windowed
from support.gemma3_270m import PROMPTS as REAL_PROMPTS, find_gemma3_270m
from support.gemma3_models import GEMMA3_MODELS, GREEDY_TOKENS, write_gemma3_model
from support.gguf_factory import write_tiny_llama
from support.model_steps import step_batch
from test_forward_ops_gpu import AttentionRun

pytestmark = pytest.mark.gpu

GOLDEN = Path(__file__).parents[1] / "golden" / "gemma3_llamacpp.json"
U32 = 2.0**-24
# Both backends compute in float32 with f16 K/V; they differ in summation order and exp/sin/cos (~1e-7
# relative each) through 7 layers. 1e-3 of the largest logit (~0.009 on logits of ~9) is far below the golden
# test's tolerance (0.05) and what a wrong kernel does (a missing post-norm or a wrong window: whole units).
# (F16 and BF16 files whose products take the matrix cores: support.family_golden.gpu_logit_tolerance.)
MAX_RELATIVE_LOGIT_DIFF = 1e-3
NEAR_TIE = 0.05
# Quantized weights: as tests/gpu/test_families_gpu.py (activations rounded to int8 per 32 values).
MAX_RELATIVE_QUANT_LOGIT_DIFF = 4e-2
WEIGHT_TYPES = ("F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q4_K", "Q5_K", "Q6_K")


def options(**kw) -> LoadOptions:
    return LoadOptions(**{"max_seqs": 8, "ctx_size": 256, "kv_dtype": "f16", "max_step_tokens": 128, "kv_blocks": 96,
                          **kw})


def record_figures(name: str, figures: dict) -> None:
    if os.environ.get("ROCMFORGE_FIGURES"):
        path = Path(os.environ["ROCMFORGE_FIGURES"]) / "gemma3_gpu_figures.json"
        data = json.loads(path.read_text()) if path.exists() else {}
        data[name] = figures
        path.write_text(json.dumps(data, indent=2))


# ---- the kernels --------------------------------------------------------------------------------


@pytest.mark.parametrize("n", [1, 1000, 65_537])
def test_gelu_mul(gpu, mem, rng, seed, n):
    gate = (rng.standard_normal(n) * 4).astype(np.float32)
    up = rng.standard_normal(n).astype(np.float32)
    g, u, out = mem.upload(gate), mem.upload(up), mem.poisoned(4 * n)
    gelu_mul.launch(gpu, None, out, g, u, n)
    want = gelu_mul.reference(gate, up)
    # the bound of tests/test_kernels_emulated_gemma.py (its derivation there), 2 ulp of expf on NVIDIA included
    u_abs = np.abs(gelu_mul.SQRT_2_OVER_PI * (gate.astype(np.float64) + gelu_mul.GELU_COEF_A * gate.astype(np.float64) ** 3))
    tol = 1.25 * (8 * u_abs + 5) * U32 * np.abs(want) + 1e-37
    got = out.download(np.float32)
    assert np.all(np.abs(got - want) <= tol), f"seed {seed}: worst {float(np.max(np.abs(got - want) / tol)):.2f} x tolerance"
    gelu_mul.launch(gpu, None, g, g, u, n)  # in place, as the forward pass runs it
    assert np.array_equal(g.download(np.float32), got)


def test_scale_is_exact(gpu, mem, rng, seed):
    x = rng.standard_normal(5000).astype(np.float32)
    buf = mem.upload(x)
    scale.launch(gpu, None, buf, buf, 5000, 25.298221281347036)
    assert np.array_equal(buf.download(np.float32), scale.reference(x, 25.298221281347036)), f"seed {seed}"


@pytest.mark.parametrize("kv", ["f16", "bf16", "f32", "q8_0"])
@pytest.mark.parametrize("case", ["decode 1 x 2000, window 512", "decode 32 x 600, window 512",
                                  "prompt chunk 64 at 1500, window 1024", "Gemma 3 270M heads, window 512"])
def test_paged_attention_window(gpu, mem, rng, seed, kv, case):
    """Tokens see exactly their last `window` positions; the table entries before the windows point at the
    null block, whose rows are NaN (forward_pass_samples.windowed), so a read outside the window shows."""
    n_heads, n_kv_heads, head_dim, seqs, window = {
        "decode 1 x 2000, window 512": (9, 3, 64, [(2000, 1)], 512),
        "decode 32 x 600, window 512": (8, 4, 128, [(int(c), 1) for c in rng.integers(520, 601, 32)], 512),
        "prompt chunk 64 at 1500, window 1024": (8, 2, 64, [(1500, 64)], 1024),
        "Gemma 3 270M heads, window 512": (4, 1, 256, [(900, 1), (700, 5)], 512),
    }[case]
    sample = windowed(make_sample(rng, kv, n_heads, n_kv_heads, head_dim, 16, seqs, q_scale=2.0), window)
    run = AttentionRun(gpu, mem, sample)
    run.launch()
    run.check(seed, case)


# ---- the tiny models ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def golden() -> dict:
    return json.loads(GOLDEN.read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("gemma3-models-gpu")
    return {name: write_gemma3_model(name, folder) for name in GEMMA3_MODELS}


def evaluate_all(model, record: dict) -> dict:
    out = {}
    for p, rec in record["prompts"].items():
        out[p] = evaluate(model, rec["prompt_ids"], rec["greedy_ids"], GREEDY_TOKENS)
        model.device.synchronize()
        model.cache.release_fenced()
    return out


@pytest.mark.parametrize("name", GEMMA3_MODELS)
def test_gpu_equals_cpu_and_agrees_with_llamacpp(gpu, golden, files, name):
    record = golden["models"][name]
    runs = {}
    for backend in ("gpu", "cpu"):
        opts = options() if backend == "gpu" else options(device="cpu")
        with load_model(str(files[name]), opts, device=gpu if backend == "gpu" else None) as model:
            runs[backend] = evaluate_all(model, record)
    figures = {}
    for prompt in record["prompts"]:
        g, c = runs["gpu"][prompt], runs["cpu"][prompt]
        rows_g, rows_c = np.vstack([g["last"], g["forced"]]), np.vstack([c["last"], c["forced"]])
        rel = float(np.max(np.abs(rows_g.astype(np.float64) - rows_c)) / np.max(np.abs(rows_c)))
        same = next((i for i, (a, b) in enumerate(zip(g["free"], c["free"])) if a != b), GREEDY_TOKENS)
        figures[prompt] = {"max_rel_logit_diff": rel, "greedy_same_prefix": same}
        assert rel <= gpu_logit_tolerance(name, gpu.arch, MAX_RELATIVE_LOGIT_DIFF), \
            f"{prompt}: logits differ by {rel:.2e} (relative)"
        if same < GREEDY_TOKENS:
            top2 = np.sort(c["forced"][same])[-2:] if same else np.sort(c["last"])[-2:]
            assert top2[1] - top2[0] < NEAR_TIE, f"{prompt}: greedy step {same} differs at a margin of {top2[1] - top2[0]:.3f}"
    figures["llamacpp_disagreements"] = disagreements(record, runs["gpu"])
    print(f"{name}: {figures}")
    record_figures(name, figures)
    assert figures["llamacpp_disagreements"] == []


def test_graph_replay_equals_eager(gpu, files):
    """Decode steps past the 16-key window (contexts from 17 to 60), in two batch-size buckets."""
    with load_model(str(files["gemma3-f16"]), options(), device=gpu) as model:
        cache, graphs = model.cache, model.runner
        eager = ModelRunner(model.device, model.config, model.weights, cache, max_step_tokens=128, max_seqs=8,
                            max_context=256, use_graphs=False)
        lengths = {11: 17, 12: 40, 13: 1, 14: 30, 15: 9}
        try:
            last, pos = {}, dict(lengths)
            for s, n in lengths.items():
                last[s] = int(np.argmax(graphs.execute(step_batch(cache, [(s, list(range(10, 10 + n)), 0)]))[0]))
            for step in range(20):
                live = [s for s in lengths if step < (8 if s in (11, 12) else 20)]  # 5 sequences, then 3
                batch = step_batch(cache, [(s, [last[s]], pos[s]) for s in live])
                want, got = eager.execute(batch), graphs.execute(batch)
                assert np.array_equal(got, want), f"step {step}: replay differs from eager"
                for i, s in enumerate(live):
                    last[s], pos[s] = int(np.argmax(got[i])), pos[s] + 1
            assert graphs.graphs.captures >= 2 and graphs.graphs.replays >= 18
        finally:
            for s in lengths:
                if cache.has_sequence(s):
                    cache.free_sequence(s)
            model.device.synchronize()
            cache.release_fenced()
            eager.close()


@pytest.mark.parametrize("weight_type", WEIGHT_TYPES)
def test_every_weight_type_matches_the_cpu_backend(gpu, tmp_path, weight_type):
    """Shapes multiples of 256 so that every block format fits (Gemma's head size, 256, too); 7 layers, so
    local and global layers both run; teacher-forced on the cpu's greedy tokens past the window."""
    path = write_tiny_llama(tmp_path / "m.gguf", architecture="gemma3", tensor_type=weight_type, n_layers=7,
                            hidden=256, n_heads=4, n_kv_heads=1, head_dim=256, ffn=512, vocab=384, tied=True,
                            embedding_gain=3.0, post_norm_gain=4.0, rope_theta=1e6, seed=5)
    prompt, steps = [5, 17, 99, 200, 3, 44, 61, 120, 7, 300, 12, 8, 140, 33, 2, 90, 250, 31, 77], 12
    with load_model(str(path), options(device="cpu")) as on_cpu, load_model(str(path), options(), device=gpu) as on_gpu:
        seq, tokens, worst = 77, list(prompt), 0.0
        for step in range(steps):
            batch_items = [(seq, tokens if step == 0 else tokens[-1:], 0 if step == 0 else len(tokens) - 1)]
            g, c = (m.runner.execute(step_batch(m.cache, batch_items))[0].astype(np.float64) for m in (on_gpu, on_cpu))
            top = np.argsort(c)[-10:]
            rel = float(np.max(np.abs(g[top] - c[top])) / np.max(np.abs(c)))
            worst = max(worst, rel)
            assert rel <= MAX_RELATIVE_QUANT_LOGIT_DIFF, f"step {step}: top-10 logits differ by {rel:.3e} of the largest"
            top2 = np.sort(c)[-2:]
            if top2[1] - top2[0] > 2 * MAX_RELATIVE_QUANT_LOGIT_DIFF * np.max(np.abs(c)):
                assert np.argmax(g) == np.argmax(c), f"step {step}: greedy pick differs"
            tokens.append(int(np.argmax(c)))
        print(f"gemma3 {weight_type}: max relative top-10 logit difference {worst:.2e}")
        record_figures(f"gemma3-{weight_type}", {"max_rel_top10_logit_diff": worst})


def test_gemma3_270m_gpu_equals_cpu_and_agrees_with_llamacpp(gpu):
    """Teacher-forced on llama.cpp's greedy tokens: the GPU's top-10 logits within the quantized bound of the
    cpu backend's (the GPU rounds activations to int8 for the int8-activation types, Q4_K/Q5_0/Q8_0/Q6_K
    here), and both within test_golden_gemma3_270m.py's tolerances of llama.cpp."""
    from test_golden_gemma3_270m import GOLDEN as REAL_GOLDEN, disagreements as real_disagreements
    path, why = find_gemma3_270m()
    if path is None:
        pytest.skip(why)
    record = json.loads(REAL_GOLDEN.read_text(encoding="utf-8"))
    opts = dict(max_seqs=2, ctx_size=1024, kv_dtype="f16", max_step_tokens=1024, kv_blocks=160)
    runs = {}
    for backend in ("gpu", "cpu"):
        with load_model(str(path), LoadOptions(**opts, **({} if backend == "gpu" else {"device": "cpu"})),
                        device=gpu if backend == "gpu" else None) as model:
            runs[backend] = evaluate_all(model, record)
    figures = {}
    for prompt in REAL_PROMPTS:
        g, c = runs["gpu"][prompt], runs["cpu"][prompt]
        rows_g, rows_c = np.vstack([g["last"], g["forced"]]), np.vstack([c["last"], c["forced"]])
        tops = [np.argsort(row)[-10:] for row in rows_c]
        rel = max(float(np.max(np.abs(rg[t].astype(np.float64) - rc[t])) / np.max(np.abs(rc)))
                  for rg, rc, t in zip(rows_g, rows_c, tops))
        figures[prompt] = {"max_rel_top10_logit_diff_vs_cpu": rel,
                           "llamacpp_disagreements": real_disagreements(record["prompts"][prompt], g)}
        assert rel <= MAX_RELATIVE_QUANT_LOGIT_DIFF, f"{prompt}: top-10 logits differ by {rel:.2e} of the largest"
    print(f"gemma3-270m: {figures}")
    record_figures("gemma3-270m", figures)
    assert all(not f["llamacpp_disagreements"] for f in figures.values()), figures
