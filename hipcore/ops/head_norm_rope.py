"""head_norm_rope: what comes between the q|k|v products and attention, in one launch: the biases (gpt-oss), the
per-head norms (qwen3, gemma3), RoPE of q and k, and the store of k and v into the paged cache.

Kernel `head_norm_rope_f32` (q p, k p, v p, q_weight p, k_weight p, q_bias p, k_bias p, v_bias p, positions p,
freq_factors p, n_tokens i, n_heads i, n_kv_heads i, head_dim i, rope_dim i, neox i, eps f, theta f, freq_scale f,
k_pool p, v_pool p, slots p, block_size i, num_blocks i, kv_format i) (kernels/head_norm_rope.hip): every head of q
[n_tokens, n_heads, head_dim] and of k [n_tokens, n_kv_heads, head_dim] becomes rope(rmsnorm(head + bias) * weight),
the bias as add_bias adds it (none where null), rmsnorm as rmsnorm.py's (none where the weights are null) and RoPE as
rope.py's in the model's layout (neox 0: NORM, 1: NEOX): the same bits as those launches one after another. Without a
cache target (kv_format 0) q and k are written in place, v too where it has a bias; with one
(kv_store.EpilogueTarget: f16, bf16 or f32 pools) q is written in place and k and v (its bias added) go into the pools
at each token's slot instead, the bytes kv_store would write, and that launch leaves the step. One workgroup of 64
threads a head, grid-stride. On an NVIDIA H100 gpt-oss-20b's q, k and v biases, two RoPEs and kv_store took six
launches of 1.2-1.7 us each at 8 tokens (8.1 us a layer, 179dedf's profile).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from hipcore.ops import add_bias, kv_store, rmsnorm, rope
from hipcore.ops.launch_checks import ELEMENTWISE_MAX_BLOCKS, INT32_MAX, check_memory, check_sizes
from hipcore.runtime.cpu import CpuDevice, cpu_kernel
from hipcore.runtime.device import Device, Dim3, Stream
from hipcore.runtime.kernels import get_kernel

OP = "head_norm_rope"
ENTRY = "head_norm_rope_f32"
SIGNATURE = "ppppppppppiiiiiifffpppiii"
THREADS = 64
MAX_HEAD_DIM = 512  # the kernel's shared row (kMaxHeadDim)
ROPE_TYPES = {"norm": 0, "neox": 1}


def supports(head_dim: int) -> bool:
    """True when the kernel takes heads of head_dim elements."""
    return 2 <= head_dim <= MAX_HEAD_DIM and head_dim % 2 == 0


def reference(x: np.ndarray, weight: np.ndarray | None, eps: float, positions: np.ndarray, rope_dim: int,
              theta: float, freq_scale: float, freq_factors: np.ndarray | None = None, rope_type: str = "norm",
              bias: np.ndarray | None = None) -> np.ndarray:
    """float32 [n_tokens, n_heads, head_dim]: each head of x plus its bias (heads * head_dim floats, or None),
    RMS-normalized with `weight` (None: not normalized), each rounded to float32 (as the launches stored them where
    they were apart), then rotated."""
    n_tokens, n_heads, head_dim = x.shape
    x = np.asarray(x, np.float32)
    if bias is not None:
        x = add_bias.reference(x.reshape(n_tokens, -1), bias).reshape(x.shape)
    normed = x if weight is None else \
        rmsnorm.reference(x.reshape(-1, head_dim), weight, eps).astype(np.float32).reshape(x.shape)
    rotated = rope.reference(normed.reshape(n_tokens, n_heads, head_dim), positions, rope_dim, theta, freq_scale,
                             freq_factors, rope_type)
    return rotated.astype(np.float32)


def _pointer(buf: Any) -> Any:
    """The kernel argument for an optional buffer: 0 (null) where it is not given."""
    return 0 if buf is None else buf


@cpu_kernel(ENTRY, SIGNATURE)
def _host(dev: CpuDevice, grid: Dim3, block: Dim3, q: int, k: int, v: int, q_weight: int, k_weight: int, q_bias: int,
          k_bias: int, v_bias: int, positions: int, freq_factors: int, n_tokens: int, n_heads: int, n_kv_heads: int,
          head_dim: int, rope_dim: int, neox: int, eps: float, theta: float, freq_scale: float, k_pool: int,
          v_pool: int, slots: int, block_size: int, num_blocks: int, kv_format: int) -> None:
    rope_type = "neox" if neox else "norm"
    pos = dev.view(positions, np.int32, n_tokens)
    factors = rope.host_factors(dev, freq_factors, rope_dim)
    results = {}
    for name, ptr, weight, bias, heads in (("q", q, q_weight, q_bias, n_heads), ("k", k, k_weight, k_bias, n_kv_heads)):
        view = dev.view(ptr, np.float32, (n_tokens, heads, head_dim))
        results[name] = reference(view, dev.view(weight, np.float32, head_dim) if weight else None, eps, pos, rope_dim,
                                  theta, freq_scale, factors, rope_type,
                                  dev.view(bias, np.float32, heads * head_dim) if bias else None)
    dev.view(q, np.float32, (n_tokens, n_heads, head_dim))[:] = results["q"]
    v_rows = dev.view(v, np.float32, (n_tokens, n_kv_heads * head_dim))
    if v_bias:
        v_rows = add_bias.reference(v_rows, dev.view(v_bias, np.float32, n_kv_heads * head_dim))
    if not kv_format:
        dev.view(k, np.float32, (n_tokens, n_kv_heads, head_dim))[:] = results["k"]
        if v_bias:
            dev.view(v, np.float32, (n_tokens, n_kv_heads * head_dim))[:] = v_rows
        return
    kv_store.store_host_rows(dev, k_pool, v_pool, slots, block_size, num_blocks, kv_format,
                             results["k"].reshape(n_tokens, -1), v_rows, head_dim)


def launch(device: Device, stream: Stream | None, q: Any, k: Any, v: Any, q_weight: Any, k_weight: Any,
           positions: Any, *, n_tokens: int, n_heads: int, n_kv_heads: int, head_dim: int, rope_dim: int, eps: float,
           theta: float, freq_scale: float = 1.0, freq_factors: Any = None, rope_type: str = "norm",
           kv_target: kv_store.EpilogueTarget | None = None, biases: tuple[Any, Any, Any] | None = None) -> None:
    """Add the biases (q's, k's and v's rows: heads * head_dim floats each, where given), normalize every head of q
    and k (float32 [n_tokens, heads, head_dim]) with the head_dim weights q_weight and k_weight (both None: no norm)
    and rotate it in place, RoPE in the rope_type layout; with kv_target, k and v (float32 [n_tokens, n_kv_heads,
    head_dim]) go into its pools instead (k's and v's buffers then keep what the products wrote); without one, v
    takes its bias in place."""
    if rope_type not in ROPE_TYPES:
        raise ValueError(f"{OP}: rope_type must be 'norm' or 'neox', not {rope_type!r}")
    check_sizes(OP, n_tokens=n_tokens, n_heads=n_heads, n_kv_heads=n_kv_heads, head_dim=head_dim, rope_dim=rope_dim)
    if not supports(head_dim) or rope_dim % 2 or rope_dim > head_dim:
        raise ValueError(f"{OP}: head_dim must be even and at most {MAX_HEAD_DIM}, rope_dim even and at most head_dim; "
                         f"got {head_dim} and {rope_dim}")
    if not theta > 0 or not freq_scale > 0:
        raise ValueError(f"{OP}: theta and freq_scale must be positive, got {theta} and {freq_scale}")
    if (q_weight is None) != (k_weight is None):
        raise ValueError(f"{OP}: q_weight and k_weight go together (both None: no per-head norm)")
    q_bias, k_bias, v_bias = biases if biases is not None else (None, None, None)
    heads = n_heads + 2 * n_kv_heads
    if n_tokens * heads > INT32_MAX:
        raise ValueError(f"{OP}: {n_tokens} tokens of {heads} heads exceed the kernel's int32 count")
    check_memory(OP, "q", q, n_tokens * n_heads * head_dim * 4)
    for name, buf in (("k", k), ("v", v)):
        check_memory(OP, name, buf, n_tokens * n_kv_heads * head_dim * 4)
    for name, buf in (("q_weight", q_weight), ("k_weight", k_weight)):
        if buf is not None:
            check_memory(OP, name, buf, head_dim * 4)
    for name, buf, rows in (("q_bias", q_bias, n_heads), ("k_bias", k_bias, n_kv_heads),
                            ("v_bias", v_bias, n_kv_heads)):
        if buf is not None:
            check_memory(OP, name, buf, rows * head_dim * 4)
    check_memory(OP, "positions", positions, n_tokens * 4)
    factors = rope.factors_arg(OP, freq_factors, rope_dim)
    target = kv_store.NO_EPILOGUE_TARGET_ARGS if kv_target is None else kv_target.args()
    if kv_target is not None:
        check_memory(OP, "slots", kv_target.slots, n_tokens * 4)
    items = n_tokens * (n_heads + n_kv_heads + (n_kv_heads if kv_target is not None or v_bias is not None else 0))
    # programmatic: the kernel waits for the products ahead first (hip_compat.h: rf_grid_dependency_sync)
    kernel = get_kernel(device, OP, ENTRY, SIGNATURE, programmatic=True)
    kernel.launch(min(items, ELEMENTWISE_MAX_BLOCKS), THREADS,
                  (q, k, v, *map(_pointer, (q_weight, k_weight, q_bias, k_bias, v_bias)), positions, factors,
                   n_tokens, n_heads, n_kv_heads, head_dim, rope_dim, ROPE_TYPES[rope_type], eps, theta, freq_scale,
                   *target), stream=stream)
