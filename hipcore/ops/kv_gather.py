"""kv_gather: read a sequence's K and V back from the paged pools as float32, in token order.

The numpy reference of what paged attention reads through a block table; tests use it to check
kv_store and copy-on-write, and attention references use it to build contiguous K/V.
"""

from __future__ import annotations

import numpy as np

from hipcore.kvcache.cache import KvCache
from hipcore.kvcache.config import KvCacheConfig


def gather_rows_reference(pool: np.ndarray, table: tuple[int, ...] | list[int], length: int,
                          config: KvCacheConfig) -> np.ndarray:
    """float32 [length, n_kv_heads, head_dim] from a pool array (uint8 [num_blocks, n_kv_heads,
    block_size, row_bytes]) through a block table."""
    blocks = pool[np.asarray(table, dtype=np.int64)]  # [n_blocks, heads, block_size, row]
    tokens = blocks.transpose(0, 2, 1, 3).reshape(-1, config.n_kv_heads, config.row_bytes)[:length]
    return config.format.decode(tokens, config.head_dim)


def gather_kv(cache: KvCache, seq_id: int, layer: int) -> tuple[np.ndarray, np.ndarray]:
    """(K, V) of `seq_id` in `layer`, float32 [seq_len, n_kv_heads, head_dim], downloaded block by block
    through the table of the layer's group. In a sliding-window layer the positions whose block went back
    to the pool read the null block (whatever it holds); only the window's positions mean anything."""
    cfg = cache.config
    if not 0 <= layer < cfg.n_layers:
        raise ValueError(f"layer {layer} outside the cache's {cfg.n_layers} layers")
    table, length = cache.block_table(seq_id, cfg.layer_group(layer)), cache.seq_len(seq_id)
    block_bytes = cfg.block_bytes_per_pool
    shape = (cfg.n_kv_heads, cfg.block_size, cfg.row_bytes)
    out = []
    for pool in (cache.k_pools[layer], cache.v_pools[layer]):
        blocks = np.stack([pool.download(np.uint8, block_bytes, b * block_bytes).reshape(shape) for b in table]) \
            if table else np.zeros((0,) + shape, dtype=np.uint8)
        out.append(gather_rows_reference(blocks, list(range(len(table))), length, cfg))
    return out[0], out[1]
