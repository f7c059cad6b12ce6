"""Which path a mixture-of-experts step takes and moe_experts_mma on the cpu backend: the per-pair, grouped, matrix-core
and few-pairs thresholds and their settings, the 64-column entries' names and results, and the few-pairs tiles (NVIDIA
only) against the reference. The ops' references and host kernels are tests/test_ops_cpu_moe.py's."""

from __future__ import annotations

import numpy as np
import pytest

from hipcore.ops import moe_experts
from support.weight_samples import random_weights
from test_ops_cpu_moe import to_device


def test_path_thresholds_follow_their_settings(monkeypatch):
    """The grouped path from one pair an expert, the matrix cores from 4 (8 where an expert tensor is MXFP4), NVIDIA's
    few-pairs tiles from 2 to 8 (4 to 16 for MXFP4) and never on AMD, 64-pair shared tiles from 48 an expert; the
    ROCMFORGE_MOE_GROUPED_MIN_PAIRS, ROCMFORGE_MOE_MMA_MIN_PAIRS, ROCMFORGE_MOE_DIRECT_MIN_PAIRS,
    ROCMFORGE_MOE_DIRECT_MAX_PAIRS and ROCMFORGE_MOE_MMA_WIDE_PAIRS settings move them; a value that is no number of 0
    or more is a UsageError naming the setting."""
    from hipcore.ops import moe_experts_mma
    from hipcore.runtime.errors import UsageError
    for name in ("ROCMFORGE_MOE_GROUPED_MIN_PAIRS", "ROCMFORGE_MOE_MMA_MIN_PAIRS", "ROCMFORGE_MOE_DIRECT_MIN_PAIRS",
                 "ROCMFORGE_MOE_DIRECT_MAX_PAIRS", "ROCMFORGE_MOE_MMA_WIDE_PAIRS"):
        monkeypatch.delenv(name, raising=False)
    # the shared tiles: 64 pairs from 48 an expert (gpt-oss-20b's 384-token prompt), 32 below
    assert moe_experts_mma.tile_tokens(384 * 4, 32) == 64 and moe_experts_mma.tile_tokens(383 * 4, 32) == 32
    qwen, oss = ("q4_k", "q6_k"), ("mxfp4", "mxfp4")
    widths = (2048, 768)
    assert moe_experts.grouped_pays(16, 8, 128) and not moe_experts.grouped_pays(15, 8, 128)
    assert moe_experts_mma.pays("sm_90", 64, 8, 128, qwen, widths) and not moe_experts_mma.pays("sm_90", 63, 8, 128, qwen,
                                                                                                widths)
    assert moe_experts_mma.pays("sm_90", 64, 4, 32, oss, widths) and not moe_experts_mma.pays("sm_90", 63, 4, 32, oss,
                                                                                              widths)
    direct = moe_experts_mma.direct_pays
    assert direct("sm_90", 32, 8, 128, qwen, widths) and not direct("sm_90", 31, 8, 128, qwen, widths)
    assert direct("sm_80", 32, 4, 32, oss, widths) and not direct("sm_90", 31, 4, 32, oss, widths)
    assert not direct("gfx942", 32, 4, 32, oss, widths) and not direct("sm_90", 32, 4, 32, ("mxfp4", "f32"), widths)
    assert direct("sm_90", 128, 8, 128, qwen, widths) and not direct("sm_90", 129, 8, 128, qwen, widths)
    assert direct("sm_90", 128, 4, 32, oss, widths) and not direct("sm_90", 129, 4, 32, oss, widths)
    monkeypatch.setenv("ROCMFORGE_MOE_DIRECT_MIN_PAIRS", "1")
    monkeypatch.setenv("ROCMFORGE_MOE_DIRECT_MAX_PAIRS", "32")
    assert direct("sm_90", 8, 4, 32, oss, widths) and not direct("sm_90", 7, 4, 32, oss, widths)
    assert direct("sm_90", 256, 4, 32, oss, widths) and not direct("sm_90", 257, 4, 32, oss, widths)
    monkeypatch.setenv("ROCMFORGE_MOE_MMA_WIDE_PAIRS", "65")
    assert moe_experts_mma.tile_tokens(512 * 4, 32) == 32 and moe_experts_mma.tile_tokens(520 * 4, 32) == 64
    monkeypatch.setenv("ROCMFORGE_MOE_GROUPED_MIN_PAIRS", "2")
    monkeypatch.setenv("ROCMFORGE_MOE_MMA_MIN_PAIRS", "2")
    assert not moe_experts.grouped_pays(16, 8, 128) and moe_experts.grouped_pays(32, 8, 128)
    assert moe_experts_mma.pays("sm_90", 16, 4, 32, oss, widths) and not moe_experts_mma.pays("sm_90", 15, 4, 32, oss,
                                                                                              widths)
    for name, check in (("ROCMFORGE_MOE_GROUPED_MIN_PAIRS", lambda: moe_experts.grouped_pays(16, 8, 128)),
                        ("ROCMFORGE_MOE_MMA_MIN_PAIRS", lambda: moe_experts_mma.pays("sm_90", 64, 8, 128, qwen, widths)),
                        ("ROCMFORGE_MOE_DIRECT_MIN_PAIRS", lambda: direct("sm_90", 64, 8, 128, qwen, widths)),
                        ("ROCMFORGE_MOE_DIRECT_MAX_PAIRS", lambda: direct("sm_90", 64, 8, 128, qwen, widths)),
                        ("ROCMFORGE_MOE_MMA_WIDE_PAIRS", lambda: moe_experts_mma.tile_tokens(512 * 4, 32))):
        for bad in ("two", "-1", "nan"):
            monkeypatch.setenv(name, bad)
            with pytest.raises(UsageError, match=f"{name} must be a number of 0 or more, got '{bad}'"):
                check()
        monkeypatch.delenv(name)


