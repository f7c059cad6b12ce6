"""Open and validate a GGUF model file in two phases.

Phase 1 (`read_plan`): the bounded header parser (gguf_header.py), then every tensor's type, size
and offset checked with Python ints against the file size, then the metadata turned into a
ModelConfig and every tensor's shape checked against it. The result is a frozen ModelPlan.

Phase 2 (`GGUFFile`): the file memory-mapped; each tensor is a read-only view at the offset and
size the plan recorded. Nothing here re-derives a size from the header.

The gguf package's own reader is not used: on crafted files it hangs, over-allocates and lets
offsets wrap (docs/architecture.md, "Reading GGUF files safely"). We use the package for type constants and reference dequantization.
"""

from __future__ import annotations

import mmap
import os
import stat
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Mapping

import numpy as np

from hipcore.gguf import quants
from hipcore.errors import UsageError
from hipcore.gguf.header import (  # noqa: F401  (GGUFError and Limits are part of this module's API)
    SIZE_LIMIT, GGUFError, Limits, RawHeader, RawTensorInfo, parse_header, show,
)
from hipcore.gguf.config import ModelConfig, config_from_metadata


@dataclass(frozen=True)
class TensorInfo:
    name: str
    ggml_type: int
    type_name: str              # e.g. "Q4_1"
    dims: tuple[int, ...]       # GGUF order: ne0 (innermost, contiguous) first
    shape: tuple[int, ...]      # numpy order (reversed dims): a weight is (out_features, in_features)
    n_elements: int
    offset: int                 # ABSOLUTE byte offset in the file
    nbytes: int
    header_offset: int          # byte where this tensor's info record sits in the header


@dataclass(frozen=True)
class ModelPlan:
    """Everything phase 2 needs, validated against the file size and the architecture."""

    path: str
    file_size: int
    version: int
    alignment: int
    data_offset: int
    metadata: Mapping[str, object]        # read-only; int/float/bool/str or tuples of those
    tensors: tuple[TensorInfo, ...]       # file order
    total_tensor_bytes: int
    config: ModelConfig
    metadata_types: Mapping[str, str] = field(default_factory=dict)    # "uint32", "array[string]" ...
    metadata_offsets: Mapping[str, int] = field(default_factory=dict)  # byte of each value's type field
    _by_name: Mapping[str, TensorInfo] = field(default_factory=dict, repr=False, compare=False)

    def tensor(self, name: str) -> TensorInfo:
        info = self._by_name.get(name)
        if info is None:
            raise GGUFError(f"tensor {show(name)}", None, name, "a tensor of this file",
                            problem=f"{self.path} has no tensor {show(name)}")
        return info

    def bytes_by_type(self) -> dict[str, tuple[int, int]]:
        """type name -> (tensor count, bytes), largest first."""
        totals: dict[str, list[int]] = {}
        for info in self.tensors:
            entry = totals.setdefault(info.type_name, [0, 0])
            entry[0] += 1
            entry[1] += info.nbytes
        return {k: (c, b) for k, (c, b) in sorted(totals.items(), key=lambda kv: -kv[1][1])}


def read_plan(path: str | os.PathLike, limits: Limits = Limits()) -> ModelPlan:
    """Phase 1 on a file: parse and validate the header without reading the tensor data."""
    with _open_mapping(path) as (mapping, size):
        return _plan(mapping, size, limits, os.fspath(path))


def read_plan_from_bytes(data: bytes, limits: Limits = Limits(), name: str = "<bytes>") -> ModelPlan:
    """Phase 1 on bytes in memory: the same parser (what the fuzz tests drive)."""
    return _plan(data, len(data), limits, name)


