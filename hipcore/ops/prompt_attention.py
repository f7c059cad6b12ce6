"""prompt_attention: paged_attention's causal grouped-query attention for prompt steps, on the matrix cores.

The same result as paged_attention (its reference, its rules for windows, soft caps and padding) for an f16
KV cache, computed the way a prompt wants it: a workgroup takes 16 to 64 consecutive query tokens and the query
heads of one KV head, loads each K and V row once for all of them, and runs both products (q . K and the
softmax weights . V) as f16 matrix instructions (kernels/prompt_attention.hip). paged_attention serves one
token per workgroup on the FMA units: at a 512-token prompt of an 8B model it took 229 us a layer on an NVIDIA
H100, of Gemma-2-9B (heads of 256) 424 us on an H200.

Kernels `prompt_attention_f16_d<head_dim>` and, for the head sizes of the models that cap their scores
(SOFTCAP_HEAD_DIMS: Gemma 2's), `prompt_attention_f16_d<head_dim>_softcap` (kernels/prompt_attention.hip; one
per head size, each with the registers of its own accumulators), signature
    (out p, q p, k_pool p, v_pool p, block_tables p, token_seq p, positions p,
     n_tokens i, n_heads i, n_kv_heads i, head_dim i, block_size i, max_blocks i, num_blocks i, window i, scale f,
     out_f16 i, softcap f)
with paged_attention's layouts. A workgroup has 4 warps: for a head up to 128 each holds a tile of 16 query
rows (64 query tokens a workgroup at most), for a head of 256 two share one, each with half its output's
columns (32 tokens; its tiles' shared memory and accumulators, the kernel's Tile). The forward pass takes it
(`takes`) for steps that are not decode steps, of at least MIN_TOKENS tokens, with an f16 cache, a head size of
HEAD_DIMS (and of SOFTCAP_HEAD_DIMS with a soft cap), on a GPU with matrix cores (matmul_mma.has_matrix_cores);
a head of 256 not on RDNA4 (that entry spills a few registers there); everything else stays on paged_attention.
With sinks (gpt-oss's attn_sinks, a logit per query head: paged_attention's rule, the sink joins each softmax's max
and denominator and adds no value) the entries `prompt_attention_f16_d<head_dim>_sinks` for SINKS_HEAD_DIMS take
`sinks p` last (SINKS_SIGNATURE); no soft cap with them (gpt-oss has none).

Precision: q (scaled) and the weights are rounded to f16, K and V are the cache's f16 values, the products
are exact and summed in f32 (tests/support/forward_pass_samples.py's matrix_core_tolerance bounds the
difference from the reference).
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np

from hipcore.ops import paged_attention
from hipcore.ops.launch_checks import check_disjoint, check_memory
from hipcore.ops.matmul_mma import has_matrix_cores
from hipcore.kvcache.dtypes import KV_DTYPES
from hipcore.runtime.cpu import CpuDevice, cpu_kernel
from hipcore.runtime.device import Device, Stream
from hipcore.runtime.kernels import get_kernel, wavefront_size

OP = "prompt_attention"
SIGNATURE = "ppppppp iiiiiiii f i f"
SINKS_SIGNATURE = SIGNATURE + " p"
WARPS = 4  # per workgroup: the kernel's launch bounds
WIDE_COLUMN_SPLIT = 2  # warps that share a tile of query rows for a head of WIDE_HEAD_DIM, each with its columns
ROWS = 16  # query tokens per row tile: one matrix tile
HEAD_DIM_MULTIPLE = 16
NARROW_MAX_HEAD_DIM = 128
WIDE_HEAD_DIM = 256  # Gemma's heads (the kernel's wide Tile)
HEAD_DIMS = (*range(HEAD_DIM_MULTIPLE, NARROW_MAX_HEAD_DIM + 1, HEAD_DIM_MULTIPLE), WIDE_HEAD_DIM)  # an entry each
SOFTCAP_HEAD_DIMS = (NARROW_MAX_HEAD_DIM, WIDE_HEAD_DIM)  # Gemma 2's heads (27B; 2B and 9B): a capped entry each
SINKS_HEAD_DIMS = (32, 64)  # gpt-oss's heads of 64, and the tiny test models' 32: an entry with sinks each
MIN_TOKENS = 32  # fewer query tokens: paged_attention (a workgroup's 16-64 token tile would be mostly empty)
KV_DTYPE = "f16"
_RDNA4 = re.compile(r"gfx12[0-9a-f]{2}$")


def kernel_name(head_dim: int, softcap: bool = False, sinks: bool = False) -> str:
    return f"prompt_attention_{KV_DTYPE}_d{head_dim}" + ("_softcap" if softcap else "") + ("_sinks" if sinks else "")


KERNEL_NAMES = (*(kernel_name(d) for d in HEAD_DIMS), *(kernel_name(d, True) for d in SOFTCAP_HEAD_DIMS),
                *(kernel_name(d, sinks=True) for d in SINKS_HEAD_DIMS))


def row_tiles(head_dim: int) -> int:
    """A workgroup's tiles of 16 query rows for this head size (the kernel's Tile: one a warp, one per two warps for
    a head of 256)."""
    return WARPS // WIDE_COLUMN_SPLIT if head_dim > NARROW_MAX_HEAD_DIM else WARPS


def heads_per_workgroup(n_heads: int, n_kv_heads: int, head_dim: int) -> int:
    """Query heads one workgroup serves: 4, 2 or 1, the most that divides the group and the row tiles (the
    kernel's hpw)."""
    group = n_heads // n_kv_heads
    return 4 if row_tiles(head_dim) % 4 == 0 and group % 4 == 0 else 2 if group % 2 == 0 else 1


def tokens_per_workgroup(n_heads: int, n_kv_heads: int, head_dim: int) -> int:
    """Consecutive query tokens one workgroup serves: 16 per row tile, the row tiles not spent on heads."""
    return ROWS * (row_tiles(head_dim) // heads_per_workgroup(n_heads, n_kv_heads, head_dim))


def geometry(arch: str, n_tokens: int, n_heads: int, n_kv_heads: int, head_dim: int) -> tuple[int, int]:
    """(grid, block): a workgroup of 4 warps per (query tile, KV head, chunk of the group's query heads)."""
    chunks = (n_heads // n_kv_heads) // heads_per_workgroup(n_heads, n_kv_heads, head_dim)
    tiles = -(-n_tokens // tokens_per_workgroup(n_heads, n_kv_heads, head_dim))
    return tiles * n_kv_heads * chunks, WARPS * wavefront_size(arch)


def supports(kv_dtype: str, head_dim: int, softcap: float = 0.0, sinks: bool = False) -> bool:
    """Whether a kernel computes attention of this cache format, head size, soft cap and sinks (not both)."""
    if sinks:
        return kv_dtype == KV_DTYPE and not softcap and head_dim in SINKS_HEAD_DIMS
    return kv_dtype == KV_DTYPE and head_dim in (SOFTCAP_HEAD_DIMS if softcap else HEAD_DIMS)


def takes(arch: str, n_tokens: int, kv_dtype: str, head_dim: int, softcap: float = 0.0, sinks: bool = False) -> bool:
    """Whether a step of n_tokens query tokens that is not a decode step runs its attention here on `arch`
    (the rest: paged_attention). Decode steps never do: each of their tokens is its own sequence, which
    would leave 15 of a warp's 16 rows empty. A head of 256 not on RDNA4: that entry spills 16-24 bytes
    there (its WMMA fragments hold 16 halves a lane, twice NVIDIA's and CDNA's)."""
    if head_dim > NARROW_MAX_HEAD_DIM and _RDNA4.match(arch):
        return False
    return n_tokens >= MIN_TOKENS and has_matrix_cores(arch) and supports(kv_dtype, head_dim, softcap, sinks)


def _register(head_dim: int, capped: bool, with_sinks: bool = False) -> None:
    @cpu_kernel(kernel_name(head_dim, capped, with_sinks), (SINKS_SIGNATURE if with_sinks else SIGNATURE).replace(" ", ""))
    def host(dev: CpuDevice, grid, block, out: int, q: int, k_pool: int, v_pool: int, block_tables: int,
             token_seq: int, positions: int, n_tokens: int, n_heads: int, n_kv_heads: int, head_dim: int,
             block_size: int, max_blocks: int, num_blocks: int, window: int, scale: float, out_f16: int,
             softcap: float, sinks: int = 0) -> None:
        fmt = KV_DTYPES[KV_DTYPE]
        pool_shape = (num_blocks, n_kv_heads, block_size, fmt.row_bytes(head_dim))
        seqs = dev.view(token_seq, np.int32, n_tokens)
        n_seqs = int(seqs.max()) + 1 if n_tokens else 0
        result = paged_attention.reference(
            dev.view(q, np.float32, (n_tokens, n_heads, head_dim)),
            dev.view(k_pool, np.uint8, pool_shape), dev.view(v_pool, np.uint8, pool_shape), fmt,
            dev.view(block_tables, np.int32, (n_seqs, max_blocks)), seqs,
            dev.view(positions, np.int32, n_tokens), scale, window, softcap if capped else 0.0,
            dev.view(sinks, np.float32, n_heads) if with_sinks else None)
        # computed in full first: out may be q
        dev.view(out, np.float16 if out_f16 else np.float32, (n_tokens, n_heads, head_dim))[:] = result


for _head_dim in HEAD_DIMS:
    _register(_head_dim, False)
for _head_dim in SOFTCAP_HEAD_DIMS:
    _register(_head_dim, True)
for _head_dim in SINKS_HEAD_DIMS:
    _register(_head_dim, False, with_sinks=True)


def launch(device: Device, stream: Stream | None, out, q, k_pool, v_pool, block_tables, token_seq, positions, *,
           n_tokens: int, n_heads: int, n_kv_heads: int, head_dim: int, block_size: int, max_blocks: int,
           num_blocks: int, scale: float, window: int = 0, softcap: float = 0.0, out_f16: bool = False,
           sinks: Any = None) -> None:
    """Queue attention for n_tokens query tokens of an f16 cache (paged_attention's arguments and result; no
    workspace); softcap > 0 caps the scaled scores (Gemma 2), 0 leaves them; out_f16: out receives f16 values (for
    an o product reading f16 x) instead of float32, and may not overlap q; sinks: float32 [n_heads] (gpt-oss).
    The caller checks `supports` first; this raises ValueError otherwise."""
    name = kernel_name(head_dim, softcap > 0, sinks is not None)
    if not (np.isfinite(softcap) and softcap >= 0):
        raise ValueError(f"{name}: softcap must be 0 (none) or a positive finite cap, got {softcap}")
    if not supports(KV_DTYPE, head_dim, softcap, sinks is not None):
        sizes = SINKS_HEAD_DIMS if sinks is not None and not softcap else SOFTCAP_HEAD_DIMS if softcap else HEAD_DIMS
        what = " with a soft cap" if softcap else ""
        what += " with sinks" if sinks is not None else ""
        raise ValueError(f"{OP}: no entry for head_dim {head_dim}{what}; have {', '.join(map(str, sizes))}"
                         + (" (none with both a cap and sinks)" if softcap and sinks is not None else ""))
    if sinks is not None:
        check_memory(name, "sinks", sinks, n_heads * 4)
    paged_attention.check_operands(name, KV_DTYPE, out, q, k_pool, v_pool, block_tables, token_seq, positions,
                                   n_tokens=n_tokens, n_heads=n_heads, n_kv_heads=n_kv_heads, head_dim=head_dim,
                                   block_size=block_size, max_blocks=max_blocks, num_blocks=num_blocks, window=window,
                                   head_dim_multiple=HEAD_DIM_MULTIPLE, max_head_dim=WIDE_HEAD_DIM,
                                   out_itemsize=2 if out_f16 else 4)
    if out_f16:  # out may be q only at q's layout: f16 rows land where other workgroups' q rows are still read
        rows = n_tokens * n_heads * head_dim
        check_disjoint(name, ("out", out, rows * 2), ("q", q, rows * 4))
    grid, block = geometry(device.arch, n_tokens, n_heads, n_kv_heads, head_dim)
    # programmatic: the entry waits for the kernel ahead first (hip_compat.h: rf_grid_dependency_sync)
    kernel = get_kernel(device, OP, name, (SIGNATURE if sinks is None else SINKS_SIGNATURE).replace(" ", ""),
                        programmatic=True)
    kernel.launch(grid, block,
                  [out, q, k_pool, v_pool, block_tables, token_seq, positions, n_tokens, n_heads, n_kv_heads, head_dim,
                   block_size, max_blocks, num_blocks, window, scale, int(bool(out_f16)), float(softcap),
                   *(() if sinks is None else (sinks,))], stream=stream)
