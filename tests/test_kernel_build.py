"""The kernel build (kernels/build.py) and the loader's use of its manifest (hipcore/runtime/kernels.py).

One build of every op of this suite for every default AMD target (clang-22, no ROCm) and NVIDIA target
(nvcc) per test run, into a temporary folder (tests/conftest.py's `built`, tests/support/kernel_builds.py).
The checks read the code objects with their own ELF parsing, independent of the build script's; what the
objects use (registers, spills, shared memory, matrix instructions): tests/test_kernel_resources.py.
"""

from __future__ import annotations

import json
import logging
import shutil
import struct
from pathlib import Path

import pytest
from typer.testing import CliRunner

from support.compiler_gate import require_compiler
from support.kernel_builds import EXPECTED_KERNELS, all_targets, expected_entries
from hipcore.runtime import kernels as loader
from rocmforge_kernels import build as kbuild

# EF_AMDGPU_MACH_* from LLVM's include/llvm/BinaryFormat/ELF.h (the low byte of e_flags).
AMDGPU_MACH = {"gfx90a": 0x3F, "gfx942": 0x4C, "gfx1030": 0x36, "gfx1100": 0x41, "gfx1201": 0x4E}
EM_AMDGPU, EM_CUDA = 224, 190


def elf_header(data: bytes) -> tuple[int, int, int]:
    """(e_machine, e_flags, EI_ABIVERSION) of an ELF64 little-endian file."""
    assert data[:4] == b"\x7fELF" and data[4] == 2 and data[5] == 1, "not an ELF64 little-endian file"
    return struct.unpack_from("<H", data, 18)[0], struct.unpack_from("<I", data, 48)[0], data[8]


def global_functions(data: bytes) -> set[str]:
    """Names of the STB_GLOBAL STT_FUNC symbols of .symtab."""
    shoff = struct.unpack_from("<Q", data, 40)[0]
    shnum = struct.unpack_from("<H", data, 60)[0]
    headers = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + 64 * i) for i in range(shnum)]
    names: set[str] = set()
    for _, kind, _, _, offset, size, link, _, _, _ in headers:
        if kind != 2:  # SHT_SYMTAB
            continue
        strtab = data[headers[link][4]:headers[link][4] + headers[link][5]]
        for at in range(offset, offset + size, 24):
            name, info = struct.unpack_from("<IB", data, at)
            if info == (1 << 4) | 2:
                names.add(strtab[name:strtab.index(b"\0", name)].decode())
    return names


def require_both_vendors() -> None:
    require_compiler("amd")
    require_compiler("nvidia")


def test_every_default_target_builds(built):
    require_both_vendors()
    out, report, lines = built
    assert not report.missing_compilers, report.missing_compilers
    assert [f"{r.target} {r.op}: {r.error}" for r in report.failures] == []
    assert len(report.results) == len(all_targets()) * len(EXPECTED_KERNELS)
    assert sum(line.startswith("[") for line in lines) == len(report.results)  # one progress line per object
    for target in all_targets():
        for op in EXPECTED_KERNELS:
            suffix = "hsaco" if target.startswith("gfx") else "cubin"
            assert (out / target / f"{op}.{suffix}").stat().st_size > 0


@pytest.mark.parametrize("target", list(kbuild.DEFAULT_AMD_TARGETS))
def test_amd_objects_are_amdgpu_elfs_for_their_target(built, target):
    require_compiler("amd")
    out, _, _ = built
    for op, entries in EXPECTED_KERNELS.items():
        data = (out / target / f"{op}.hsaco").read_bytes()
        machine, flags, abi = elf_header(data)
        assert machine == EM_AMDGPU
        assert flags & 0xFF == AMDGPU_MACH[target], f"{op}: e_flags {flags:#x} is not {target}"
        assert abi == 3, "code object version 5 (ELFABIVERSION_AMDGPU_HSA_V5) was asked for"
        assert set(entries) <= global_functions(data), f"{target}/{op} lacks a kernel"


