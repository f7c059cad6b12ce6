"""A low-level GGUF builder that will write anything, including files no valid writer would produce.

Every field can be overridden: counts that disagree with the entries, wrong value types, string
lengths that lie, raw bytes in place of a value, tensor offsets and dims of any size, truncation.
`RawGGUF.to_bytes()` also records where each integer field landed (`fields`), so the fuzz tests
can aim mutations at counts, lengths, dims, types and offsets rather than only at random bytes.

Values are packed modulo their width, so `u64(-1)` writes 0xFFFFFFFFFFFFFFFF: tests can state
"the value a corrupt file would hold" directly.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import Sequence

from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

# GGUF value type ids
UINT8, INT8, UINT16, INT16, UINT32, INT32, FLOAT32, BOOL, STRING, ARRAY, UINT64, INT64, FLOAT64 = range(13)
_MAX_WRITTEN = 1 << 26  # never materialize more than 64 MiB of tensor data for a test file
_FORMATS = {UINT8: "B", INT8: "B", UINT16: "H", INT16: "H", UINT32: "I", INT32: "I", FLOAT32: "f",
            BOOL: "B", UINT64: "Q", INT64: "Q", FLOAT64: "d"}


def pack(value_type: int, value: object) -> bytes:
    """One scalar, little-endian; integers wrap to the field width (so -1 is all ones)."""
    fmt = _FORMATS[value_type]
    if fmt in "fd":
        return struct.pack("<" + fmt, value)
    width = struct.calcsize(fmt)
    return struct.pack("<" + fmt, int(value) & ((1 << (8 * width)) - 1))


def u32(value: int) -> bytes:
    return pack(UINT32, value)


def u64(value: int) -> bytes:
    return pack(UINT64, value)


def gguf_string(text: str | bytes, length: int | None = None) -> bytes:
    """A GGUF string: u64 length then the bytes; `length` overrides the stored length (to lie)."""
    data = text.encode("utf-8") if isinstance(text, str) else text
    return u64(len(data) if length is None else length) + data


@dataclass
class RawKV:
    """One metadata entry. `raw` replaces everything after the value-type field (or after the key
    when value_type is None), for values no encoder would produce."""

    key: str | bytes
    value_type: int | None
    value: object = None
    element_type: int | None = None   # for arrays
    raw: bytes | None = None

    def encode(self) -> bytes:
        out = gguf_string(self.key)
        if self.value_type is not None:
            out += u32(self.value_type)
        if self.raw is not None:
            return out + self.raw
        return out + encode_value(self.value_type, self.value, self.element_type)


def encode_value(value_type: int, value: object, element_type: int | None = None) -> bytes:
    if value_type == STRING:
        return gguf_string(value)  # type: ignore[arg-type]
    if value_type == ARRAY:
        assert element_type is not None, "arrays need an element_type"
        items = list(value)  # type: ignore[call-overload]
        return u32(element_type) + u64(len(items)) + b"".join(encode_value(element_type, v) for v in items)
    return pack(value_type, value)


@dataclass
class RawTensor:
    """One tensor-info record. offset None: the running padded sum (what a valid writer stores);
    data None: zeros of the size the dims and type imply (when the type has a known geometry)."""

    name: str | bytes
    dims: Sequence[int]            # GGUF order (ne0 first), any u64 values
    ggml_type: int
    offset: int | None = None
    data: bytes | None = None
    n_dims: int | None = None      # overrides len(dims) in the record

    def nbytes(self) -> int:
        if self.data is not None:
            return len(self.data)
        try:
            block, block_bytes = GGML_QUANT_SIZES[GGMLQuantizationType(self.ggml_type)]
        except ValueError:
            return 0
        n = 1
        for d in self.dims:
            n *= d
        return n // block * block_bytes


@dataclass
class RawGGUF:
    kvs: list[RawKV] = field(default_factory=list)
    tensors: list[RawTensor] = field(default_factory=list)
    magic: bytes = b"GGUF"
    version: int = 3
    tensor_count: int | None = None   # None: len(tensors)
    kv_count: int | None = None       # None: len(kvs)
    alignment: int = 32               # used for padding; write general.alignment yourself to declare it
    truncate: int = 0                 # drop this many bytes from the end
    trailing: bytes = b""             # appended after the data
    fields: list[tuple[str, int, int]] = field(default_factory=list)  # (label, byte offset, width)

    def kv(self, key: str) -> RawKV:
        return next(kv for kv in self.kvs if kv.key == key)

    def remove_kv(self, key: str) -> None:
        self.kvs = [kv for kv in self.kvs if kv.key != key]

    def set_kv(self, key: str, value_type: int, value: object, element_type: int | None = None) -> None:
        entry = RawKV(key, value_type, value, element_type)
        for i, kv in enumerate(self.kvs):
            if kv.key == key:
                self.kvs[i] = entry
                return
        self.kvs.append(entry)

    def tensor(self, name: str) -> RawTensor:
        return next(t for t in self.tensors if t.name == name)

    def to_bytes(self) -> bytes:
        self.fields = []
        out = bytearray(self.magic)
        self._int(out, "version", u32(self.version))
        self._int(out, "tensor_count", u64(len(self.tensors) if self.tensor_count is None else self.tensor_count))
        self._int(out, "kv_count", u64(len(self.kvs) if self.kv_count is None else self.kv_count))
        for kv in self.kvs:
            self._record_kv(out, kv)
            out += kv.encode()
        running = 0
        offsets = []
        for t in self.tensors:
            name = t.name.encode("utf-8") if isinstance(t.name, str) else t.name
            self._int(out, f"tensor {t.name!r} name length", u64(len(name)))
            out += name
            self._int(out, f"tensor {t.name!r} n_dims", u32(len(t.dims) if t.n_dims is None else t.n_dims))
            for axis, dim in enumerate(t.dims):
                self._int(out, f"tensor {t.name!r} dim {axis}", u64(dim))
            self._int(out, f"tensor {t.name!r} type", u32(t.ggml_type))
            offset = running if t.offset is None else t.offset
            offsets.append(offset)
            self._int(out, f"tensor {t.name!r} offset", u64(offset))
            running += _pad(t.nbytes(), self.alignment)
        out += bytes(_pad(len(out), self.alignment) - len(out))
        out += self._data_section(offsets, running)
        out += self.trailing
        if self.truncate:
            del out[len(out) - self.truncate:]
        return bytes(out)

    def _data_section(self, offsets: list[int], padded_total: int) -> bytes:
        """Each tensor's bytes at the offset its record claims, where that is a sane place to write;
        absurd sizes or offsets (the point of some tests) get no bytes at all."""
        placed = [(off, t) for off, t in zip(offsets, self.tensors) if off + t.nbytes() <= _MAX_WRITTEN]
        size = padded_total if padded_total <= _MAX_WRITTEN else 0
        for off, t in placed:
            size = max(size, _pad(off + t.nbytes(), self.alignment))
        data = bytearray(size)
        for off, t in placed:
            if t.data is not None:
                data[off:off + len(t.data)] = t.data
        return bytes(data)

    def _int(self, out: bytearray, label: str, data: bytes) -> None:
        self.fields.append((label, len(out), len(data)))
        out += data

    def _record_kv(self, out: bytearray, kv: RawKV) -> None:
        """Note the key length, value type, array header and scalar value positions of one entry."""
        key = kv.key.encode() if isinstance(kv.key, str) else kv.key
        pos = len(out)
        self.fields.append((f"{kv.key!r} key length", pos, 8))
        pos += 8 + len(key)
        if kv.value_type is None or kv.raw is not None:
            return
        self.fields.append((f"{kv.key!r} value type", pos, 4))
        pos += 4
        if kv.value_type == ARRAY:
            self.fields.append((f"{kv.key!r} element type", pos, 4))
            self.fields.append((f"{kv.key!r} array length", pos + 4, 8))
            if kv.element_type == STRING and kv.value:
                self.fields.append((f"{kv.key!r}[0] length", pos + 12, 8))
        elif kv.value_type == STRING:
            self.fields.append((f"{kv.key!r} string length", pos, 8))
        else:
            self.fields.append((f"{kv.key!r} value", pos, len(pack(kv.value_type, kv.value))))


def _pad(n: int, align: int) -> int:
    return -(-n // align) * align if align > 0 else n
