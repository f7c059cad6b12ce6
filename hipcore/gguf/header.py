"""Phase 1, first half: the bounded parser of a GGUF header (magic, counts, metadata, tensor infos).

Model files are untrusted input. Every field becomes a Python int as it is read, and before any
read or any allocation the parser checks the request against the bytes that remain and against
the hard caps in `Limits` (docs/architecture.md, "Reading GGUF files safely"). What a header *means*
(tensor types, sizes, offsets, the model config) is checked by gguf_file.py and model/config.py;
this module only guarantees that what it returns was really in the file and is well-formed.

It parses from any object supporting the buffer protocol (bytes, or a read-only mmap), so the
fuzz tests drive exactly the code that reads real files.
"""

from __future__ import annotations

import re
import struct
from dataclasses import dataclass
from types import MappingProxyType
from typing import Mapping

from hipcore.gguf.errors import GGUFError, show, truncated  # noqa: F401  (re-exported)

GGUF_MAGIC = b"GGUF"
READABLE_VERSIONS = (2, 3)  # v2 and v3 share the little-endian layout; v1 used 32-bit counts
DEFAULT_ALIGNMENT = 32
ALIGNMENT_KEY = "general.alignment"
SIZE_LIMIT = 1 << 63  # element counts, byte sizes and offsets must stay below this (int64 in ggml)

# GGUF metadata value types: id -> (name, struct format, width). 8 = string, 9 = array.
_SCALAR_TYPES: dict[int, tuple[str, str, int]] = {
    0: ("uint8", "B", 1), 1: ("int8", "b", 1), 2: ("uint16", "H", 2), 3: ("int16", "h", 2),
    4: ("uint32", "I", 4), 5: ("int32", "i", 4), 6: ("float32", "f", 4), 7: ("bool", "B", 1),
    10: ("uint64", "Q", 8), 11: ("int64", "q", 8), 12: ("float64", "d", 8),
}
TYPE_STRING = 8
TYPE_ARRAY = 9
TYPE_BOOL = 7

# Hyphens appear in real architecture prefixes (command-r.block_count, gpt-oss.expert_count).
_KEY_PATTERN = re.compile(rb"[a-z0-9_-]+(?:\.[a-z0-9_-]+)*\Z")
_MIN_KV_BYTES = 8 + 1 + 4 + 1          # key length, a 1-byte key, value type, a 1-byte value
_MIN_TENSOR_INFO_BYTES = 8 + 1 + 4 + 8 + 4 + 8  # name length, 1-byte name, n_dims, one dim, type, offset
_STRING_MIN_BYTES = 8                   # an empty string is still its u64 length

_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")


@dataclass(frozen=True)
class Limits:
    """Hard caps on what a header may declare; a file past any of them is rejected before reading."""

    max_key_bytes: int = 65_535
    max_string_bytes: int = 64 << 20
    max_array_elements: int = 64 << 20
    max_kv_entries: int = 65_536
    max_tensors: int = 1 << 20
    max_alignment: int = 1 << 20
    max_tensor_name_bytes: int = 63  # ggml's GGML_MAX_NAME is 64 including the terminating NUL
    max_dims: int = 4
    max_layers: int = 4096           # block_count; the largest public models have ~130
    max_context: int = 1 << 24       # context_length; 16 Mi tokens is past every public model
    # The text of one vocabulary token. Real vocabularies stay near 100 characters (the demo model's
    # longest is 81: a newline and 80 spaces); a BOS of megabytes only inflates every prompt built with it.
    max_token_chars: int = 4096


@dataclass(frozen=True)
class RawTensorInfo:
    """A tensor-info record as read, before its type, size and offset are checked."""

    index: int
    name: str
    dims: tuple[int, ...]     # GGUF order, ne0 first
    ggml_type: int
    relative_offset: int      # from the start of the data section, as stored
    record_offset: int        # byte where this record starts (for error messages)
    dims_offset: int          # byte of the first dimension
    type_offset: int          # byte of the type field
    offset_offset: int        # byte of the offset field


@dataclass(frozen=True)
class RawHeader:
    version: int
    alignment: int
    metadata: Mapping[str, object]
    metadata_types: Mapping[str, str]    # e.g. "uint32", "string", "array[int32]"
    metadata_offsets: Mapping[str, int]  # byte where each value starts
    tensors: tuple[RawTensorInfo, ...]
    data_offset: int                     # start of the data section (aligned)


