"""The phi3 forward pass on the cpu backend against llama.cpp, on tiny random-weight models whose files hold
q|k|v and gate|up concatenated, as Phi-3's do.

Golden data: tests/golden/phi3_llamacpp.json, written by scripts/golden/record_llamacpp_tiny_family.py phi3
(llama-cpp-python 0.3.36 built from its sdist, CPU). The models are rebuilt here by the same code from the
same seeds (tests/support/phi3_models.py) and must hash to what was recorded. Inputs are llama.cpp's own
token ids. Tolerances: tests/support/family_golden.py's (0.05 on logits spanning about +-15; near-tie 0.1),
the same arithmetic as qwen2's (llama's layer, NEOX RoPE, no per-head norm) measured there at 0.0026 with F32
weights and 0.028 with F16; the figures this family reaches print with `pytest -s`.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest

from hipcore.engine.loader import LoadOptions, load_model
from support.family_golden import TIE_MARGIN, disagreements, evaluate, load_reordering, margin, with_config
from support.phi3_models import GREEDY_TOKENS, PHI3_MODELS, PROMPTS, write_model

GOLDEN = Path(__file__).parent / "golden" / "phi3_llamacpp.json"


@pytest.fixture(scope="module")
def golden() -> dict:
    return json.loads(GOLDEN.read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def model_files(tmp_path_factory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("phi3-models")
    return {name: write_model(name, folder) for name in PHI3_MODELS}


# Blocks for both sequences of both prompts (evaluate frees without waiting for a step fence to release).
KV_BLOCKS = 40


def run_model(path: Path, golden_model: dict, adjust=None, adjust_runner=None, neox_as_norm=None) -> dict:
    """Our logits for every recorded prompt; adjust(layer weights) of every layer and adjust_runner(runner) before the
    first step; neox_as_norm: the architectures whose q and k rows the load reorders (weights.NEOX_AS_NORM), when not
    the module's."""
    options = LoadOptions(device="cpu", kv_dtype="f16", max_step_tokens=64, ctx_size=256, kv_blocks=KV_BLOCKS)
    with load_reordering(path, options, neox_as_norm) as model:
        if adjust is not None:
            for lw in model.runner.weights.layers:
                adjust(lw)
        if adjust_runner is not None:
            adjust_runner(model.runner)
        return {name: evaluate(model, rec["prompt_ids"], rec["greedy_ids"], GREEDY_TOKENS)
                for name, rec in golden_model["prompts"].items()}


@pytest.fixture(scope="module")
def runs(golden, model_files) -> dict:
    return {name: run_model(model_files[name], golden["models"][name]) for name in PHI3_MODELS}


@pytest.mark.parametrize("name", PHI3_MODELS)
def test_model_file_is_the_recorded_one(golden, model_files, name):
    digest = hashlib.sha256(model_files[name].read_bytes()).hexdigest()
    assert digest == golden["models"][name]["model_sha256"], (
        f"{name} is not the file the golden data was recorded from: re-record with "
        "scripts/golden/record_llamacpp_tiny_family.py phi3")


def test_golden_data_is_complete(golden):
    assert set(golden["models"]) == set(PHI3_MODELS)
    for model in golden["models"].values():
        assert set(model["prompts"]) == set(PROMPTS)
        for rec in model["prompts"].values():
            assert len(rec["greedy_ids"]) == len(rec["greedy_step_top"]) == len(rec["forced_step_top"]) == GREEDY_TOKENS
            assert len(rec["last_top_ids"]) >= 20 and len(rec["prompt_ids"]) >= 10


@pytest.mark.parametrize("name", PHI3_MODELS)
def test_our_tokenizer_gives_llamacpps_ids(golden, model_files, name):
    with load_model(str(model_files[name]), LoadOptions(device="cpu", ctx_size=256)) as model:
        for prompt, rec in golden["models"][name]["prompts"].items():
            assert model.tokenizer.encode(PROMPTS[prompt]) == rec["prompt_ids"], prompt


