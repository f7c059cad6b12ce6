"""Compile every kernel (kernels/<op>.hip) to code objects for AMD and NVIDIA targets.

    python -m rocmforge_kernels.build                     # the default targets below
    python -m rocmforge_kernels.build --amd-targets gfx1101 --nvidia-targets none
    rocmforge kernels build ...                           # the same, from the CLI

Output: <out>/<target>/<op>.hsaco (AMD) or .cubin (NVIDIA), and <out>/manifest.json recording for each
code object the sha256 of the sources it was built from (hip_compat.h with its vendor parts, <op>.hip and what it includes), the compiler, the
kernel symbols and each kernel's registers and shared memory. <out> defaults to the package's
prebuilt/ folder, where the loader (hipcore/runtime/kernels.py) looks and which a wheel carries, or to
$ROCMFORGE_PREBUILT_DIR when that is set (the loader then looks there instead).

AMD: Debian's clang-22 (apt-get install clang-22 lld-22) needs no ROCm: hip_compat.h defines the HIP
kernel language on clang builtins. --amd-compiler takes another clang (ROCm's llvm/bin/clang works the
same way) or a hipcc, which is given ROCm's own headers and device libraries instead. Code object
version 5 is asked for explicitly: every ROCm since 5.x loads it, while clang-22's default (6) needs
a recent runtime. NVIDIA: nvcc from the CUDA toolkit, one cubin per sm.

Each (target, op) is its own compiler process, run in parallel. A failure is reported and the rest
goes on; what succeeded is kept and recorded in the manifest as soon as it is written.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

from hipcore.runtime.kernels import (
    code_object_suffix, kernels_dir, op_names, prebuilt_dir, read_manifest, source_digest, write_atomically,
    write_manifest,
)

try:  # as a package module (python -m rocmforge_kernels.build) or as a plain script
    from rocmforge_kernels.code_objects import (
        EM_AMDGPU, EM_CUDA, CodeObjectError, parse_amdgpu_remarks, parse_ptxas_verbose, read_elf,
    )
except ImportError:  # pragma: no cover - running kernels/build.py directly from a checkout
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from code_objects import EM_AMDGPU, EM_CUDA, CodeObjectError, parse_amdgpu_remarks, parse_ptxas_verbose, read_elf

DEFAULT_AMD_TARGETS = ("gfx90a", "gfx942", "gfx1030", "gfx1100", "gfx1201")
DEFAULT_NVIDIA_TARGETS = ("sm_80", "sm_90")
DEFAULT_AMD_COMPILER = "clang-22"
DEFAULT_NVCC = "nvcc"
HEARTBEAT_SECONDS = 10.0  # with nothing finished for this long, a line names the compiles still running

AMD_TARGET = re.compile(r"gfx[0-9a-f]{3,4}|gfx[0-9]+(-[0-9]+)?-generic")
NVIDIA_TARGET = re.compile(r"sm_[0-9]{2,3}[af]?")

INSTALL_HINTS = {
    "amd": "install Debian's clang-22 and lld-22 (apt-get install clang-22 lld-22; apt.llvm.org has them for "
           "other releases), or pass --amd-compiler with your own clang or hipcc",
    "nvidia": "install the CUDA toolkit's nvcc (the cuda-nvcc package of NVIDIA's apt repository, or "
              "pip install nvidia-cuda-nvcc) and a host C++ compiler (g++), or pass --nvcc with its path",
}


class BuildUsageError(ValueError):
    """Bad options: an unknown target, an unknown op."""


@dataclass
class ObjectResult:
    target: str
    op: str
    ok: bool
    path: Path | None = None
    kernels: dict[str, dict[str, int]] = field(default_factory=dict)
    seconds: float = 0.0
    error: str = ""


@dataclass
class BuildReport:
    out_dir: Path
    results: list[ObjectResult] = field(default_factory=list)
    missing_compilers: dict[str, str] = field(default_factory=dict)  # vendor -> message

    @property
    def ok(self) -> bool:
        return not self.missing_compilers and all(r.ok for r in self.results)

    @property
    def failures(self) -> list[ObjectResult]:
        return [r for r in self.results if not r.ok]


def parse_targets(text: str | Sequence[str] | None, vendor: str) -> list[str]:
    """'gfx90a,gfx942' (or a list) -> checked target names; 'none' or '' -> []."""
    if text is None:
        return list(DEFAULT_AMD_TARGETS if vendor == "amd" else DEFAULT_NVIDIA_TARGETS)
    items = text.split(",") if isinstance(text, str) else list(text)
    names = [t.strip() for t in items if t.strip() and t.strip().lower() != "none"]
    pattern, example = (AMD_TARGET, "gfx90a") if vendor == "amd" else (NVIDIA_TARGET, "sm_90")
    bad = [t for t in names if not pattern.fullmatch(t)]
    if bad:
        raise BuildUsageError(f"not {'an AMD' if vendor == 'amd' else 'an NVIDIA'} target: {', '.join(bad)} "
                              f"(expected names like {example}; 'none' builds nothing for this vendor)")
    return list(dict.fromkeys(names))


def amd_command(compiler: str, target: str, source: Path, output: Path) -> list[str]:
    common = [f"--offload-arch={target}", "--cuda-device-only", "--no-gpu-bundle-output", "-O3",
              "-mcode-object-version=5", "-Rpass-analysis=kernel-resource-usage", "-fno-caret-diagnostics",
              "-I", str(source.parent), "-c", str(source), "-o", str(output)]
    if "hipcc" in Path(compiler).name:  # ROCm's headers and device libraries define the language
        return [compiler, "-x", "hip", *common]
    return [compiler, "-x", "hip", "-nogpulib", "-nogpuinc", "-nohipwrapperinc",
            "-Wno-unused-command-line-argument", *common]


def nvidia_command(nvcc: str, target: str, source: Path, output: Path) -> list[str]:
    return [nvcc, "-x", "cu", "-cubin", f"-arch={target}", "-O3", "-Xptxas", "-v",
            "-I", str(source.parent), "-o", str(output), str(source)]


def find_compiler_problem(vendor: str, compiler: str) -> str:
    """'' when the compiler can run; else one line saying what is missing and what to install."""
    path = shutil.which(compiler)
    if path is None:
        return f"{compiler} not found: {INSTALL_HINTS[vendor]}"
    if vendor == "amd" and "hipcc" not in Path(compiler).name:
        # clang links the device code with ld.lld from its own folder (the lld-22 package for clang-22).
        bin_dir = Path(os.path.realpath(path)).parent
        if not (bin_dir / "ld.lld").exists() and not shutil.which("ld.lld"):
            return f"ld.lld not found next to {compiler} ({bin_dir}): {INSTALL_HINTS[vendor]}"
    return ""


def compiler_version(compiler: str) -> str:
    try:
        out = subprocess.run([compiler, "--version"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return compiler
    lines = [line.strip() for line in out.stdout.splitlines() if line.strip()]
    release = next((line for line in lines if "release" in line or "version" in line), lines[0] if lines else "")
    return f"{Path(compiler).name}: {release}" if release else compiler


def _error_excerpt(stderr: str, limit: int = 12) -> str:
    """The compiler's error lines (not its remarks), or its last lines when none is marked."""
    lines = [line for line in stderr.splitlines() if line.strip() and "remark:" not in line
             and not line.startswith("ptxas info")]
    marked = [line for line in lines if "error" in line.lower() or "fatal" in line.lower()]
    return "\n".join((marked or lines)[-limit:]) or "no output"


