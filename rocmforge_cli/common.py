"""What every command shares: the error-to-exit-code boundary, the consoles, the --debug switch."""

from __future__ import annotations

import functools
import os
import sys
import traceback
from typing import Any, Callable, TypeVar

import typer
from rich.console import Console

from hipcore.errors import EXIT_FAILURE, RocmforgeError, printable
from hipcore.runtime.errors import DeviceOutOfMemory, KernelCompileError

# Results go to stdout; progress, stats and errors go to stderr (so `generate ... > out.txt` and
# `--json | jq` stay clean).
stdout = Console(highlight=False, soft_wrap=True)
stderr = Console(stderr=True, highlight=False, soft_wrap=True)

_state = {"debug": False}


def terminal_width(console: Console) -> int | None:
    """The columns a reader of `console` sees: its terminal's, or COLUMNS; None for a file or a pipe, which nothing
    wraps (a log keeps llama.cpp's lines and bench's markdown whole)."""
    return console.width if console.is_terminal or os.environ.get("COLUMNS", "").isdigit() else None

# The reader of stdout went away (`rocmforge generate ... | head -c 20`): end quietly with the status a
# shell reports for a Unix tool ended by SIGPIPE (128 + 13), so `set -o pipefail` scripts can still tell.
EXIT_BROKEN_PIPE = 141

F = TypeVar("F", bound=Callable[..., Any])


def set_debug(on: bool) -> None:
    _state["debug"] = on


def debug_enabled() -> bool:
    return _state["debug"]


def fail(message: str, code: int) -> "typer.Exit":
    """Print one 'error: ...' line on stderr and return the Exit to raise."""
    stderr.print(f"[bold red]error:[/] {message}", markup=True, highlight=False)
    return typer.Exit(code)


def handle_errors(fn: F) -> F:
    """Turn RocmforgeError into one line and its exit code; anything else into exit 1 with a hint.

    With --debug the traceback is printed as well.
    """

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except (typer.Exit, typer.Abort, SystemExit):
            raise
        except BrokenPipeError:
            _silence_stdout()
            raise typer.Exit(EXIT_BROKEN_PIPE) from None
        except RocmforgeError as exc:
            if debug_enabled():
                traceback.print_exc(file=sys.stderr)
            raise fail(_escape(_terminal_safe(exc)), exc.exit_code) from None
        except KeyboardInterrupt:
            stderr.print("interrupted")
            raise typer.Exit(130) from None
        except Exception as exc:  # a bug of ours: say so, keep the traceback behind --debug
            if debug_enabled():
                traceback.print_exc(file=sys.stderr)
                raise typer.Exit(EXIT_FAILURE) from None
            raise fail(
                _escape(printable(f"internal error: {type(exc).__name__}: {exc} (run with --debug for the traceback)")),
                EXIT_FAILURE,
            ) from None

    return wrapper  # type: ignore[return-value]


def _silence_stdout() -> None:
    """Point stdout at /dev/null, so the interpreter's last flush of what is still buffered for the gone
    reader cannot print "Exception ignored ... BrokenPipeError" on the way out."""
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):  # not a real file (a test runner's capture)
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, fd)
    finally:
        os.close(devnull)


def _terminal_safe(exc: RocmforgeError) -> str:
    """The message with every control character escaped: errors quote model files, whose text must
    never move the cursor or add a line. A compiler log (our own kernels) and an out-of-memory error's table of
    the plan keep their line breaks (each line still escaped)."""
    if isinstance(exc, (KernelCompileError, DeviceOutOfMemory)):  # a compiler log; the memory plan's table
        return "\n".join(printable(line) for line in str(exc).split("\n"))
    return printable(str(exc))


def _escape(text: str) -> str:
    from rich.markup import escape

    return escape(text)
