"""The gemma3 forward pass on the cpu backend against llama.cpp, on tiny random-weight models.

Golden data: tests/golden/gemma3_llamacpp.json, written by scripts/golden/record_llamacpp_gemma3.py
(llama-cpp-python 0.3.36 built from its sdist, CPU). The models are rebuilt here by the same code from the
same seeds (tests/support/gemma3_models.py) and must hash to what was recorded. Inputs are llama.cpp's own
token ids; a separate test checks that our tokenizer and the file's chat template produce them.

Tolerances: those of the other families (tests/support/family_golden.py: 0.05 on logits, near-ties below a
0.1 margin), which hold here with room: the figures print with `pytest -s`. The gemma3 models' logits span
about +-8, and besides llama.cpp's float16 rounding of activations before F16 products, its CPU GELU reads a
float16 table (input and output rounded to float16, relative 5e-4), where ours computes it in float32.
Every planted fault below moves the logits by far more than 0.05.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path

import numpy as np
import pytest

from hipcore.engine.loader import LoadOptions, load_model
from hipcore.model import blocks
from hipcore.runtime.errors import DeviceError
from hipcore.tokenizer.chat_template import render_chat
from support.family_golden import TIE_MARGIN, disagreements, margin, run_on_cpu
from support.gemma3_models import GEMMA3_MODELS, GREEDY_TOKENS, PROMPTS, write_gemma3_model

GOLDEN = Path(__file__).parent / "golden" / "gemma3_llamacpp.json"


@pytest.fixture(scope="module")
def golden() -> dict:
    return json.loads(GOLDEN.read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def model_files(tmp_path_factory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("gemma3-models")
    return {name: write_gemma3_model(name, folder) for name in GEMMA3_MODELS}


def run_model(path: Path, golden_model: dict, adjust=None) -> dict:
    return run_on_cpu(path, golden_model, GREEDY_TOKENS, adjust)


@pytest.fixture(scope="module")
def runs(golden, model_files) -> dict:
    return {name: run_model(model_files[name], golden["models"][name]) for name in GEMMA3_MODELS}


@pytest.mark.parametrize("name", GEMMA3_MODELS)
def test_model_file_is_the_recorded_one(golden, model_files, name):
    digest = hashlib.sha256(model_files[name].read_bytes()).hexdigest()
    assert digest == golden["models"][name]["model_sha256"], (
        f"{name} is not the file the golden data was recorded from: re-record with "
        "scripts/golden/record_llamacpp_gemma3.py")


def test_golden_data_is_complete_and_exercises_the_window(golden):
    assert set(golden["models"]) == set(GEMMA3_MODELS)
    for model in golden["models"].values():
        assert set(model["prompts"]) == set(PROMPTS)
        for rec in model["prompts"].values():
            assert len(rec["greedy_ids"]) == len(rec["greedy_step_top"]) == len(rec["forced_step_top"]) == GREEDY_TOKENS
            assert len(rec["last_top_ids"]) >= 20
            assert len(rec["prompt_ids"]) > 16, "every prompt is longer than the sliding window"


@pytest.mark.parametrize("name", GEMMA3_MODELS)
def test_our_tokenizer_and_chat_template_give_llamacpps_ids(golden, model_files, name):
    with load_model(str(model_files[name]), LoadOptions(device="cpu", ctx_size=256)) as model:
        tok = model.tokenizer
        for prompt, rec in golden["models"][name]["prompts"].items():
            assert tok.encode(PROMPTS[prompt]) == rec["prompt_ids"], prompt
        chat = render_chat(model.gguf.metadata["tokenizer.chat_template"],
                           [{"role": "user", "content": "Hello there, how are you today?"}],
                           bos_token="", eos_token="<|endoftext|>", isolated=False)
        assert chat == PROMPTS["chat"]


@pytest.mark.parametrize("name", GEMMA3_MODELS)
def test_agrees_with_llamacpp(golden, runs, name):
    assert disagreements(golden["models"][name], runs[name]) == []


@pytest.mark.parametrize("name", GEMMA3_MODELS)
def test_greedy_margins_are_mostly_clear(golden, name):
    tops = [top for rec in golden["models"][name]["prompts"].values() for top in rec["greedy_step_top"]]
    clear = sum(margin(top["logits"]) >= TIE_MARGIN for top in tops)
    assert clear >= 0.75 * len(tops), f"{clear} of {len(tops)} steps clear of a near-tie"


def _replace_block(old, new):
    def adjust(runner):
        family = runner.family
        runner.family = dataclasses.replace(family, layer=tuple(new if b is old else b for b in family.layer))
        assert runner.family.layer != family.layer, "the planted block replaced nothing"
    return adjust


def _config(**changes):
    def adjust(runner):
        runner.config = dataclasses.replace(runner.config, **changes)
    return adjust


def _no_embedding_scale(runner):
    runner.family = dataclasses.replace(runner.family, embedding_input=None)


FAULTS = {
    "no embedding scale": _no_embedding_scale,
    "no post-attention norm": _replace_block(blocks.post_normed_attention_output, blocks.attention_output),
    "SwiGLU for GeGLU": _replace_block(blocks.geglu_feed_forward, blocks.feed_forward),
    "window one key wider": _config(sliding_window=17),
    "window one key narrower": _config(sliding_window=15),
    "no sliding window": _config(sliding_window=0),
    "local RoPE base 1e6": _config(swa_rope_theta=1e6),
}


@pytest.mark.parametrize("fault", FAULTS)
def test_planted_faults_are_caught(golden, model_files, fault):
    """Each fault changes the logits beyond the tolerance, or, for a window wider than the KV cache's (the
    cache has given back the blocks before its window), the attention refuses to read a block it no
    longer holds: caught either way."""
    name = "gemma3-f32"
    try:
        found = disagreements(golden["models"][name], run_model(model_files[name], golden["models"][name],
                                                                FAULTS[fault]))
    except DeviceError as err:
        assert "reads block outside" in str(err), err
        assert fault in ("window one key wider", "no sliding window"), f"{fault}: {err}"
        found = [str(err)]
    assert found, f"{fault} went unnoticed"


def agreement_report(golden: dict, runs: dict) -> str:
    lines = []
    for name in GEMMA3_MODELS:
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
    assert report.count("\n") == len(GEMMA3_MODELS) * len(PROMPTS) - 1
