"""gemma2 and phi3 on the GPU (run with `pytest -m gpu tests/gpu/test_gemma2_phi3_gpu.py`): Gemma 2's soft-capping
kernels against their references (softcap; paged_attention with a softcap, with and without a window), each
tiny model of tests/support/gemma2_models.py and tests/support/phi3_models.py against the cpu backend (greedy
tokens; logits within tolerance) and against llama.cpp's record (the checks of tests/test_golden_gemma2.py and
tests/test_golden_phi3.py), graph replay equal to eager (gemma2 past its window, with the final cap inside the
captured graph), and both families in every weight type with GPU kernels against the cpu backend
(teacher-forced).

gemma2 runs its layers as single ops like gemma3 (plus softcap after the head); phi3 takes llama's fused attention
input over its attn_qkv buffer (q and k rows reordered at load for NORM RoPE: hipcore/model/weights.py NEOX_AS_NORM)
and the fused gate|up kernels over its ffn_up buffer as it is.
The figures also go to gemma2_phi3_gpu_figures.json in $ROCMFORGE_FIGURES, when set.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import os
from pathlib import Path

import numpy as np
import pytest

from hipcore.engine.loader import LoadOptions, load_model
from hipcore.model.forward import ModelRunner
from hipcore.ops import softcap
from support.family_golden import disagreements, evaluate, gpu_logit_tolerance
from support.forward_pass_samples import make_sample, windowed
from support.gguf_factory import write_tiny_llama
from support.model_steps import step_batch
from test_forward_ops_gpu import AttentionRun

pytestmark = pytest.mark.gpu

U32 = 2.0**-24
FAMILIES = {name: importlib.import_module(f"support.{name}_models") for name in ("gemma2", "phi3")}
MODELS = {model: family for family, module in FAMILIES.items() for model in getattr(module, f"{family.upper()}_MODELS")}
# As tests/gpu/test_gemma3_gpu.py: float32 on both backends with f16 K/V, differing in summation order and in
# exp/sin/cos (~1e-7 relative each) through a few layers; 1e-3 of the largest logit is far below the golden
# tests' 0.05 and what a wrong kernel does (a missing cap or a swapped half: whole units).
# (F16 and BF16 files whose products take the matrix cores: support.family_golden.gpu_logit_tolerance.)
MAX_RELATIVE_LOGIT_DIFF = 1e-3
NEAR_TIE = 0.05
# Quantized weights: activations rounded to int8 per 32 values (tests/gpu/test_fused_qmatvec_gpu.py's bound).
MAX_RELATIVE_QUANT_LOGIT_DIFF = 4e-2
WEIGHT_TYPES = ("F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q4_K", "Q5_K", "Q6_K")


def options(**kw) -> LoadOptions:
    return LoadOptions(**{"max_seqs": 8, "ctx_size": 256, "kv_dtype": "f16", "max_step_tokens": 128, "kv_blocks": 96,
                          **kw})


def record_figures(name: str, figures: dict) -> None:
    if os.environ.get("ROCMFORGE_FIGURES"):
        path = Path(os.environ["ROCMFORGE_FIGURES"]) / "gemma2_phi3_gpu_figures.json"
        data = json.loads(path.read_text()) if path.exists() else {}
        data[name] = figures
        path.write_text(json.dumps(data, indent=2))


# ---- the kernels --------------------------------------------------------------------------------


@pytest.mark.parametrize("n", [1, 1000, 65_537])
def test_softcap(gpu, mem, rng, seed, n):
    x = (rng.standard_normal(n) * 40).astype(np.float32)
    buf, out = mem.upload(x), mem.poisoned(4 * n)
    softcap.launch(gpu, None, out, buf, n, 30.0)
    want = softcap.reference(x, 30.0)
    # the bound of tests/test_kernels_emulated_gemma2.py (its derivation there)
    tol = 1.25 * 30.0 * ((np.abs(2 * x.astype(np.float64) / 30.0) + 2) + 8) * U32
    got = out.download(np.float32)
    assert np.all(np.abs(got - want) <= tol), f"seed {seed}: worst {float(np.max(np.abs(got - want) / tol)):.2f} x tolerance"
    softcap.launch(gpu, None, buf, buf, n, 30.0)  # in place, as the forward pass runs it
    assert np.array_equal(buf.download(np.float32), got)


@pytest.mark.parametrize("kv", ["f16", "bf16", "f32", "q8_0"])
@pytest.mark.parametrize("case", ["decode 1 x 2000", "decode 32 x 600", "prompt chunk 64 at 1500, window 1024",
                                  "Gemma 2 2B heads, window 512"])
def test_paged_attention_softcap(gpu, mem, rng, seed, kv, case):
    """Scores of several units capped at 5 (Gemma 2 uses 50 on its own scores; a low cap makes it bite here)."""
    n_heads, n_kv_heads, head_dim, seqs, window = {
        "decode 1 x 2000": (9, 3, 64, [(2000, 1)], 0),
        "decode 32 x 600": (8, 4, 128, [(int(c), 1) for c in rng.integers(520, 601, 32)], 0),
        "prompt chunk 64 at 1500, window 1024": (8, 2, 64, [(1500, 64)], 1024),
        "Gemma 2 2B heads, window 512": (8, 4, 256, [(900, 1), (700, 5)], 512),
    }[case]
    sample = make_sample(rng, kv, n_heads, n_kv_heads, head_dim, 16, seqs, q_scale=8.0)
    sample = dataclasses.replace(windowed(sample, window) if window else sample, softcap=5.0)
    run = AttentionRun(gpu, mem, sample)
    run.launch()
    run.check(seed, case)


# ---- the tiny models ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def goldens() -> dict:
    return {f: json.loads((Path(__file__).parents[1] / "golden" / f"{f}_llamacpp.json").read_text(encoding="utf-8"))
            for f in FAMILIES}


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("gemma2-phi3-models-gpu")
    return {name: FAMILIES[family].write_model(name, folder) for name, family in MODELS.items()}


def evaluate_all(model, record: dict, steps: int) -> dict:
    out = {}
    for p, rec in record["prompts"].items():
        out[p] = evaluate(model, rec["prompt_ids"], rec["greedy_ids"], steps)
        model.device.synchronize()
        model.cache.release_fenced()
    return out


@pytest.mark.parametrize("name", MODELS)
def test_gpu_equals_cpu_and_agrees_with_llamacpp(gpu, goldens, files, name):
    family = MODELS[name]
    record, steps = goldens[family]["models"][name], FAMILIES[family].GREEDY_TOKENS
    runs = {}
    for backend in ("gpu", "cpu"):
        opts = options() if backend == "gpu" else options(device="cpu")
        with load_model(str(files[name]), opts, device=gpu if backend == "gpu" else None) as model:
            runs[backend] = evaluate_all(model, record, steps)
    figures = {}
    for prompt in record["prompts"]:
        g, c = runs["gpu"][prompt], runs["cpu"][prompt]
        rows_g, rows_c = np.vstack([g["last"], g["forced"]]), np.vstack([c["last"], c["forced"]])
        rel = float(np.max(np.abs(rows_g.astype(np.float64) - rows_c)) / np.max(np.abs(rows_c)))
        same = next((i for i, (a, b) in enumerate(zip(g["free"], c["free"])) if a != b), steps)
        figures[prompt] = {"max_rel_logit_diff": rel, "greedy_same_prefix": same}
        assert rel <= gpu_logit_tolerance(name, gpu.arch, MAX_RELATIVE_LOGIT_DIFF), \
            f"{prompt}: logits differ by {rel:.2e} (relative)"
        if same < steps:
            top2 = np.sort(c["forced"][same])[-2:] if same else np.sort(c["last"])[-2:]
            assert top2[1] - top2[0] < NEAR_TIE, f"{prompt}: greedy step {same} differs at a margin of {top2[1] - top2[0]:.3f}"
    figures["llamacpp_disagreements"] = disagreements(record, runs["gpu"])
    print(f"{name}: {figures}")
    record_figures(name, figures)
    assert figures["llamacpp_disagreements"] == []


@pytest.mark.parametrize("name", ["gemma2-f16", "phi3-f16"])
def test_graph_replay_equals_eager(gpu, files, name):
    """Decode steps (contexts from 17 to 60: past gemma2's 16-key window), in two batch-size buckets."""
    with load_model(str(files[name]), options(), device=gpu) as model:
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


SHAPES = {  # multiples of 256 so that every block format fits
    "gemma2": dict(architecture="gemma2", n_layers=4, hidden=256, n_heads=4, n_kv_heads=2, head_dim=256, ffn=512,
                   vocab=384, tied=True, embedding_gain=3.0, post_norm_gain=12.0, seed=5,
                   extra_metadata={"gemma2.attn_logit_softcapping": 2.0, "gemma2.final_logit_softcapping": 15.0}),
    "phi3": dict(architecture="phi3", n_layers=2, hidden=256, n_heads=4, n_kv_heads=2, ffn=512, vocab=384, tied=False,
                 logit_scale=6.0, seed=5),
}


@pytest.mark.parametrize("weight_type", WEIGHT_TYPES)
@pytest.mark.parametrize("family", FAMILIES)
def test_every_weight_type_matches_the_cpu_backend(gpu, tmp_path, family, weight_type):
    """Teacher-forced on the cpu's greedy tokens, past gemma2's 16-key window (phi3: its fused tensors' row
    views in every block format)."""
    path = write_tiny_llama(tmp_path / "m.gguf", tensor_type=weight_type, **SHAPES[family])
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
        print(f"{family} {weight_type}: max relative top-10 logit difference {worst:.2e}")
        record_figures(f"{family}-{weight_type}", {"max_rel_top10_logit_diff": worst})