def test_narrow_step_setting_picks_the_64_column_entries(monkeypatch):
    """The `_s64` entries (the default, and ROCMFORGE_MOE_MMA_NARROW_STEP=64) for the 32-element formats where cols is
    a multiple of 64 (gpt-oss-20b's 2,880), never for the K-quants (their steps are 64 already) nor at 32-multiple
    widths; 32 keeps the 32-column entries; anything but 32 or 64 is a UsageError naming the setting, also from
    check_settings."""
    from hipcore.ops import kernel_choice, moe_experts_mma
    from hipcore.runtime.errors import UsageError
    names = lambda: (moe_experts_mma.entry_name("up", "mxfp4", 2880), moe_experts_mma.entry_name("down", "q8_0", 96),
                     moe_experts_mma.entry_name("gate", "q4_k", 2048), moe_experts_mma.entry_name("gate", "bf16", 128))
    wide = ("moe_mma_up_mxfp4_s64", "moe_mma_down_q8_0", "moe_mma_gate_q4_k", "moe_mma_gate_bf16_s64")
    monkeypatch.delenv("ROCMFORGE_MOE_MMA_NARROW_STEP", raising=False)
    assert names() == wide
    monkeypatch.setenv("ROCMFORGE_MOE_MMA_NARROW_STEP", "32")
    assert names() == ("moe_mma_up_mxfp4", "moe_mma_down_q8_0", "moe_mma_gate_q4_k", "moe_mma_gate_bf16")
    monkeypatch.setenv("ROCMFORGE_MOE_MMA_NARROW_STEP", "64")
    assert names() == wide
    for bad in ("48", "sixty-four", "-64"):
        monkeypatch.setenv("ROCMFORGE_MOE_MMA_NARROW_STEP", bad)
        with pytest.raises(UsageError, match="ROCMFORGE_MOE_MMA_NARROW_STEP must be"):
            moe_experts_mma.entry_name("up", "mxfp4", 2880)
        with pytest.raises(UsageError, match="ROCMFORGE_MOE_MMA_NARROW_STEP must be"):
            kernel_choice.check_settings()


