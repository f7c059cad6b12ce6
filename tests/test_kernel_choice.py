"""Which kernel each product takes, by weight type, architecture, token count and shape, against
tests/golden/kernel_choices.json: the choices the code made before they moved into hipcore/ops/kernel_choice.py
(recorded from 7ab3041's decision functions in hipcore/model/projections.py and the ops' launchers, by `python
tests/test_kernel_choice.py --record`), now asked of kernel_choice. A choice that differs from the record fails
with its key, the recorded and the present value. Nothing here needs a GPU: the launchers run on the cpu backend
behind a device that reports each architecture, and record the entry they would launch instead of launching it.
Also: the ROCMFORGE_* switches are read in kernel_choice alone, and the README lists them."""

from __future__ import annotations

import json
import os
import re
import sys
from dataclasses import fields
from pathlib import Path
from types import SimpleNamespace

import pytest

from hipcore.ops import fused_matmul, kernel_choice, matmul_mma
from hipcore.runtime.errors import UsageError

GOLDEN = Path(__file__).parent / "golden" / "kernel_choices.json"
TYPES = ("f32", "f16", "bf16", "q4_0", "q4_1", "q5_0", "q5_1", "q8_0", "q4_k", "q5_k", "q6_k", "mxfp4")
ARCHS = ("sm_90", "sm_80", "sm_75", "gfx942", "gfx1100", "gfx1201", "gfx1030")
TOKENS = (1, 2, 4, 5, 6, 7, 8, 9, 16, 32, 64, 128, 512)
# (rows, cols) of a product, and the gate/up rows of the feed-forward over the same columns: the demo model's
# narrow shapes and the Llama-3.1-8B's
SHAPES = {"576x576": (576, 576, 1536), "4096x4096": (4096, 4096, 14336)}


def _launched(device, monkeypatch, **kwargs) -> str:
    """The entry matmul_mma.launch picks for this product (W at address 0, so word-aligned)."""
    entries = []
    monkeypatch.setattr(matmul_mma, "get_kernel", lambda dev, op, entry, sig, programmatic=False: SimpleNamespace(
        launch=lambda *a, **k: entries.append(entry)))
    monkeypatch.setattr(matmul_mma.matvec, "check_operands", lambda *a, **k: None)
    matmul_mma.launch(device, None, 0, 0, 0, **kwargs)
    return entries[0]