class _Cursor:
    """Reads little-endian fields from a buffer, refusing any read past its end."""

    __slots__ = ("buf", "pos", "size")

    def __init__(self, buf, size: int):
        self.buf = buf
        self.pos = 0
        self.size = size

    def remaining(self) -> int:
        return self.size - self.pos

    def need(self, n: int, field: str) -> None:
        if n > self.size - self.pos:
            raise truncated(field, self.pos, n, self.size - self.pos)

    def u32(self, field: str) -> int:
        self.need(4, field)
        (value,) = _U32.unpack_from(self.buf, self.pos)
        self.pos += 4
        return value

    def u64(self, field: str) -> int:
        self.need(8, field)
        (value,) = _U64.unpack_from(self.buf, self.pos)
        self.pos += 8
        return value

    def take(self, n: int, field: str) -> bytes:
        self.need(n, field)
        data = bytes(self.buf[self.pos:self.pos + n])
        self.pos += n
        return data

    def string_bytes(self, field: str, cap: int) -> bytes:
        start = self.pos
        length = self.u64(f"{field} length")
        if length > cap:
            raise GGUFError(f"{field} length", start, length, f"at most {cap} bytes")
        return self.take(length, field)


def _decode_utf8(data: bytes, field: str, offset: int) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise GGUFError(field, offset, data, "valid UTF-8 text",
                        problem=f"{show(data)} is not valid UTF-8 (byte {exc.start} of the string)") from None


