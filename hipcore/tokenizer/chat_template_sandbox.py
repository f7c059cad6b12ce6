"""The sandbox chat templates render in: Jinja's ImmutableSandboxedEnvironment plus the limits
it does not give by itself (see hipcore.tokenizer.chat_template for the list). Used by chat_template, in
process or inside the child process of chat_template_worker; so it imports nothing of the
project but the standard library and jinja2, and reports failures as (kind, message) pairs that
the caller turns into rocmforge errors.
"""

from __future__ import annotations

import functools
import json
import os
import re
import string
import sys
import threading
import time
from datetime import datetime
from typing import Any, Mapping, Sequence

import jinja2
import jinja2.ext
import jinja2.nodes
from jinja2.compiler import CodeGenerator, Frame
from jinja2.exceptions import SecurityError, TemplateSyntaxError
from jinja2.sandbox import ImmutableSandboxedEnvironment

try:  # memory probe fallback where /proc is absent; missing on Windows
    import resource
except ImportError:  # pragma: no cover - platform dependent
    resource = None  # type: ignore[assignment]

DEFAULT_TIMEOUT_S = 2.0
MEMORY_GROWTH_LIMIT = 256 << 20
BASE_OUTPUT_CAP = 4 << 20  # characters; render_chat adds 4x the conversation's own size
_MAX_INT_BITS = 1 << 20
_TEMPLATE_FILENAME = "<template>"  # what Jinja names the code compiled from a string


class LimitExceeded(Exception):
    """A render went past one of the limits."""


class RaisedByTemplate(Exception):
    """The template called raise_exception(message)."""


class BadTemplate(Exception):
    """The template does not compile."""


# Outcome kinds: "usage" (the conversation was rejected by the template: exit 2) and "invalid"
# (the template itself is broken or hostile: exit 3).
USAGE, INVALID = "usage", "invalid"


def render_sandboxed(template: str, context: Mapping[str, Any], *, timeout_s: float, max_chars: int) -> str:
    """Render in the sandbox within the limits; raises the exceptions describe_failure knows."""
    compiled = compile_template(template)
    budget = Budget(timeout_s, max_chars)
    with budget:
        pieces: list[str] = []
        produced = 0
        for chunk in compiled.generate(context):
            produced += len(chunk)
            budget.check_size(produced, "the rendered prompt")
            pieces.append(chunk)
        return "".join(pieces)


def describe_failure(exc: BaseException) -> tuple[str, str]:
    """(kind, one-line message) for any exception a render raised."""
    prefix = "the model's chat template"
    if isinstance(exc, RaisedByTemplate):
        return USAGE, f"{prefix} rejected the conversation: {exc}"
    if isinstance(exc, BadTemplate):
        return INVALID, f"{prefix} {exc}"
    if isinstance(exc, LimitExceeded):
        return INVALID, f"{prefix} was stopped: {exc}"
    if isinstance(exc, SecurityError):
        return INVALID, f"{prefix} tried an unsafe operation and was stopped: {one_line(exc)}"
    if isinstance(exc, RecursionError):
        return INVALID, f"{prefix} recursed too deeply and was stopped"
    if isinstance(exc, MemoryError):
        return INVALID, f"{prefix} ran out of memory and was stopped"
    return INVALID, f"{prefix} failed: {type(exc).__name__}: {one_line(exc)}"


def one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())[:300]


class Budget:
    """The limits of one render; the trace hook and the checked operations consult it."""

    def __init__(self, timeout_s: float, max_chars: int):
        self.deadline = time.monotonic() + timeout_s
        self.timeout_s = timeout_s
        self.max_chars = max_chars
        self._rss: _RssProbe | None = None
        self._rss_start: int | None = None

    def check_size(self, n: int, what: str) -> None:
        if n > self.max_chars:
            raise LimitExceeded(f"{what} would exceed {self.max_chars:,} characters")

    def tick(self) -> None:
        if time.monotonic() > self.deadline:
            raise LimitExceeded(f"rendering took longer than {self.timeout_s:g} s")
        if self._rss_start is not None:
            grown = (self._rss.read() or 0) - self._rss_start  # type: ignore[union-attr]
            if grown > MEMORY_GROWTH_LIMIT:
                raise LimitExceeded(f"rendering grew memory by more than {MEMORY_GROWTH_LIMIT >> 20} MiB")

    def __enter__(self) -> "Budget":
        """Watch the template's own frames (a line tracer) until the render ends."""
        self._previous_budget = getattr(_active, "budget", None)
        self._previous_trace = sys.gettrace()
        self._rss = _RssProbe()
        self._rss_start = self._rss.read()
        _active.budget = self

        def local(frame: Any, event: str, arg: Any) -> Any:
            self.tick()
            return local

        def global_(frame: Any, event: str, arg: Any) -> Any:
            if frame.f_code.co_filename == _TEMPLATE_FILENAME:
                self.tick()
                return local
            return None

        sys.settrace(global_)
        return self

    def __exit__(self, *exc: object) -> None:
        sys.settrace(self._previous_trace)
        _active.budget = self._previous_budget
        if self._rss is not None:
            self._rss.close()
        self._rss = self._rss_start = None


