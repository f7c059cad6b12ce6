"""The qwen2 and qwen3 forward passes on the cpu backend against llama.cpp, on tiny random-weight models.

Golden data: tests/golden/families_llamacpp.json, written by scripts/golden/record_llamacpp_families.py
(llama-cpp-python 0.3.36 built from its sdist, CPU). The models are rebuilt here by the same code from the
same seeds (tests/support/family_models.py) and must hash to what was recorded. Inputs are llama.cpp's own
token ids; a separate test checks that our tokenizer produces them.

Tolerances: tests/support/family_golden.py says what they are and why.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest

from hipcore.engine.loader import LoadOptions, load_model
from hipcore.model.blocks import Family, compose, pre_norm_layer, qk_head_norm, qkv_products, rope_qk
from hipcore.tokenizer.chat_template import render_chat
from support.family_models import FAMILY_MODELS, GREEDY_TOKENS, PROMPTS, write_family_model
from support.family_golden import GOLDEN, TIE_MARGIN, disagreements, evaluate, load_reordering, margin, with_config


@pytest.fixture(scope="module")
def golden() -> dict:
    return json.loads(GOLDEN.read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def model_files(tmp_path_factory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("family-models")
    return {name: write_family_model(name, folder) for name in FAMILY_MODELS}


def run_model(path: Path, golden_model: dict, adjust=None, neox_as_norm=None) -> dict:
    """Our logits for every recorded prompt; adjust(runner) before the first step; neox_as_norm: the architectures
    whose q and k rows the load reorders (weights.NEOX_AS_NORM) when not the module's."""
    options = LoadOptions(device="cpu", kv_dtype="f16", max_step_tokens=64, ctx_size=256)
    with load_reordering(path, options, neox_as_norm) as model:
        if adjust is not None:
            adjust(model.runner)
        return {name: evaluate(model, rec["prompt_ids"], rec["greedy_ids"], GREEDY_TOKENS)
                for name, rec in golden_model["prompts"].items()}


@pytest.fixture(scope="module")
def runs(golden, model_files) -> dict:
    return {name: run_model(model_files[name], golden["models"][name]) for name in FAMILY_MODELS}


@pytest.mark.parametrize("name", FAMILY_MODELS)
def test_model_file_is_the_recorded_one(golden, model_files, name):
    digest = hashlib.sha256(model_files[name].read_bytes()).hexdigest()
    assert digest == golden["models"][name]["model_sha256"], (
        f"{name} is not the file the golden data was recorded from: re-record with "
        "scripts/golden/record_llamacpp_families.py")


def test_golden_data_is_complete(golden):
    assert set(golden["models"]) == set(FAMILY_MODELS)
    for model in golden["models"].values():
        assert set(model["prompts"]) == set(PROMPTS)
        for rec in model["prompts"].values():
            assert len(rec["greedy_ids"]) == len(rec["greedy_step_top"]) == len(rec["forced_step_top"]) == GREEDY_TOKENS
            assert len(rec["last_top_ids"]) >= 20 and len(rec["prompt_ids"]) >= 10


@pytest.mark.parametrize("name", FAMILY_MODELS)
def test_our_tokenizer_and_chat_template_give_llamacpps_ids(golden, model_files, name):
    with load_model(str(model_files[name]), LoadOptions(device="cpu", ctx_size=256)) as model:
        tok = model.tokenizer
        for prompt, rec in golden["models"][name]["prompts"].items():
            assert tok.encode(PROMPTS[prompt]) == rec["prompt_ids"], prompt
        chat = render_chat(model.gguf.metadata["tokenizer.chat_template"],
                           [{"role": "user", "content": "Hello there, how are you today?"}],
                           bos_token="", eos_token="<|endoftext|>", isolated=False)
        assert chat == PROMPTS["chat"]


@pytest.mark.parametrize("name", FAMILY_MODELS)
def test_agrees_with_llamacpp(golden, runs, name):
    assert disagreements(golden["models"][name], runs[name]) == []


@pytest.mark.parametrize("name", FAMILY_MODELS)
def test_greedy_margins_are_mostly_clear(golden, name):
    """The models were made peaked: most greedy steps are decided by more than TIE_MARGIN."""
    tops = [top for rec in golden["models"][name]["prompts"].values() for top in rec["greedy_step_top"]]
    clear = sum(margin(top["logits"]) >= TIE_MARGIN for top in tops)
    assert clear >= 0.75 * len(tops), f"{clear} of {len(tops)} steps clear of a near-tie"


def _without_head_norm(runner):
    runner.family = Family("qwen3-planted", pre_norm_layer(compose(qkv_products, rope_qk)))


# NORM-mode RoPE on rows in the file's order: qwen3 computes NEOX RoPE on them; qwen2 loads them reordered (each NEOX
# pair side by side, weights.NEOX_AS_NORM) for NORM mode, and is planted with that reordering left out.
PLANTED = {"no q/k/v bias": (with_config(qkv_bias=False), None),
           "no per-head q/k norm": (_without_head_norm, None),
           "NORM-mode RoPE on the file's rows": (with_config(rope_type="norm"), frozenset())}


@pytest.mark.parametrize("name, fault", [
    ("qwen2-f32", "no q/k/v bias"), ("qwen3-f32", "no per-head q/k norm"),
    ("qwen2-f16", "NORM-mode RoPE on the file's rows"), ("qwen3-f16", "NORM-mode RoPE on the file's rows"),
])
def test_planted_faults_are_caught(golden, model_files, name, fault):
    adjust, neox_as_norm = PLANTED[fault]
    found = disagreements(golden["models"][name],
                          run_model(model_files[name], golden["models"][name], adjust, neox_as_norm))
    assert found, f"{fault} went unnoticed"


def agreement_report(golden: dict, runs: dict) -> str:
    lines = []
    for name in FAMILY_MODELS:
        for prompt, rec in golden["models"][name]["prompts"].items():
            ours = runs[name][prompt]
            ids, values = rec["last_top_ids"][:10], np.array(rec["last_top_logits"][:10])
            last = np.abs(ours["last"][ids] - values).max()
            forced = max(np.abs(ours["forced"][s][t["ids"]] - t["logits"]).max()
                         for s, t in enumerate(rec["forced_step_top"]))
            same = sum(int(np.argmax(r)) == t for r, t in zip(ours["forced"], rec["greedy_ids"]))
            follow = next((i for i, (a, b) in enumerate(zip(ours["free"], rec["greedy_ids"])) if a != b),
                          GREEDY_TOKENS)
            tight = min(margin(t["logits"]) for t in rec["greedy_step_top"])
            lines.append(f"{name} {prompt}: last top-10 max|diff| {last:.4f}, teacher-forced max|diff| {forced:.4f}, "
                         f"argmax {same}/{GREEDY_TOKENS}, free greedy follows {follow}/{GREEDY_TOKENS}, "
                         f"smallest llama.cpp margin {tight:.3f}")
    return "\n".join(lines)


def test_print_agreement_figures(golden, runs, capsys):
    report = agreement_report(golden, runs)
    with capsys.disabled():
        print("\n" + report)
    assert report.count("\n") == len(FAMILY_MODELS) * len(PROMPTS) - 1
