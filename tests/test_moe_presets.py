"""The mixture-of-experts presets (Qwen3-30B-A3B, gpt-oss-20b, gpt-oss-120b): their parameter counts from the shape
against the published ones, total against active, MXFP4 experts at 4.25 bits a weight, gpt-oss's sliding-window
layers planned window-true, and what fits on 16, 24, 80 and 128 GiB."""

from __future__ import annotations

import pytest

from profiles.kv_capacity import plan_kv, weight_bytes
from profiles.presets import PRESETS, moe_parameter_counts

GiB = 1 << 30


@pytest.mark.parametrize("name, total, active", [
    ("gpt-oss-20b", 20.91e9, 3.6e9),    # llama.cpp's 20.91 B; the model card's 3.6B active (embedding aside)
    ("gpt-oss-120b", 116.83e9, 5.1e9),  # llama-bench's 116.83 B; the card's 5.1B active
])
def test_gpt_oss_counts_are_the_published_ones(name, total, active):
    shape = PRESETS[name]
    assert round(shape.n_params / 1e9, 2) == total / 1e9
    assert round(shape.n_active_params / 1e9, 1) == active / 1e9
    assert shape.layer_windows == tuple(128 if i % 2 == 0 else 0 for i in range(shape.n_layers))


def test_qwen3_30b_a3b_counts():
    shape = PRESETS["Qwen3-30B-A3B"]
    assert shape.n_params == 30_532_122_624  # Qwen/Qwen3-30B-A3B's safetensors count ("30.5B")
    # the card's "3.3B activated" counts the embedding table; ours reads one row of it
    assert 3.3e9 <= shape.n_active_params + shape.vocab_size * shape.hidden_size < 3.4e9
    assert not shape.layer_windows and shape.expert_type == ""


def test_parameter_counts_by_hand():
    """One layer, two experts of which one is used, every weight counted once."""
    total, active, expert = moe_parameter_counts(1, 2, 1, 4, 8, 10, 2, 1, 6, biases=True)
    attention = 2 * 8 * 8 + 2 * 8 * 4 + (8 + 8 + 8 + 2)  # q, o; k, v; q/k/v/o biases and 2 sinks
    router, one_expert = 2 * 8 + 2, 3 * 6 * 8 + (6 + 6 + 8)
    dense = attention + router + 2 * 8
    assert expert == 2 * one_expert
    assert total == dense + 2 * one_expert + 2 * 10 * 8 + 8
    assert active == dense + one_expert + 10 * 8 + 8


def test_mxfp4_experts_weigh_what_the_published_files_do():
    bytes_20b, how = weight_bytes(PRESETS["gpt-oss-20b"], None)
    assert "MXFP4 (4.25 bits/weight)" in how
    assert abs(bytes_20b - 12.1e9) < 0.05 * 12.1e9   # ggml-org/gpt-oss-20b-GGUF: 12.1 GB
    bytes_120b, _ = weight_bytes(PRESETS["gpt-oss-120b"], None)
    assert abs(bytes_120b - 59.02 * GiB) < 0.02 * 59.02 * GiB  # llama-bench: 59.02 GiB
    assert weight_bytes(PRESETS["gpt-oss-20b"], "Q8_0")[0] > 1.8 * bytes_20b  # --weights-type still applies


# Whether one 8,192-token f16 sequence fits beside the weights (Qwen3 as Q4_K_M, gpt-oss as published).
FITS = {"Qwen3-30B-A3B": {16: False, 24: True, 80: True, 128: True},
        "gpt-oss-20b": {16: True, 24: True, 80: True, 128: True},
        "gpt-oss-120b": {16: False, 24: False, 80: True, 128: True}}


@pytest.mark.parametrize("name", FITS)
def test_what_fits_on_16_24_80_and_128_gib(name):
    for gib, fits in FITS[name].items():
        plan = plan_kv(PRESETS[name], gib * GiB, context=8192, dtypes=("f16",))
        assert (plan.rows[0].sequences >= 1) == fits, (name, gib, plan.weights / GiB, plan.rows[0])


def test_window_layers_hold_a_window_only():
    """gpt-oss-20b on 80 GiB: its half of the layers that slide keep 128 tokens, so a long sequence costs about
    half the bytes a token of every layer would."""
    plan = plan_kv(PRESETS["gpt-oss-20b"], 80 * GiB, context=131072, dtypes=("f16",))
    row = plan.rows[0]
    assert row.window_true_bytes_per_token < 0.51 * row.bytes_per_token