_active = threading.local()  # the render in progress on this thread


class _RssProbe:
    """Resident memory now: /proc/self/statm on Linux (cheap to re-read), else the peak from
    getrusage (which only sees growth past the process's earlier peak), else nothing."""

    def __init__(self) -> None:
        self._fd: int | None = None
        try:
            self._fd = os.open("/proc/self/statm", os.O_RDONLY)
            self._page = os.sysconf("SC_PAGE_SIZE")
        except (OSError, ValueError, AttributeError):
            self._fd = None

    def read(self) -> int | None:
        if self._fd is not None:
            try:
                return int(os.pread(self._fd, 128, 0).split()[1]) * self._page
            except (OSError, ValueError, IndexError):
                return None
        if resource is not None:
            peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
            return peak if sys.platform == "darwin" else peak * 1024  # bytes on macOS, KiB elsewhere
        return None

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def _budget() -> Budget:
    budget = getattr(_active, "budget", None)
    # Outside render_chat (a compiled template used directly) the size limits still apply.
    return budget if budget is not None else Budget(DEFAULT_TIMEOUT_S, BASE_OUTPUT_CAP)


def _check_width(value: object, what: str) -> None:
    if isinstance(value, int) and not isinstance(value, bool):
        _budget().check_size(abs(value), what)


def _size_of(value: object) -> int | None:
    return len(value) if isinstance(value, (str, list, tuple)) else None


_BIG_NUMBER_IN_FORMAT = re.compile(r"\d{7,}")
_WIDTH_LIMITED_STR_METHODS = {"center", "ljust", "rjust", "zfill", "expandtabs"}


def _check_printf(fmt: str, args: Any) -> None:
    """'%10s' % x: a width written in the format, or taken from the arguments by '*'."""
    if _BIG_NUMBER_IN_FORMAT.search(fmt):
        raise LimitExceeded("a %-format width is too large")
    if "*" in fmt:
        for arg in args if isinstance(args, tuple) else (args,):
            _check_width(arg, "a %-format width")


def _check_str_format(fmt: str, args: Sequence[Any], kwargs: Mapping[str, Any]) -> None:
    """'{:>10}'.format(x): a width in the format, or in an argument when a spec nests a field."""
    if _BIG_NUMBER_IN_FORMAT.search(fmt):
        raise LimitExceeded("a format width is too large")
    try:
        nested = any(spec and "{" in spec for _, _, spec, _ in string.Formatter().parse(fmt))
    except ValueError:
        return  # malformed: str.format will say so
    if nested:
        for value in (*args, *kwargs.values()):
            _check_width(value, "a format width")


class _CheckedConcat(CodeGenerator):
    """Compiles `a ~ b` to a call that checks the joined size before building it."""

    def visit_Concat(self, node: jinja2.nodes.Concat, frame: Frame) -> None:
        self.write("environment.checked_concat((")
        for arg in node.nodes:
            self.visit(arg, frame)
            self.write(", ")
        self.write("))")


class _GenerationTag(jinja2.ext.Extension):
    """Hugging Face's `{% generation %}` marker (for training masks): rendered as its content."""

    tags = {"generation"}

    def parse(self, parser: Any) -> Any:
        parser.stream.skip(1)
        return parser.parse_statements(("name:endgeneration",), drop_needle=True)