@pytest.mark.parametrize("target", list(kbuild.DEFAULT_NVIDIA_TARGETS))
def test_nvidia_objects_are_cubins_for_their_sm(built, target):
    require_compiler("nvidia")
    out, _, _ = built
    sm = int(target[3:])
    for op in EXPECTED_KERNELS:
        entries = expected_entries(target, op)
        data = (out / target / f"{op}.cubin").read_bytes()
        machine, flags, abi = elf_header(data)
        assert machine == EM_CUDA
        # CUDA 12.8+ (ELF ABI version 8) keeps the sm in bits 8..15, earlier toolkits in the low byte.
        assert ((flags >> 8) & 0xFF if abi >= 8 else flags & 0xFF) == sm, f"{op}: e_flags {flags:#x}"
        assert set(entries) <= global_functions(data), f"{target}/{op} lacks a kernel"


def test_every_kernel_source_is_built_here():
    """A new kernels/<op>.hip missing from EXPECTED_KERNELS would go unbuilt and untested by this file."""
    assert sorted(EXPECTED_KERNELS) == loader.op_names()


def test_manifest_records_hashes_symbols_and_register_use(built):
    require_both_vendors()
    out, _, _ = built
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["sources"] == {op: loader.source_digest(op) for op in EXPECTED_KERNELS}
    for target in all_targets():
        for op in EXPECTED_KERNELS:
            entry = manifest["objects"][target][op]
            assert entry["source_sha256"] == loader.source_digest(op)
            assert (out / entry["file"]).is_file()
            assert sorted(entry["kernels"]) == sorted(expected_entries(target, op))
            for name, usage in entry["kernels"].items():
                assert usage["registers"] > 0, f"{target} {name}: no register use recorded"
                assert usage["shared_bytes"] >= 0
    # The kernels with a __shared__ scratch report it.
    assert manifest["objects"]["gfx90a"]["rmsnorm"]["kernels"]["rmsnorm_f32"]["shared_bytes"] > 0
    assert manifest["objects"]["sm_90"]["argmax"]["kernels"]["argmax_f32"]["shared_bytes"] > 0


def test_loader_finds_current_objects_and_drops_stale_ones(built, monkeypatch, tmp_path):
    require_both_vendors()
    out, _, _ = built
    monkeypatch.setattr(loader, "prebuilt_dir", lambda: out)
    for target in all_targets():
        assert set(EXPECTED_KERNELS) <= set(loader.available_code_objects(target))
    # An sm_86 card runs the sm_80 cubins (same major architecture); an sm_100 card runs neither.
    assert set(EXPECTED_KERNELS) <= set(loader.available_code_objects("sm_86"))
    assert loader.available_code_objects("sm_100") == []
    assert loader.available_code_objects("gfx1101") == []

    stale = tmp_path / "stale"
    shutil.copytree(out, stale)
    manifest = json.loads((stale / "manifest.json").read_text())
    manifest["objects"]["gfx942"]["rope"]["source_sha256"] = "0" * 64  # built from other sources
    (stale / "manifest.json").write_text(json.dumps(manifest))
    monkeypatch.setattr(loader, "prebuilt_dir", lambda: stale)
    available = loader.available_code_objects("gfx942")
    assert "rope" not in available and "matvec" in available


class RecordingGpu:
    """Just enough of a GPU device for the loader: it records what it is asked to load or compile."""

    backend = "cuda"

    def __init__(self, arch: str):
        self.arch = arch
        self.loaded: list[tuple[str, bytes]] = []
        self.compiled: list[tuple[str, str, list[str]]] = []
        self.loaded_code: dict[str, dict] = {"modules": {}, "kernels": {}}  # as Device keeps them

    def load_module(self, image: bytes, name: str = ""):
        self.loaded.append((name, image))
        device = self

        class Module:
            def kernel(self, entry: str, signature: str, programmatic: bool = False):
                return (device, name, entry, signature)

        return Module()

    def jit_compile(self, source: str, name: str, include_dirs, options) -> bytes:
        self.compiled.append((name, source, list(include_dirs)))
        return b"compiled " + name.encode()


