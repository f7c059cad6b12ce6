"""The one error a bad GGUF model file raises, and how values appear in its one-line message."""

from __future__ import annotations

from hipcore.errors import EXIT_INVALID_MODEL, EXIT_UNSUPPORTED, RocmforgeError, printable


def show(value: object, limit: int = 60) -> str:
    """A value as it can appear inside a one-line message: quoted, shortened, and escaped by
    hipcore.errors.printable (the one rule for model-file text on a terminal)."""
    if isinstance(value, (bytes, bytearray)):
        text = repr(bytes(value[:limit]))
        return text + ("..." if len(value) > limit else "")
    if isinstance(value, str):
        return "'" + printable(value, limit) + "'"
    if isinstance(value, bool) or value is None:
        return str(value)
    if isinstance(value, int):
        return f"{value} (0x{value:x})" if value >= 1 << 32 else str(value)
    if isinstance(value, tuple):
        return f"array of {len(value)}"
    return printable(repr(value), limit)


class GGUFError(RocmforgeError):
    """The one error a bad model file raises: exit 3 (invalid) or 4 (valid but unsupported).

    `field` names what was wrong, `offset` the byte where it sits in the file (None when it is not
    one place, e.g. a missing key), `value` what was found, `allowed` what would have been accepted.
    str(e) is one line with all four and, where it helps, what to do.
    """

    def __init__(
        self,
        field: str,
        offset: int | None,
        value: object,
        allowed: str,
        *,
        unsupported: bool = False,
        problem: str | None = None,
        source: str | None = None,
    ):
        super().__init__(field)
        self.field = field
        self.offset = offset
        self.value = value
        self.allowed = allowed
        self.unsupported = unsupported
        self.problem = problem
        self.source = source
        self.exit_code = EXIT_UNSUPPORTED if unsupported else EXIT_INVALID_MODEL

    def __reduce__(self):  # picklable across processes despite the keyword-only arguments
        return (_rebuild, (self.field, self.offset, self.value, self.allowed, self.unsupported, self.problem,
                           self.source))

    def __str__(self) -> str:
        kind = "unsupported model file" if self.unsupported else "invalid model file"
        where = f" {show(self.source, 200)}" if self.source else ""
        at = f" at byte {self.offset}" if self.offset is not None else ""
        problem = self.problem or f"found {show(self.value)}"
        text = f"{kind}{where}: {self.field}{at}: {problem}; allowed: {self.allowed}"
        return printable(" ".join(text.split()))  # one line, no control character, whatever a caller passed in


def _rebuild(field, offset, value, allowed, unsupported, problem, source) -> GGUFError:
    return GGUFError(field, offset, value, allowed, unsupported=unsupported, problem=problem, source=source)


def truncated(field: str, offset: int, need: int, have: int) -> GGUFError:
    return GGUFError(
        field, offset, need, f"at most {have} bytes (what the file holds from byte {offset})",
        problem=f"file truncated: need {need} bytes, have {have}; the download is probably incomplete",
    )
