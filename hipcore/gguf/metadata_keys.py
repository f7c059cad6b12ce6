"""Typed, range-checked access to GGUF metadata, raising GGUFError with the key's byte offset.

llama.cpp insists on the exact value type of each key it reads (a block_count stored as int64 is
"wrong type" there), so we do too: accepting more would make us looser than llama.cpp.
"""

from __future__ import annotations

import math
from typing import Mapping

from hipcore.gguf.header import GGUFError, show

_INT_TYPES = {"uint8", "int8", "uint16", "int16", "uint32", "int32", "uint64", "int64"}


def _python_type(value: object) -> str:
    """The type of a value from a plain dict (no GGUF type table): loose names that match below."""
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "int"
    if isinstance(value, float):
        return "float"
    if isinstance(value, str):
        return "string"
    if isinstance(value, tuple):
        return "array[" + (_python_type(value[0]) if value else "?") + "]"
    return type(value).__name__


def _matches(actual: str, wanted: str) -> bool:
    if actual == wanted:
        return True
    # Values from a plain dict carry only Python types; accept those for the matching kind.
    loose = {"int": _INT_TYPES, "float": {"float32", "float64"}, "?": None}
    if actual.startswith("array[") and wanted.startswith("array["):
        inner = actual[6:-1]
        return inner == "?" or (inner in loose and wanted[6:-1] in (loose[inner] or ()))
    return actual in loose and wanted in (loose[actual] or ())


class MetadataKeys:
    """Reads keys of one file's metadata with their types; every failure names the key and its byte."""

    def __init__(self, metadata: Mapping[str, object], types: Mapping[str, str] | None = None,
                 offsets: Mapping[str, int] | None = None):
        self.metadata = metadata
        self.types = types if types is not None else {k: _python_type(v) for k, v in metadata.items()}
        self.offsets = offsets or {}

    def __contains__(self, key: str) -> bool:
        return key in self.metadata

    def error(self, key: str, value: object, allowed: str, *, problem: str | None = None,
              unsupported: bool = False) -> GGUFError:
        return GGUFError(key, self.offsets.get(key), value, allowed, problem=problem, unsupported=unsupported)

    def typed(self, key: str, wanted: tuple[str, ...], allowed: str, *, required: bool) -> object:
        if key not in self.metadata:
            if required:
                raise self.error(key, None, allowed, problem="the key is missing")
            return None
        actual = self.types.get(key, "?")
        if not any(_matches(actual, w) for w in wanted):
            raise self.error(key, self.metadata[key], allowed,
                             problem=f"has type {actual} (value {show(self.metadata[key])})")
        return self.metadata[key]

    def uint32(self, key: str, *, lo: int = 0, hi: int = (1 << 32) - 1, default: int | None = None,
               required: bool = True) -> int | None:
        allowed = f"a uint32 from {lo} to {hi}"
        value = self.typed(key, ("uint32",), allowed, required=required and default is None)
        if value is None:
            return default
        if not lo <= value <= hi:
            raise self.error(key, value, allowed)
        return value

    def uint32_or_uniform_array(self, key: str, n_layers: int, *, lo: int, hi: int,
                                default: int | None = None) -> int:
        """A per-model count that some files store per layer; per-layer values must all be equal."""
        value = self.metadata.get(key)
        if isinstance(value, tuple):
            self.typed(key, ("array[uint32]", "array[int32]"), f"a uint32, or {n_layers} equal per-layer values",
                       required=True)
            if len(value) != n_layers:
                raise self.error(key, len(value), f"{n_layers} values, one per layer",
                                 problem=f"has {len(value)} per-layer values for {n_layers} layers")
            if len(set(value)) != 1:
                raise self.error(key, value, "the same value for every layer", unsupported=True,
                                 problem=f"differs between layers ({show(value[0])}, ...); "
                                         "per-layer sizes are not supported")
            if not lo <= value[0] <= hi:
                raise self.error(key, value[0], f"from {lo} to {hi}")
            return value[0]
        result = self.uint32(key, lo=lo, hi=hi, default=default)
        assert result is not None
        return result

    def float32(self, key: str, *, lo: float, hi: float, default: float | None = None,
                lo_open: bool = True) -> float:
        allowed = f"a finite float32 {'>' if lo_open else '>='} {lo:g} and <= {hi:g}"
        value = self.typed(key, ("float32",), allowed, required=default is None)
        if value is None:
            assert default is not None
            return default
        if not math.isfinite(value) or value > hi or value < lo or (lo_open and value == lo):
            raise self.error(key, value, allowed)
        return float(value)

    def string(self, key: str, *, default: str | None = None) -> str:
        value = self.typed(key, ("string",), "a string", required=default is None)
        return default if value is None else value

    def array(self, key: str, element_types: tuple[str, ...]) -> tuple | None:
        wanted = tuple(f"array[{t}]" for t in element_types)
        return self.typed(key, wanted, "an array of " + " or ".join(element_types), required=False)