def parse_header(buf, size: int, limits: Limits = Limits()) -> RawHeader:
    """Parse magic, version, counts, metadata and tensor infos from the first `size` bytes of buf."""
    cur = _Cursor(buf, size)
    _check_magic(cur)
    version = _read_version(cur)
    n_tensors = _read_count(cur, "tensor_count", limits.max_tensors, _MIN_TENSOR_INFO_BYTES, "tensors")
    n_kv = _read_count(cur, "metadata_kv_count", limits.max_kv_entries, _MIN_KV_BYTES, "metadata entries")
    metadata: dict[str, object] = {}
    types: dict[str, str] = {}
    offsets: dict[str, int] = {}
    for _ in range(n_kv):
        _read_kv(cur, limits, metadata, types, offsets)
    alignment = _alignment(metadata, types, offsets, limits)
    tensors = tuple(_read_tensor_info(cur, limits, i) for i in range(n_tensors))
    _check_unique_names(tensors)
    data_offset = -(-cur.pos // alignment) * alignment
    if tensors and data_offset > size:
        raise truncated("data section", cur.pos, data_offset - cur.pos, size - cur.pos)
    return RawHeader(
        version=version, alignment=alignment,
        metadata=MappingProxyType(metadata), metadata_types=MappingProxyType(types),
        metadata_offsets=MappingProxyType(offsets), tensors=tensors, data_offset=data_offset,
    )


def _check_magic(cur: _Cursor) -> None:
    if cur.size == 0:
        raise GGUFError("magic", 0, 0, "a GGUF file (it starts with the 4 bytes 'GGUF')",
                        problem="the file is empty; the download is probably incomplete")
    magic = bytes(cur.buf[:min(4, cur.size)])
    if len(magic) < 4 and GGUF_MAGIC.startswith(magic):
        raise truncated("magic", 0, 4, cur.size)
    cur.pos = len(magic)
    if magic != GGUF_MAGIC:
        raise GGUFError("magic", 0, magic, "b'GGUF'",
                        problem=f"the file starts with {show(magic)}, so it is not a GGUF model file")


def _read_version(cur: _Cursor) -> int:
    version = cur.u32("version")
    if version in READABLE_VERSIONS:
        return version
    swapped = int.from_bytes(version.to_bytes(4, "little"), "big")
    if version & 0xFFFF == 0 and swapped in (1, 2, 3):
        raise GGUFError("version", 4, version, "2 or 3, little-endian", unsupported=True,
                        problem=f"{version} is version {swapped} byte-swapped: a big-endian GGUF; "
                                "convert it to little-endian (llama.cpp's gguf tools)")
    if version == 1:
        raise GGUFError("version", 4, 1, "2 or 3", unsupported=True,
                        problem="GGUF version 1 is obsolete; re-convert the model with a current llama.cpp")
    if 3 < version < 256:
        raise GGUFError("version", 4, version, "2 or 3", unsupported=True,
                        problem=f"GGUF version {version} is newer than this rocmforge reads; update rocmforge")
    raise GGUFError("version", 4, version, "2 or 3")


def _read_count(cur: _Cursor, field: str, cap: int, min_item_bytes: int, what: str) -> int:
    start = cur.pos
    count = cur.u64(field)
    if count > cap:
        raise GGUFError(field, start, count, f"at most {cap} {what}")
    if count * min_item_bytes > cur.remaining():
        raise GGUFError(field, start, count,
                        f"at most {cur.remaining() // min_item_bytes} {what} in the {cur.remaining()} bytes left",
                        problem=f"{count} {what} need at least {count * min_item_bytes} bytes, "
                                f"only {cur.remaining()} remain (a corrupt count, or the file is truncated)")
    return count


def _read_kv(cur: _Cursor, limits: Limits, metadata: dict, types: dict, offsets: dict) -> None:
    key_at = cur.pos
    raw_key = cur.string_bytes("metadata key", limits.max_key_bytes)
    if not raw_key:
        raise GGUFError("metadata key", key_at, raw_key, "a non-empty lower_snake_case.dotted ASCII key")
    if not _KEY_PATTERN.match(raw_key):
        raise GGUFError("metadata key", key_at, raw_key, "lower_snake_case.dotted ASCII ([a-z0-9_-] and '.')")
    key = raw_key.decode("ascii")
    if key in metadata:
        raise GGUFError(f"metadata key {key!r}", key_at, raw_key, "each key once",
                        problem=f"key {key!r} appears twice")
    type_at = cur.pos
    value_type = cur.u32(f"{key} value type")
    if value_type == TYPE_ARRAY:
        value, type_name = _read_array(cur, key, limits)
    elif value_type == TYPE_STRING:
        value, type_name = _read_string_value(cur, key, limits), "string"
    elif value_type in _SCALAR_TYPES:
        value, type_name = _read_scalar(cur, key, value_type), _SCALAR_TYPES[value_type][0]
    else:
        raise GGUFError(f"{key} value type", type_at, value_type, "a GGUF value type id 0..12")
    metadata[key] = value
    types[key] = type_name
    offsets[key] = type_at


def _read_string_value(cur: _Cursor, key: str, limits: Limits) -> str:
    at = cur.pos
    return _decode_utf8(cur.string_bytes(key, limits.max_string_bytes), key, at)


def _read_scalar(cur: _Cursor, key: str, value_type: int) -> object:
    _, fmt, width = _SCALAR_TYPES[value_type]
    at = cur.pos
    cur.need(width, key)
    (value,) = struct.unpack_from("<" + fmt, cur.buf, cur.pos)
    cur.pos += width
    if value_type == TYPE_BOOL:
        if value > 1:
            raise GGUFError(key, at, value, "a bool stored as 0 or 1")
        return bool(value)
    return value


def _read_array(cur: _Cursor, key: str, limits: Limits) -> tuple[tuple, str]:
    type_at = cur.pos
    elem_type = cur.u32(f"{key} array element type")
    if elem_type == TYPE_ARRAY:
        raise GGUFError(f"{key} array element type", type_at, elem_type, "a scalar or string type (nested arrays are rejected)")
    if elem_type != TYPE_STRING and elem_type not in _SCALAR_TYPES:
        raise GGUFError(f"{key} array element type", type_at, elem_type, "a GGUF value type id 0..12 other than 9")
    count_at = cur.pos
    count = cur.u64(f"{key} array length")
    if count > limits.max_array_elements:
        raise GGUFError(f"{key} array length", count_at, count, f"at most {limits.max_array_elements} elements")
    item_bytes = _STRING_MIN_BYTES if elem_type == TYPE_STRING else _SCALAR_TYPES[elem_type][2]
    if count * item_bytes > cur.remaining():
        raise GGUFError(f"{key} array length", count_at, count,
                        f"at most {cur.remaining() // item_bytes} elements in the {cur.remaining()} bytes left",
                        problem=f"{count} elements need at least {count * item_bytes} bytes, "
                                f"only {cur.remaining()} remain (a corrupt length, or the file is truncated)")
    if elem_type == TYPE_STRING:
        return _read_string_array(cur, key, count, limits), "array[string]"
    name, fmt, width = _SCALAR_TYPES[elem_type]
    at = cur.pos
    values = struct.unpack_from(f"<{count}{fmt}", cur.buf, cur.pos)
    cur.pos += count * width
    if elem_type == TYPE_BOOL:
        bad = next((i for i, v in enumerate(values) if v > 1), None)
        if bad is not None:
            raise GGUFError(f"{key}[{bad}]", at + bad, values[bad], "a bool stored as 0 or 1")
        values = tuple(v == 1 for v in values)
    return values, f"array[{name}]"


def _read_string_array(cur: _Cursor, key: str, count: int, limits: Limits) -> tuple[str, ...]:
    # The hot loop of a real file (a 50k-256k entry vocabulary): locals only, one check per read.
    buf, size, cap, unpack = cur.buf, cur.size, limits.max_string_bytes, _U64.unpack_from
    pos = cur.pos
    out = []
    append = out.append
    for i in range(count):
        if size - pos < 8:
            cur.pos = pos
            raise truncated(f"{key}[{i}] length", pos, 8, size - pos)
        (length,) = unpack(buf, pos)
        if length > cap:
            raise GGUFError(f"{key}[{i}] length", pos, length, f"at most {cap} bytes")
        pos += 8
        if length > size - pos:
            raise truncated(f"{key}[{i}]", pos, length, size - pos)
        data = bytes(buf[pos:pos + length])
        try:
            append(data.decode("utf-8"))
        except UnicodeDecodeError:
            _decode_utf8(data, f"{key}[{i}]", pos)
        pos += length
    cur.pos = pos
    return tuple(out)


def _alignment(metadata: dict, types: dict, offsets: dict, limits: Limits) -> int:
    if ALIGNMENT_KEY not in metadata:
        return DEFAULT_ALIGNMENT
    value, at = metadata[ALIGNMENT_KEY], offsets[ALIGNMENT_KEY]
    allowed = f"a uint32 power of two from 1 to {limits.max_alignment}"
    if types[ALIGNMENT_KEY] != "uint32":
        raise GGUFError(ALIGNMENT_KEY, at, value, allowed, problem=f"has type {types[ALIGNMENT_KEY]}")
    if value == 0 or value & (value - 1) or value > limits.max_alignment:
        raise GGUFError(ALIGNMENT_KEY, at, value, allowed)
    return value


def _read_tensor_info(cur: _Cursor, limits: Limits, index: int) -> RawTensorInfo:
    record_at = cur.pos
    field = f"tensor #{index} name"
    length = cur.u64(f"{field} length")
    if length == 0:
        raise GGUFError(field, record_at, "", f"1 to {limits.max_tensor_name_bytes} bytes of UTF-8",
                        problem="the name is empty")
    if length > limits.max_tensor_name_bytes:
        raise GGUFError(f"{field} length", record_at, length, f"1 to {limits.max_tensor_name_bytes} bytes")
    name = _decode_utf8(cur.take(length, field), field, record_at + 8)
    dims_at = cur.pos
    n_dims = cur.u32(f"tensor {name!r} n_dims")
    if not 1 <= n_dims <= limits.max_dims:
        raise GGUFError(f"tensor {name!r} n_dims", dims_at, n_dims, f"1 to {limits.max_dims}")
    dims = []
    first_dim_at = cur.pos
    for axis in range(n_dims):
        at = cur.pos
        dim = cur.u64(f"tensor {name!r} dimension {axis}")
        if dim >= SIZE_LIMIT:
            raise GGUFError(f"tensor {name!r} dimension {axis}", at, dim - (1 << 64), f"1 to {SIZE_LIMIT - 1}",
                            problem=f"is negative ({dim - (1 << 64)}) as the int64 ggml reads")
        if dim == 0:
            raise GGUFError(f"tensor {name!r} dimension {axis}", at, 0, f"1 to {SIZE_LIMIT - 1}")
        dims.append(dim)
    type_at = cur.pos
    ggml_type = cur.u32(f"tensor {name!r} type")
    offset_at = cur.pos
    relative_offset = cur.u64(f"tensor {name!r} offset")
    return RawTensorInfo(index, name, tuple(dims), ggml_type, relative_offset, record_at, first_dim_at, type_at, offset_at)


def _check_unique_names(tensors: tuple[RawTensorInfo, ...]) -> None:
    seen: dict[str, int] = {}
    for info in tensors:
        if info.name in seen:
            raise GGUFError(f"tensor #{info.index} name", info.record_offset, info.name, "each tensor name once",
                            problem=f"{show(info.name)} is also the name of tensor #{seen[info.name]}")
        seen[info.name] = info.index