def choices(device, workspace, monkeypatch, arch: str, weight_type: str, n_tokens: int, shape: str) -> str:
    """One line of every choice for this product, as the model's projections ask them."""
    rows, cols, ffn_rows = SHAPES[shape]
    monkeypatch.setattr(device, "arch", arch)
    w = SimpleNamespace(fmt=weight_type, cols=cols)
    family = kernel_choice.fused_family(weight_type, n_tokens, cols=cols, arch=arch)
    head = kernel_choice.fused_family(weight_type, n_tokens, kernel_choice.HEAD_MATVEC_MAX_ROWS, cols=cols, arch=arch)
    out = {
        "family": family.__name__.rsplit(".", 1)[-1] if family else "-",
        "head_family": head.__name__.rsplit(".", 1)[-1] if head else "-",
        "qmatvec_first": kernel_choice.qmatvec_first(weight_type, n_tokens, cols),
        "mma_first": kernel_choice.mma_first(weight_type, n_tokens, cols, arch),
        "separate": kernel_choice.separate_fusable(n_tokens, w, max_tokens=kernel_choice.qmatvec_limit(device, w)),
        "head_separate": kernel_choice.separate_fusable(n_tokens, w,
                                                      max_tokens=kernel_choice.head_qmatvec_limit(device, w)),
    }
    op = kernel_choice.project_op(device, n_tokens, weight_type, rows, cols)
    if op is matmul_mma:
        out["project"] = _launched(device, monkeypatch, rows=rows, cols=cols, n_tokens=n_tokens,
                                   weight_type=weight_type, workspace=workspace)
    else:
        out["project"] = op.__name__.rsplit(".", 1)[-1]
    out["f16_x"] = kernel_choice.takes_f16_x(device, weight_type, rows, n_tokens)
    if out["f16_x"]:
        out["f16_x_entry"] = _launched(device, monkeypatch, rows=rows, cols=cols, n_tokens=n_tokens,
                                       weight_type=weight_type, workspace=workspace, x_f16=True)
    out["qkv_one_launch"] = kernel_choice.takes_qkv(device, n_tokens, (weight_type,) * 3, cols,
                                                     (rows, rows // 4, rows // 4))
    out["swiglu_pair"] = kernel_choice.swiglu_fits(device, n_tokens, ffn_rows, weight_type, workspace)
    out["silu_up"] = kernel_choice.silu_up_fits(device, n_tokens, ffn_rows, weight_type, "silu")
    out["gelu_up"] = kernel_choice.silu_up_fits(device, n_tokens, ffn_rows, weight_type, "gelu")
    out["swiglu_fragments"] = kernel_choice.swiglu_fragments_fit(device, n_tokens, ffn_rows, cols,
                                                                     (weight_type,) * 2, workspace)
    return " ".join(f"{k}={v}" for k, v in out.items())


def mixed_choices(device, monkeypatch, arch: str, n_tokens: int) -> str:
    """A Q4_K_M layer's q|k|v (Q4_K q and k, Q6_K v) on the 8B's shapes: one launch or three."""
    monkeypatch.setattr(device, "arch", arch)
    q, k, v = (SimpleNamespace(fmt=t, cols=4096) for t in ("q4_k", "q4_k", "q6_k"))
    limit = kernel_choice.qmatvec_limit(device, q, k, v)
    return (f"separate={kernel_choice.separate_fusable(n_tokens, q, k, v, max_tokens=limit)} "
            f"qkv_one_launch={kernel_choice.takes_qkv(device, n_tokens, ('q4_k', 'q4_k', 'q6_k'), 4096, (4096, 1024, 1024))}")


def decision_table(device, monkeypatch) -> dict[str, str]:
    workspace = device.allocate(max(fused_matmul.WORKSPACE_BYTES, matmul_mma.WIDE_WORKSPACE_BYTES), "scratch")
    try:
        table = {}
        for arch in ARCHS:
            for weight_type in TYPES:
                for shape in SHAPES:
                    for t in TOKENS:
                        table[f"{arch} {weight_type} {shape} t={t}"] = choices(device, workspace, monkeypatch, arch,
                                                                               weight_type, t, shape)
            for t in TOKENS:
                table[f"{arch} q4_k_m-qkv 4096x4096 t={t}"] = mixed_choices(device, monkeypatch, arch, t)
        return table
    finally:
        workspace.free()


def grouped(table: dict[str, str]) -> dict[str, list[str]]:
    """The table as the golden file holds it: each distinct line of choices, with the products that take it."""
    out: dict[str, list[str]] = {}
    for key, line in table.items():
        out.setdefault(line, []).append(key)
    return out


def recorded_table() -> dict[str, str]:
    return {key: line for line, keys in json.loads(GOLDEN.read_text()).items() for key in keys}


def test_every_product_takes_the_kernel_it_took_before(cpu_device, monkeypatch):
    recorded = recorded_table()
    now = decision_table(cpu_device, monkeypatch)
    assert sorted(now) == sorted(recorded), "the table's keys changed"
    changed = [f"{key}:\n  recorded {recorded[key]}\n  now      {now[key]}" for key in recorded if now[key] != recorded[key]]
    assert not changed, f"{len(changed)} choices changed:\n" + "\n".join(changed[:10])


def test_the_comparison_catches_a_changed_choice(cpu_device, monkeypatch):
    """Planted: Q6_K's direct entry over one more step a split than measured; the table must differ there."""
    recorded = recorded_table()
    monkeypatch.setattr(matmul_mma, "DIRECT_Q6K_MAX_SPLIT_STEPS", 0)
    now = decision_table(cpu_device, monkeypatch)
    assert any(now[key] != recorded[key] for key in recorded if " q6_k " in key)
    assert all(now[key] == recorded[key] for key in recorded if " q6_k " not in key and "q4_k_m" not in key)


# The MoE routers (F32, experts x hidden): Qwen3-30B-A3B's, gpt-oss-20b's, gpt-oss-120b's
ROUTERS = {"qwen3-30b-a3b": (128, 2048), "gpt-oss-20b": (32, 2880), "gpt-oss-120b": (128, 2880)}


@pytest.mark.parametrize("arch", ARCHS)
def test_a_routers_product_takes_the_split_matvec_while_its_x_is_within_the_bound(cpu_device, monkeypatch, arch):
    """Past 8 tokens a router keeps matvec's split entry while its items' x (rows x tokens x cols floats) stays within
    matvec.SPLIT_MAX_X_BYTES, matmul beyond: a decode batch of 32 on every router (one to four matmul workgroups
    walked the columns there), gpt-oss-20b's 512-token prompt too, Qwen3-30B-A3B's and gpt-oss-120b's on matmul;
    project launches the entry project_op names, at split_geometry's grid (a workgroup a row and pass of 8 tokens)."""
    from hipcore.ops import matmul, matvec
    monkeypatch.setattr(cpu_device, "arch", arch)
    for name, (rows, cols) in ROUTERS.items():
        for t in (1, 8, 9, 16, 32, 64, 128, 256, 512, 2048):
            split = t <= 8 or rows * t * cols * 4 <= matvec.SPLIT_MAX_X_BYTES
            assert kernel_choice.project_op(cpu_device, t, "f32", rows, cols) is (matvec if split else matmul), (name, t)
        assert kernel_choice.project_op(cpu_device, 32, "f32", rows, cols) is matvec, name
    assert kernel_choice.project_op(cpu_device, 512, "f32", 32, 2880) is matvec  # gpt-oss-20b's prompt: 180 MiB
    assert kernel_choice.project_op(cpu_device, 512, "f32", 128, 2048) is matmul  # Qwen3-30B-A3B's: 512 MiB
    assert kernel_choice.project_op(cpu_device, 32, "f32", 4096, 4096) is matmul  # not few rows: matmul's tiles
    assert kernel_choice.project_op(cpu_device, 32, "q8_0", 32, 2880) is not matvec  # not a split type
    launched = []
    monkeypatch.setattr(matvec, "get_kernel", lambda dev, op, entry, sig: SimpleNamespace(
        launch=lambda grid, block, args, stream=None: launched.append((entry, grid, block))))
    monkeypatch.setattr(matvec, "check_operands", lambda *a, **k: None)
    kernel_choice.project(cpu_device, None, 0, 0, 0, 32, 2880, 32, weight_type="f32")
    assert launched == [("matvec_split_f32", 32 * 4, 256)]


# ROCMFORGE_* variables the package reads outside kernel_choice: settings, not paths of a product.
SETTINGS = {
    "ROCMFORGE_PREBUILT_DIR": "the code objects' folder (hipcore/runtime/kernels.py)",
    "ROCMFORGE_CACHE_DIR": "the run-time compiled kernels' cache (hipcore/runtime/kernels.py)",
    "ROCMFORGE_API_KEY": "serve's --api-key",
    "ROCMFORGE_COMMIT": "the commit named in bench's reports where the sources have no .git",
    "ROCMFORGE_TESTING": "--plant-bug, for the project's own tests",
    "ROCMFORGE_MOE_MMA_MIN_PAIRS": "the pairs an expert from which a MoE step takes the matrix cores (ops/moe_experts_mma.py)",
    "ROCMFORGE_MOE_GROUPED_MIN_PAIRS": "the pairs an expert from which a MoE step takes the grouped path (ops/moe_experts.py)",
    "ROCMFORGE_MOE_DIRECT_MIN_PAIRS": "the pairs an expert from which a MoE step takes the few-pairs tiles (ops/moe_experts_mma.py)",
    "ROCMFORGE_MOE_DIRECT_MAX_PAIRS": "the pairs an expert up to which a MoE step takes the few-pairs tiles (ops/moe_experts_mma.py)",
    "ROCMFORGE_MOE_MMA_NARROW_STEP": "the columns a step of the 32-element formats' MoE matrix-core products (ops/moe_experts_mma.py)",
    "ROCMFORGE_MOE_MMA_WIDE_PAIRS": "the pairs an expert from which the MoE matrix-core tiles hold 64 pairs (ops/moe_experts_mma.py)",
}
PACKAGES = ("hipcore", "profiles", "rocmforge_cli", "rocmforge_serve")
REPO = Path(__file__).resolve().parents[1]


def variables_read_outside(source: str) -> set[str]:
    """The ROCMFORGE_* names a module's source spells out in a string (every read of one does: os.environ, envvar=)."""
    return set(re.findall(r"[\"'](ROCMFORGE_[A-Z0-9_]+)[\"']", source))


def test_the_switches_are_read_in_kernel_choice_alone():
    """No module but kernel_choice names a switch; the other ROCMFORGE_* variables are SETTINGS, none of them a
    switch; a planted read of a removed experiment switch is found."""
    found = {}
    for package in PACKAGES:
        for path in (REPO / package).rglob("*.py"):
            if path.name != "kernel_choice.py":
                for name in variables_read_outside(path.read_text()):
                    found.setdefault(name, []).append(str(path.relative_to(REPO)))
    assert set(found) <= set(SETTINGS), {k: v for k, v in found.items() if k not in SETTINGS}
    assert not set(SETTINGS) & set(kernel_choice.ENVIRONMENT)
    planted = 'if os.environ.get("ROCMFORGE_WIDE_TILES", "1") != "0":'
    assert variables_read_outside(planted) == {"ROCMFORGE_WIDE_TILES"}


def test_each_switch_is_read_once_as_documented():
    """Each switch is on unless its variable is "0"; SWITCHES is what the environment said at import; the README's
    table lists every switch and setting a user may set."""
    switches = kernel_choice.Switches
    assert sorted(kernel_choice.ENVIRONMENT.values()) == sorted(f.name for f in fields(switches))
    assert switches.read({}) == switches(step_overlap=True, prompt_graphs=True)
    assert switches.read({"ROCMFORGE_STEP_OVERLAP": "0"}) == switches(step_overlap=False, prompt_graphs=True)
    assert switches.read({"ROCMFORGE_PROMPT_GRAPHS": " 0 ", "ROCMFORGE_STEP_OVERLAP": "1"}) == switches(
        step_overlap=True, prompt_graphs=False)
    assert kernel_choice.SWITCHES == switches.read(os.environ)
    readme = (REPO / "README.md").read_text()
    for name in [*kernel_choice.ENVIRONMENT, "ROCMFORGE_PREBUILT_DIR", "ROCMFORGE_CACHE_DIR", "ROCMFORGE_API_KEY",
                 "ROCMFORGE_MOE_MMA_MIN_PAIRS", "ROCMFORGE_MOE_GROUPED_MIN_PAIRS", "ROCMFORGE_MMA_FIRST_MIN_COLS",
                 "ROCMFORGE_QMATVEC_FIRST_MIN_COLS", "ROCMFORGE_MOE_MMA_NARROW_STEP", "ROCMFORGE_MOE_DIRECT_MIN_PAIRS",
                 "ROCMFORGE_MOE_DIRECT_MAX_PAIRS", "ROCMFORGE_MOE_MMA_WIDE_PAIRS"]:
        assert f"| `{name}" in readme, name


def test_mma_first_columns_follow_their_setting(monkeypatch):
    """ROCMFORGE_MMA_FIRST_MIN_COLS moves where the block-32 formats leave the fused families for the matrix cores:
    gpt-oss-20b's 2,880-column Q8_0 products take the matrix cores by default (measured) and stay on the fused
    families at 4096 (the earlier default); the demo model's 576 columns stay put; a value that is no whole number of
    0 or more is a UsageError naming it, from the choice itself and from check_settings (which the loader calls on
    every device)."""
    n = matmul_mma.min_tokens("q8_0", "sm_90")
    def choices() -> tuple:
        return (kernel_choice.mma_first_min_cols(), kernel_choice.mma_first("q8_0", n, 2880, "sm_90"),
                kernel_choice.mma_first("q8_0", n, 576, "sm_90"), kernel_choice.mma_first("q8_0", n - 1, 2880, "sm_90"),
                kernel_choice.fused_family("q8_0", 8, cols=2880, arch="sm_90") is None)
    monkeypatch.delenv("ROCMFORGE_MMA_FIRST_MIN_COLS", raising=False)
    assert choices() == (2880, True, False, False, True)
    monkeypatch.setenv("ROCMFORGE_MMA_FIRST_MIN_COLS", "4096")
    assert choices() == (4096, False, False, False, False)
    for bad in ("abc", "-1", "2880.5", ""):
        monkeypatch.setenv("ROCMFORGE_MMA_FIRST_MIN_COLS", bad)
        with pytest.raises(UsageError, match=r"ROCMFORGE_MMA_FIRST_MIN_COLS must be a whole number of 0 or more"):
            kernel_choice.mma_first("q8_0", n, 2880, "sm_90")
        with pytest.raises(UsageError, match=r"ROCMFORGE_MMA_FIRST_MIN_COLS must be a whole number of 0 or more"):
            kernel_choice.check_settings()


def test_qmatvec_first_columns_follow_their_setting(monkeypatch):
    """ROCMFORGE_QMATVEC_FIRST_MIN_COLS moves where one token of Q8_0, Q5_0 and Q5_1 leaves fused_matvec for
    fused_qmatvec: gpt-oss-20b's 2,880 columns take fused_qmatvec by default (measured; no fused family: its q, k and
    v take fused_qmatvec's separate matrices) and fused_matvec at 4096 (the earlier default); two tokens never move;
    a bad value is a UsageError naming it, from the choice and from check_settings."""
    def choices() -> tuple:
        return (kernel_choice.qmatvec_first_min_cols(), kernel_choice.qmatvec_first("q8_0", 1, 2880),
                kernel_choice.qmatvec_first("q8_0", 2, 2880), kernel_choice.qmatvec_first("q4_1", 1, 2880),
                kernel_choice.fused_family("q8_0", 1, cols=2880, arch="sm_90") is None)
    monkeypatch.delenv("ROCMFORGE_QMATVEC_FIRST_MIN_COLS", raising=False)
    assert choices() == (2880, True, False, False, True)
    monkeypatch.setenv("ROCMFORGE_QMATVEC_FIRST_MIN_COLS", "4096")
    assert choices() == (4096, False, False, False, False)
    for bad in ("abc", "-1", "1e3"):
        monkeypatch.setenv("ROCMFORGE_QMATVEC_FIRST_MIN_COLS", bad)
        with pytest.raises(UsageError, match=r"ROCMFORGE_QMATVEC_FIRST_MIN_COLS must be a whole number of 0 or more"):
            kernel_choice.qmatvec_first("q8_0", 1, 2880)
        with pytest.raises(UsageError, match=r"ROCMFORGE_QMATVEC_FIRST_MIN_COLS must be a whole number of 0 or more"):
            kernel_choice.check_settings()

if __name__ == "__main__" and sys.argv[1:] == ["--record"]:
    from hipcore.runtime.cpu import CpuDevice

    mp = pytest.MonkeyPatch()
    dev = CpuDevice(capacity=4 << 30)
    try:
        GOLDEN.write_text(json.dumps(grouped(decision_table(dev, mp)), indent=1) + "\n")
    finally:
        mp.undo()
        dev.close()
    print(f"wrote {GOLDEN}")