def test_the_files_hold_the_fused_layout(model_files):
    """What makes this family: attn_qkv and a double-height ffn_up, no attn_q/k/v or ffn_gate; and the F16
    model's sliding-window key, which llama.cpp ignores for phi3 (so must we: every layer global)."""
    with load_model(str(model_files["phi3-f16"]), LoadOptions(device="cpu", ctx_size=256)) as model:
        names = {t.name for t in model.gguf.plan.tensors}
        assert {"blk.0.attn_qkv.weight", "blk.0.ffn_up.weight"} <= names
        assert not {"blk.0.attn_q.weight", "blk.0.ffn_gate.weight"} & names
        assert model.gguf.metadata["phi3.attention.sliding_window"] == 8
        config = model.runner.config
        assert config.sliding_window == 0 and all(config.layer_window(i) == 0 for i in range(config.n_layers))
        lw = model.runner.weights.layers[0]
        assert lw.ffn_gate_up is not None and lw.ffn_gate_up.shape == (2 * config.ffn_size, config.hidden_size)
        assert lw.attn_qkv.shape == (config.q_size + 2 * config.kv_size, config.hidden_size)
        assert (lw.attn_q.buffer is lw.attn_k.buffer is lw.attn_v.buffer) and lw.ffn_gate.buffer is lw.ffn_up.buffer


@pytest.mark.parametrize("name", PHI3_MODELS)
def test_agrees_with_llamacpp(golden, runs, name):
    assert disagreements(golden["models"][name], runs[name]) == []


def _separate_gate_up(lw):
    lw.ffn_gate_up = None  # the feed-forward reads the gate and up row views one at a time


def test_agrees_with_llamacpp_through_the_row_views(golden, model_files):
    """Without the whole gate|up buffer the feed-forward takes the separate path over the row views: the
    views themselves (offsets, shapes) must give llama.cpp's numbers too."""
    name = "phi3-f32"
    assert disagreements(golden["models"][name], run_model(model_files[name], golden["models"][name],
                                                           _separate_gate_up)) == []


@pytest.mark.parametrize("name", PHI3_MODELS)
def test_greedy_margins_are_mostly_clear(golden, name):
    """The models were made peaked: most greedy steps are decided by more than TIE_MARGIN."""
    tops = [top for rec in golden["models"][name]["prompts"].values() for top in rec["greedy_step_top"]]
    clear = sum(margin(top["logits"]) >= TIE_MARGIN for top in tops)
    assert clear >= 0.75 * len(tops), f"{clear} of {len(tops)} steps clear of a near-tie"


def _gate_up_swapped(lw):
    """A loader that took the up half for the gate: silu(up) * gate."""
    lw.ffn_gate, lw.ffn_up, lw.ffn_gate_up = lw.ffn_up, lw.ffn_gate, None


def _k_v_swapped(lw):
    """A q|k|v split that took k's rows for v and v's for k (they have the same shape); the products read the views
    (the whole q|k|v buffer left out, as the fused kernels of a concatenated q|k|v would read it)."""
    lw.attn_k, lw.attn_v, lw.attn_qkv = lw.attn_v, lw.attn_k, None


def _q_split_short(lw):
    """A q|k|v split one head of rows off: q taken from a head further down (k's first rows included)."""
    from hipcore.model.weights import Weight
    head_bytes = (lw.attn_k.offset - lw.attn_q.offset) // lw.attn_q.rows * (lw.attn_q.rows // 4)
    lw.attn_q = Weight(lw.attn_q.buffer, lw.attn_q.fmt, lw.attn_q.shape, lw.attn_q.offset + head_bytes)
    lw.attn_qkv = None


@pytest.mark.parametrize("fault, adjust", [("gate and up halves swapped", _gate_up_swapped),
                                           ("k and v rows swapped", _k_v_swapped),
                                           ("q split one head late", _q_split_short)])
def test_planted_faults_are_caught(golden, model_files, fault, adjust):
    name = "phi3-f32"
    found = disagreements(golden["models"][name], run_model(model_files[name], golden["models"][name], adjust))
    assert found, f"{fault} went unnoticed"


@pytest.mark.parametrize("name", PHI3_MODELS)
def test_norm_rope_on_the_files_row_order_is_caught(golden, model_files, name):
    """The q|k|v loaded without its q and k rows reordered (weights.NEOX_AS_NORM left out) and RoPE in NORM mode:
    what the fused attention input would compute on phi3's NEOX pairs without the reordering."""
    found = disagreements(golden["models"][name], run_model(model_files[name], golden["models"][name],
                                                            adjust_runner=with_config(rope_type="norm"),
                                                            neox_as_norm=frozenset()))
    assert found, "NORM RoPE on the file's rows went unnoticed"


def test_print_agreement_figures(golden, runs, capsys):
    lines = []
    for name in PHI3_MODELS:
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
    assert len(lines) == len(PHI3_MODELS) * len(PROMPTS)
