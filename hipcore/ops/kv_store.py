"""kv_store: write n tokens' K and V rows (float32) into their cache slots, converting to the KV dtype.

Kernels `kv_store_<dtype>` for dtype in f16, bf16, f32, q8_0, all with the signature
    (k_pool p, v_pool p, k p, v p, slot_mapping p, n_tokens i, n_kv_heads i, head_dim i, block_size i, num_blocks i)
k and v: float32 [n_tokens, n_kv_heads, head_dim]; slot_mapping: int32 [n_tokens], slot =
block * block_size + offset, and a negative slot means "skip this token" (padding rows of a batch);
pools: [num_blocks, n_kv_heads, block_size, row_bytes] as laid out by KvCacheConfig. The GPU kernels
(kernels/kv_store.hip) skip a slot past the pool, which the host reference refuses.
Launch geometry: workgroup-stride over the tokens (at most 65,535 workgroups), 128 threads each.

The numpy reference below is what the host kernels run and what GPU kernels are compared with: the
kernels store the same bytes (for q8_0: given finite inputs).

A product whose epilogue makes k and v (fused_qmatvec's norm_rope at decode) can store them itself:
epilogue_target() describes the layer's pools, slots and format for it, so a decode step saves this launch
and the gap before the next. Only the element-wise formats (EPILOGUE_FORMATS): q8_0 takes a 32-element amax
across rows that different warps compute, so its rows still come through here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from hipcore.kvcache.cache import KvCache
from hipcore.kvcache.dtypes import KV_DTYPES, KvDtype, kv_dtype
from hipcore.ops.launch_checks import ELEMENTWISE_MAX_BLOCKS
from hipcore.runtime.cpu import CpuDevice, cpu_kernel
from hipcore.runtime.device import Buffer, Device, Stream
from hipcore.runtime.errors import DeviceError
from hipcore.runtime.kernels import get_kernel

SIGNATURE = "pppppiiiii"
THREADS = 128  # a multiple of 32: q8_0 gives each 32-element block to 32 lanes


# The kernels' kv_format codes (kernels/fused_qmatvec.hip: KvTarget); 0 means "no target".
EPILOGUE_FORMATS = {"f16": 1, "bf16": 2, "f32": 3}
_EPILOGUE_DTYPES = {code: name for name, code in EPILOGUE_FORMATS.items()}


@dataclass(frozen=True)
class EpilogueTarget:
    """Where a product's epilogue stores k and v rows: the layer's pools, the slot mapping (int32 [tokens],
    as launch()'s), and the pools' geometry and format code."""

    k_pool: Any
    v_pool: Any
    slots: Any
    block_size: int
    num_blocks: int
    dtype: str

    @property
    def format_code(self) -> int:
        return EPILOGUE_FORMATS[self.dtype]

    def args(self) -> tuple:
        """The kernels' (k_pool, v_pool, slots, block_size, num_blocks, kv_format)."""
        return self.k_pool, self.v_pool, self.slots, self.block_size, self.num_blocks, self.format_code


NO_EPILOGUE_TARGET_ARGS = (0, 0, 0, 0, 0, 0)


def epilogue_fusable(dtype: str) -> bool:
    """True when a product's epilogue can store rows of this KV dtype (element-wise formats)."""
    return kv_dtype(dtype).name in EPILOGUE_FORMATS


def epilogue_target(cache: KvCache, layer: int, slot_mapping: Any) -> EpilogueTarget:
    """The target for `layer` of `cache` (a KvCache or a group's view, as launch() takes), slots at
    `slot_mapping` (a Buffer whose start is the mapping, or an address)."""
    cfg = cache.config
    if not 0 <= layer < cfg.n_layers:
        raise ValueError(f"layer {layer} outside the cache's {cfg.n_layers} layers")
    if not epilogue_fusable(cfg.dtype):
        raise ValueError(f"kv_store: a product's epilogue cannot store KV dtype {cfg.dtype} "
                         f"({', '.join(EPILOGUE_FORMATS)} only)")
    return EpilogueTarget(cache.k_pools[layer], cache.v_pools[layer], slot_mapping, cfg.block_size,
                          cfg.layer_num_blocks(layer), kv_dtype(cfg.dtype).name)


def store_host_rows(dev: CpuDevice, k_pool: int, v_pool: int, slots: int, block_size: int, num_blocks: int,
                    kv_format: int, k_rows: np.ndarray, v_rows: np.ndarray, head_dim: int) -> None:
    """What an epilogue target does on the cpu backend: reference() into both pools (k_rows and v_rows
    float32 [n, n_kv_heads * head_dim])."""
    fmt = kv_dtype(_EPILOGUE_DTYPES[kv_format])
    n, width = k_rows.shape
    shape = (num_blocks, width // head_dim, block_size, fmt.row_bytes(head_dim))
    slot_view = dev.view(slots, np.int32, n)
    for pool_ptr, rows in ((k_pool, k_rows), (v_pool, v_rows)):
        reference(dev.view(pool_ptr, np.uint8, shape), rows.reshape(n, -1, head_dim), slot_view, fmt)


def kernel_name(dtype: str) -> str:
    return f"kv_store_{kv_dtype(dtype).name}"


def reference(pool: np.ndarray, rows: np.ndarray, slots: np.ndarray, fmt: KvDtype) -> None:
    """Encode float32 rows [n, n_kv_heads, head_dim] into `pool` (uint8 [num_blocks, n_kv_heads,
    block_size, row_bytes]) at `slots`; negative slots are skipped."""
    num_blocks, _, block_size, _ = pool.shape
    slots = np.asarray(slots, dtype=np.int64)
    valid = slots >= 0
    target = slots[valid]
    if target.size and int(target.max()) >= num_blocks * block_size:
        raise DeviceError(f"kv_store: slot {int(target.max())} is outside the pool of {num_blocks * block_size} slots")
    pool[target // block_size, :, target % block_size, :] = fmt.encode(rows[valid])


def _register_host_kernel(fmt: KvDtype) -> None:
    @cpu_kernel(kernel_name(fmt.name), SIGNATURE)
    def kv_store_host(dev: CpuDevice, grid: tuple, block: tuple, k_pool: int, v_pool: int, k: int, v: int,
                      slot_mapping: int, n_tokens: int, n_kv_heads: int, head_dim: int, block_size: int,
                      num_blocks: int) -> None:
        pool_shape = (num_blocks, n_kv_heads, block_size, fmt.row_bytes(head_dim))
        slots = dev.view(slot_mapping, np.int32, n_tokens)
        for pool_ptr, src_ptr in ((k_pool, k), (v_pool, v)):
            reference(dev.view(pool_ptr, np.uint8, pool_shape),
                               dev.view(src_ptr, np.float32, (n_tokens, n_kv_heads, head_dim)), slots, fmt)


for _fmt in KV_DTYPES.values():
    _register_host_kernel(_fmt)


def launch(device: Device, stream: Stream | None, cache: KvCache, layer: int, k: Buffer, v: Buffer,
           slot_mapping: Buffer, n_tokens: int) -> None:
    """Queue the write of n_tokens K/V rows into `layer` of `cache` at the slots in `slot_mapping`
    (device buffers, laid out as the module docstring says). `cache` may be a KvCache or the KvGroupView
    of the layer's group; either way the slots index the pool of the layer's group."""
    cfg = cache.config
    if not 0 <= layer < cfg.n_layers:
        raise ValueError(f"layer {layer} outside the cache's {cfg.n_layers} layers")
    row_f32 = cfg.n_kv_heads * cfg.head_dim * 4
    for name, buf, need in (("k", k, n_tokens * row_f32), ("v", v, n_tokens * row_f32),
                            ("slot_mapping", slot_mapping, n_tokens * 4)):
        if buf.nbytes < need:
            raise ValueError(f"kv_store: {name} holds {buf.nbytes} bytes, {n_tokens} tokens need {need}")
    if n_tokens == 0:
        return
    # programmatic: the entries wait for the kernel ahead first (hip_compat.h: rf_grid_dependency_sync)
    kernel = get_kernel(device, "kv_store", kernel_name(cfg.dtype), SIGNATURE, programmatic=True)
    kernel.launch(min(n_tokens, ELEMENTWISE_MAX_BLOCKS), THREADS,
                  [cache.k_pools[layer], cache.v_pools[layer], k, v, slot_mapping, n_tokens, cfg.n_kv_heads,
                   cfg.head_dim, cfg.block_size, cfg.layer_num_blocks(layer)], stream=stream)
