"""Comparing a runner with llama.cpp's record on the tiny family models (tests/golden/families_llamacpp.json):
used by tests/test_golden_families.py on the cpu backend and tests/gpu/test_families_gpu.py on a GPU.

Tolerances, from these data (the figures print with `pytest -s tests/test_golden_families.py`):
* LOGIT_TOLERANCE = 0.05: llama.cpp keeps K and V in float16 and, for F16 weights, rounds the activations
  to float16 before each product; we keep K and V in float16 too but compute in float32. Measured over
  the last prompt position's top-10 and every teacher-forced step's top-10 (logits span about +-15): at
  most 0.0026 with F32 weights, 0.028 with F16 (qwen3, whose per-head norm amplifies the rounding of q
  and k). 0.05 is under twice that.
* TIE_MARGIN = 0.1: a greedy step whose top-2 margin in llama.cpp's logits is below it is a near-tie;
  there we only require our pick to be among llama.cpp's candidates within the margin, and the
  free-running comparison stops. Two results that each differ from the truth by up to 0.028 can swap
  two tokens closer than 0.056; 0.1 leaves margin over that and is still far below what a real error
  does: a dropped bias, a skipped per-head norm or NORM-mode RoPE move the logits by whole units
  (test_planted_faults_are_caught). One step of the 192 is such a near-tie and swaps (qwen3-f32 "text",
  step 2, llama.cpp's margin 0.008); the others agree token for token.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np

from hipcore.engine.loader import LoadedModel, LoadOptions, load_model
from hipcore.model import weights
from hipcore.ops import matmul_mma
from support.model_steps import step_batch

GOLDEN = Path(__file__).parents[1] / "golden" / "families_llamacpp.json"
LOGIT_TOLERANCE = 0.05
TIE_MARGIN = 0.1
# The GPU tier's comparison with the cpu backend (tests/gpu/test_families_gpu.py, test_gemma3_gpu.py) holds the
# float32 paths to 1e-3 of the largest logit. An F16 or BF16 file's single-op products of 5 tokens and more run on
# the matrix cores where the GPU has them (hipcore/ops/matmul_mma.py: x rounded to f16, u = 2^-11), as llama.cpp's
# do. Rounding x so in those products on the cpu backend reproduces their effect (2026-11-29,
# docs/history/2026-12-06-removed-measurement-tools.md): qwen2-f16 3.8e-4 / 3.2e-4 (an H200 measured 3.80e-4 / 3.25e-4),
# qwen3-f16 1.05e-3 / 1.14e-3 and gemma3-f16 0.90e-3 / 1.03e-3 (their per-head norms amplify it). 3e-3 is that
# thrice over; a wrong kernel moves logits by whole units.
MAX_RELATIVE_MMA_LOGIT_DIFF = 3e-3


def gpu_logit_tolerance(name: str, arch: str, float_tolerance: float) -> float:
    """The GPU-against-cpu tolerance of the tiny model `name` ("qwen3-f16" ...) on `arch`."""
    if name.endswith(("-f16", "-bf16")) and matmul_mma.has_matrix_cores(arch):
        return MAX_RELATIVE_MMA_LOGIT_DIFF
    return float_tolerance


def evaluate(model, ids: list[int], forced: list[int], steps: int) -> dict:
    """Our logits at the last prompt position; at each of `steps` continuation positions with llama.cpp's tokens
    fed one at a time (teacher forcing); and our own free greedy continuation, from a fresh sequence."""
    runner, cache = model.runner, model.cache
    out = {}
    for seq, feed in ((1, forced), (2, None)):
        logits = runner.execute(step_batch(cache, [(seq, list(ids), 0)]))[0]
        rows, picks = [logits], []
        for step in range(steps):
            token = int(np.argmax(logits)) if feed is None else feed[step]
            picks.append(int(np.argmax(logits)))
            logits = runner.execute(step_batch(cache, [(seq, [token], len(ids) + step)]))[0]
            rows.append(logits)
        cache.free_sequence(seq)
        if feed is None:
            out["free"] = picks
        else:
            out["last"], out["forced"] = rows[0], np.array(rows[:steps])
    return out


def margin(values: list[float]) -> float:
    return values[0] - values[1]


def near_tied(ids: list[int], values: list[float]) -> set[int]:
    return {token for token, value in zip(ids, values) if value > values[0] - TIE_MARGIN}


def disagreements(golden_model: dict, run: dict) -> list[str]:
    """Every way `run` departs from llama.cpp's record beyond the tolerances (empty: it agrees)."""
    found = []
    for name, rec in golden_model["prompts"].items():
        ours = run[name]
        ids, values = rec["last_top_ids"][:10], rec["last_top_logits"][:10]
        diff = np.abs(ours["last"][ids] - values).max()
        if diff > LOGIT_TOLERANCE:
            found.append(f"{name}: last position top-10 |diff| {diff:.3f}")
        recorded = dict(zip(rec["last_top_ids"], rec["last_top_logits"]))
        for token in set(np.argsort(-ours["last"])[:10].tolist()) ^ set(ids):
            if token not in recorded or abs(recorded[token] - values[9]) >= TIE_MARGIN:
                found.append(f"{name}: token {token} in one top-10 only, not at a near-tie of the 10th")
        for step, (token, top) in enumerate(zip(rec["greedy_ids"], rec["forced_step_top"])):
            row = ours["forced"][step]
            diff = np.abs(row[top["ids"]] - top["logits"]).max()
            if diff > LOGIT_TOLERANCE:
                found.append(f"{name} step {step}: top-10 |diff| {diff:.3f}")
            pick = int(np.argmax(row))
            if pick != token and (margin(top["logits"]) >= TIE_MARGIN or pick not in near_tied(top["ids"], top["logits"])):
                found.append(f"{name} step {step}: ours {pick}, llama.cpp {token} (margin {margin(top['logits']):.3f})")
        for step, (a, b, top) in enumerate(zip(ours["free"], rec["greedy_ids"], rec["greedy_step_top"])):
            if a != b:
                if margin(top["logits"]) >= TIE_MARGIN:
                    found.append(f"{name}: free greedy left llama.cpp's at step {step} ({a} vs {b})")
                break
    return found


