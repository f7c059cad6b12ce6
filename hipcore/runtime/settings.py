"""Numeric settings a measurement sets through the environment (ROCMFORGE_MOE_MMA_MIN_PAIRS and the like; the README
lists them): read where they are used rather than at import, so that a bad value is a UsageError the command prints
as one line (exit 2) instead of a traceback before any command runs. Each distinct value is parsed once."""

from __future__ import annotations

import functools
import os

from hipcore.runtime.errors import UsageError


def number(name: str, default: float, *, whole: bool = False) -> float:
    """The variable `name` as a number of 0 or more (a whole one where `whole`), or `default` where it is unset."""
    return _parse(name, os.environ.get(name), default, whole)


@functools.lru_cache(maxsize=64)
def _parse(name: str, raw: str | None, default: float, whole: bool) -> float:
    if raw is None:
        return default
    kind = "a whole number" if whole else "a number"
    try:
        value = int(raw.strip()) if whole else float(raw.strip())
    except ValueError:
        value = None
    if value is None or not value >= 0:  # `not >=` also refuses nan
        raise UsageError(f"{name} must be {kind} of 0 or more, got {raw!r}; unset it for the default ({default:g})")
    return value
