"""The paged KV cache: block pool, block tables, the KvCache and its MemoryProfile."""

from hipcore.kvcache.cache import KvCache
from hipcore.kvcache.config import DEFAULT_BLOCK_SIZE, NULL_BLOCK, KvCacheConfig
from hipcore.kvcache.dtypes import DEFAULT_KV_DTYPE, KV_DTYPES, kv_dtype
from hipcore.kvcache.errors import KvCacheError, KvConfigError, KvInvariantError
from hipcore.kvcache.profile import MemoryProfile

__all__ = [
    "DEFAULT_BLOCK_SIZE", "DEFAULT_KV_DTYPE", "KV_DTYPES", "NULL_BLOCK", "KvCache", "KvCacheConfig",
    "KvCacheError", "KvConfigError", "KvInvariantError", "MemoryProfile", "kv_dtype",
]