def test_64_column_entries_compute_what_the_others_do(cpu_device, monkeypatch):
    """On the cpu backend the `_s64` entries are registered and give the 32-column entries' results (both are the
    float64 reference): a prompt's MXFP4 gate launched under either setting."""
    from hipcore.ops import moe_experts_mma
    rng = np.random.default_rng(64)
    tokens, k, n_expert, rows, cols = 12, 2, 4, 64, 128
    ids = np.stack([rng.permutation(n_expert)[:k] for _ in range(tokens)]).astype(np.int32)
    pairs = tokens * k
    raw = random_weights(rng, "mxfp4", n_expert * rows, cols)
    x = rng.standard_normal((tokens, cols)).astype(np.float16)  # the products' x: f16 (moe_experts_mma.X_BYTES)
    tile = moe_experts_mma.tile_tokens(pairs, n_expert)
    sorted_bytes, tiles_bytes = moe_experts_mma.sort_bytes(pairs, n_expert)
    bufs = {name: cpu_device.allocate(size, "scratch") for name, size in
            (("sorted", sorted_bytes), ("tiles", tiles_bytes), ("out", pairs * rows * 4))}
    w, xb, idb = (to_device(cpu_device, a) for a in (raw, x, ids))
    moe_experts_mma.launch_sort(cpu_device, None, bufs["sorted"], bufs["tiles"], idb, pairs, n_expert, tile)
    results = []
    for step in ("32", "64"):
        monkeypatch.setenv("ROCMFORGE_MOE_MMA_NARROW_STEP", step)
        moe_experts_mma.launch_products(cpu_device, None, "gate", bufs["out"], w, xb, bufs["sorted"], bufs["tiles"],
                                        weight_type="mxfp4", rows=rows, cols=cols, pairs=pairs, x_per=k,
                                        n_expert=n_expert, tile=tile)
        results.append(bufs["out"].download(np.float32).reshape(pairs, rows))
    want, bound = moe_experts_mma.products_reference(x[np.arange(pairs) // k].astype(np.float64), raw, "mxfp4", ids,
                                                     rows, cols)
    assert np.all(np.abs(results[0] - want) <= bound) and np.array_equal(results[0], results[1])


def test_few_pairs_tiles_are_nvidias_and_compute_the_reference(cpu_device, monkeypatch):
    """The 8-pair tiles (`_direct`) run only where NVIDIA's fragments exist: refused on the cpu backend and on an AMD
    stand-in, launched on an sm_90 one (its host twin: the reference's products), each listed tile of at most 8
    pairs, one expert's 13 pairs over two tiles."""
    from hipcore.ops import moe_experts_mma
    from support.stand_in_gpu import StandInGpu, host_kernels_for_stand_ins
    host_kernels_for_stand_ins(monkeypatch)
    rng = np.random.default_rng(8)
    tokens, k, n_expert, rows, cols = 13, 2, 4, 64, 128
    ids = np.stack([[0, 1 + rng.integers(0, n_expert - 1)] for _ in range(tokens)]).astype(np.int32)
    pairs, tile = tokens * k, moe_experts_mma.DIRECT_TILE_PAIRS
    raw = random_weights(rng, "mxfp4", n_expert * rows, cols)
    x = rng.standard_normal((tokens, cols)).astype(np.float16)  # the products' x: f16 (moe_experts_mma.X_BYTES)
    for dev in (cpu_device, StandInGpu(arch="gfx942"), StandInGpu(arch="sm_90")):
        sorted_bytes, tiles_bytes = moe_experts_mma.sort_bytes(pairs, n_expert)
        bufs = {name: dev.allocate(size, "scratch") for name, size in
                (("sorted", sorted_bytes), ("tiles", tiles_bytes), ("out", pairs * rows * 4))}
        w, xb, idb = (to_device(dev, a) for a in (raw, x, ids))
        moe_experts_mma.launch_sort(dev, None, bufs["sorted"], bufs["tiles"], idb, pairs, n_expert, tile)
        launch = lambda: moe_experts_mma.launch_products(  # noqa: E731
            dev, None, "gate", bufs["out"], w, xb, bufs["sorted"], bufs["tiles"], weight_type="mxfp4", rows=rows,
            cols=cols, pairs=pairs, x_per=k, n_expert=n_expert, tile=tile)
        if not dev.arch.startswith("sm_"):
            with pytest.raises(ValueError, match="no few-pairs entry for mxfp4 experts"):
                launch()
            continue
        launch()
        listed = bufs["tiles"].download(np.int32)
        table = listed[1:1 + 3 * int(listed[0])].reshape(-1, 3)
        assert table[:, 2].max() <= tile and [int(n) for e, _, n in table if e == 0] == [8, 5]
        got = bufs["out"].download(np.float32).reshape(pairs, rows)
        want, bound = moe_experts_mma.products_reference(x[np.arange(pairs) // k].astype(np.float64), raw, "mxfp4",
                                                         ids, rows, cols)
        assert np.all(np.abs(got - want) <= bound)
        assert "moe_mma_gate_mxfp4_direct" in dev.entries