def load_reordering(path: Path, options: LoadOptions, neox_as_norm: frozenset[str] | None = None) -> LoadedModel:
    """load_model(path, options); neox_as_norm: the architectures whose q and k rows this load reorders
    (hipcore.model.weights.NEOX_AS_NORM) when not the module's, as a planted fault that leaves one out does."""
    kept = weights.NEOX_AS_NORM
    if neox_as_norm is not None:
        weights.NEOX_AS_NORM = neox_as_norm
    try:
        return load_model(str(path), options)
    finally:
        weights.NEOX_AS_NORM = kept


def with_config(**changes):
    """A planted fault: the runner's config changed, as its blocks and its planner of the products read it."""
    def adjust(runner):
        runner.config = runner.products.config = dataclasses.replace(runner.config, **changes)
    return adjust


def run_on_cpu(path: Path, golden_model: dict, greedy_tokens: int, adjust=None) -> dict:
    """evaluate() for every recorded prompt of `golden_model`, on the cpu backend (f16 KV, a 256-token
    context); adjust(runner), when given, plants a fault first."""
    options = LoadOptions(device="cpu", kv_dtype="f16", max_step_tokens=128, ctx_size=256, kv_blocks=64)
    with load_model(str(path), options) as model:
        if adjust is not None:
            adjust(model.runner)
        out = {}
        for name, rec in golden_model["prompts"].items():
            out[name] = evaluate(model, rec["prompt_ids"], rec["greedy_ids"], greedy_tokens)
            model.cache.release_fenced()
        return out