def test_loader_takes_the_prebuilt_object(built, monkeypatch):
    require_compiler("nvidia")
    out, _, _ = built
    monkeypatch.setattr(loader, "prebuilt_dir", lambda: out)
    gpu = RecordingGpu("sm_90")
    kernel = loader.get_kernel(gpu, "matvec", "matvec_q4_1", "pppiii")
    assert kernel == (gpu, "matvec", "matvec_q4_1", "pppiii")
    assert gpu.loaded == [("matvec", (out / "sm_90" / "matvec.cubin").read_bytes())]
    assert gpu.compiled == []
    assert loader.get_kernel(gpu, "matvec", "matvec_q4_1", "pppiii") is kernel  # cached per device and op
    loader.get_kernel(gpu, "matvec", "matvec_q8_0", "pppiii")
    assert len(gpu.loaded) == 1  # one module per op


def test_loader_compiles_at_run_time_into_the_cache_and_says_so_once(built, monkeypatch, tmp_path, caplog):
    out, _, _ = built
    monkeypatch.setattr(loader, "prebuilt_dir", lambda: out)
    monkeypatch.setattr(loader, "_warned_runtime_compile", False)
    monkeypatch.setenv("ROCMFORGE_CACHE_DIR", str(tmp_path / "cache"))
    caplog.set_level(logging.WARNING, logger="rocmforge")

    gpu = RecordingGpu("sm_120")  # no sm_12x code object was built
    loader.get_kernel(gpu, "add", "add_f32", "pppi")
    loader.get_kernel(gpu, "rope", "rope_f32", "pppiiiiff")
    assert [name for name, _, _ in gpu.compiled] == ["add.hip", "rope.hip"]
    name, source, include_dirs = gpu.compiled[0]
    assert source == (loader.kernels_dir() / "add.hip").read_text()
    assert (Path(include_dirs[0]) / "hip_compat.h").is_file()
    cached = tmp_path / "cache" / "kernels" / "sm_120" / f"add-{loader.source_digest('add')[:16]}.bin"
    assert cached.read_bytes() == b"compiled add.hip"
    warnings = [r for r in caplog.records if r.name == "rocmforge"]
    assert len(warnings) == 1 and "sm_120" in warnings[0].getMessage()

    again = RecordingGpu("sm_120")  # a later run: the disk cache answers, nothing is compiled
    loader.get_kernel(again, "add", "add_f32", "pppi")
    assert again.compiled == [] and again.loaded == [("add", b"compiled add.hip")]


def test_prebuilt_dir_follows_the_environment(built, monkeypatch, tmp_path):
    require_compiler("amd")
    out, _, _ = built
    monkeypatch.setenv("ROCMFORGE_PREBUILT_DIR", str(out))
    assert loader.prebuilt_dir() == out
    assert set(EXPECTED_KERNELS) <= set(loader.available_code_objects("gfx1201"))
    monkeypatch.delenv("ROCMFORGE_PREBUILT_DIR")
    assert loader.prebuilt_dir() == loader.kernels_dir() / "prebuilt"


def test_an_unwritable_output_folder_is_a_usage_error(tmp_path):
    blocker = tmp_path / "a file"
    blocker.write_text("not a folder")
    with pytest.raises(kbuild.BuildUsageError, match="ROCMFORGE_PREBUILT_DIR"):
        kbuild.build(out_dir=blocker / "prebuilt", ops=["add"], progress=lambda line: None)