class _ManifestWriter:
    """Records each finished code object in the manifest at once, so an interrupted or partly failed
    build keeps everything that succeeded."""

    def __init__(self, out_dir: Path):
        self.out_dir = out_dir
        self.manifest = read_manifest(out_dir)
        self.lock = threading.Lock()

    def record(self, target: str, op: str, entry: dict) -> None:
        with self.lock:
            self.manifest["objects"].setdefault(target, {})[op] = entry
            self.manifest.setdefault("sources", {})[op] = entry["source_sha256"]  # the latest build's, per op
            write_manifest(self.manifest, self.out_dir)


def _compile_one(vendor: str, compiler: str, version: str, target: str, op: str, sources: Path, out_dir: Path,
                 writer: _ManifestWriter) -> ObjectResult:
    started = time.perf_counter()
    source = sources / f"{op}.hip"
    relative = Path(target) / f"{op}.{code_object_suffix(target)}"
    final = out_dir / relative
    final.parent.mkdir(parents=True, exist_ok=True)
    scratch = final.with_name(f".{final.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    digest = source_digest(op, sources)  # before compiling: an edit during the build makes the entry stale, not wrong
    command = (amd_command if vendor == "amd" else nvidia_command)(compiler, target, source, scratch)
    result = ObjectResult(target=target, op=op, ok=False)
    try:
        proc = subprocess.run(command, capture_output=True, text=True, timeout=600)
        if proc.returncode != 0 or not scratch.is_file():
            result.error = _error_excerpt(proc.stderr + proc.stdout)
            return result
        image = scratch.read_bytes()
        summary = read_elf(image)
        expected = EM_AMDGPU if vendor == "amd" else EM_CUDA
        if summary.machine != expected:
            result.error = f"the compiler wrote an ELF for machine {summary.machine}, expected {expected}"
            return result
        usage = (parse_amdgpu_remarks if vendor == "amd" else parse_ptxas_verbose)(proc.stderr + proc.stdout)
        kernels = {name: usage.get(name, {}) for name in summary.functions}
        write_atomically(final, image)
        writer.record(target, op, {
            "file": relative.as_posix(), "source_sha256": digest, "compiler": version,
            "flags": [a for a in command[1:] if a not in (str(source), str(scratch), str(source.parent), "-I", "-o", "-c")],
            "elf_machine": summary.machine, "elf_flags": f"{summary.flags:#x}", "kernels": kernels,
        })
        result.ok, result.path, result.kernels = True, final, kernels
        return result
    except subprocess.TimeoutExpired:
        result.error = "the compiler ran for more than 10 minutes"
        return result
    except (OSError, CodeObjectError) as exc:
        result.error = str(exc)
        return result
    finally:
        result.seconds = time.perf_counter() - started
        scratch.unlink(missing_ok=True)


def _check_writable(out_dir: Path) -> None:
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=out_dir):
            pass
    except OSError as exc:
        raise BuildUsageError(f"cannot write the code objects to {out_dir} ({exc.strerror or exc}); set "
                              "ROCMFORGE_PREBUILT_DIR to a folder of yours (rocmforge then loads them from there too) "
                              "or pass --out") from None


