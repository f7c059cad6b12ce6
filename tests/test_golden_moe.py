"""The mixture-of-experts forward passes on the cpu backend against llama.cpp, on tiny random-weight models whose
routing varies across tokens and layers (tests/support/moe_models.py).

Golden data: tests/golden/moe_llamacpp.json, written by scripts/golden/record_llamacpp_moe.py (llama-cpp-python
0.3.36 built from its sdist, CPU). The models are rebuilt here by the same code from the same seeds and must hash to
what was recorded. Inputs are llama.cpp's own token ids. Tolerances: tests/support/family_golden.py's (0.05 on
logits; near-tie 0.1), the figures this architecture reaches print with `pytest -s`.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from hipcore.engine.loader import LoadOptions, load_model
from hipcore.model.blocks import Family
from hipcore.model.moe_blocks import shared_expert
from support import family_golden
from support.family_golden import TIE_MARGIN, disagreements, margin, run_on_cpu, with_config
from support.model_steps import step_batch
from support.moe_models import GREEDY_TOKENS, MOE_MODELS, N_EXPERTS, N_USED, PROMPTS, write_moe_model

GOLDEN = Path(__file__).parent / "golden" / "moe_llamacpp.json"
# Quantized experts: llama.cpp's CPU products quantize their input (Q8_K for Q4_K and Q6_K, per 256 values; Q8_0 for
# MXFP4, per 32), the cpu backend's expert products per 32 values to int8 (moe_experts.QUANTIZED_X_TYPES, the GPU
# kernels' function): the tolerances of the real Q4_K_M model's comparison (tests/test_golden_gemma3_270m.py: 1.0
# on logits spanning about 30, near-ties under 0.5). Measured here: see test_print_agreement_figures. The same files
# with their experts decoded to F32 agree with llama.cpp to 0.024 at every position (the float models' tolerance),
# so what remains is the input's rounding, not the decoding.
QUANTIZED_TOLERANCES = {"qwen3moe-q4km": (1.0, 0.5), "gpt-oss-mxfp4": (1.0, 0.5)}
# A token whose k-th and (k+1)-th router logits lie closer than this may be routed otherwise by llama.cpp (its logits
# differ from ours by rounding): gpt-oss-mxfp4's chat prompt has such a token at step 7 (a gap of 0.0002 in layer 1,
# where llama.cpp's logits then differ by 4.9); the comparison stops there, as the free-running one does at
# llama.cpp's own near-ties.
ROUTER_TIE_MARGIN = 0.001


@pytest.fixture(scope="module")
def golden() -> dict:
    return json.loads(GOLDEN.read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def model_files(tmp_path_factory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("moe-models")
    return {name: write_moe_model(name, folder) for name in MOE_MODELS}


@pytest.fixture(scope="module")
def runs(golden, model_files) -> dict:
    return {name: run_on_cpu(model_files[name], golden["models"][name], GREEDY_TOKENS) for name in MOE_MODELS}


@pytest.mark.parametrize("name", MOE_MODELS)
def test_model_file_is_the_recorded_one(golden, model_files, name):
    digest = hashlib.sha256(model_files[name].read_bytes()).hexdigest()
    assert digest == golden["models"][name]["model_sha256"], (
        f"{name} is not the file the golden data was recorded from: re-record with scripts/golden/record_llamacpp_moe.py")


def test_golden_data_is_complete(golden):
    assert set(golden["models"]) == set(MOE_MODELS)
    for model in golden["models"].values():
        assert set(model["prompts"]) == set(PROMPTS)
        for rec in model["prompts"].values():
            assert len(rec["greedy_ids"]) == len(rec["greedy_step_top"]) == len(rec["forced_step_top"]) == GREEDY_TOKENS


@pytest.mark.parametrize("name", MOE_MODELS)
def test_our_tokenizer_gives_llamacpps_ids(golden, model_files, name):
    """qwen's pre-tokenizer, and gpt-oss's ("gpt-4o", o200k's split as llama.cpp runs it)."""
    with load_model(str(model_files[name]), LoadOptions(device="cpu", ctx_size=256)) as model:
        for prompt, rec in golden["models"][name]["prompts"].items():
            assert model.tokenizer.encode(PROMPTS[prompt]) == rec["prompt_ids"], prompt


@contextlib.contextmanager
def tolerances(name: str):
    """family_golden's tolerances for the float models; the quantized ones' (QUANTIZED_TOLERANCES) for the others."""
    kept = family_golden.LOGIT_TOLERANCE, family_golden.TIE_MARGIN
    if name in QUANTIZED_TOLERANCES:
        family_golden.LOGIT_TOLERANCE, family_golden.TIE_MARGIN = QUANTIZED_TOLERANCES[name]
    try:
        yield
    finally:
        family_golden.LOGIT_TOLERANCE, family_golden.TIE_MARGIN = kept


def router_gaps(path: Path, ids: list[int]) -> np.ndarray:
    """[layers, tokens]: the gap between the k-th and the (k+1)-th router logit of each token of `ids`, run as one
    teacher-forced step (read after each router product)."""
    with load_model(str(path), LoadOptions(device="cpu", kv_dtype="f16", max_step_tokens=128, ctx_size=256)) as model:
        runner, cfg = model.runner, model.config
        gaps: list[np.ndarray] = []

        def read(ctx, lw, t):
            logits = np.empty((t, cfg.n_experts), dtype=np.float32)
            runner.device.copy_device_to_host(logits, ctx.buffers["moe_logits"])
            if lw.ffn_gate_inp_bias is not None:  # moe_route adds the router's bias as it reads the logits
                bias = np.empty(cfg.n_experts, dtype=np.float32)
                runner.device.copy_device_to_host(bias, lw.ffn_gate_inp_bias.buffer)
                logits += bias
            top = -np.sort(-logits, axis=1)
            gaps.append(top[:, cfg.n_experts_used - 1] - top[:, cfg.n_experts_used])

        def recorded(block):
            def run(ctx, i, lw, t):
                launches = block(ctx, i, lw, t)
                at = next((j for j, (what, _) in enumerate(launches) if what == "moe_route"), None)
                if at is None:
                    return launches
                return launches[:at] + [("read moe_logits", lambda: read(ctx, lw, t))] + launches[at:]
            return run

        runner.family = replace(runner.family, layer=tuple(recorded(block) for block in runner.family.layer))
        runner.execute(step_batch(model.cache, [(1, list(ids), 0)]))
        return np.array(gaps)


def up_to_routing_tie(golden_model: dict, run: dict, path: Path) -> tuple[dict, dict, dict[str, int]]:
    """The record and the run cut before the first continuation step at which a layer's k-th and (k+1)-th router logits
    lie within ROUTER_TIE_MARGIN (llama.cpp's rounding may route that token otherwise: its own near-tie, one level
    down), and where each prompt was cut."""
    record, ours, cuts = {**golden_model, "prompts": {}}, {}, {}
    for prompt, rec in golden_model["prompts"].items():
        n = len(rec["prompt_ids"])
        gaps = router_gaps(path, rec["prompt_ids"] + rec["greedy_ids"]).min(axis=0)[n - 1:]
        cut = next((s for s, gap in enumerate(gaps[:GREEDY_TOKENS]) if gap < ROUTER_TIE_MARGIN), GREEDY_TOKENS)
        cuts[prompt] = cut
        record["prompts"][prompt] = {**rec, **{key: rec[key][:cut] for key in ("greedy_ids", "greedy_step_top",
                                                                            "forced_step_top")}}
        ours[prompt] = {**run[prompt], "forced": run[prompt]["forced"][:cut], "free": run[prompt]["free"][:cut]}
    return record, ours, cuts


@pytest.mark.parametrize("name", MOE_MODELS)
def test_agrees_with_llamacpp(golden, runs, model_files, name, capsys):
    record, ours, cuts = up_to_routing_tie(golden["models"][name], runs[name], model_files[name])
    with capsys.disabled():
        print(f"\n{name}: continuation steps compared before a routing near-tie: {cuts}")
    assert all(cut >= GREEDY_TOKENS // 4 for cut in cuts.values()), cuts  # most of every run is compared
    with tolerances(name):
        assert disagreements(record, ours) == []


@pytest.mark.parametrize("name", MOE_MODELS)
def test_greedy_margins_are_mostly_clear(golden, name):
    tops = [top for rec in golden["models"][name]["prompts"].values() for top in rec["greedy_step_top"]]
    clear = sum(margin(top["logits"]) >= TIE_MARGIN for top in tops)
    assert clear >= 0.75 * len(tops), f"{clear} of {len(tops)} steps clear of a near-tie"


def expert_sets(path: Path, prompt_ids: list[int]) -> list[set[tuple[int, ...]]]:
    """Per layer, the distinct sets of experts the prompt's tokens were routed to (read after each moe_route)."""
    with load_model(str(path), LoadOptions(device="cpu", kv_dtype="f16", max_step_tokens=128, ctx_size=256)) as model:
        runner, k = model.runner, model.config.n_experts_used
        seen: list[set[tuple[int, ...]]] = [set() for _ in range(model.config.n_layers)]

        def recorded(block):
            def run(ctx, i, lw, t):
                def read():
                    ids = np.empty((t, k), dtype=np.int32)
                    runner.device.copy_device_to_host(ids, ctx.buffers["moe_ids"])
                    seen[i].update(tuple(sorted(row)) for row in ids.tolist())
                launches = block(ctx, i, lw, t)
                routes = any(what == "moe_route" for what, _ in launches)  # the block of the experts
                return launches + [("read moe_ids", read)] if routes else launches
            return run

        runner.family = replace(runner.family, layer=tuple(recorded(block) for block in runner.family.layer))
        runner.execute(step_batch(model.cache, [(1, list(prompt_ids), 0)]))
        return seen


@pytest.mark.parametrize("name", MOE_MODELS)
def test_routing_varies_across_tokens_and_layers(golden, model_files, name, capsys):
    ids = golden["models"][name]["prompts"]["text"]["prompt_ids"]
    sets = expert_sets(model_files[name], ids)
    with capsys.disabled():
        print(f"\n{name}: distinct expert sets per layer over {len(ids)} tokens: {[len(s) for s in sets]} "
              f"(of {N_EXPERTS} experts, {N_USED} used)")
    assert all(len(s) >= 4 for s in sets), [len(s) for s in sets]
    assert len({frozenset(s) for s in sets}) == len(sets), "every layer routes the tokens its own way"


def _router_negated(runner):
    """A planted fault: every router logit's sign flipped (the least likely experts chosen)."""
    for lw in runner.weights.layers:
        w = lw.ffn_gate_inp
        values = np.empty(w.shape, dtype=np.float32)
        runner.device.copy_device_to_host(values, w.buffer)
        w.buffer.upload(-values)


def _sinks_dropped(runner):
    """A planted fault: every sink logit at -1e30 (attention without sinks)."""
    for lw in runner.weights.layers:
        lw.attn_sinks.buffer.upload(np.full(lw.attn_sinks.shape, -1e30, dtype=np.float32))


def _yarn_frequencies_dropped(runner):
    """A planted fault: RoPE's divisors all 1 (YaRN's magnitude kept)."""
    w = runner.weights.rope_freqs
    w.buffer.upload(np.ones(w.shape, dtype=np.float32))


def _shared_expert_dropped(runner):
    runner.family = Family("planted", tuple(b for b in runner.family.layer if b is not shared_expert))


def _shared_gate_dropped(runner):
    """A planted fault: the shared expert added whole (its sigmoid gate 1 for every token)."""
    for lw in runner.weights.layers:
        lw.ffn_gate_inp_shexp.buffer.upload(np.full(lw.ffn_gate_inp_shexp.shape, 0.0, dtype=np.float32))
    runner.buffers["moe_half"].upload(np.array([1.0], dtype=np.float32))


def _yarn_magnitude_dropped(runner):
    runner.scale = runner.config.attention_scale


PLANTED = {"router logits negated": ("qwen3moe-f32", _router_negated),
           "routed weights not renormalized": ("qwen3moe-f32", with_config(expert_weights_norm=False)),
           "one expert fewer": ("qwen3moe-f32", with_config(n_experts_used=N_USED - 1)),
           "shared expert dropped": ("qwen2moe-f32", _shared_expert_dropped),
           "shared expert ungated": ("qwen2moe-f32", _shared_gate_dropped),
           "qwen2moe's routed weights renormalized": ("qwen2moe-f32", with_config(expert_weights_norm=True)),
           "sinks dropped": ("gpt-oss-f16", _sinks_dropped),
           "YaRN's frequencies dropped": ("gpt-oss-f16", _yarn_frequencies_dropped),
           "YaRN's magnitude dropped": ("gpt-oss-f16", _yarn_magnitude_dropped),
           "SwiGLU without gpt-oss's clamp": ("gpt-oss-f16", with_config(expert_activation="swiglu")),
           "softmax before top-k": ("gpt-oss-mxfp4", with_config(expert_gating="softmax_topk"))}


@pytest.mark.parametrize("fault", PLANTED)
def test_planted_faults_are_caught(golden, model_files, fault):
    name, adjust = PLANTED[fault]
    with tolerances(name):
        found = disagreements(golden["models"][name], run_on_cpu(model_files[name], golden["models"][name],
                                                                  GREEDY_TOKENS, adjust))
    assert found, f"{fault} went unnoticed"


def test_print_agreement_figures(golden, runs, capsys):
    lines = []
    for name in MOE_MODELS:
        for prompt, rec in golden["models"][name]["prompts"].items():
            ours = runs[name][prompt]
            last = np.abs(ours["last"][rec["last_top_ids"][:10]] - np.array(rec["last_top_logits"][:10])).max()
            forced = max(np.abs(ours["forced"][s][t["ids"]] - t["logits"]).max()
                         for s, t in enumerate(rec["forced_step_top"]))
            follow = next((i for i, (a, b) in enumerate(zip(ours["free"], rec["greedy_ids"])) if a != b), GREEDY_TOKENS)
            lines.append(f"{name} {prompt}: last top-10 max|diff| {last:.4f}, teacher-forced max|diff| {forced:.4f}, "
                         f"free greedy follows {follow}/{GREEDY_TOKENS}")
    with capsys.disabled():
        print("\n" + "\n".join(lines))
    assert len(lines) == len(MOE_MODELS) * len(PROMPTS)
