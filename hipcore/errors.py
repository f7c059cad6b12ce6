"""The error types every layer raises, and the exit code each one maps to.

The CLI turns any RocmforgeError into one line on stderr and its exit code (no traceback unless
--debug). Exit codes are the same in every command:
0 ok; 1 failure; 2 usage error; 3 invalid model file; 4 valid but unsupported; 5 out of memory.
"""

from __future__ import annotations

from hipcore.runtime.errors import (  # noqa: F401  (re-exported)
    EXIT_FAILURE,
    EXIT_INVALID_MODEL,
    EXIT_OK,
    EXIT_OUT_OF_MEMORY,
    EXIT_UNSUPPORTED,
    EXIT_USAGE,
    DeviceError,
    DeviceOutOfMemory,
    RocmforgeError,
    UsageError,
)


class InvalidModelError(RocmforgeError):
    """The model file is malformed (exit 3)."""

    exit_code = EXIT_INVALID_MODEL


class UnsupportedModelError(RocmforgeError):
    """The model file is valid but uses something we do not support (exit 4): name it."""

    exit_code = EXIT_UNSUPPORTED


def printable(text: str, limit: int | None = None) -> str:
    """Text from a model file (or any untrusted source) as it may reach a terminal: every character
    that is not printable - control characters such as ESC and newline, bidirectional overrides,
    unassigned code points - is shown escaped as Python writes it (\\n, \\x1b, \\u202e), so no such
    text can move the cursor, recolour the terminal or break a one-line message; text longer than
    `limit` characters is cut, with "..." after it. Printable non-ASCII text is kept as it is.
    Markup of the console that prints the result (rich's "[bold]") is the printer's to escape."""
    cut = text if limit is None else text[:limit]
    if not cut.isprintable():
        cut = "".join(c if c.isprintable() else repr(c)[1:-1] for c in cut)
    return cut + ("..." if limit is not None and len(text) > limit else "")
