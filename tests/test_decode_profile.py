"""profiles/decode_profile.py's arithmetic: the bandwidth floor and the launch-gap advice, on the figures of
the NVIDIA H100 8B decode step (docs/history/raw/2026-11-24-fused-decode-h100.md), so a wrong formula shows as a
wrong number."""

from __future__ import annotations

import pytest

from profiles.decode_profile import DecodeProfile, KernelKind


def h100_8b_step(graph_us: float = 3651.3) -> DecodeProfile:
    return DecodeProfile(batch=1, context=128, device="cuda:0", launches=195, graph_us=graph_us, eager_us=6173.6,
                         kernels=[KernelKind("ffn_norm+gate_up+silu", 32, 1475.7), KernelKind("ffn_down+residual", 32,
                                                                                              719.2),
                                  KernelKind("rest", 131, 1198.4)],
                         runner_us=3909.8, runner_split_us={}, engine_step_us=4408.6,
                         weight_bytes=4_913_000_000, copy_bandwidth=2.954e12)


def test_floor_reads_the_weights_at_the_copy_traffic_rate():
    # 4.913 GB at 2,954 GB/s: 1,663 us, the ~1.7 ms the 8B decode floor is quoted at (not twice that).
    assert h100_8b_step().floor_us == pytest.approx(1663.2, abs=0.5)


def test_launch_advice_gives_the_gap_per_launch_not_the_mean_kernel_time():
    lines = h100_8b_step().advice()
    gap = next(line for line in lines if "launches" in line)
    # (3,651.3 - 3,393.3) / 195 = 1.3 us per launch; the mean kernel time would be 18.7.
    assert "1.3 us each" in gap and "18.7" not in gap


def test_no_launch_advice_when_the_kinds_alone_take_longer_than_the_graph():
    lines = h100_8b_step(graph_us=3000.0).advice()
    assert not any("us each" in line for line in lines)
    assert any("miss the cache" in line for line in lines)
