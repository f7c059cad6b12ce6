"""A gpt-oss whose every layer has a sliding window (one layer: llama.cpp's gpt-oss slides on the even layers) on the
cpu backend against llama.cpp: the KV cache's window-only case (hipcore/kvcache/config.py), whose global group holds
no layer, with prompts longer than the window.

Golden data: tests/golden/gpt_oss_window_only_llamacpp.json, written by
scripts/golden/record_llamacpp_gpt_oss_window_only.py (llama-cpp-python 0.3.36 built from its sdist, CPU). The model
is rebuilt here by the same code from the same seed and must hash to what was recorded. F16 experts, everything else
F32: tests/support/family_golden.py's float tolerances (0.05 on logits; near-tie 0.1).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest

from hipcore.engine.loader import LoadOptions, load_model
from hipcore.kvcache.config import GLOBAL_GROUP, LOCAL_GROUP
from support.family_golden import disagreements, run_on_cpu, with_config
from support.moe_models import GPT_OSS_WINDOW, GREEDY_TOKENS, PROMPTS, WINDOW_ONLY_MODELS, write_moe_model

GOLDEN = Path(__file__).parent / "golden" / "gpt_oss_window_only_llamacpp.json"
NAME = "gpt-oss-window-only"


@pytest.fixture(scope="module")
def golden() -> dict:
    return json.loads(GOLDEN.read_text(encoding="utf-8"))["models"][NAME]


@pytest.fixture(scope="module")
def model_file(tmp_path_factory) -> Path:
    return write_moe_model(NAME, tmp_path_factory.mktemp("window-only"))


@pytest.fixture(scope="module")
def run(golden, model_file) -> dict:
    return run_on_cpu(model_file, golden, GREEDY_TOKENS)


def test_model_file_is_the_recorded_one(golden, model_file):
    assert set(json.loads(GOLDEN.read_text(encoding="utf-8"))["models"]) == set(WINDOW_ONLY_MODELS)
    assert hashlib.sha256(model_file.read_bytes()).hexdigest() == golden["model_sha256"], (
        "not the file the golden data was recorded from: re-record with "
        "scripts/golden/record_llamacpp_gpt_oss_window_only.py")
    assert set(golden["prompts"]) == set(PROMPTS)


def test_every_layer_slides_and_every_prompt_is_longer_than_the_window(golden, model_file):
    with load_model(str(model_file), LoadOptions(device="cpu", ctx_size=256)) as model:
        config = model.cache.config
        assert config.window_only and config.global_layers == () and config.window == GPT_OSS_WINDOW
        assert model.cache.groups == (GLOBAL_GROUP, LOCAL_GROUP)
        assert config.bytes_per_block == 0 and config.cache_bytes == 2 * config.window_pool_bytes
        assert model.device.ledger.bytes_by_tag()["kv"] == config.cache_bytes
    assert all(len(rec["prompt_ids"]) >= 2 * GPT_OSS_WINDOW for rec in golden["prompts"].values())


def test_greedy_tokens_are_llamacpps(golden, run):
    assert disagreements({**golden, "name": NAME}, run) == []
    for prompt, rec in golden["prompts"].items():  # the free run follows llama.cpp's tokens all the way
        assert run[prompt]["free"] == rec["greedy_ids"], prompt


def _sinks_dropped(runner):
    """A planted fault: every sink logit at -1e30 (attention without sinks)."""
    for lw in runner.weights.layers:
        lw.attn_sinks.buffer.upload(np.full(lw.attn_sinks.shape, -1e30, dtype=np.float32))


@pytest.mark.parametrize("fault, adjust", [
    ("a window one key shorter", with_config(sliding_window=GPT_OSS_WINDOW - 1)),
    ("sinks dropped", _sinks_dropped),
])
def test_planted_faults_are_caught(golden, model_file, fault, adjust):
    assert disagreements({**golden, "name": NAME}, run_on_cpu(model_file, golden, GREEDY_TOKENS, adjust)), (
        f"{fault} went unnoticed")


def test_the_engine_plans_and_holds_a_window_of_blocks_through_a_chunked_prompt(golden, model_file):
    """Through the engine: the memory plan sizes the local pool for a window and a step per sequence (the global group
    costs nothing), a prompt of several windows in chunks of 16 tokens then 24 tokens decoded hold at most that many
    blocks at any step, the greedy tokens are still llama.cpp's, and every block comes back."""
    from hipcore.engine.sampler import SamplingParams

    rec = golden["prompts"]["text"]
    options = LoadOptions(device="cpu", kv_dtype="f16", max_step_tokens=16, ctx_size=256, max_seqs=2)
    with load_model(str(model_file), options) as model:
        plan, config, cache, engine = model.memory_plan, model.cache.config, model.cache, model.engine
        assert config.window_blocks == config.window_pool_blocks(2, 16) < config.num_blocks
        assert plan.kv == config.cache_bytes == config.window_blocks * config.window_bytes_per_block
        assert f"every layer slides: a window of {GPT_OSS_WINDOW}" in plan.table()
        per_sequence = config.window_blocks_per_sequence() + config.blocks_for_tokens(16)
        held: list[int] = []
        rid = engine.submit(rec["prompt_ids"], SamplingParams(temperature=0.0, max_tokens=GREEDY_TOKENS))
        while engine.has_work():
            engine.step()
            held.append(cache.memory_profile().groups[1].physical_blocks)
            cache.check_invariants()
        assert list(engine.finished_record(rid).generated_tokens[0]) == rec["greedy_ids"]
        assert 0 < max(held) <= per_sequence, held
        cache.release_fenced()
        cache.check_invariants(quiescent=True)


