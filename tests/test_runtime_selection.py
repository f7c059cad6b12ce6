"""Device selection (pick_device, discover_devices) and `rocmforge devices`, on a machine without GPUs.

The preference order and the reasons when a GPU does answer are checked by standing a cpu device in
for the GPU backend's open (what the backends themselves do without a GPU is in
test_runtime_gpu_backends.py).
"""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from hipcore.runtime import selection
from hipcore.runtime.cpu import CpuDevice
from hipcore.runtime.selection import pick_device
from hipcore.runtime.errors import EXIT_USAGE, BackendUnavailable, UsageError
from rocmforge_cli.app import app

HIP_REASON = "hip: not taken: no HIP runtime (libamdhip64.so not found)"
CUDA_REASON = "cuda: not taken: no NVIDIA driver (libcuda.so not found)"


def test_auto_takes_the_cpu_here_and_says_why_not_each_gpu_backend():
    choice = pick_device("auto", cpu_capacity=1 << 30)
    try:
        assert choice.device.backend == "cpu" and choice.device.capacity == 1 << 30
        assert choice.reasons[0] == HIP_REASON
        assert choice.reasons[1] == CUDA_REASON
        assert choice.reasons[2].startswith("cpu: taken: no GPU answered: host CPU (numpy) (cpu)")
    finally:
        choice.device.close()


@pytest.mark.parametrize("spec, why", [
    ("hip", r"device hip is not available: no HIP runtime \(libamdhip64\.so not found\)"),
    ("cuda", r"device cuda is not available: no NVIDIA driver \(libcuda\.so not found\)"),
    (" CUDA:1 ", r"device CUDA:1 is not available: no NVIDIA driver"),
])
def test_an_unavailable_backend_asked_by_name_is_a_usage_error(spec, why):
    with pytest.raises(UsageError, match=why) as info:
        pick_device(spec)
    assert info.value.exit_code == EXIT_USAGE


@pytest.mark.parametrize("spec", ["gpu", "rocm", "cuda:x", "cuda:-1", "", "cpu0"])
def test_an_unknown_spec_lists_the_valid_ones(spec):
    with pytest.raises(UsageError, match=r"unknown device .*; valid devices: auto, hip, cuda, cpu") as info:
        pick_device(spec)
    assert info.value.exit_code == EXIT_USAGE


def test_auto_takes_no_index_and_the_cpu_is_only_cpu_0():
    with pytest.raises(UsageError, match="'auto' takes no index"):
        pick_device("auto:0")
    with pytest.raises(UsageError, match="one CPU device, cpu:0"):
        pick_device("cpu:1")
    choice = pick_device("cpu:0")
    assert choice.device.backend == "cpu"
    assert choice.reasons == ["cpu: taken: asked for: host CPU (numpy) (cpu), cpu:0"]  # only what was tried


class StandInGpu(CpuDevice):
    """A cpu device wearing a GPU backend's name, to drive selection as if that GPU answered."""

    def __init__(self, backend: str, index: int):
        super().__init__(capacity=8 << 30, index=index)
        self.backend, self.name, self.arch = backend, f"stand-in {backend} GPU", {"hip": "gfx942", "cuda": "sm_90"}[backend]


def answering(*backends: str):
    def open_gpu(backend: str, index: int = 0):
        if backend not in backends:
            raise BackendUnavailable(f"no {backend} here")
        return StandInGpu(backend, index)
    return open_gpu


def test_auto_prefers_hip_over_cuda(monkeypatch):
    monkeypatch.setattr(selection, "open_gpu", answering("hip", "cuda"))
    choice = pick_device("auto")
    assert choice.device.backend == "hip"
    assert choice.reasons == ["hip: taken: first AMD GPU that answered: stand-in hip GPU (gfx942), hip:0",
                              "cuda: not taken: hip was found first",
                              "cpu: not taken: hip was found first"]


def test_auto_takes_cuda_when_hip_does_not_answer(monkeypatch):
    monkeypatch.setattr(selection, "open_gpu", answering("cuda"))
    choice = pick_device("auto")
    assert choice.device.backend == "cuda"
    assert choice.reasons == ["hip: not taken: no hip here",
                              "cuda: taken: first NVIDIA GPU that answered: stand-in cuda GPU (sm_90), cuda:0",
                              "cpu: not taken: cuda was found first"]


def test_an_index_reaches_the_backend(monkeypatch):
    monkeypatch.setattr(selection, "open_gpu", answering("cuda"))
    choice = pick_device("cuda:3")
    assert (choice.device.backend, choice.device.index) == ("cuda", 3)
    assert choice.reasons == ["cuda: taken: asked for: stand-in cuda GPU (sm_90), cuda:3"]  # hip was not tried: no line


def test_a_broken_binding_never_stops_the_cpu_fallback(monkeypatch):
    def explode(backend: str, index: int = 0):
        raise AttributeError("module 'hip' has no attribute 'hipInit'")
    monkeypatch.setattr(selection, "open_gpu", explode)
    choice = pick_device("auto")
    assert choice.device.backend == "cpu"
    assert choice.reasons[0] == "hip: not taken: unexpected AttributeError while probing: module 'hip' has no attribute 'hipInit'"


