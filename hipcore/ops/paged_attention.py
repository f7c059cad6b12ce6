"""paged_attention: causal grouped-query attention that reads K and V through block tables.

One op serves prompt evaluation and decode alike: every query token attends to the keys of its
own sequence at positions 0..its own position (its own K/V is written by kv_store first).

Kernels `paged_attention_<kv dtype>` (f16, bf16, f32, q8_0) with the signature
    (out p, q p, k_pool p, v_pool p, block_tables p, token_seq p, positions p,
     n_tokens i, n_heads i, n_kv_heads i, head_dim i, block_size i, max_blocks i, num_blocks i, scale f)
q, out: float32 [n_tokens, n_heads, head_dim]; pools: [num_blocks, n_kv_heads, block_size, row_bytes]
(the KvCache layout); block_tables: int32 [n_seqs, max_blocks]; token_seq, positions: int32 [n_tokens].
Query head h reads KV head h // (n_heads / n_kv_heads), as llama.cpp does.
Launch geometry: one workgroup per (token, query head).
"""

from __future__ import annotations

import numpy as np

from hipcore.kvcache.dtypes import KV_DTYPES, KvDtype
from hipcore.runtime.cpu import CpuDevice, cpu_kernel
from hipcore.runtime.device import Device, Stream
from hipcore.runtime.errors import DeviceError
from hipcore.runtime.kernels import get_kernel

SIGNATURE = "ppppppp iiiiiii f"
THREADS = 128


def reference(q: np.ndarray, k_pool: np.ndarray, v_pool: np.ndarray, fmt: KvDtype, block_tables: np.ndarray,
              token_seq: np.ndarray, positions: np.ndarray, scale: float) -> np.ndarray:
    """float32 [T, n_heads, head_dim]. Pools are uint8 [num_blocks, n_kv_heads, block_size, row_bytes]."""
    n_tokens, n_heads, head_dim = q.shape
    num_blocks, n_kv_heads, block_size, _ = k_pool.shape
    if n_heads % n_kv_heads:
        raise DeviceError(f"paged_attention: {n_heads} query heads do not group over {n_kv_heads} KV heads")
    group = n_heads // n_kv_heads
    out = np.zeros((n_tokens, n_heads, head_dim), dtype=np.float32)
    for s in np.unique(token_seq):
        idx = np.nonzero(token_seq == s)[0]
        pos = positions[idx].astype(np.int64)
        ctx = int(pos.max()) + 1
        n_blk = -(-ctx // block_size)
        blocks = block_tables[s, :n_blk].astype(np.int64)
        if blocks.min() < 1 or blocks.max() >= num_blocks:
            raise DeviceError(f"paged_attention: sequence {int(s)} reads block outside [1, {num_blocks})")
        # [n_blk, n_kv, bs, hd] -> [n_kv, ctx, hd]
        k = fmt.decode(k_pool[blocks], head_dim).transpose(1, 0, 2, 3).reshape(n_kv_heads, -1, head_dim)[:, :ctx]
        v = fmt.decode(v_pool[blocks], head_dim).transpose(1, 0, 2, 3).reshape(n_kv_heads, -1, head_dim)[:, :ctx]
        qs = q[idx].reshape(len(idx), n_kv_heads, group, head_dim).transpose(1, 2, 0, 3)  # [kv, g, n, hd]
        scores = np.einsum("kgnd,kcd->kgnc", qs, k, dtype=np.float64) * scale
        scores[..., np.arange(ctx)[None, :] > pos[:, None]] = -np.inf
        scores -= scores.max(axis=-1, keepdims=True)
        p = np.exp(scores)
        p /= p.sum(axis=-1, keepdims=True)
        o = np.einsum("kgnc,kcd->kgnd", p, v.astype(np.float64))  # [kv, g, n, hd]
        out[idx] = o.transpose(2, 0, 1, 3).reshape(len(idx), n_heads, head_dim)
    return out


def kernel_name(kv_dtype: str) -> str:
    return f"paged_attention_{kv_dtype}"


def _register(fmt: KvDtype) -> None:
    @cpu_kernel(kernel_name(fmt.name), SIGNATURE)
    def host(dev: CpuDevice, grid, block, out: int, q: int, k_pool: int, v_pool: int, block_tables: int,
             token_seq: int, positions: int, n_tokens: int, n_heads: int, n_kv_heads: int, head_dim: int,
             block_size: int, max_blocks: int, num_blocks: int, scale: float) -> None:
        pool_shape = (num_blocks, n_kv_heads, block_size, fmt.row_bytes(head_dim))
        seqs = dev.view(token_seq, np.int32, n_tokens)
        n_seqs = int(seqs.max()) + 1 if n_tokens else 0
        result = reference(
            dev.view(q, np.float32, (n_tokens, n_heads, head_dim)),
            dev.view(k_pool, np.uint8, pool_shape), dev.view(v_pool, np.uint8, pool_shape), fmt,
            dev.view(block_tables, np.int32, (n_seqs, max_blocks)), seqs,
            dev.view(positions, np.int32, n_tokens), scale,
        )
        dev.view(out, np.float32, (n_tokens, n_heads, head_dim))[:] = result


for _fmt in KV_DTYPES.values():
    _register(_fmt)


def launch(device: Device, stream: Stream | None, out, q, k_pool, v_pool, block_tables, token_seq, positions, *,
           n_tokens: int, n_heads: int, n_kv_heads: int, head_dim: int, block_size: int, max_blocks: int,
           num_blocks: int, scale: float, kv_dtype: str) -> None:
    kernel = get_kernel(device, "paged_attention", kernel_name(kv_dtype), SIGNATURE.replace(" ", ""))
    kernel.launch((n_tokens, n_heads), THREADS,
                  [out, q, k_pool, v_pool, block_tables, token_seq, positions, n_tokens, n_heads, n_kv_heads,
                   head_dim, block_size, max_blocks, num_blocks, scale], stream=stream)
