"""The simplest KV cache: one contiguous array per layer for K and V, for the numpy reference.

The engine uses the paged cache (hipcore.kvcache); this one exists so that the reference forward
pass stays obviously correct. One cache holds one sequence. Positions [0, length) are valid;
a forward pass writes its new rows past `length` and only then advances it, so a pass that fails
half-way leaves the cache as it was.
"""

from __future__ import annotations

import numpy as np

from hipcore.errors import UsageError

SUPPORTED_DTYPES = (np.float32, np.float16)


class ContiguousKvCache:
    def __init__(self, *, n_layers: int, n_kv_heads: int, head_dim: int, capacity: int,
                 dtype=np.float32):
        if np.dtype(dtype) not in [np.dtype(d) for d in SUPPORTED_DTYPES]:
            raise UsageError(f"reference KV cache dtype must be float32 or float16, got {np.dtype(dtype)}")
        for name, value in (("n_layers", n_layers), ("n_kv_heads", n_kv_heads),
                            ("head_dim", head_dim), ("capacity", capacity)):
            if int(value) <= 0:
                raise UsageError(f"KV cache {name} must be positive, got {value}")
        self.n_layers = int(n_layers)
        self.n_kv_heads = int(n_kv_heads)
        self.head_dim = int(head_dim)
        self.capacity = int(capacity)
        self.dtype = np.dtype(dtype)
        shape = (self.n_layers, self.n_kv_heads, self.capacity, self.head_dim)
        # np.zeros maps pages lazily: a long context costs memory only once it is used.
        self._keys = np.zeros(shape, dtype=self.dtype)
        self._values = np.zeros(shape, dtype=self.dtype)
        self.length = 0

    @classmethod
    def for_config(cls, config, capacity: int | None = None, dtype=np.float32) -> "ContiguousKvCache":
        """A cache shaped for a ModelConfig; capacity defaults to the model's context length."""
        return cls(n_layers=config.n_layers, n_kv_heads=config.n_kv_heads, head_dim=config.head_dim,
                   capacity=int(capacity if capacity is not None else config.context_length), dtype=dtype)

    @property
    def nbytes(self) -> int:
        return int(self._keys.nbytes) + int(self._values.nbytes)

    def check_room(self, n_tokens: int) -> None:
        """Raise UsageError unless n_tokens more tokens fit."""
        if self.length + int(n_tokens) > self.capacity:
            raise UsageError(
                f"context full: {self.length} tokens cached + {int(n_tokens)} new > capacity "
                f"{self.capacity}; use a shorter prompt or fewer tokens")

    def write(self, layer: int, start: int, keys: np.ndarray, values: np.ndarray) -> None:
        """Store rows for positions [start, start + len(keys)); keys/values: (tokens, kv_heads, head_dim)."""
        n = keys.shape[0]
        if start != self.length or start + n > self.capacity:
            raise UsageError(f"KV write at {start}..{start + n} but the cache holds {self.length} "
                             f"of {self.capacity} tokens")
        self._keys[layer, :, start:start + n] = keys.transpose(1, 0, 2)
        self._values[layer, :, start:start + n] = values.transpose(1, 0, 2)

    def keys(self, layer: int, end: int) -> np.ndarray:
        """Keys of positions [0, end) as float32, shape (kv_heads, end, head_dim)."""
        return self._keys[layer, :, :end].astype(np.float32, copy=False)

    def values(self, layer: int, end: int) -> np.ndarray:
        return self._values[layer, :, :end].astype(np.float32, copy=False)

    def advance(self, n_tokens: int) -> None:
        self.check_room(n_tokens)
        self.length += int(n_tokens)

    def truncate(self, length: int) -> None:
        """Forget every position from `length` on (e.g. to re-run from a shared prefix)."""
        if not 0 <= int(length) <= self.length:
            raise UsageError(f"cannot truncate a cache of {self.length} tokens to {length}")
        self.length = int(length)

    def reset(self) -> None:
        self.length = 0