class _ChatSandbox(ImmutableSandboxedEnvironment):
    intercepted_binops = frozenset({"*", "**", "+", "%"})
    code_generator_class = _CheckedConcat

    def checked_concat(self, parts: Sequence[Any]) -> str:
        texts = [str(p) for p in parts]
        _budget().check_size(sum(len(t) for t in texts), "a joined string")
        return "".join(texts)

    def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
        budget = _budget()
        if operator == "*":
            for seq, times in ((left, right), (right, left)):
                size = _size_of(seq)
                if size is not None and isinstance(times, int):
                    budget.check_size(size * max(times, 0), "a repeated sequence")
            if isinstance(left, int) and isinstance(right, int) and left.bit_length() + right.bit_length() > _MAX_INT_BITS:
                raise LimitExceeded("an integer product is too large")
        elif operator == "**":
            if isinstance(left, int) and isinstance(right, int) and abs(left) > 1 and right > 0:
                if right * left.bit_length() > _MAX_INT_BITS:
                    raise LimitExceeded("a power is too large")
        elif operator == "+":
            a, b = _size_of(left), _size_of(right)
            if a is not None and b is not None:
                budget.check_size(a + b, "a concatenation")
        elif operator == "%" and isinstance(left, str):
            _check_printf(left, right)
        return super().call_binop(context, operator, left, right)

    def call(__self, __context: Any, __obj: Any, *args: Any, **kwargs: Any) -> Any:  # noqa: N805
        owner = getattr(__obj, "__self__", None)
        name = getattr(__obj, "__name__", "")
        if isinstance(owner, str) and name in _WIDTH_LIMITED_STR_METHODS:
            for value in (*args, *kwargs.values()):
                _check_width(value, f"the width given to str.{name}")
        return super().call(__context, __obj, *args, **kwargs)

    def wrap_str_format(self, value: Any) -> Any:
        # The sandbox swaps str.format for its own formatter when the attribute is read; check
        # the widths before that formatter runs.
        formatter = super().wrap_str_format(value)
        if formatter is None:
            return None
        fmt = value.__self__
        is_format_map = value.__name__ == "format_map"

        def checked(*args: Any, **kwargs: Any) -> Any:
            mapping = args[0] if is_format_map and len(args) == 1 and isinstance(args[0], Mapping) else {}
            _check_str_format(fmt, () if is_format_map else args, mapping or kwargs)
            return formatter(*args, **kwargs)

        return checked


def _raise_exception(message: object) -> None:
    raise RaisedByTemplate(one_line(Exception(message)))


def _strftime_now(fmt: str) -> str:
    if not isinstance(fmt, str) or len(fmt) > 200:
        raise LimitExceeded("strftime_now needs a short format string")
    return datetime.now().strftime(fmt)


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None, separators: Any = None,
            sort_keys: bool = False) -> str:
    _check_width(indent, "the tojson indent")
    text = json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)
    _budget().check_size(len(text), "a tojson result")
    return text


def _checked_center(filter_fn: Any) -> Any:
    def center(value: Any, width: int = 80) -> Any:
        _check_width(width, "the width given to the center filter")
        return filter_fn(value, width)

    return center


def _checked_indent(filter_fn: Any) -> Any:
    def indent(value: Any, width: Any = 4, *args: Any, **kwargs: Any) -> Any:
        _check_width(width, "the width given to the indent filter")
        return filter_fn(value, width, *args, **kwargs)

    return indent


def _checked_format(filter_fn: Any) -> Any:
    def format_(value: Any, *args: Any, **kwargs: Any) -> Any:
        if isinstance(value, str):
            _check_printf(value, tuple(args) or tuple(kwargs.values()))
        return filter_fn(value, *args, **kwargs)

    return format_


@functools.lru_cache(maxsize=16)
def compile_template(template: str) -> jinja2.Template:
    env = _ChatSandbox(
        trim_blocks=True,
        lstrip_blocks=True,
        extensions=[jinja2.ext.loopcontrols, _GenerationTag],
        auto_reload=False,
        cache_size=0,
    )
    env.globals.pop("lipsum", None)  # generates text of any requested length
    env.globals.update(raise_exception=_raise_exception, strftime_now=_strftime_now)
    env.filters["tojson"] = _tojson
    env.filters["center"] = _checked_center(env.filters["center"])
    env.filters["indent"] = _checked_indent(env.filters["indent"])
    env.filters["format"] = _checked_format(env.filters["format"])
    try:
        return env.from_string(template)
    except TemplateSyntaxError as exc:
        raise BadTemplate(f"does not parse (line {exc.lineno}): {one_line(exc)}") from None
    except Exception as exc:  # anything else the compiler trips on is the template's fault too
        raise BadTemplate(f"cannot be compiled: {type(exc).__name__}: {one_line(exc)}") from None
