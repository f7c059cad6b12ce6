"""`rocmforge profile-kv --workloads`: the MemoryProfile after engine workloads, on a real model
(engine mode) and on a preset (kv-only mode), with figures checked by hand and the two modes
checked against each other on the same model shape."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from support.engine_testing import tiny_model

from hipcore.kvcache.profile import HASH_ENTRY_BYTES, TOKEN_ID_BYTES
from profiles.kv_workloads import WorkloadSpec, run_workloads
from profiles.presets import PRESETS, shape_from_gguf
from rocmforge_cli.app import app

runner = CliRunner()
LLAMA2_70B_F16_BLOCK = 2 * 80 * 8 * 128 * 2 * 16  # K and V, 80 layers, 8 KV heads, head_dim 128, f16, 16 tokens


def run(*args: str):
    result = runner.invoke(app, ["profile-kv", "--workloads", *args], env={"COLUMNS": "250"})
    return result.exit_code, result.stdout, result.stderr


def snapshots(report: dict) -> dict[str, dict]:
    return {f"{w['name']}/{s['label']}": s["profile"] for w in report["workloads"] for s in w["snapshots"]}


@pytest.fixture(scope="module")
def preset_report() -> dict:
    code, out, err = run("--preset", "Llama-2-70B", "--json")
    assert code == 0, err
    return json.loads(out)


def test_kv_only_mode_says_so_and_ends_quiescent(preset_report):
    assert preset_report["mode"] == "kv-only" and "no forward pass" in preset_report["mode_note"]
    assert [w["name"] for w in preset_report["workloads"]] == ["single", "concurrent", "appends", "forks", "chat", "system"]
    assert all(w["quiescent_after"] for w in preset_report["workloads"])
    assert not any(w["notes"] for w in preset_report["workloads"][:4])  # (the prefix workloads note their hit rates)


def test_single_sequences_by_hand(preset_report):
    snap = snapshots(preset_report)
    for tokens, blocks in ((1, 1), (17, 2), (100, 7)):
        p = snap[f"single/{tokens} tokens"]
        assert (p["active_sequences"], p["total_tokens"], p["physical_blocks"]) == (1, tokens, blocks)
        assert p["bytes_per_block"] == LLAMA2_70B_F16_BLOCK and p["pool_bytes_used"] == blocks * LLAMA2_70B_F16_BLOCK
        assert p["allocated_slots"] - p["used_slots"] == blocks * 16 - tokens
        assert p["fragmentation_ratio"] == pytest.approx((blocks * 16 - tokens) / (blocks * 16))
        assert p["page_table_bytes"] == 4 * blocks
        assert p["capacity_tokens"] == p["free_blocks"] * 16


def test_appends_and_batched_prompt_leave_the_same_figures(preset_report):
    snap = snapshots(preset_report)
    appended, batched = snap["appends/17 tokens by 1-token appends"], snap["appends/17 tokens by one batched prompt"]
    # The prefix counts are the workload's prompts so far; the batched prompt's full block is hashed at its first
    # token (one hash entry in the allocator), the appended one's only when it ends.
    counts = ("prefix_query_tokens", "prefix_hit_tokens", "prefix_hit_rate", "allocator_bytes")
    assert {k: v for k, v in appended.items() if k not in counts} == {k: v for k, v in batched.items() if k not in counts}
    assert batched["allocator_bytes"] - appended["allocator_bytes"] == HASH_ENTRY_BYTES + 16 * TOKEN_ID_BYTES
    assert (appended["physical_blocks"], appended["allocated_slots"] - appended["used_slots"]) == (2, 15)


def test_forks_share_the_prompt_then_copy_the_last_block(preset_report):
    snap = snapshots(preset_report)
    forked, grown = snap["forks/4 samples forked from a 40-token prompt"], snap["forks/after 4 tokens each"]
    # 40 tokens: 2 full blocks + 8 tokens in a third, all three held by the 4 samples.
    assert (forked["active_sequences"], forked["physical_blocks"], forked["logical_blocks"]) == (4, 3, 12)
    assert forked["shared_blocks"] == 3 and forked["sharing_saved_bytes"] == 9 * LLAMA2_70B_F16_BLOCK
    # Each sample appended into the shared third block: three copies, the last holder kept it.
    assert (grown["physical_blocks"], grown["logical_blocks"], grown["shared_blocks"]) == (6, 12, 2)
    assert grown["sharing_saved_bytes"] == 6 * LLAMA2_70B_F16_BLOCK and grown["total_tokens"] == 4 * 44


def test_concurrent_sequences(preset_report):
    (p,) = [s["profile"] for w in preset_report["workloads"] if w["name"] == "concurrent" for s in w["snapshots"]]
    lengths = WorkloadSpec().concurrent_lengths
    assert p["active_sequences"] == 8 and p["total_tokens"] >= sum(lengths)
    assert p["physical_blocks"] == p["logical_blocks"] >= sum(-(-n // 16) for n in lengths)


@pytest.fixture(scope="module")
def tiny_path(tmp_path_factory) -> str:
    return str(tiny_model(tmp_path_factory))


def test_engine_mode_leaves_the_cache_exactly_as_kv_only_mode(tiny_path):
    """The same request pattern on the tiny model: with its forward passes (engine mode) and on its
    KV cache alone (kv-only mode, as for a preset). Every profile of every workload is identical:
    kv-only mode drives the cache exactly as the engine does."""
    shape = shape_from_gguf(tiny_path)
    spec = WorkloadSpec(lengths=(1, 17, 40), concurrent=4, samples=3)
    engine = run_workloads(shape, model_path=tiny_path, device="cpu", spec=spec, max_step_tokens=32)
    kv_only = run_workloads(shape, model_path=None, spec=spec, max_step_tokens=32)
    assert (engine.mode, kv_only.mode) == ("engine", "kv-only")
    assert len(engine.results) == len(kv_only.results) == 6
    for real, alone in zip(engine.results, kv_only.results):
        assert real.quiescent_after and alone.quiescent_after and real.notes == alone.notes
        assert [s.label for s in real.snapshots] == [s.label for s in alone.snapshots]
        for a, b in zip(real.snapshots, alone.snapshots):
            assert a.profile == b.profile, (real.name, a.label)


def test_table_output_on_a_model_file(tiny_path):
    code, out, err = run("--model", tiny_path, "--device", "cpu", "--length", "5", "--concurrent", "2", "--samples", "2",
                         "--block-size", "8", "--dtype", "q8_0")
    assert code == 0, err
    assert "engine: the real model runs every forward pass" in out and "q8_0, blocks of 8 tokens" in out
    for title in ("single:", "concurrent:", "appends:", "forks:", "5 tokens", "fragmentation", "saved by sharing"):
        assert title in out
    assert out.count("cache quiescent after the workload: yes") == 6
    assert "running KV workloads" in err


@pytest.mark.parametrize("args, message", [
    (["--preset", "Llama-2-7B", "--plan"], "--plan does not apply to --workloads"),
    (["--preset", "Llama-2-7B", "--memory", "8GiB"], "--memory does not apply to --workloads"),
    (["--preset", "Llama-2-7B", "--dtype", "f16", "--dtype", "f32"], "one --dtype"),
    (["--preset", "Llama-2-7B", "--length", "0"], "at least 1 token"),
    (["--preset", "Llama-2-7B", "--length", "5000"], "context"),
    (["--preset", "Llama-2-7B", "--concurrent", "0"], "--concurrent must be between"),
    (["--preset", "Llama-2-7B", "--dtype", "f9"], "unknown KV dtype"),
    (["--preset", "Llama-2-7B", "--block-size", "3"], "power of two"),
])
def test_bad_workload_options_exit_2_with_one_line(args, message):
    code, out, err = run(*args)
    assert code == 2, (out, err)
    assert message in err and err.count("\n") == 1 and out == ""


def test_workload_options_need_workloads():
    result = runner.invoke(app, ["profile-kv", "--preset", "Llama-2-7B", "--memory", "1GiB", "--concurrent", "4"])
    assert result.exit_code == 2 and "--concurrent only applies to --workloads" in result.stderr


def test_chat_turns_find_their_history_in_the_prefix_cache(preset_report):
    (chat,) = [w for w in preset_report["workloads"] if w["name"] == "chat"]
    spec = WorkloadSpec()
    turns = [s["profile"] for s in chat["snapshots"]]
    assert len(turns) == spec.chat_turns
    # Turn t's prompts are t x 24 user tokens + (t - 1) x 8 reply tokens; every full block of the last turn's
    # computed tokens (its prompt and all but the last reply token) is found: (t - 1) x 32 - 1 tokens, rounded down
    # to blocks of 16, per conversation.
    hits = [p["prefix_hit_tokens"] for p in turns]
    expected = [0]
    for turn in range(1, spec.chat_turns):
        expected.append(expected[-1] + spec.chat_conversations * ((turn * 32 - 1) // 16 * 16))
    assert hits == expected
    assert chat["notes"][0].startswith("turn 1: 0 of 96 prompt tokens") and "(0%)" in chat["notes"][0]
    assert all(p["cached_blocks"] == 0 for p in turns)  # each turn took every block the last one left


def test_a_shared_system_prompt_is_computed_once_and_shared(preset_report):
    (system,) = [w for w in preset_report["workloads"] if w["name"] == "system"]
    alone, together = (s["profile"] for s in system["snapshots"])
    blocks = WorkloadSpec().system_tokens // 16  # 3 full blocks
    assert alone["cached_blocks"] == blocks and alone["active_sequences"] == 0
    others = WorkloadSpec().system_requests - 1
    assert together["shared_blocks"] == blocks and together["prefix_hit_tokens"] == others * blocks * 16
    assert together["sharing_saved_bytes"] == (others - 1) * blocks * LLAMA2_70B_F16_BLOCK


def test_no_prefix_cache_computes_every_prompt_whole():
    code, out, err = run("--preset", "Llama-2-7B", "--json", "--no-prefix-cache")
    assert code == 0, err
    profiles = [s["profile"] for w in json.loads(out)["workloads"] for s in w["snapshots"]]
    assert not any(p["prefix_caching"] or p["prefix_hit_tokens"] or p["cached_blocks"] for p in profiles)
    assert not any(p["shared_blocks"] for w in json.loads(out)["workloads"] if w["name"] == "system"
                   for p in (s["profile"] for s in w["snapshots"]))
