"""The gemma2 forward pass on the cpu backend against llama.cpp, on tiny random-weight models whose soft caps
bite and whose sliding window (16 keys) is shorter than every prompt.

Golden data: tests/golden/gemma2_llamacpp.json, written by scripts/golden/record_llamacpp_tiny_family.py gemma2
(llama-cpp-python 0.3.36 built from its sdist, CPU). The models are rebuilt here by the same code from the
same seeds (tests/support/gemma2_models.py) and must hash to what was recorded. Inputs are llama.cpp's own
token ids. Tolerances: tests/support/family_golden.py's (0.05 on logits; near-tie 0.1). The soft caps only
shrink differences (tanh's slope is at most 1), so the qwen/gemma3 measurements that set 0.05 bound these
too; the figures this family reaches print with `pytest -s`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path

import numpy as np
import pytest

from hipcore.engine.loader import LoadOptions, load_model
from hipcore.gguf.config import ModelConfig
from hipcore.model import weights
from hipcore.runtime.errors import DeviceError
from hipcore.tokenizer.chat_template import render_chat
from support.family_golden import TIE_MARGIN, disagreements, margin, run_on_cpu, with_config
from support.gemma2_models import ATTN_SOFTCAP, FINAL_SOFTCAP, GEMMA2_MODELS, GREEDY_TOKENS, PROMPTS, write_model

GOLDEN = Path(__file__).parent / "golden" / "gemma2_llamacpp.json"


@pytest.fixture(scope="module")
def golden() -> dict:
    return json.loads(GOLDEN.read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def model_files(tmp_path_factory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("gemma2-models")
    return {name: write_model(name, folder) for name in GEMMA2_MODELS}


def run_model(path: Path, golden_model: dict, adjust=None) -> dict:
    return run_on_cpu(path, golden_model, GREEDY_TOKENS, adjust)


@pytest.fixture(scope="module")
def runs(golden, model_files) -> dict:
    return {name: run_model(model_files[name], golden["models"][name]) for name in GEMMA2_MODELS}


@pytest.mark.parametrize("name", GEMMA2_MODELS)
def test_model_file_is_the_recorded_one(golden, model_files, name):
    digest = hashlib.sha256(model_files[name].read_bytes()).hexdigest()
    assert digest == golden["models"][name]["model_sha256"], (
        f"{name} is not the file the golden data was recorded from: re-record with "
        "scripts/golden/record_llamacpp_tiny_family.py gemma2")


def test_golden_data_is_complete_and_exercises_the_window(golden):
    assert set(golden["models"]) == set(GEMMA2_MODELS)
    for model in golden["models"].values():
        assert set(model["prompts"]) == set(PROMPTS)
        for rec in model["prompts"].values():
            assert len(rec["greedy_ids"]) == len(rec["greedy_step_top"]) == len(rec["forced_step_top"]) == GREEDY_TOKENS
            assert len(rec["last_top_ids"]) >= 20
            assert len(rec["prompt_ids"]) > 16, "every prompt is longer than the sliding window"


def test_the_config_reads_gemma2s_traits(model_files):
    """The file's caps (or llama.cpp's defaults where the keys are absent), the even layers local, local
    layers rotating with the model's base and scaling, the output tied to the embedding."""
    with load_model(str(model_files["gemma2-f32"]), LoadOptions(device="cpu", ctx_size=256)) as model:
        c = model.runner.config
        assert (c.attn_softcap, c.final_softcap) == (ATTN_SOFTCAP, FINAL_SOFTCAP)
        assert [c.layer_window(i) for i in range(4)] == [16, 0, 16, 0]
        assert not c.qk_norm and c.post_norms and c.activation == "gelu" and c.tie_embeddings
    with load_model(str(model_files["gemma2-f16"]), LoadOptions(device="cpu", ctx_size=256)) as model:
        c = model.runner.config
        assert (c.attn_softcap, c.final_softcap) == (50.0, 30.0)
        assert c.layer_rope(0, 0.25) == c.layer_rope(1, 0.25) == (10000.0, 0.25)


@pytest.mark.parametrize("name", GEMMA2_MODELS)
def test_our_tokenizer_and_chat_template_give_llamacpps_ids(golden, model_files, name):
    with load_model(str(model_files[name]), LoadOptions(device="cpu", ctx_size=256)) as model:
        tok = model.tokenizer
        for prompt, rec in golden["models"][name]["prompts"].items():
            assert tok.encode(PROMPTS[prompt]) == rec["prompt_ids"], prompt
        chat = render_chat(model.gguf.metadata["tokenizer.chat_template"],
                           [{"role": "user", "content": "Hello there, how are you today?"}],
                           bos_token="", eos_token="<|endoftext|>", isolated=False)
        assert chat == PROMPTS["chat"]


