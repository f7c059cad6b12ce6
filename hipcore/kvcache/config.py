"""The shape of a KV cache and every size derived from it, in checked Python-int arithmetic.

One place computes bytes per token, per block and per pool, so the cache that allocates, the
profile that reports and `rocmforge profile-kv` that plans can never disagree.
"""

from __future__ import annotations

from dataclasses import dataclass

from hipcore.kvcache.dtypes import DEFAULT_KV_DTYPE, KvDtype, kv_dtype
from hipcore.kvcache.errors import KvConfigError
from hipcore.runtime.ledger import format_bytes

DEFAULT_BLOCK_SIZE = 16
MAX_BLOCK_SIZE = 256
NULL_BLOCK = 0  # never handed out, never freed; padding in block tables points at it
RESERVED_BLOCKS = 1

# Limits that reject absurd configurations before anything is allocated. Slots are int32 in the
# slot mapping and the kernels, hence the slot cap; 1 PiB per cache is far past any real device.
MAX_LAYERS = 1024
MAX_KV_HEADS = 1024
MAX_HEAD_DIM = 4096
MAX_SLOTS = 2**31 - 1
MAX_CACHE_BYTES = 2**50


def _check_int(name: str, value: object, low: int, high: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise KvConfigError(f"KV cache {name} must be an integer, got {value!r}")
    if not low <= value <= high:
        raise KvConfigError(f"KV cache {name} must be between {low:,} and {high:,}, got {value:,}")
    return value


@dataclass(frozen=True)
class KvCacheConfig:
    """Shape of a paged KV cache. `num_blocks` counts the null block, so num_blocks - 1 are usable.

    Pool layout, per layer and for K and V separately: [num_blocks, n_kv_heads, block_size, row],
    where a row is head_dim elements of `dtype` (row_bytes bytes). One block of one pool is
    contiguous, so copy-on-write copies 2 * n_layers contiguous ranges.
    """

    n_layers: int
    n_kv_heads: int
    head_dim: int
    num_blocks: int
    block_size: int = DEFAULT_BLOCK_SIZE
    dtype: str = DEFAULT_KV_DTYPE

    def __post_init__(self) -> None:
        _check_int("n_layers", self.n_layers, 1, MAX_LAYERS)
        _check_int("n_kv_heads", self.n_kv_heads, 1, MAX_KV_HEADS)
        _check_int("head_dim", self.head_dim, 1, MAX_HEAD_DIM)
        _check_block_size(self.block_size)
        _check_int("num_blocks", self.num_blocks, RESERVED_BLOCKS + 1, MAX_SLOTS // self.block_size)
        object.__setattr__(self, "dtype", self.format.name)  # normalised spelling; raises if unknown
        self.format.row_bytes(self.head_dim)  # q8_0 needs head_dim % 32 == 0
        if self.cache_bytes > MAX_CACHE_BYTES:
            raise KvConfigError(
                f"KV cache of {self.num_blocks:,} blocks would need {format_bytes(self.cache_bytes)}, past the "
                f"{format_bytes(MAX_CACHE_BYTES)} limit; use fewer blocks"
            )

    @classmethod
    def for_memory(cls, budget_bytes: int, n_layers: int, n_kv_heads: int, head_dim: int,
                   block_size: int = DEFAULT_BLOCK_SIZE, dtype: str = DEFAULT_KV_DTYPE) -> "KvCacheConfig":
        """The largest cache (null block included) whose pools fit in `budget_bytes`."""
        _check_int("memory budget", budget_bytes, 0, 2**63 - 1)
        probe = cls(n_layers, n_kv_heads, head_dim, RESERVED_BLOCKS + 1, block_size, dtype)
        num_blocks = min(budget_bytes // probe.bytes_per_block, MAX_SLOTS // block_size,
                         MAX_CACHE_BYTES // probe.bytes_per_block)
        if num_blocks < RESERVED_BLOCKS + 1:
            raise KvConfigError(
                f"a KV budget of {format_bytes(budget_bytes)} holds no usable block: one block of {block_size} "
                f"tokens needs {format_bytes(probe.bytes_per_block)} and block 0 is reserved, so at least "
                f"{format_bytes((RESERVED_BLOCKS + 1) * probe.bytes_per_block)} is needed"
            )
        return cls(n_layers, n_kv_heads, head_dim, num_blocks, block_size, dtype)

    @property
    def format(self) -> KvDtype:
        return kv_dtype(self.dtype)

    @property
    def row_bytes(self) -> int:
        """One (token, KV head) row of K (or V) in one layer."""
        return self.format.row_bytes(self.head_dim)

    @property
    def block_bytes_per_pool(self) -> int:
        """One block in one pool (one layer's K, or its V)."""
        return self.n_kv_heads * self.block_size * self.row_bytes

    @property
    def pool_bytes(self) -> int:
        """One pool: one layer's K (or V) for every block."""
        return self.num_blocks * self.block_bytes_per_pool

    @property
    def bytes_per_block(self) -> int:
        """One block across K and V of every layer: what taking a block from the free list costs."""
        return 2 * self.n_layers * self.block_bytes_per_pool

    @property
    def bytes_per_token(self) -> int:
        """K + V of one token in every layer (KV heads, not query heads; scales included)."""
        return 2 * self.n_layers * self.n_kv_heads * self.row_bytes

    @property
    def cache_bytes(self) -> int:
        return 2 * self.n_layers * self.pool_bytes

    @property
    def usable_blocks(self) -> int:
        return self.num_blocks - RESERVED_BLOCKS

    @property
    def usable_tokens(self) -> int:
        return self.usable_blocks * self.block_size

    @property
    def num_slots(self) -> int:
        """Slot indices run over [0, num_slots): slot = block * block_size + offset."""
        return self.num_blocks * self.block_size

    def blocks_for_tokens(self, n_tokens: int) -> int:
        """Blocks a fresh sequence of n_tokens needs: ceil(n_tokens / block_size)."""
        return -(-n_tokens // self.block_size)


def _check_block_size(block_size: object) -> int:
    _check_int("block_size", block_size, 1, MAX_BLOCK_SIZE)
    if block_size & (block_size - 1):  # type: ignore[operator]
        raise KvConfigError(f"KV cache block_size must be a power of two (1, 2, 4 ... {MAX_BLOCK_SIZE}), got {block_size}")
    return block_size  # type: ignore[return-value]
