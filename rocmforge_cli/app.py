"""Assembles the rocmforge commands; nothing else lives here."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from rocmforge_cli.common import set_debug
from rocmforge_cli.llama_flags import FlagCheckedCommand, FlagCheckedGroup
from rocmforge_cli.options import short_flag_table

app = typer.Typer(
    name="rocmforge",
    help=(
        "Run GGUF language models on your GPU (AMD through HIP, NVIDIA through CUDA, or the CPU) "
        "and see where the GPU memory goes.\n\n"
        "Start with `rocmforge generate \"Hello\"` (uses the demo model if installed) or "
        "`rocmforge devices` to see what hardware was found."
    ),
    epilog=(
        "Examples:\n\n"
        "  rocmforge generate -m model.gguf -p \"The capital of France is\" -n 32\n\n"
        "  rocmforge generate -cnv          (a chat in the terminal)\n\n"
        "  rocmforge bench -p 512 -n 128\n\n"
        "  rocmforge serve -m model.gguf -np 16 --port 8080\n\n"
        "Short flags mean the same in every command (llama.cpp's meanings; bench takes llama-bench's -p and -n):\n\n"
        + "\n\n".join(short_flag_table())
        + "\n\nllama.cpp flags with no meaning here (-ngl, -fa, --mlock, --no-mmap, ...) are refused with one line "
          "saying what to do instead, exit 2."
    ),
    cls=FlagCheckedGroup,
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _print_version(value: bool) -> None:
    if not value:
        return
    from importlib.metadata import PackageNotFoundError, version

    from profiles.bench import source_commit

    try:
        number = version("rocmforge")
    except PackageNotFoundError:  # run from a source tree that was never installed
        number = "unknown"
    commit = source_commit()
    typer.echo(f"rocmforge {number}" + (f" (commit {commit})" if commit != "unknown" else ""))
    raise typer.Exit(0)


@app.callback()
def _global_options(
    debug: Annotated[bool, typer.Option("--debug", help="Show full tracebacks on errors.")] = False,
    version: Annotated[Optional[bool], typer.Option(
        "--version", "-V", callback=_print_version, is_eager=True,
        help="Print the version (and the git commit of a checkout) and exit.")] = None,
) -> None:
    set_debug(debug)


# Commands register here, one line each; every one checks its flags first (llama_flags.py).
from rocmforge_cli import generate as _generate  # noqa: E402
app.command("generate", cls=FlagCheckedCommand)(_generate.generate)
from rocmforge_cli import devices as _devices  # noqa: E402
app.command("devices", cls=FlagCheckedCommand)(_devices.devices_command)
from rocmforge_cli import kernels_cmd as _kernels  # noqa: E402
app.add_typer(_kernels.app, name="kernels")
from rocmforge_cli import profile_kv as _profile_kv  # noqa: E402
app.command("profile-kv", cls=FlagCheckedCommand)(_profile_kv.profile_kv_command)
from rocmforge_cli import inspect as _inspect  # noqa: E402
app.command("inspect", cls=FlagCheckedCommand)(_inspect.inspect_command)
from rocmforge_cli import bench as _bench  # noqa: E402
app.command("bench", cls=FlagCheckedCommand)(_bench.bench_command)
from rocmforge_cli import leak_check as _leak_check  # noqa: E402
app.command("leak-check", cls=FlagCheckedCommand)(_leak_check.leak_check_command)
from rocmforge_cli import serve as _serve  # noqa: E402
app.command("serve", cls=FlagCheckedCommand)(_serve.serve_command)
from rocmforge_cli import serve_leak_check as _serve_leak_check  # noqa: E402
app.command("serve-leak-check", cls=FlagCheckedCommand)(_serve_leak_check.serve_leak_check_command)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