@pytest.mark.parametrize("name", GEMMA2_MODELS)
def test_agrees_with_llamacpp(golden, runs, name):
    assert disagreements(golden["models"][name], runs[name]) == []


@pytest.mark.parametrize("name", GEMMA2_MODELS)
def test_greedy_margins_are_mostly_clear(golden, name):
    tops = [top for rec in golden["models"][name]["prompts"].values() for top in rec["greedy_step_top"]]
    clear = sum(margin(top["logits"]) >= TIE_MARGIN for top in tops)
    assert clear >= 0.75 * len(tops), f"{clear} of {len(tops)} steps clear of a near-tie"


def _config(**changes):
    def adjust(runner):
        runner.config = dataclasses.replace(runner.config, **changes)
    return adjust


def _no_final_softcap(runner):
    runner.family = dataclasses.replace(runner.family, logits_output=None)


FAULTS = {
    "no attention softcap": _config(attn_softcap=0.0),
    "no final softcap": _no_final_softcap,
    "no sliding window": _config(sliding_window=0),
}


@pytest.mark.parametrize("fault", FAULTS)
def test_planted_faults_are_caught(golden, model_files, fault):
    """Each fault changes the logits beyond the tolerance, or (no window: the KV cache has given back the
    local layers' blocks before their window) the attention refuses to read a block it no longer holds."""
    name = "gemma2-f32"
    try:
        found = disagreements(golden["models"][name], run_model(model_files[name], golden["models"][name],
                                                                FAULTS[fault]))
    except DeviceError as err:
        assert "reads block outside" in str(err) and fault == "no sliding window", f"{fault}: {err}"
        found = [str(err)]
    assert found, f"{fault} went unnoticed"


def test_the_odd_layers_local_is_caught(golden, model_files, monkeypatch):
    """Planted fault: the window on the odd layers (llama.cpp's dense-first pattern) instead of the even ones,
    everywhere at once (the KV cache's layer groups as well as the attention), so only the numbers tell."""
    monkeypatch.setattr(ModelConfig, "is_local_layer", lambda self, i: self.sliding_window > 0 and i % 2 == 1)
    name = "gemma2-f32"
    found = disagreements(golden["models"][name], run_model(model_files[name], golden["models"][name]))
    assert found, "the odd layers attending through the window went unnoticed"


@pytest.mark.parametrize("name", GEMMA2_MODELS)
def test_norm_rope_on_the_files_row_order_is_caught(golden, model_files, name, monkeypatch):
    """Planted fault: q and k loaded in the file's row order (weights.NEOX_AS_NORM without gemma2) and RoPE in NORM
    mode: what the fused attention input would compute on gemma2's NEOX pairs without the reordering."""
    monkeypatch.setattr(weights, "NEOX_AS_NORM", weights.NEOX_AS_NORM - {"gemma2"})
    found = disagreements(golden["models"][name], run_model(model_files[name], golden["models"][name],
                                                            with_config(rope_type="norm")))
    assert found, "NORM RoPE on the file's rows went unnoticed"


def test_print_agreement_figures(golden, runs, capsys):
    lines = []
    for name in GEMMA2_MODELS:
        for prompt, rec in golden["models"][name]["prompts"].items():
            ours = runs[name][prompt]
            ids, values = rec["last_top_ids"][:10], np.array(rec["last_top_logits"][:10])
            last = np.abs(ours["last"][ids] - values).max()
            forced = max(np.abs(ours["forced"][s][t["ids"]] - t["logits"]).max()
                         for s, t in enumerate(rec["forced_step_top"]))
            same = sum(int(np.argmax(r)) == t for r, t in zip(ours["forced"], rec["greedy_ids"]))
            follow = next((i for i, (a, b) in enumerate(zip(ours["free"], rec["greedy_ids"])) if a != b), GREEDY_TOKENS)
            tight = min(margin(t["logits"]) for t in rec["greedy_step_top"])
            lines.append(f"{name} {prompt}: last top-10 max|diff| {last:.4f}, teacher-forced max|diff| {forced:.4f}, "
                         f"argmax {same}/{GREEDY_TOKENS}, free greedy follows {follow}/{GREEDY_TOKENS}, "
                         f"smallest llama.cpp margin {tight:.3f}")
    with capsys.disabled():
        print("\n" + "\n".join(lines))
    assert len(lines) == len(GEMMA2_MODELS) * len(PROMPTS)
