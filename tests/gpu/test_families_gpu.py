"""qwen2 and qwen3 on the GPU (run with `pytest -m gpu tests/gpu/test_families_gpu.py`): each tiny family model of
tests/support/family_models.py against the cpu backend (greedy tokens; logits within tolerance) and against
llama.cpp's golden record (the same check as tests/test_golden_families.py), graph replay equal to eager, and
both families in every weight type with GPU kernels against the cpu backend (teacher-forced, the tolerance of
tests/gpu/test_fused_qmatvec_gpu.py, whose reasoning holds here: the same nine products on a logit's path).

These models take the unfused attention input (norm, three products, bias adds or per-head norms, NEOX RoPE:
kernels add_bias.hip, rmsnorm.hip over heads, rope.hip's rope_neox_f32) and the fused kernels everywhere else.
The figures also go to families_gpu_figures.json in $ROCMFORGE_FIGURES, when set.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

from hipcore.engine.loader import LoadOptions, load_model
from hipcore.model.forward import ModelRunner
from hipcore.runtime import kernels as loader
from support.family_models import FAMILY_MODELS, GREEDY_TOKENS, write_family_model
from support.gguf_factory import write_tiny_llama
from support.model_steps import step_batch
from support.family_golden import GOLDEN, disagreements, evaluate, gpu_logit_tolerance

pytestmark = pytest.mark.gpu

# Both backends compute in float32 with f16 K/V; they differ in summation order and exp/sin/cos (~1e-7
# relative each) through 2 layers. 1e-3 of the largest logit (~0.015 on logits of ~15) is far below the
# golden test's tolerance and what a wrong kernel does (a dropped bias or NORM RoPE: whole units).
# (F16 and BF16 files whose products take the matrix cores: support.family_golden.gpu_logit_tolerance.)
MAX_RELATIVE_LOGIT_DIFF = 1e-3
NEAR_TIE = 0.05
# Quantized weights: the GPU rounds activations to int8 per 32 values before the int8 products (see
# tests/gpu/test_fused_qmatvec_gpu.py for the derivation of this bound); the cpu decodes to float32.
MAX_RELATIVE_QUANT_LOGIT_DIFF = 4e-2
WEIGHT_TYPES = ("F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q4_K", "Q5_K", "Q6_K")


@pytest.fixture(scope="module")
def golden() -> dict:
    return json.loads(GOLDEN.read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("family-models-gpu")
    return {name: write_family_model(name, folder) for name in FAMILY_MODELS}


def options(**kw) -> LoadOptions:
    return LoadOptions(**{"max_seqs": 8, "ctx_size": 256, "kv_dtype": "f16", "max_step_tokens": 64, **kw})


def record_figures(name: str, figures: dict) -> None:
    if os.environ.get("ROCMFORGE_FIGURES"):
        path = Path(os.environ["ROCMFORGE_FIGURES"]) / "families_gpu_figures.json"
        data = json.loads(path.read_text()) if path.exists() else {}
        data[name] = figures
        path.write_text(json.dumps(data, indent=2))


@pytest.mark.parametrize("name", FAMILY_MODELS)
def test_gpu_equals_cpu_and_agrees_with_llamacpp(gpu, golden, files, name):
    record = golden["models"][name]
    runs = {}
    for backend in ("gpu", "cpu"):
        opts = options() if backend == "gpu" else options(device="cpu")
        with load_model(str(files[name]), opts, device=gpu if backend == "gpu" else None) as model:
            runs[backend] = {p: evaluate(model, rec["prompt_ids"], rec["greedy_ids"], GREEDY_TOKENS)
                             for p, rec in record["prompts"].items()}
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


@pytest.mark.parametrize("name", ["qwen2-f16", "qwen3-f16"])
def test_graph_replay_equals_eager(gpu, files, name):
    with load_model(str(files[name]), options(), device=gpu) as model:
        cache, graphs = model.cache, model.runner
        eager = ModelRunner(model.device, model.config, model.weights, cache, max_step_tokens=64, max_seqs=8,
                            max_context=256, use_graphs=False)
        lengths = {11: 7, 12: 30, 13: 1, 14: 17, 15: 3}
        try:
            last, pos = {}, dict(lengths)
            for s, n in lengths.items():
                last[s] = int(np.argmax(graphs.execute(step_batch(cache, [(s, list(range(10, 10 + n)), 0)]))[0]))
            for step in range(10):
                live = [s for s in lengths if step < (4 if s in (11, 12) else 10)]  # 5 sequences, then 3
                batch = step_batch(cache, [(s, [last[s]], pos[s]) for s in live])
                want, got = eager.execute(batch), graphs.execute(batch)
                assert np.array_equal(got, want), f"step {step}: replay differs from eager"
                for i, s in enumerate(live):
                    last[s], pos[s] = int(np.argmax(got[i])), pos[s] + 1
            # ten decode steps in two buckets (5 sequences, then 3): the first of each captures, 8 replay
            assert graphs.graphs.captures >= 2 and graphs.graphs.replays >= 8
        finally:
            for s in lengths:
                if cache.has_sequence(s):
                    cache.free_sequence(s)
            model.device.synchronize()
            cache.release_fenced()
            eager.close()


@pytest.mark.parametrize("weight_type", WEIGHT_TYPES)
@pytest.mark.parametrize("architecture", ["qwen2", "qwen3"])
def test_every_weight_type_matches_the_cpu_backend(gpu, tmp_path, architecture, weight_type):
    """Shapes multiples of 256 so that every block format fits; teacher-forced on the cpu's greedy tokens."""
    path = write_tiny_llama(tmp_path / "m.gguf", architecture=architecture, tensor_type=weight_type, n_layers=2,
                            hidden=256, n_heads=4, n_kv_heads=2, ffn=512, vocab=384, tied=False, logit_scale=6.0,
                            seed=5)
    prompt, steps = [5, 17, 99, 200, 3, 44, 61, 120, 7, 300, 12], 12
    with load_model(str(path), options(device="cpu")) as on_cpu, load_model(str(path), options(), device=gpu) as on_gpu:
        seq, tokens, worst = 77, list(prompt), 0.0
        for step in range(steps):
            batch_items = [(seq, tokens if step == 0 else tokens[-1:], 0 if step == 0 else len(tokens) - 1)]
            got = [m.runner.execute(step_batch(m.cache, batch_items))[0].astype(np.float64) for m in (on_gpu, on_cpu)]
            g, c = got
            scale = np.max(np.abs(c))
            top = np.argsort(c)[-10:]
            rel = float(np.max(np.abs(g[top] - c[top])) / scale)
            worst = max(worst, rel)
            assert rel <= MAX_RELATIVE_QUANT_LOGIT_DIFF, f"step {step}: top-10 logits differ by {rel:.3e} of the largest"
            top2 = np.sort(c)[-2:]
            if top2[1] - top2[0] > 2 * MAX_RELATIVE_QUANT_LOGIT_DIFF * scale:
                assert np.argmax(g) == np.argmax(c), f"step {step}: greedy pick differs"
            tokens.append(int(np.argmax(c)))
        print(f"{architecture} {weight_type}: max relative top-10 logit difference {worst:.2e}")
        record_figures(f"{architecture}-{weight_type}", {"max_rel_top10_logit_diff": worst})