def _plan(buf, size: int, limits: Limits, source: str) -> ModelPlan:
    try:
        header = parse_header(buf, size, limits)
        tensors, unsupported = _layout(header, size)
        config = config_from_metadata(header.metadata, tensors, types=header.metadata_types,
                                      offsets=header.metadata_offsets, limits=limits)
        if unsupported is not None:
            raise GGUFError(f"tensor {unsupported.name!r} type", unsupported.header_offset, unsupported.type_name,
                            ", ".join(sorted(quants.SUPPORTED_TYPES)), unsupported=True,
                            problem=f"tensor type {unsupported.type_name} is not supported")
    except GGUFError as exc:
        if exc.source is None:
            exc.source = source
        raise
    return ModelPlan(
        path=source, file_size=size, version=header.version, alignment=header.alignment,
        data_offset=header.data_offset, metadata=header.metadata, tensors=tensors,
        total_tensor_bytes=sum(t.nbytes for t in tensors), config=config,
        metadata_types=header.metadata_types, metadata_offsets=header.metadata_offsets,
        _by_name=MappingProxyType({t.name: t for t in tensors}),
    )


def _layout(header: RawHeader, file_size: int) -> tuple[tuple[TensorInfo, ...], TensorInfo | None]:
    """Types, checked sizes and offsets of every tensor. Returns the first unsupported-typed tensor
    separately: a corrupt file must be reported as corrupt before we call it merely unsupported."""
    out: list[TensorInfo] = []
    first_unsupported: TensorInfo | None = None
    expected = 0  # the running padded sum of sizes: where ggml requires the next tensor to start
    align = header.alignment
    for raw in header.tensors:
        block, block_bytes = _geometry(raw)
        n_elements = 1
        for dim in raw.dims:
            n_elements *= dim
            if n_elements >= SIZE_LIMIT:
                raise GGUFError(f"tensor {raw.name!r} dimensions", raw.dims_offset, raw.dims,
                                f"an element count below 2^63",
                                problem=f"dimensions {raw.dims} hold more than 2^63 elements")
        nbytes = n_elements // block * block_bytes
        if nbytes >= SIZE_LIMIT:
            raise GGUFError(f"tensor {raw.name!r} dimensions", raw.dims_offset, raw.dims, "a byte size below 2^63",
                            problem=f"dimensions {raw.dims} of {quants.type_name(raw.ggml_type)} need {nbytes} bytes")
        if raw.relative_offset != expected:
            raise _offset_error(raw, expected, align)
        info = TensorInfo(
            name=raw.name, ggml_type=raw.ggml_type, type_name=quants.type_name(raw.ggml_type),
            dims=raw.dims, shape=tuple(reversed(raw.dims)), n_elements=n_elements,
            offset=header.data_offset + expected, nbytes=nbytes, header_offset=raw.record_offset,
        )
        out.append(info)
        if first_unsupported is None and quants.type_kind(raw.ggml_type) == "unsupported":
            first_unsupported = info
        expected += -(-nbytes // align) * align
        if header.data_offset + expected >= SIZE_LIMIT:
            raise GGUFError(f"tensor {raw.name!r} dimensions", raw.dims_offset, raw.dims,
                            "tensor data that ends below 2^63", problem="the tensor data would end past 2^63 bytes")
    if out:
        last = out[-1]
        end = last.offset + last.nbytes
        if end > file_size:
            lacking = next(t for t in out if t.offset + t.nbytes > file_size)
            raise GGUFError(
                "tensor data", lacking.offset, end, f"a file of at least {end} bytes",
                problem=f"file truncated: need {end} bytes, have {file_size}; the download is probably incomplete "
                        f"(tensor {lacking.name!r} and later lie past the end)",
            )
    return tuple(out), first_unsupported


def _geometry(raw: RawTensorInfo) -> tuple[int, int]:
    kind = quants.type_kind(raw.ggml_type)
    name = quants.type_name(raw.ggml_type)
    if kind == "unknown":
        raise GGUFError(f"tensor {raw.name!r} type", raw.type_offset, raw.ggml_type,
                        "a ggml type id (" + ", ".join(f"{k}={v}" for k, v in sorted(quants.TYPE_IDS.items(),
                                                                                      key=lambda kv: kv[1])[:12]) + ", ...)",
                        problem=f"type id {raw.ggml_type} is not a ggml tensor type")
    if kind == "removed":
        raise GGUFError(f"tensor {raw.name!r} type", raw.type_offset, name,
                        ", ".join(sorted(quants.SUPPORTED_TYPES)), unsupported=True,
                        problem=f"tensor type {name} (id {raw.ggml_type}) was removed from ggml; "
                                "re-convert or re-download the model made with a current llama.cpp")
    block, block_bytes = quants.block_geometry(raw.ggml_type)
    if raw.dims[0] % block:
        raise GGUFError(f"tensor {raw.name!r} dimension 0", raw.dims_offset, raw.dims[0],
                        f"a multiple of {block}, the {name} block size",
                        problem=f"a row of {raw.dims[0]} elements is not a whole number of {name} blocks")
    return block, block_bytes


def _offset_error(raw: RawTensorInfo, expected: int, align: int) -> GGUFError:
    found = raw.relative_offset
    if found % align:
        why = f"offset {found} is not a multiple of the alignment {align}"
    elif found < expected:
        why = f"offset {found} overlaps the previous tensor or is out of order (expected {expected})"
    else:
        why = f"offset {found} leaves a gap after the previous tensor or is out of order (expected {expected})"
    return GGUFError(f"tensor {raw.name!r} offset", raw.offset_offset, found,
                     f"{expected}, the end of the previous tensor padded to {align}", problem=why)


class _open_mapping:
    """Context manager: (read-only mmap or b'' for an empty file, size); OS errors become one line."""

    def __init__(self, path: str | os.PathLike):
        self.path = os.fspath(path)
        self.mapping: mmap.mmap | None = None

    def __enter__(self):
        try:
            if not stat.S_ISREG(os.stat(self.path).st_mode):  # a FIFO would block open(), a device has no size
                raise UsageError(f"cannot open model file {show(self.path, 200)}: not a regular file")
            with open(self.path, "rb") as fh:
                size = os.fstat(fh.fileno()).st_size
                if size:
                    self.mapping = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
        except OSError as exc:
            raise UsageError(f"cannot open model file {show(self.path, 200)}: {exc.strerror or exc}") from None
        return (self.mapping if self.mapping is not None else b""), size

    def detach(self) -> mmap.mmap | None:
        mapping, self.mapping = self.mapping, None
        return mapping

    def __exit__(self, *exc_info) -> None:
        if self.mapping is not None:
            self.mapping.close()


class GGUFFile:
    """Phase 2: the mapped file and read-only views of its tensors, exactly as the plan describes.

    Use as a context manager or call close(). Views handed out by raw() keep the mapping alive
    until they are dropped, even after close().
    """

    def __init__(self, plan: ModelPlan, mapping: mmap.mmap | None):
        self.plan = plan
        self.config: ModelConfig = plan.config
        self.metadata: Mapping[str, object] = plan.metadata
        self._mapping = mapping
        self._bytes = np.frombuffer(mapping, dtype=np.uint8) if mapping is not None else np.empty(0, np.uint8)

    @classmethod
    def open(cls, path: str | os.PathLike, limits: Limits = Limits()) -> "GGUFFile":
        opener = _open_mapping(path)
        with opener as (mapping, size):
            plan = _plan(mapping, size, limits, os.fspath(path))
            return cls(plan, opener.detach())

    def raw(self, name: str) -> np.ndarray:
        """Read-only uint8 view of the tensor's bytes (offset and size from the plan)."""
        info = self.plan.tensor(name)
        if self._bytes is None:
            raise ValueError(f"{self.plan.path} is closed")
        return self._bytes[info.offset:info.offset + info.nbytes]

    def dequantize(self, name: str) -> np.ndarray:
        """The tensor as a new float32 array of its numpy-order shape."""
        info = self.plan.tensor(name)
        return quants.dequantize(self.raw(name), info.ggml_type, info.shape)

    def close(self) -> None:
        self._bytes = None
        mapping, self._mapping = self._mapping, None
        if mapping is not None:
            try:
                mapping.close()
            except BufferError:
                pass  # views from raw() are still alive; the mapping goes when the last of them does

    def __enter__(self) -> "GGUFFile":
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()
