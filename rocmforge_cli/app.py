"""Assembles the rocmforge commands; nothing else lives here."""

from __future__ import annotations

import typer

from rocmforge_cli.common import set_debug

app = typer.Typer(
    name="rocmforge",
    help=(
        "Run GGUF language models on your GPU (AMD through HIP, NVIDIA through CUDA, or the CPU) "
        "and see where the GPU memory goes.\n\n"
        "Start with `rocmforge generate \"Hello\"` (uses the demo model if installed) or "
        "`rocmforge devices` to see what hardware was found."
    ),
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


@app.callback()
def _global_options(
    debug: bool = typer.Option(False, "--debug", help="Show full tracebacks on errors."),
) -> None:
    set_debug(debug)


# Commands register here, one line each.
from rocmforge_cli import generate as _generate  # noqa: E402
app.command("generate")(_generate.generate)
from rocmforge_cli import devices as _devices  # noqa: E402
app.command("devices")(_devices.devices_command)
from rocmforge_cli import kernels_cmd as _kernels  # noqa: E402
app.add_typer(_kernels.app, name="kernels")
from rocmforge_cli import profile_kv as _profile_kv  # noqa: E402
app.command("profile-kv")(_profile_kv.profile_kv_command)
from rocmforge_cli import inspect as _inspect  # noqa: E402
app.command("inspect")(_inspect.inspect_command)
from rocmforge_cli import bench as _bench  # noqa: E402
app.command("bench")(_bench.bench_command)
from rocmforge_cli import leak_check as _leak_check  # noqa: E402
app.command("leak-check")(_leak_check.leak_check_command)
from rocmforge_cli import serve as _serve  # noqa: E402
app.command("serve")(_serve.serve_command)
from rocmforge_cli import serve_leak_check as _serve_leak_check  # noqa: E402
app.command("serve-leak-check")(_serve_leak_check.serve_leak_check_command)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