def test_discover_devices_lists_the_cpu_and_the_reasons():
    inventory = selection.discover_devices(cpu_capacity=2 << 30)
    assert [(d.backend, d.index, d.arch, d.total_bytes) for d in inventory.found] == [("cpu", 0, "cpu", 2 << 30)]
    assert inventory.unavailable == {"hip": "no HIP runtime (libamdhip64.so not found)",
                                     "cuda": "no NVIDIA driver (libcuda.so not found)"}
    assert inventory.auto_reasons() == [HIP_REASON, CUDA_REASON, "cpu: taken by auto: host CPU (numpy) (cpu), cpu:0"]


def test_inventory_prefers_the_first_backend_that_was_found():
    inventory = selection.DeviceInventory(
        found=[selection.DeviceSummary("cuda", 0, "H100", "sm_90", 80 << 30, 79 << 30),
               selection.DeviceSummary("cpu", 0, "host", "cpu", 1, 1)],
        unavailable={"hip": "no HIP runtime (libamdhip64.so not found)"})
    assert inventory.auto_choice.backend == "cuda"
    assert inventory.auto_reasons() == [HIP_REASON, "cuda: taken by auto: H100 (sm_90), cuda:0",
                                        "cpu: not taken: cuda is preferred"]


# ---- the command -------------------------------------------------------------------------------

runner = CliRunner()


def test_devices_command_shows_the_table_and_the_reasons():
    result = runner.invoke(app, ["devices"])
    assert result.exit_code == 0, result.output
    assert "host CPU" in result.output and "--device auto takes cpu:0" in result.output
    assert HIP_REASON in result.output and CUDA_REASON in result.output


def test_devices_json_is_machine_readable():
    result = runner.invoke(app, ["devices", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert data["auto"] == "cpu:0"
    assert data["devices"][0]["backend"] == "cpu" and data["devices"][0]["total_bytes"] > 0
    assert data["unavailable"]["hip"] == "no HIP runtime (libamdhip64.so not found)"
    assert data["reasons"][:2] == [HIP_REASON, CUDA_REASON]


def test_devices_checks_one_device_value():
    ok = runner.invoke(app, ["devices", "--device", "cpu", "--json"])
    assert ok.exit_code == 0, ok.output
    assert json.loads(ok.output)["device"] == "cpu:0"
    bad = runner.invoke(app, ["devices", "--device", "hip"])
    assert bad.exit_code == EXIT_USAGE
    assert "error: device hip is not available: no HIP runtime (libamdhip64.so not found)" in bad.output
    assert "Traceback" not in bad.output
    unknown = runner.invoke(app, ["devices", "-d", "tpu"])
    assert unknown.exit_code == EXIT_USAGE and "valid devices: auto, hip, cuda, cpu" in unknown.output


def test_devices_shows_a_gpu_row_with_its_code_objects(monkeypatch):
    from rocmforge_cli import devices as devices_cli

    inventory = selection.DeviceInventory(
        found=[selection.DeviceSummary("cuda", 0, "NVIDIA H100 80GB HBM3", "sm_90", 80 << 30, 79 << 30),
               selection.DeviceSummary("cpu", 0, "host CPU (numpy)", "cpu", 16 << 30, 16 << 30)],
        unavailable={"hip": "no HIP runtime (libamdhip64.so not found)"})
    monkeypatch.setattr(devices_cli, "discover_devices", lambda: inventory)
    monkeypatch.setattr(devices_cli, "code_objects_for", lambda arch: ["add", "rmsnorm"] if arch == "sm_90" else None)
    table = runner.invoke(app, ["devices"])
    assert table.exit_code == 0, table.output
    assert "NVIDIA H100 80GB HBM3" in table.output and "sm_90" in table.output and "add, rmsnorm" in table.output
    assert "--device auto takes cuda:0" in table.output and "cpu: not taken: cuda is preferred" in table.output
    data = json.loads(runner.invoke(app, ["devices", "--json"]).output)
    assert data["auto"] == "cuda:0" and data["devices"][0]["code_objects"] == ["add", "rmsnorm"]


def test_code_object_cells_say_what_is_there_or_why_not():
    from rocmforge_cli.devices import _code_objects_cell

    gpu = selection.DeviceSummary("hip", 0, "AMD Instinct MI300X", "gfx942", 192 << 30, 190 << 30)
    assert _code_objects_cell(gpu, ["matvec", "rmsnorm"]) == "matvec, rmsnorm"
    assert _code_objects_cell(gpu, []) == "none for gfx942 (kernels compile at run time)"
    assert _code_objects_cell(gpu, None) == "n/a"
    cpu = selection.DeviceSummary("cpu", 0, "host", "cpu", 1, 1)
    assert _code_objects_cell(cpu, None) == "host kernels (numpy)"


def test_the_kernel_loader_lists_code_objects_for_an_arch():
    from rocmforge_cli.devices import code_objects_for

    listed = code_objects_for("sm_90")
    assert isinstance(listed, list) and all(isinstance(op, str) for op in listed)
    assert code_objects_for("cpu") is None