def test_leak_check_reads_a_window_only_model_clean(model_file):
    from typer.testing import CliRunner

    from rocmforge_cli.app import app

    result = CliRunner().invoke(app, ["leak-check", "--model", str(model_file), "--device", "cpu", "--requests", "60",
                                      "--seed", "3", "--json", "-q"], env={"COLUMNS": "200"})
    report = json.loads(result.stdout)
    assert result.exit_code == 0 and report["verdict"] == "clean", report["findings"]
    final = report["phases"][-1]["blocks"]
    assert final["groups"]["global"]["bytes_per_block"] == 0 and final["groups"]["local"]["not_free"] == 0
    assert final["groups"]["local"]["free"] == final["groups"]["local"]["usable"] > 0


def test_a_window_pool_too_small_for_the_first_chunk_is_refused_not_left_waiting(golden, model_file):
    from typer.testing import CliRunner

    from rocmforge_cli.app import app

    result = CliRunner().invoke(app, ["generate", "-m", str(model_file), "--device", "cpu", "--kv-blocks", "1", "-n", "4",
                                      "--temp", "0", "-p", PROMPTS["text"]], env={"COLUMNS": "200"})
    assert result.exit_code != 0
    assert "KV blocks of the sliding-window layers at once" in " ".join(result.output.split())


def test_profile_kv_plans_a_window_only_model_by_its_window(model_file):
    """profile-kv --plan: a sequence of 200 tokens costs a window of blocks (plus a step's, for the pool), whatever its
    length; the table says the global pool holds no layer."""
    from typer.testing import CliRunner

    from rocmforge_cli.app import app

    args = ["profile-kv", "-m", str(model_file), "--memory", "100MiB", "--context", "200", "--dtype", "f16"]
    result = CliRunner().invoke(app, [*args, "--plan", "--json"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    (row,) = json.loads(result.stdout)["plan"]["rows"]
    window_bytes = 2 * 2 * 32 * 2 * 16 * 2  # K and V, 2 KV heads of 32, f16, a window's 2 blocks of 16
    assert row["global_bytes_per_token"] == 0 and row["window_true_bytes_per_token"] == -(-window_bytes // 200)
    text = CliRunner().invoke(app, args, env={"COLUMNS": "200"}).stdout
    assert "0 global layers, 1 sliding (window 16)" in text and "every layer slides: the global pool holds no layer" in text
