"""head_norm_rope: the per-head norms and RoPE of q and k (qwen3, gemma3), and the store of k and v into the paged
cache, in one launch after the q|k|v products.

Kernel `head_norm_rope_f32` (q p, k p, v p, q_weight p, k_weight p, positions p, freq_factors p, n_tokens i,
n_heads i, n_kv_heads i, head_dim i, rope_dim i, neox i, eps f, theta f, freq_scale f, k_pool p, v_pool p, slots p,
block_size i, num_blocks i, kv_format i) (kernels/head_norm_rope.hip): every head of q [n_tokens, n_heads, head_dim]
and of k [n_tokens, n_kv_heads, head_dim] becomes rope(rmsnorm(head) * weight), rmsnorm as rmsnorm.py's and RoPE as
rope.py's in the model's layout (neox 0: NORM, 1: NEOX). Without a cache target (kv_format 0) q and k are written
in place and v is untouched; with one (kv_store.EpilogueTarget: f16, bf16 or f32 pools) q is written in place and
k and v go into the pools at each token's slot instead, the bytes kv_store would write, and that launch leaves
the step. One workgroup of 64 threads a head, grid-stride.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from hipcore.ops import kv_store, rmsnorm, rope
from hipcore.ops.launch_checks import ELEMENTWISE_MAX_BLOCKS, INT32_MAX, check_memory, check_sizes
from hipcore.runtime.cpu import CpuDevice, cpu_kernel
from hipcore.runtime.device import Device, Dim3, Stream
from hipcore.runtime.kernels import get_kernel

OP = "head_norm_rope"
ENTRY = "head_norm_rope_f32"
SIGNATURE = "pppppppiiiiiifffpppiii"
THREADS = 64
MAX_HEAD_DIM = 512  # the kernel's shared row (kMaxHeadDim)
ROPE_TYPES = {"norm": 0, "neox": 1}


def supports(head_dim: int) -> bool:
    """True when the kernel takes heads of head_dim elements."""
    return 2 <= head_dim <= MAX_HEAD_DIM and head_dim % 2 == 0


def reference(x: np.ndarray, weight: np.ndarray, eps: float, positions: np.ndarray, rope_dim: int, theta: float,
              freq_scale: float, freq_factors: np.ndarray | None = None, rope_type: str = "norm") -> np.ndarray:
    """float32 [n_tokens, n_heads, head_dim]: each head of x RMS-normalized with `weight`, rounded to float32 (as the
    norm's launch stored it where the two were apart), then rotated."""
    n_tokens, n_heads, head_dim = x.shape
    normed = rmsnorm.reference(np.asarray(x, np.float32).reshape(-1, head_dim), weight, eps).astype(np.float32)
    rotated = rope.reference(normed.reshape(n_tokens, n_heads, head_dim), positions, rope_dim, theta, freq_scale,
                             freq_factors, rope_type)
    return rotated.astype(np.float32)


@cpu_kernel(ENTRY, SIGNATURE)
def _host(dev: CpuDevice, grid: Dim3, block: Dim3, q: int, k: int, v: int, q_weight: int, k_weight: int,
          positions: int, freq_factors: int, n_tokens: int, n_heads: int, n_kv_heads: int, head_dim: int,
          rope_dim: int, neox: int, eps: float, theta: float, freq_scale: float, k_pool: int, v_pool: int, slots: int,
          block_size: int, num_blocks: int, kv_format: int) -> None:
    rope_type = "neox" if neox else "norm"
    pos = dev.view(positions, np.int32, n_tokens)
    factors = rope.host_factors(dev, freq_factors, rope_dim)
    results = {}
    for name, ptr, weight, heads in (("q", q, q_weight, n_heads), ("k", k, k_weight, n_kv_heads)):
        view = dev.view(ptr, np.float32, (n_tokens, heads, head_dim))
        results[name] = reference(view, dev.view(weight, np.float32, head_dim), eps, pos, rope_dim, theta,
                                  freq_scale, factors, rope_type)
    dev.view(q, np.float32, (n_tokens, n_heads, head_dim))[:] = results["q"]
    if not kv_format:
        dev.view(k, np.float32, (n_tokens, n_kv_heads, head_dim))[:] = results["k"]
        return
    v_rows = dev.view(v, np.float32, (n_tokens, n_kv_heads * head_dim))
    kv_store.store_host_rows(dev, k_pool, v_pool, slots, block_size, num_blocks, kv_format,
                             results["k"].reshape(n_tokens, -1), v_rows, head_dim)


def launch(device: Device, stream: Stream | None, q: Any, k: Any, v: Any, q_weight: Any, k_weight: Any,
           positions: Any, *, n_tokens: int, n_heads: int, n_kv_heads: int, head_dim: int, rope_dim: int, eps: float,
           theta: float, freq_scale: float = 1.0, freq_factors: Any = None, rope_type: str = "norm",
           kv_target: kv_store.EpilogueTarget | None = None) -> None:
    """Normalize and rotate every head of q and k (float32 [n_tokens, heads, head_dim]) in place with the head_dim
    weights q_weight and k_weight, RoPE in the rope_type layout; with kv_target, k and v (float32 [n_tokens,
    n_kv_heads, head_dim]) go into its pools instead (k's buffer then keeps what the products wrote)."""
    if rope_type not in ROPE_TYPES:
        raise ValueError(f"{OP}: rope_type must be 'norm' or 'neox', not {rope_type!r}")
    check_sizes(OP, n_tokens=n_tokens, n_heads=n_heads, n_kv_heads=n_kv_heads, head_dim=head_dim, rope_dim=rope_dim)
    if not supports(head_dim) or rope_dim % 2 or rope_dim > head_dim:
        raise ValueError(f"{OP}: head_dim must be even and at most {MAX_HEAD_DIM}, rope_dim even and at most head_dim; "
                         f"got {head_dim} and {rope_dim}")
    if not theta > 0 or not freq_scale > 0:
        raise ValueError(f"{OP}: theta and freq_scale must be positive, got {theta} and {freq_scale}")
    heads = n_heads + 2 * n_kv_heads
    if n_tokens * heads > INT32_MAX:
        raise ValueError(f"{OP}: {n_tokens} tokens of {heads} heads exceed the kernel's int32 count")
    check_memory(OP, "q", q, n_tokens * n_heads * head_dim * 4)
    for name, buf in (("k", k), ("v", v)):
        check_memory(OP, name, buf, n_tokens * n_kv_heads * head_dim * 4)
    for name, buf in (("q_weight", q_weight), ("k_weight", k_weight)):
        check_memory(OP, name, buf, head_dim * 4)
    check_memory(OP, "positions", positions, n_tokens * 4)
    factors = rope.factors_arg(OP, freq_factors, rope_dim)
    target = kv_store.NO_EPILOGUE_TARGET_ARGS if kv_target is None else kv_target.args()
    if kv_target is not None:
        check_memory(OP, "slots", kv_target.slots, n_tokens * 4)
    items = n_tokens * (n_heads + n_kv_heads + (n_kv_heads if kv_target is not None else 0))
    # programmatic: the kernel waits for the products ahead first (hip_compat.h: rf_grid_dependency_sync)
    kernel = get_kernel(device, OP, ENTRY, SIGNATURE, programmatic=True)
    kernel.launch(min(items, ELEMENTWISE_MAX_BLOCKS), THREADS,
                  (q, k, v, q_weight, k_weight, positions, factors, n_tokens, n_heads, n_kv_heads, head_dim, rope_dim,
                   ROPE_TYPES[rope_type], eps, theta, freq_scale, *target), stream=stream)
