"""`rocmforge kernels build` and `rocmforge kernels list`: precompile the HIP kernels, show what is built."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer
from rich import box
from rich.table import Table

from hipcore.errors import UsageError
from hipcore.runtime.kernels import MANIFEST_NAME, op_names, prebuilt_dir, read_manifest, source_digest
from profiles.breakable_text import TableNote
from rocmforge_cli.common import handle_errors, stderr, stdout
from rocmforge_cli.llama_flags import FlagCheckedCommand, FlagCheckedGroup

app = typer.Typer(
    name="kernels",
    help=(
        "Precompile the GPU kernels and show which are built.\n\n"
        "Without precompiled code objects for your GPU, rocmforge compiles each kernel at run time the "
        "first time it is used (hiprtc / nvrtc) and keeps it in ~/.cache/rocmforge.\n\n"
        "Examples:\n\n"
        "  rocmforge kernels list\n\n"
        "  rocmforge kernels build --amd-targets gfx1100 --nvidia-targets none"
    ),
    cls=FlagCheckedGroup,
    no_args_is_help=True,
)


@app.command("build", cls=FlagCheckedCommand)
@handle_errors
def build_command(
    amd_targets: Optional[str] = typer.Option(
        None, "--amd-targets", metavar="LIST",
        help="AMD GPUs to build for, comma-separated gfx names (gfx90a = MI200, gfx942 = MI300, gfx1030 = RX 6000, "
             "gfx1100 = RX 7900, gfx1201 = RX 9070), or 'none'. Default: all five.",
    ),
    nvidia_targets: Optional[str] = typer.Option(
        None, "--nvidia-targets", metavar="LIST",
        help="NVIDIA GPUs to build for, comma-separated sm names (sm_80 = A100 and later Ampere/Ada cards, "
             "sm_90 = H100/H200), or 'none'. Default: sm_80,sm_90.",
    ),
    amd_compiler: str = typer.Option(
        "clang-22", "--amd-compiler", metavar="PATH",
        help="Compiler for the AMD code objects: a clang (Debian's clang-22 needs no ROCm) or ROCm's hipcc.",
    ),
    nvcc: str = typer.Option("nvcc", "--nvcc", metavar="PATH", help="nvcc from the CUDA toolkit, for the NVIDIA ones."),
    ops: Optional[str] = typer.Option(None, "--ops", metavar="LIST", help="Only these ops, comma-separated (default: all)."),
    out: Optional[Path] = typer.Option(
        None, "--out", metavar="DIR", help="Where to write them (default: where rocmforge loads them from: "
                                          "$ROCMFORGE_PREBUILT_DIR if set, else the installed package's prebuilt/).",
    ),
    jobs: Optional[int] = typer.Option(None, "--jobs", "-j", min=1, metavar="N",
                                       help="Compiler processes to run at once (default: one per CPU)."),
) -> None:
    """Compile every kernel for the chosen GPUs; progress on stderr, failures listed at the end.

    What compiled is kept even when something else fails.

    Exit status 1 when anything failed or a compiler is missing (the message names what to install).

    Examples:
      rocmforge kernels build --amd-targets gfx1100 --nvidia-targets none
      rocmforge kernels build --amd-targets none --nvidia-targets sm_90 --ops rmsnorm,matvec -j 2
      rocmforge kernels build --out /tmp/prebuilt       (then ROCMFORGE_PREBUILT_DIR=/tmp/prebuilt)
    """
    from rocmforge_kernels import build as kbuild

    def say(line: str) -> None:
        stderr.print(line, markup=False, highlight=False)

    try:
        report = kbuild.build(
            out_dir=out, amd_targets=amd_targets, nvidia_targets=nvidia_targets, amd_compiler=amd_compiler, nvcc=nvcc,
            ops=[o.strip() for o in ops.split(",") if o.strip()] if ops else None, jobs=jobs, progress=say,
        )
    except kbuild.BuildUsageError as exc:
        raise UsageError(str(exc)) from None
    status = kbuild.summarize(report, say=say)
    if status:
        raise typer.Exit(status)


@app.command("list", cls=FlagCheckedCommand)
@handle_errors
def list_command(
    directory: Optional[Path] = typer.Option(
        None, "--dir", metavar="DIR", help="The prebuilt folder to show (default: the one rocmforge loads from).",
    ),
    as_json: bool = typer.Option(False, "--json", help="Print the manifest as JSON instead of a table."),
) -> None:
    """Show the precompiled code objects and the registers their kernels use.

    One row per op, one column per GPU target.

    A cell is the most registers per thread any of the op's kernels uses there.

    'stale' marks a code object built from older sources (rocmforge compiles those at run time).

    Examples:
      rocmforge kernels list
      rocmforge kernels list --json | jq '.objects | keys'
      rocmforge kernels list --dir /tmp/prebuilt
    """
    folder = directory or prebuilt_dir()
    if directory is not None and not (directory / MANIFEST_NAME).is_file():
        raise UsageError(f"no {MANIFEST_NAME} in {directory}; build one with `rocmforge kernels build --out {directory}`")
    manifest = read_manifest(folder)
    if as_json:
        stdout.print_json(json.dumps(manifest))
        return
    objects = manifest["objects"]
    if not objects:
        stderr.print(f"no precompiled kernels in {folder}; run `rocmforge kernels build`", markup=False)
        return
    targets = sorted(objects, key=lambda t: (not t.startswith("gfx"), t))
    # Rules under the header only and a target's name never shortened: 'gfx1…' could be any of three.
    table = Table(title=TableNote(f"precompiled kernels in {folder} (registers per thread, most of the op's kernels)"),
                  title_justify="left", box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, padding=(0, 0, 0, 1))
    table.add_column("op", no_wrap=True)
    for target in targets:
        table.add_column(target, justify="right", min_width=len(target))
    ops = sorted(set(op_names()) | {op for per_target in objects.values() for op in per_target})
    digests = {op: source_digest(op) for op in op_names()}
    for op in ops:
        row = [op]
        for target in targets:
            entry = objects[target].get(op)
            if entry is None:
                row.append("-")
                continue
            registers = [k.get("registers", 0) for k in entry.get("kernels", {}).values()]
            cell = str(max(registers)) if registers else "?"
            row.append(cell if entry.get("source_sha256") == digests.get(op) else f"{cell} stale")
        table.add_row(*row)
    stdout.print(table, soft_wrap=False)
