"""profile-kv for models with sliding-window layers (Gemma 3): bytes per token that are GQA-true and
window-true, a capacity plan that uses them, per-group figures in the tables and the JSON; and the
presets of issue 13 (Qwen2.5-7B, Qwen3-8B, Gemma-3-4B/12B/27B) beside Llama-2-70B."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from hipcore.kvcache.config import KvCacheConfig
from profiles.kv_capacity import capacity_table, fit_sequences, plan_kv, window_true_bytes_per_token
from profiles.presets import PRESETS, gemma3_layer_windows
from rocmforge_cli.app import app

GiB = 1 << 30
runner = CliRunner()

# Parameter counts published with each checkpoint (Hugging Face safetensors metadata). The Gemma 3
# checkpoints hold the SigLIP vision tower and a projector (1,152 x hidden) beside the text decoder.
PUBLISHED_TOTAL = {"Gemma-3-4B": 4_300_079_472, "Gemma-3-12B": 12_187_325_040, "Gemma-3-27B": 27_432_406_640}
QWEN3_8B_PARAMETERS = 8_190_735_360


def run(*args: str, columns: int = 250):
    result = runner.invoke(app, ["profile-kv", *args], env={"COLUMNS": str(columns)})
    return result.exit_code, result.stdout


def test_the_issue_13_presets_sit_beside_llama_2_70b():
    assert {"Llama-2-70B", "Qwen2.5-7B", "Qwen3-8B", "Gemma-3-4B", "Gemma-3-12B", "Gemma-3-27B"} <= set(PRESETS)
    assert PRESETS["Qwen3-8B"].n_params == QWEN3_8B_PARAMETERS
    assert (PRESETS["Qwen3-8B"].n_kv_heads, PRESETS["Qwen3-8B"].head_dim, PRESETS["Qwen3-8B"].layer_windows) == (8, 128, ())


def test_the_gemma3_text_decoders_leave_the_same_vision_tower_in_each_published_count():
    # If a layer count, a width or a head_dim were wrong, the three remainders would not agree.
    towers = {name: PUBLISHED_TOTAL[name] - PRESETS[name].n_params - 1152 * PRESETS[name].hidden_size
              for name in PUBLISHED_TOTAL}
    assert set(towers.values()) == {416_867_184}, towers


@pytest.mark.parametrize("name, layers, local", [("Gemma-3-4B", 34, 29), ("Gemma-3-12B", 48, 40), ("Gemma-3-27B", 62, 52)])
def test_gemma3_presets_slide_five_layers_of_six_with_a_window_of_1024(name, layers, local):
    shape = PRESETS[name]
    assert len(shape.layer_windows) == layers and sum(1 for w in shape.layer_windows if w) == local
    assert set(shape.layer_windows) == {0, 1024}
    assert [i for i, w in enumerate(shape.layer_windows) if not w] == list(range(5, layers, 6))
    assert gemma3_layer_windows(7, 9) == (9, 9, 9, 9, 9, 0, 9)


def test_window_true_bytes_per_token_by_hand():
    shape = PRESETS["Gemma-3-27B"]  # 10 global, 52 local layers; 16 KV heads of 128
    per_layer = 2 * 16 * 128 * 2  # K + V, f16
    assert window_true_bytes_per_token(shape, "f16", 16, 512) == 62 * per_layer  # inside the window: every layer
    n = 32768
    expect = (2048 * 16 * 10 * per_layer + 65 * 16 * 52 * per_layer)  # 65 blocks of 16 hold the last 1,024
    assert window_true_bytes_per_token(shape, "f16", 16, n) == -(-expect // n)
    assert window_true_bytes_per_token(shape, "f16", 16, n) < 62 * per_layer / 4
    llama = PRESETS["Llama-2-70B"]
    assert window_true_bytes_per_token(llama, "f16", 16, 4096) == 2 * 80 * 8 * 128 * 2  # no window: GQA only


def test_the_plan_fits_window_true_sequences_and_its_cache_is_what_the_engine_would_allocate():
    plan = plan_kv(PRESETS["Gemma-3-12B"], 48 * GiB, seq_len=32768, block_size=16, dtypes=["f16"])
    (row,) = plan.rows
    seqs, cfg = fit_sequences(PRESETS["Gemma-3-12B"], "f16", 16, plan.kv_budget, 32768)
    assert row.sequences == seqs > 0 and row.kv_bytes == cfg.cache_bytes <= plan.kv_budget
    bigger = KvCacheConfig(48, 8, 256, (seqs + 1) * 2048 + 1, 16, "f16", PRESETS["Gemma-3-12B"].layer_windows)
    bigger = KvCacheConfig(48, 8, 256, bigger.num_blocks, 16, "f16", bigger.layer_windows,
                           bigger.window_pool_blocks(seqs + 1, 512))
    assert bigger.cache_bytes > plan.kv_budget  # one more sequence would not fit
    all_global = plan.kv_budget // (2048 * 16 * 2 * 48 * 8 * 256 * 2)
    assert row.sequences > 4 * all_global  # what the window saves at 32k
    assert row.local_blocks == cfg.window_blocks - 1 and row.usable_blocks == seqs * 2048


def test_plan_table_and_json_show_per_group_figures():
    code, out = run("--preset", "Gemma-3-27B", "--plan", "--memory", "80GiB", "--seq-len", "32768", "--dtype", "f16")
    assert code == 0
    assert "10 global, 52 sliding-window (window 1,024 tokens)" in out
    line = next(line for line in out.splitlines() if line.strip().startswith("f16") and "81,920" in line)
    true_bpt = window_true_bytes_per_token(PRESETS["Gemma-3-27B"], "f16", 16, 32768)
    assert "425,984" in line and f"{true_bpt:,}" in line
    code, out = run("--preset", "Gemma-3-27B", "--plan", "--memory", "80GiB", "--seq-len", "32768", "--dtype", "f16",
                    "--json")
    data = json.loads(out)
    (row,) = data["plan"]["rows"]
    assert (row["global_bytes_per_token"], row["local_bytes_per_token"]) == (81_920, 425_984)
    assert row["window_true_bytes_per_token"] == window_true_bytes_per_token(PRESETS["Gemma-3-27B"], "f16", 16, 32768)
    assert data["model"]["layer_windows"] == list(PRESETS["Gemma-3-27B"].layer_windows)


def test_capacity_table_counts_sequences_window_true():
    table = capacity_table(PRESETS["Gemma-3-4B"], 16 * GiB, context=32768, dtypes=["f16"], block_sizes=[16])
    (row,) = table.rows
    assert row.context_sequences == fit_sequences(PRESETS["Gemma-3-4B"], "f16", 16, 16 * GiB, 32768)[0] > 0
    assert row.bytes_per_block == 16 * 2 * 5 * 4 * 256 * 2  # the global pool's block: 5 global layers
    code, out = run("--preset", "Gemma-3-4B", "--memory", "16GiB", "--context", "32768", "--dtype", "f16",
                    "--block-size", "16")
    assert code == 0 and "Window-true: 5 global layers, 29 sliding (window 1,024)" in out


def test_a_narrow_terminal_keeps_every_digit_of_a_windowed_plan():
    code, out = run("--preset", "Gemma-3-27B", "--plan", "--memory", "80GiB", "--seq-len", "32768", columns=80)
    assert code == 0 and "…" not in out and max(len(line) for line in out.splitlines()) <= 80
