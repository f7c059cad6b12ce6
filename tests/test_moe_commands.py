"""The commands on the tiny mixture-of-experts files (tests/support/moe_models.py: qwen3moe, and gpt-oss with MXFP4
experts and sliding-window layers) on the cpu backend: generate, bench, profile-kv, leak-check and serve each run
them, and the router's and experts' buffers are in the ledger under their own tags (moe_router, moe_experts), all back
at the end."""

from __future__ import annotations

import json

import httpx
import pytest
from typer.testing import CliRunner

from hipcore.engine.loader import LoadOptions, load_model
from hipcore.model.forward import activation_sizes
from hipcore.runtime.device import Device
from rocmforge_cli.app import app
from support.moe_models import write_moe_model
from support.serve_testing import MODEL_NAME, live_server

runner = CliRunner()
ENV = {"COLUMNS": "200"}


MODELS = ("qwen3moe-f32", "gpt-oss-mxfp4")


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, str]:
    folder = tmp_path_factory.mktemp("moe-commands")
    return {name: str(write_moe_model(name, folder)) for name in MODELS}


@pytest.fixture(params=MODELS)
def moe_file(request, files) -> str:
    return files[request.param]


def invoke(*args: str):
    result = runner.invoke(app, list(args), env=ENV)
    return result.exit_code, result.stdout, result.stderr


def test_the_ledger_holds_the_moe_buffers_under_their_tags(moe_file):
    options = LoadOptions(device="cpu", max_step_tokens=32, ctx_size=128)
    with load_model(moe_file, options) as model:
        by_tag = model.device.ledger.bytes_by_tag()
        sizes = activation_sizes(model.config, 32, options.max_seqs, model.runner.max_blocks)
        for tag in ("moe_router", "moe_experts"):
            assert by_tag[tag] == sum(n for n, t in sizes.values() if t == tag) > 0, tag
        assert model.memory_plan.activations >= by_tag["moe_router"] + by_tag["moe_experts"] + by_tag["activations"]
        ledger = model.device.ledger
    assert ledger.bytes_by_tag()["moe_router"] == ledger.bytes_by_tag()["moe_experts"] == 0


def test_generate(moe_file):
    code, out, err = invoke("generate", "-m", moe_file, "--device", "cpu", "--temp", "0", "-n", "6", "--json", "Hello")
    assert code == 0, err
    assert len(json.loads(out)["tokens"]) == 6


def test_bench(files):
    moe_file = files["qwen3moe-f32"]
    code, out, err = invoke("bench", "-m", moe_file, "--device", "cpu", "-p", "8", "-n", "4", "-r", "1", "-o", "json")
    assert code == 0, err
    rows = json.loads(out)
    assert {r["test"] for r in rows["results"]} >= {"pp8", "tg4"} and all(r["mean"] > 0 for r in rows["results"])


def test_profile_kv(moe_file):
    code, out, err = invoke("profile-kv", "-m", moe_file, "--plan", "--memory", "1GiB", "--json")
    assert code == 0, err
    model = json.loads(out)["model"]
    assert model["n_experts"] == 8 and 0 < model["n_active_params"] < model["n_params"]
    assert model["layer_windows"] == ([16, 0, 16] if "gpt-oss" in moe_file else [])


def test_leak_check_judges_it_clean(moe_file):
    code, out, err = invoke("leak-check", "-m", moe_file, "--device", "cpu", "--requests", "6", "--phases", "1",
                            "--max-tokens", "2", "--prompt-tokens", "2-6", "--parallel", "2", "--warmup", "1",
                            "--finished-bound", "4", "--step-tokens", "16", "--json")
    report = json.loads(out)
    assert code == 0 and report["verdict"] == "clean", report["findings"]
    assert report["baseline"]["ledger_bytes"]["moe_router"] > 0 and report["baseline"]["ledger_bytes"]["moe_experts"] > 0
    assert sum(report["close"]["ledger"]["bytes_by_tag"].values()) == 0


def test_serve_answers_a_completion(moe_file):
    with live_server(moe_file) as live:
        reply = httpx.post(live.url + "/v1/completions", json={"model": MODEL_NAME, "prompt": "Hello", "max_tokens": 4,
                                                               "temperature": 0}, timeout=60)
    assert reply.status_code == 200, reply.text
    assert reply.json()["usage"]["completion_tokens"] == 4


def test_leak_check_finds_a_leak_under_the_moe_tags(files, monkeypatch):
    """A planted leak (leak-check's device-leak bug) whose buffers carry the moe_experts tag is found and named by it."""
    original = Device.allocate

    def allocate(self, nbytes, tag="other", label="", owner=""):
        return original(self, nbytes, "moe_experts" if label == "planted.step_scratch" else tag, label, owner)

    monkeypatch.setattr(Device, "allocate", allocate)
    result = runner.invoke(app, ["leak-check", "-m", files["qwen3moe-f32"], "--device", "cpu", "--requests", "8",
                                 "--phases", "1", "--max-tokens", "4", "--prompt-tokens", "2-6", "--parallel", "2",
                                 "--warmup", "1", "--finished-bound", "4", "--step-tokens", "16", "--json",
                                 "--no-tracemalloc", "-q", "--plant-bug", "device-leak"],
                           env={**ENV, "ROCMFORGE_TESTING": "1"})
    report = json.loads(result.stdout)
    final = report["phases"][-1]["ledger"]
    assert result.exit_code == 1 and report["verdict"] != "clean"
    assert final["growth_bytes"]["moe_experts"] == final["leaked_bytes"] > 0


def test_inspect_names_the_experts(moe_file):
    code, out, err = invoke("inspect", moe_file)
    assert code == 0, err
    assert "2 of 8 a token, 64 wide" in out
    assert ("top-k, softmax over them" if "gpt-oss" in moe_file else "softmax over all, top-k") in out
