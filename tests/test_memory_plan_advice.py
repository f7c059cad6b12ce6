"""MemoryPlan.check's advice when a plan does not fit: a smaller KV cache where one would fit, fewer prompt tokens a
step where the weights fit but a step's activations do not, another model where the weights alone do not."""

from __future__ import annotations

import pytest

from hipcore.kvcache.config import KvCacheConfig
from hipcore.model.memory_plan import MemoryPlan
from hipcore.runtime.errors import DeviceOutOfMemory

MiB = 1 << 20
KV = KvCacheConfig(n_layers=2, n_kv_heads=2, head_dim=64, num_blocks=65, block_size=16)  # 64 usable blocks


def plan(*, weights: int, kv: int, activations: int, free: int) -> MemoryPlan:
    return MemoryPlan(device="test", backend="cuda", weights=weights, kv=kv, activations=activations, scratch=0,
                      free=free, total=free, margin=0, kv_config=KV, ctx_size=1024, max_seqs=8, max_step_tokens=2048)


def advice(p: MemoryPlan) -> str:
    with pytest.raises(DeviceOutOfMemory) as info:
        p.check()
    assert info.value.exit_code == 5
    return str(info.value)


def test_a_plan_that_fits_raises_nothing():
    plan(weights=100 * MiB, kv=KV.cache_bytes, activations=10 * MiB, free=200 * MiB).check()


def test_kv_too_large_names_the_context_that_fits():
    text = advice(plan(weights=100 * MiB, kv=10_000 * MiB, activations=1 * MiB, free=200 * MiB))
    assert "use --ctx-size" in text and "--step-tokens" not in text


def test_large_activations_beside_a_kv_that_could_shrink_name_step_tokens_too():
    text = advice(plan(weights=100 * MiB, kv=10_000 * MiB, activations=5_000 * MiB, free=6_000 * MiB))
    assert "use --ctx-size" in text and "--step-tokens" in text and "steps of 2048 tokens for 8 sequences" in text


def test_weights_that_fit_without_a_steps_activations_name_step_tokens():
    text = advice(plan(weights=100 * MiB, kv=KV.cache_bytes, activations=500 * MiB, free=200 * MiB))
    assert "the weights fit but not with a step's activations" in text and "--step-tokens" in text
    assert "weights alone do not fit" not in text


def test_weights_that_do_not_fit_say_so():
    text = advice(plan(weights=300 * MiB, kv=KV.cache_bytes, activations=1 * MiB, free=200 * MiB))
    assert "the weights alone do not fit" in text and "--step-tokens" not in text


def test_weights_that_grow_on_load_are_explained_within_80_columns(demo_model_path):
    from hipcore.gguf.file import GGUFFile
    from hipcore.model.memory_plan import make_plan
    from hipcore.runtime.cpu import CpuDevice

    gguf = GGUFFile.open(str(demo_model_path))
    device = CpuDevice()
    try:
        p = make_plan(device, gguf.plan, ctx_size=256, max_seqs=1, max_step_tokens=64)
    finally:
        device.close()
    # The demo file's matrices are Q4_1: the cpu backend keeps them as f32, about 5.6 times their bytes.
    assert p.weights > 4 * p.weights_in_file and p.weights_converted > 0.9 * p.weights_in_file
    text = p.table()
    assert "weights grow on load: the cpu backend computes on dequantized copies" in " ".join(text.split())
    assert "as f32" in text and max(len(line) for line in text.splitlines()) <= 80
    same = plan(weights=100 * MiB, kv=KV.cache_bytes, activations=1 * MiB, free=200 * MiB)  # nothing converted: no note
    assert "grow" not in same.table() and same.rows()[0][0] == "weights"
