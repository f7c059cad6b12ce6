"""Which kernels a process compiled at run time (hipcore/runtime/kernels.py runtime_compiled_ops), and the
note `rocmforge bench` adds when any were: objects from hiprtc / nvrtc can run much slower than the build
script's (docs/history/2026-11-25-split-residual-programmatic-launch.md), so a figure measured on them must say so."""

from __future__ import annotations

import json

import pytest

import hipcore.runtime.kernels as loader
from profiles.bench import BenchReport, note_runtime_compiled
from rocmforge_cli.bench import markdown


class CompilingGpu:
    """Just enough of a GPU device for the loader: modules load, sources 'compile' to their name."""

    backend = "cuda"

    def __init__(self, arch: str):
        self.arch = arch
        self.compiled: list[str] = []
        self.loaded_code: dict[str, dict] = {"modules": {}, "kernels": {}}  # as Device keeps them

    def load_module(self, image: bytes, name: str = ""):
        class Module:
            def kernel(self, entry: str, signature: str, programmatic: bool = False):
                return (name, entry)

        return Module()

    def jit_compile(self, source: str, name: str, include_dirs, options) -> bytes:
        self.compiled.append(name)
        return b"compiled " + name.encode()


@pytest.fixture
def fresh_loader(monkeypatch, tmp_path):
    """An empty record, a disk cache of this test's own, and a prebuilt folder holding one current object:
    argmax for sm_120."""
    prebuilt = tmp_path / "prebuilt"
    (prebuilt / "sm_120").mkdir(parents=True)
    (prebuilt / "sm_120" / "argmax.cubin").write_bytes(b"prebuilt argmax")
    manifest = loader.empty_manifest()
    manifest["objects"]["sm_120"] = {"argmax": {"file": "sm_120/argmax.cubin",
                                                "source_sha256": loader.source_digest("argmax")}}
    (prebuilt / "manifest.json").write_text(json.dumps(manifest))
    monkeypatch.setattr(loader, "prebuilt_dir", lambda: prebuilt)
    monkeypatch.setattr(loader, "_runtime_compiled_ops", set())
    monkeypatch.setattr(loader, "_warned_runtime_compile", True)  # the warning has its own test
    monkeypatch.setenv("ROCMFORGE_CACHE_DIR", str(tmp_path / "cache"))


def test_the_ops_compiled_at_run_time_are_named_per_arch(fresh_loader):
    gpu = CompilingGpu("sm_120")
    loader.get_kernel(gpu, "rope", "rope_f32", "pppiiiiff")
    loader.get_kernel(gpu, "add", "add_f32", "pppi")
    loader.get_kernel(gpu, "argmax", "argmax_f32", "ppi")  # its prebuilt object is current: not compiled
    assert gpu.compiled == ["rope.hip", "add.hip"]
    assert loader.runtime_compiled_ops("sm_120") == ["add", "rope"]
    assert loader.runtime_compiled_ops("sm_120:sramecc+") == ["add", "rope"]  # the target's features aside
    assert loader.runtime_compiled_ops("sm_90") == []
    # A later load that the disk cache answers still ran a run-time compiled object.
    again = CompilingGpu("sm_90")
    loader.get_kernel(again, "add", "add_f32", "pppi")
    assert loader.runtime_compiled_ops("sm_90") == ["add"]


def test_the_cpu_backend_compiles_nothing_and_names_nothing(fresh_loader, cpu_device):
    loader.get_kernel(cpu_device, "add", "add_f32", "pppi")
    assert loader.runtime_compiled_ops(cpu_device.arch) == []


def report() -> BenchReport:
    return BenchReport(model="m.gguf", model_path="m.gguf", quant="Q4_K", model_bytes=1, params=1, device="d",
                       backend="cuda", kv_dtype="f16", graphs=True, commit="c", date="today")


def test_bench_notes_kernels_compiled_at_run_time_once(fresh_loader):
    quiet = report()
    note_runtime_compiled(quiet, "sm_120")
    assert quiet.notes == []  # nothing compiled at run time: no note

    loader.get_kernel(CompilingGpu("sm_120"), "rope", "rope_f32", "pppiiiiff")
    noted = report()
    note_runtime_compiled(noted, "sm_120")
    note_runtime_compiled(noted, "sm_120")
    assert len(noted.notes) == 1 and "compiled at run time" in noted.notes[0] and noted.notes[0].endswith(": rope")
    assert "note: kernels compiled at run time" in markdown(noted)