def test_cache_dir_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.delenv("ROCMFORGE_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert loader.cache_dir() == tmp_path / "xdg" / "rocmforge" / "kernels"
    monkeypatch.setenv("ROCMFORGE_CACHE_DIR", str(tmp_path / "own"))
    assert loader.cache_dir() == tmp_path / "own" / "kernels"


def test_a_failed_op_does_not_undo_the_others(tmp_path):
    require_compiler("amd")
    sources = tmp_path / "src"
    sources.mkdir()
    for path in loader.source_files("add"):  # hip_compat.h with its vendor parts, add.hip
        shutil.copy(path, sources / path.name)
    (sources / "broken.hip").write_text('#include "hip_compat.h"\nextern "C" __global__ void broken_f32(float* p) { p[0] = undefined_name; }\n')
    out = tmp_path / "out"
    lines: list[str] = []
    report = kbuild.build(out_dir=out, amd_targets="gfx1100", nvidia_targets="none", sources=sources,
                          progress=lines.append)
    assert [(r.op, r.ok) for r in sorted(report.results, key=lambda r: r.op)] == [("add", True), ("broken", False)]
    assert "undefined_name" in report.failures[0].error
    assert any("broken: FAILED" in line for line in lines)
    manifest = json.loads((out / "manifest.json").read_text())
    assert list(manifest["objects"]["gfx1100"]) == ["add"]
    assert kbuild.summarize(report, say=lines.append) == 1


def test_a_missing_compiler_is_named_with_its_package(tmp_path):
    report = kbuild.build(out_dir=tmp_path, amd_compiler="clang-that-does-not-exist", nvidia_targets="none",
                          ops=["add"], progress=lambda line: None)
    assert "apt-get install clang-22 lld-22" in report.missing_compilers["amd"]
    assert not report.ok and report.results == []
    report = kbuild.build(out_dir=tmp_path, nvcc="/nonexistent/nvcc", amd_targets="none", ops=["add"],
                          progress=lambda line: None)
    assert "nvcc" in report.missing_compilers["nvidia"] and "CUDA toolkit" in report.missing_compilers["nvidia"]


def test_bad_targets_and_ops_are_usage_errors():
    with pytest.raises(kbuild.BuildUsageError, match="sm_80"):
        kbuild.parse_targets("gfx90a,sm_80", "amd")
    with pytest.raises(kbuild.BuildUsageError, match="gfx90a"):
        kbuild.parse_targets("gfx90a", "nvidia")
    assert kbuild.parse_targets("none", "amd") == []
    assert kbuild.parse_targets("gfx1101, gfx11-generic", "amd") == ["gfx1101", "gfx11-generic"]
    with pytest.raises(kbuild.BuildUsageError, match="unknown op"):
        kbuild.build(ops=["no_such_op"], progress=lambda line: None)
    assert kbuild.main(["--amd-targets", "sm_90"]) == 2


def test_cli_kernels_list_shows_ops_targets_and_registers(built):
    require_both_vendors()
    from rocmforge_cli.app import app

    out, _, _ = built
    # A column per target: with ops named like paged_attention the table needs about 100 characters.
    result = CliRunner().invoke(app, ["kernels", "list", "--dir", str(out)], env={"COLUMNS": "120"})
    assert result.exit_code == 0, result.output
    for target in all_targets():
        assert target in result.stdout
    assert "matvec" in result.stdout and "rmsnorm" in result.stdout
    registers = json.loads((out / "manifest.json").read_text())["objects"]["sm_90"]["matvec"]["kernels"]
    assert str(max(k["registers"] for k in registers.values())) in result.stdout

    result = CliRunner().invoke(app, ["kernels", "list", "--dir", str(out), "--json"])
    assert result.exit_code == 0
    assert json.loads(result.stdout)["objects"]["gfx1201"]["argmax"]["kernels"]["argmax_f32"]["registers"] > 0


def test_cli_kernels_build_reports_a_missing_compiler(tmp_path):
    from rocmforge_cli.app import app

    result = CliRunner().invoke(app, ["kernels", "build", "--amd-compiler", "no-such-clang", "--nvidia-targets", "none",
                                      "--ops", "add", "--out", str(tmp_path)])
    assert result.exit_code == 1
    assert "no-such-clang not found" in result.output
    result = CliRunner().invoke(app, ["kernels", "build", "--amd-targets", "sm_80", "--out", str(tmp_path)])
    assert result.exit_code == 2 and "not an AMD target" in result.output


def test_cli_kernels_build_of_nothing_says_so_and_points_at_no_manifest(tmp_path):
    from rocmforge_cli.app import app

    result = CliRunner().invoke(app, ["kernels", "build", "--amd-targets", "none", "--nvidia-targets", "none",
                                      "--out", str(tmp_path)])
    assert result.exit_code == 2
    assert "nothing was built: no targets were chosen" in result.output and "manifest" not in result.output
    result = CliRunner().invoke(app, ["kernels", "build", "--amd-compiler", "no-such-clang", "--nvidia-targets", "none",
                                      "--ops", "add", "--out", str(tmp_path)])
    assert result.exit_code == 1
    assert "nothing was built: no compiler" in result.output and "manifest.json" not in result.output

