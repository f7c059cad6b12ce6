"""The KV cache's device memory: one K and one V pool per layer (tag "kv"), each of its layer group's size,
allocated once and zeroed, and the block copy that copy-on-write queues. The block tables, the sequences and
the fence are the KvCache's (cache.py); this module only touches device memory.
"""

from __future__ import annotations

from hipcore.kvcache.config import LOCAL_GROUP, KvCacheConfig
from hipcore.runtime.device import Buffer, Device, Stream
from hipcore.runtime.errors import DeviceOutOfMemory
from hipcore.runtime.ledger import format_bytes


def allocate_pools(device: Device, config: KvCacheConfig, label: str) -> tuple[tuple[Buffer, ...], tuple[Buffer, ...]]:
    """(K pools, V pools), one each per layer; refused before any allocation if they do not fit, and every
    allocation made undone if one fails."""
    free = device.memory_info().free
    if config.cache_bytes > free:  # plan before allocating: refuse without touching the device
        raise DeviceOutOfMemory(
            f"{device.vendor_name} out of memory on {device.arch}: the KV cache needs "
            f"{format_bytes(config.cache_bytes)} ({config.num_blocks:,} blocks of {format_bytes(config.bytes_per_block)}), "
            f"{format_bytes(free)} is free; use fewer blocks or a smaller KV dtype",
            requested=config.cache_bytes, free=free, tag="kv", label=label,
        )
    made: list[Buffer] = []
    try:
        for layer in range(config.n_layers):
            local = config.layer_group(layer) == LOCAL_GROUP
            nbytes, name = ((config.window_pool_bytes, f"{label}.local.layer{layer}") if local
                            else (config.pool_bytes, f"{label}.layer{layer}"))
            for kind in "kv":
                buf = device.allocate(nbytes, tag="kv", label=f"{name}.{kind}")
                made.append(buf)
                # Zeroed so that unwritten slots (the null block, padding) read as finite numbers.
                buf.fill(0)
    except BaseException:
        for buf in reversed(made):
            buf.free()
        raise
    return tuple(made[0::2]), tuple(made[1::2])


def copy_block(device: Device, config: KvCacheConfig, k_pools: tuple[Buffer, ...], v_pools: tuple[Buffer, ...],
               src: int, dst: int, stream: Stream | None, group: str) -> None:
    """Copy block `src` to block `dst` in the K and V pools of every layer of `group`, queued on `stream`."""
    nbytes = config.block_bytes_per_pool
    for layer in range(config.n_layers):
        if config.layer_group(layer) != group:
            continue
        for pool in (k_pools[layer], v_pools[layer]):
            device.copy_device_to_device(pool, pool, nbytes, dst_offset=dst * nbytes, src_offset=src * nbytes,
                                         stream=stream)