def build(out_dir: Path | None = None, amd_targets: Sequence[str] | str | None = None,
          nvidia_targets: Sequence[str] | str | None = None, amd_compiler: str = DEFAULT_AMD_COMPILER,
          nvcc: str = DEFAULT_NVCC, ops: Sequence[str] | None = None, jobs: int | None = None,
          sources: Path | None = None, progress: Callable[[str], None] | None = None) -> BuildReport:
    """Build the code objects; see the module docstring. Raises BuildUsageError for bad options."""
    say = progress or (lambda line: print(line, file=sys.stderr, flush=True))
    sources = sources or kernels_dir()
    out_dir = Path(out_dir) if out_dir else prebuilt_dir()
    known = op_names(sources)
    chosen = list(dict.fromkeys(ops)) if ops else known
    unknown = [op for op in chosen if op not in known]
    if unknown:
        raise BuildUsageError(f"unknown op {', '.join(unknown)}; the sources in {sources} are: {', '.join(known)}")
    vendors = {"amd": (parse_targets(amd_targets, "amd"), amd_compiler),
               "nvidia": (parse_targets(nvidia_targets, "nvidia"), nvcc)}

    _check_writable(out_dir)
    report = BuildReport(out_dir=out_dir)
    tasks: list[tuple[str, str, str, str, str]] = []
    for vendor, (targets, compiler) in vendors.items():
        if not targets:
            continue
        problem = find_compiler_problem(vendor, compiler)
        if problem:
            report.missing_compilers[vendor] = problem
            say(f"skipping {', '.join(targets)}: {problem}")
            continue
        version = compiler_version(compiler)
        tasks += [(vendor, compiler, version, target, op) for target in targets for op in chosen]
    if not tasks:
        return report

    # Longest compiles first, so the last ones to finish are short.
    tasks.sort(key=lambda t: -(sources / f"{t[4]}.hip").stat().st_size)
    writer = _ManifestWriter(out_dir)
    workers = max(1, jobs or os.cpu_count() or 1)
    say(f"building {len(tasks)} code objects ({len(chosen)} ops) into {out_dir} with {workers} parallel jobs")
    running: dict[tuple[str, str], float] = {}  # (target, op) -> when its compile started

    def compile_timed(vendor, compiler, version, target, op):
        running[(target, op)] = time.monotonic()
        try:
            return _compile_one(vendor, compiler, version, target, op, sources, out_dir, writer)
        finally:
            running.pop((target, op), None)

    with ThreadPoolExecutor(max_workers=workers) as pool:
        pending = {pool.submit(compile_timed, *task) for task in tasks}
        done = 0
        try:
            while pending:
                finished, pending = wait(pending, timeout=HEARTBEAT_SECONDS, return_when=FIRST_COMPLETED)
                if not finished:  # a long compile is never silent: name what is still compiling and for how long
                    now = time.monotonic()
                    still = sorted(running.items(), key=lambda item: item[1])
                    say(f"still compiling ({done}/{len(tasks)} done): " + ", ".join(
                        f"{target} {op} {now - t0:.0f}s" for (target, op), t0 in still[:4])
                        + (f" and {len(still) - 4} more" if len(still) > 4 else ""))
                for future in finished:
                    done += 1
                    r = future.result()
                    report.results.append(r)
                    if r.ok:
                        regs = ", ".join(f"{k} {v.get('registers', '?')} regs" for k, v in sorted(r.kernels.items()))
                        say(f"[{done}/{len(tasks)}] {r.target} {r.op}: {r.path.relative_to(out_dir)} ({regs}) "
                            f"{r.seconds:.1f}s")
                    else:
                        say(f"[{done}/{len(tasks)}] {r.target} {r.op}: FAILED after {r.seconds:.1f}s\n"
                            + "\n".join("    " + line for line in r.error.splitlines()))
        except KeyboardInterrupt:
            for future in pending:
                future.cancel()
            raise
    return report


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m rocmforge_kernels.build",
        description="Compile rocmforge's HIP kernels to code objects for AMD (clang or hipcc) and NVIDIA (nvcc) GPUs.")
    parser.add_argument("--amd-targets", default=None, metavar="LIST",
                        help=f"comma-separated gfx targets, or 'none' (default: {','.join(DEFAULT_AMD_TARGETS)})")
    parser.add_argument("--nvidia-targets", default=None, metavar="LIST",
                        help=f"comma-separated sm targets, or 'none' (default: {','.join(DEFAULT_NVIDIA_TARGETS)})")
    parser.add_argument("--amd-compiler", default=DEFAULT_AMD_COMPILER, metavar="PATH",
                        help="clang (no ROCm needed) or hipcc to build the AMD code objects with (default: clang-22)")
    parser.add_argument("--nvcc", default=DEFAULT_NVCC, metavar="PATH", help="nvcc to build the NVIDIA ones with")
    parser.add_argument("--ops", default=None, metavar="LIST", help="comma-separated ops to build (default: all)")
    parser.add_argument("--out", default=None, metavar="DIR", help="output folder (default: the package's prebuilt/)")
    parser.add_argument("--jobs", type=int, default=None, metavar="N", help="parallel compiler processes (default: CPUs)")
    args = parser.parse_args(argv)
    try:
        report = build(out_dir=Path(args.out) if args.out else None, amd_targets=args.amd_targets,
                       nvidia_targets=args.nvidia_targets, amd_compiler=args.amd_compiler, nvcc=args.nvcc,
                       ops=[o.strip() for o in args.ops.split(",") if o.strip()] if args.ops else None, jobs=args.jobs)
    except BuildUsageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted; the code objects finished so far are kept", file=sys.stderr)
        return 130
    return summarize(report)


def summarize(report: BuildReport, say: Callable[[str], None] | None = None) -> int:
    """Print the closing line; the exit status: 0 all built, 1 something failed or a compiler is missing."""
    say = say or (lambda line: print(line, file=sys.stderr, flush=True))
    built = sum(r.ok for r in report.results)
    failed = report.failures
    if not report.results:  # no manifest was written: do not point at one
        if report.missing_compilers:
            why = "; ".join(f"{vendor}: {problem}" for vendor, problem in report.missing_compilers.items())
            say(f"nothing was built: no compiler for the chosen targets ({why})")
            return 1
        say("nothing was built: no targets were chosen (both --amd-targets and --nvidia-targets are 'none')")
        return 2
    say(f"{built} code objects built, {len(failed)} failed"
        + (f", {len(report.missing_compilers)} vendor(s) skipped for a missing compiler" if report.missing_compilers else "")
        + f"; manifest: {report.out_dir / 'manifest.json'}")
    for r in failed:
        say(f"  failed: {r.target} {r.op}")
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
