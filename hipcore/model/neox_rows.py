"""The row order in which qwen2's, phi3's and gemma2's q and k rows are uploaded (hipcore/model/weights.py,
NEOX_AS_NORM): each NEOX RoPE pair (i, i + rope_dim / 2) of a head side by side, so that the fused kernels' NORM-mode
RoPE rotates it."""

from __future__ import annotations

import numpy as np

from hipcore.gguf.errors import GGUFError


def neox_pair_order(head_dim: int, rope_dim: int) -> np.ndarray:
    """The rows of one head in their upload order: NEOX pair i (rows i and i + rope_dim / 2) at 2i and 2i + 1,
    the rows past rope_dim (not rotated) where they were."""
    half = rope_dim // 2
    order = np.arange(head_dim)
    order[0:rope_dim:2] = np.arange(half)
    order[1:rope_dim:2] = np.arange(half) + half
    return order


def paired_rows(data: np.ndarray, heads: int, head_dim: int, rope_dim: int) -> np.ndarray:
    """data (a matrix of heads * head_dim rows, or a vector of as many values; its bytes, as the file holds them, or
    its values) with its rows in neox_pair_order per head, in data's shape."""
    order = (np.arange(heads)[:, None] * head_dim + neox_pair_order(head_dim, rope_dim)[None, :]).reshape(-1)
    if data.size % order.size:
        raise GGUFError(f"expected whole rows of {heads} heads of {head_dim} to reorder, the tensor has {data.size} "
                        "elements")
    return np.ascontiguousarray(data.reshape(order.size, -1)[order]).reshape(data.shape)


def paired_fused_qkv(data: np.ndarray, config) -> np.ndarray:
    """A q|k|v tensor (q_size + 2 kv_size rows) with its q rows and its k rows each in neox_pair_order per head."""
    rows = config.q_size + 2 * config.kv_size
    if data.size % rows:
        raise GGUFError(f"expected whole rows of a q|k|v of {rows} rows to reorder, the tensor has {data.size} "
                        "elements")
    by_row = data.reshape(rows, -1)
    q, k = config.q_size, config.q_size + config.kv_size
    parts = [paired_rows(by_row[:q], config.n_heads, config.head_dim, config.rope_dim),
             paired_rows(by_row[q:k], config.n_kv_heads, config.head_dim, config.rope_dim), by_row[k:]]
    return np.concatenate(parts).reshape(data.shape)
