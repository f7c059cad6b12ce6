"""How far the matrix cores' f16 rounding of x moves the tiny family models' logits, reproduced on the cpu backend.

A MEASURING TOOL, no GPU needed. On a GPU with matrix cores, an F16 or BF16 product of 5 tokens or more that no fused
family takes (the qwen2/qwen3/gemma3 tiny models' attention input: biases, per-head norms) runs on matmul_mma, which
rounds x to f16 before its f16 x f16 -> f32 products (as llama.cpp's F16 products do). This script runs each tiny model
of tests/support/family_models.py and tests/support/gemma3_models.py twice on the cpu backend, as the GPU tier's
`test_gpu_equals_cpu_and_agrees_with_llamacpp` evaluates it (the golden records' prompts, teacher-forced, then free
greedy): once as it is, once with x rounded to f16 in every single-op product (matmul.project) of 5 tokens or more.
Printed per model and prompt: that test's metric between the two runs (the largest difference over the last prompt
position's and every teacher-forced step's logits, relative to the largest logit) and how many of the free greedy
tokens stay the same. Only the -f16 models stand for what a GPU does (the -f32 files' products stay float32 there).

    python scripts/f16_rounding_on_cpu.py

Its figures (2026-11-29): qwen2-f16 3.77e-4 / 3.18e-4 (chat / text; an H200 measured 3.80e-4 / 3.25e-4 against the
cpu backend), qwen3-f16 1.05e-3 / 1.14e-3, gemma3-f16 0.90e-3 / 1.03e-3, every greedy continuation unchanged: the
basis of tests/support/family_golden.py's MAX_RELATIVE_MMA_LOGIT_DIFF.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from hipcore.engine.loader import LoadOptions, load_model  # noqa: E402
from hipcore.ops import matmul  # noqa: E402
from support.family_golden import GOLDEN as FAMILY_GOLDEN, evaluate  # noqa: E402
from support.family_models import FAMILY_MODELS, GREEDY_TOKENS, write_family_model  # noqa: E402
from support.gemma3_models import GEMMA3_MODELS, GREEDY_TOKENS as GEMMA3_TOKENS, write_gemma3_model  # noqa: E402

GEMMA3_GOLDEN = ROOT / "tests" / "golden" / "gemma3_llamacpp.json"
MMA_MIN_TOKENS = 5  # matmul_mma.min_tokens on NVIDIA's fragment path: the fewest tokens its products take
_project = matmul.project


def _rounding_project(device, stream, y, w, x, rows, cols, n_tokens, **kwargs):
    """matmul.project with x rounded to f16 first, as matmul_mma stages it (in place: every product of the step
    that reads this x rounds it the same way)."""
    if n_tokens >= MMA_MIN_TOKENS:
        view = device.view(x if isinstance(x, int) else x.addr(), np.float32, (n_tokens, cols))
        view[:] = view.astype(np.float16).astype(np.float32)
    return _project(device, stream, y, w, x, rows, cols, n_tokens, **kwargs)


def _run(path: Path, record: dict, tokens: int, rounded: bool) -> dict:
    matmul.project = _rounding_project if rounded else _project
    try:
        options = LoadOptions(max_seqs=8, ctx_size=256, kv_dtype="f16", max_step_tokens=128, device="cpu")
        with load_model(str(path), options) as model:
            out = {}
            for prompt, rec in record["prompts"].items():
                out[prompt] = evaluate(model, rec["prompt_ids"], rec["greedy_ids"], tokens)
            return out
    finally:
        matmul.project = _project


def main() -> None:
    argparse.ArgumentParser(description=__doc__.split("\n\n")[0]).parse_args()
    folder = Path(tempfile.mkdtemp(prefix="f16-rounding-"))
    family_golden = json.loads(FAMILY_GOLDEN.read_text(encoding="utf-8"))["models"]
    gemma3_golden = json.loads(GEMMA3_GOLDEN.read_text(encoding="utf-8"))["models"]
    models = [(n, write_family_model(n, folder), family_golden[n], GREEDY_TOKENS) for n in FAMILY_MODELS]
    models += [(n, write_gemma3_model(n, folder), gemma3_golden[n], GEMMA3_TOKENS) for n in GEMMA3_MODELS]
    print("model        prompt  max rel logit diff  greedy tokens the same")
    for name, path, record, tokens in models:
        plain, rounded = _run(path, record, tokens, False), _run(path, record, tokens, True)
        for prompt in record["prompts"]:
            a = np.vstack([plain[prompt]["last"], plain[prompt]["forced"]]).astype(np.float64)
            b = np.vstack([rounded[prompt]["last"], rounded[prompt]["forced"]]).astype(np.float64)
            rel = float(np.max(np.abs(b - a)) / np.max(np.abs(a)))
            same = next((i for i, (u, v) in enumerate(zip(plain[prompt]["free"], rounded[prompt]["free"])) if u != v),
                        tokens)
            print(f"{name:12s} {prompt:6s}  {rel:18.2e}  {same} of {tokens}")


if __name__ == "__main__":
    main()
