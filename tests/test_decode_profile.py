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


# ---- the bytes each kind reads and the floor of the active weights, on the cpu backend -------------------------

def file_experts(path) -> tuple[int, int, int, dict[str, int]]:
    """From the GGUF file itself (the gguf package's reader): (layers, experts, experts used, the bytes of one expert
    of each expert tensor kind, its bias with it where it has one (gpt-oss; float32 in the file as on the device):
    "ffn_gate_exps" -> bytes)."""
    import gguf

    reader = gguf.GGUFReader(str(path))
    arch = reader.fields["general.architecture"].contents()
    n_expert, used = (int(reader.fields[f"{arch}.{key}"].contents()) for key in ("expert_count", "expert_used_count"))
    per_expert: dict[str, int] = {}
    layers = set()
    for t in reader.tensors:
        name = t.name.split(".")
        if name[0] == "blk" and name[2].endswith("_exps") and name[1] == "0":
            per_expert[name[2]] = per_expert.get(name[2], 0) + int(t.n_bytes) // n_expert
        if name[0] == "blk" and name[2].endswith("_exps"):
            layers.add(name[1])
    return len(layers), n_expert, used, per_expert


def expert_problems(p, path, batch: int) -> list[str]:
    """What is wrong with profile p's expert rows and floor, against the file: every MoE layer selected between the
    used count and min(batch x used, experts) experts (batch a decode bucket's size: no padding rows routed), the gate|up and down rows read exactly the selected experts'
    bytes, and the floor's weights are the total less the experts not selected."""
    layers, n_expert, used, per_expert = file_experts(path)
    kinds = {k.name: k for k in p.kernels}
    problems = []
    counts = p.experts_selected
    if len(counts) != layers or not all(used <= c <= min(batch * used, n_expert) for c in counts):
        problems.append(f"experts selected per layer {counts}, {layers} layers of {used}..{min(batch * used, n_expert)}")
    gate_up = per_expert["ffn_gate_exps"] + per_expert["ffn_up_exps"]
    for name, one in (("moe_gate_up", gate_up), ("moe_down+residual", per_expert["ffn_down_exps"])):
        if name not in kinds or kinds[name].bytes_read != one * sum(counts):
            problems.append(f"{name}: {kinds[name].bytes_read if name in kinds else 'no row'} bytes, the selected "
                            f"experts hold {one * sum(counts)}")
    unselected = (gate_up + per_expert["ffn_down_exps"]) * (layers * n_expert - sum(counts))
    if p.weight_bytes != p.total_weight_bytes - unselected:
        problems.append(f"floor: weights {p.weight_bytes}, the total less the unselected experts is "
                        f"{p.total_weight_bytes - unselected}")
    return problems


@pytest.fixture(scope="module")
def moe_files(tmp_path_factory):
    from support.moe_models import write_moe_model

    folder = tmp_path_factory.mktemp("profile-moe")
    return {name: write_moe_model(name, folder) for name in ("qwen3moe-q4km", "gpt-oss-mxfp4")}


@pytest.fixture
def moe_file(moe_files):
    return moe_files["qwen3moe-q4km"]


def profile_on_cpu(path, batch: int):
    from hipcore.engine.loader import LoadOptions, load_model
    from profiles.decode_profile import profile_decode

    with load_model(str(path), LoadOptions(device="cpu", max_seqs=4, max_step_tokens=16, ctx_size=64,
                                           kv_dtype="f16")) as loaded:
        return profile_decode(loaded, batch=batch, context=16, reps=2, engine_steps=2, copy_bytes=1 << 20), \
            loaded.weights.nbytes


@pytest.mark.parametrize("name, batch", (("qwen3moe-q4km", 1), ("qwen3moe-q4km", 4), ("gpt-oss-mxfp4", 2)))
def test_a_mixture_profiles_its_expert_rows_with_the_selected_experts_bytes(moe_files, name, batch):
    from rocmforge_cli.bench import profile_markdown

    moe_file = moe_files[name]
    p, total = profile_on_cpu(moe_file, batch)
    assert expert_problems(p, moe_file, batch) == []
    layers, n_expert, used, _ = file_experts(moe_file)
    if batch == 1:
        assert p.experts_selected == [used] * layers and p.experts_per_layer == n_expert
    assert p.total_weight_bytes == total and p.weight_bytes < total
    kinds = {k.name: k for k in p.kernels}
    assert kinds["moe_gate_up"].gb_per_s == pytest.approx(kinds["moe_gate_up"].bytes_read / kinds["moe_gate_up"].us_per_step / 1e3)
    # moe_route reads gpt-oss's router bias (n_expert floats a layer) and no weight of qwen3moe's
    assert kinds["moe_route"].bytes_read == (layers * n_expert * 4 if name.startswith("gpt-oss") else None)
    assert kinds["moe_router"].bytes_read > 0
    text = profile_markdown(p)
    assert "| weights read | GB/s |" in text and f"of each MoE layer's {n_expert} experts" in text
    assert f"is {p.graph_us / p.floor_us:.2f}x the floor" in text
    kind = p.to_dict()["kernels"][[k.name for k in p.kernels].index("moe_gate_up")]
    assert kind["bytes_read"] == kinds["moe_gate_up"].bytes_read and kind["gb_per_s"] > 0


def test_counting_every_expert_is_caught(moe_file, monkeypatch):
    """The planted fault: each expert launch's bytes counted over all the layer's experts, as if it read them all."""
    from hipcore.model import launch

    monkeypatch.setattr(launch.ExpertReads, "bytes_for",
                        lambda self, experts: sum(launch.weight_bytes(w) for w in self.weights))
    p, _ = profile_on_cpu(moe_file, 1)
    problems = expert_problems(p, moe_file, 1)
    assert {line.split(":")[0] for line in problems} == {"moe_gate_up", "moe_down+residual", "floor"}, problems


def test_a_dense_model_floor_is_every_weight(tmp_path):
    from support.gguf_factory import write_tiny_llama

    p, total = profile_on_cpu(write_tiny_llama(tmp_path / "dense.gguf", tensor_type="Q8_0", tied=False, seed=5), 2)
    assert p.weight_bytes == p.total_weight_bytes == total and p.experts_selected == []
    kinds = {k.name: k for k in p.kernels}
    assert kinds["output_norm+head"].bytes_read > 0 and kinds["attention"].bytes_read is None
    assert "all " in p.weights_line()
