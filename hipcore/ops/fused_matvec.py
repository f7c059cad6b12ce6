"""fused_matvec: matrix-vector products with the layer's small ops folded in (the decode path).

Kernels (kernels/fused_matvec.hip), for W of type q4_1, q5_0, q5_1, q8_0, f16, bf16 or f32 in its GGUF block layout:

  matvec_norm_rope_<t>(q p, k p, v p, W p, x p, g p, positions p, freq_factors p, q_rows i, kv_rows i, cols i,
                       batch i, head_dim i, rope_dim i, eps f, theta f, freq_scale f)
      [q | k | v] = rmsnorm(x) * g @ W^T, RoPE (NORM mode) on q and k at each batch row's position,
      W = [W_q; W_k; W_v] ([q_rows + 2 kv_rows, cols]); q [batch, q_rows], k and v [batch, kv_rows];
      freq_factors float32 [rope_dim / 2] divide the frequencies (rope.py), or a null pointer
  matvec_norm_swiglu_<t>(y p, W p, x p, g p, rows i, cols i, batch i, eps f)
      y = silu(n @ W_gate^T) * (n @ W_up^T), n = rmsnorm(x) * g, W = [W_gate; W_up] ([2 rows, cols])
  matvec_add_<t>(y p, W p, x p, rows i, cols i, batch i)
      y += x @ W^T (the residual connection)
  matvec_norm_<t>(y p, W p, x p, g p, rows i, cols i, batch i, eps f)
      y = rmsnorm(x) * g @ W^T (the output head)

x is float32 [batch, cols], g float32 [cols]. Each replaces a chain of the single ops (rmsnorm,
matvec, rope, silu_mul, add) and equals that chain up to float32 rounding: the references below are
those chains, computed in float64. Geometry: a warp takes two rows of W at a time; 256-thread blocks
for large matrices, 64-thread ones below BIG_MATRIX_ROW_GROUPS pairs (as matvec.py).

The first three have *_split_<t> twins (same arguments) in which a block's SPLIT warps share each row pair's
columns, their sums added in a fixed order: the launchers take them for batches of small matrices
(split_columns), whose passes would otherwise run too few warps to hide the memory latency.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from hipcore.ops import rmsnorm, rope, silu_mul
from hipcore.ops.launch_checks import check_disjoint, check_memory, check_qkv_rope, check_sizes
from hipcore.ops.matvec import WEIGHT_ALIGNMENT, dequantize_rows, row_bytes
from hipcore.runtime.cpu import CpuDevice, cpu_kernel
from hipcore.runtime.device import Device, Dim3, Stream
from hipcore.runtime.kernels import get_kernel, wavefront_size

OP = "fused_matvec"
WEIGHT_TYPES = ("q4_1", "q5_0", "q5_1", "q8_0", "f16", "bf16", "f32")
SIGNATURES = {
    "matvec_norm_rope": "ppppppppiiiiiifff",
    "matvec_norm_swiglu": "ppppiiif",
    "matvec_add": "pppiii",
    "matvec_norm": "ppppiiif",
}
BIG_MATRIX_ROW_GROUPS = 4096
SPLIT = 4  # warps per row pair in the *_split_* entries (kernels/fused_matvec.hip: kSplit)
# Batches from this size take the split entries on matrices of fewer than SPLIT_MAX_GROUPS row pairs (gate|up: rows).
# Measured on an NVIDIA H100 80GB HBM3 with the demo model's shapes at 8 tokens
# (docs/history/2026-11-27-overlapped-decode-steps.md): down (288 pairs) 11.4 -> 5.4 us, q|k|v (480) 10.2 -> 4.9, o
# (288) 7.4 -> 4.2, but gate|up (1,536) 8.6 -> 9.4; at one token the split was slower (tg128 1,538 -> 1,496 t/s).
SPLIT_MIN_BATCH = 2
SPLIT_MAX_GROUPS = 1024
VECTOR_ALIGNMENT = 16  # x and g are read with 16-byte loads
HOST_ROWS_PER_CHUNK = 4096


def supports(weight_type: str) -> bool:
    """True when the fused kernels read matrices of this type (others take the single ops)."""
    return weight_type in WEIGHT_TYPES


# ---- references (float64 chains of the single ops) ----------------------------------------------


def _weights(w_raw: np.ndarray, weight_type: str, rows: int, cols: int) -> np.ndarray:
    raw = np.ascontiguousarray(w_raw, dtype=np.uint8).reshape(rows, row_bytes(weight_type, cols))
    return dequantize_rows(raw, weight_type, cols, np.float64)


def reference_norm(w_raw, weight_type, x, g, eps, rows, cols) -> np.ndarray:
    """float64 [batch, rows] = rmsnorm(x) * g @ W^T."""
    n = rmsnorm.reference(np.asarray(x, dtype=np.float32).reshape(-1, cols), g, eps)
    return n @ _weights(w_raw, weight_type, rows, cols).T


def reference_norm_rope(w_raw, weight_type, x, g, eps, positions, q_rows, kv_rows, cols, head_dim, rope_dim, theta,
                        freq_scale, freq_factors=None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """float64 (q [batch, q_rows], k [batch, kv_rows], v [batch, kv_rows])."""
    y = reference_norm(w_raw, weight_type, x, g, eps, q_rows + 2 * kv_rows, cols)
    batch = y.shape[0]
    q = rope.reference(y[:, :q_rows].reshape(batch, -1, head_dim), positions, rope_dim, theta, freq_scale, freq_factors)
    k = rope.reference(y[:, q_rows:q_rows + kv_rows].reshape(batch, -1, head_dim), positions, rope_dim, theta, freq_scale,
                       freq_factors)
    return q.reshape(batch, q_rows), k.reshape(batch, kv_rows), y[:, q_rows + kv_rows:]


def reference_norm_swiglu(w_raw, weight_type, x, g, eps, rows, cols) -> np.ndarray:
    """float64 [batch, rows] = silu(n @ W_gate^T) * (n @ W_up^T)."""
    y = reference_norm(w_raw, weight_type, x, g, eps, 2 * rows, cols)
    return silu_mul.reference(y[:, :rows], y[:, rows:])


def reference_add(w_raw, weight_type, x, y, rows, cols) -> np.ndarray:
    """float64 [batch, rows] = y + x @ W^T."""
    xs = np.asarray(x, dtype=np.float64).reshape(-1, cols)
    return np.asarray(y, dtype=np.float64).reshape(-1, rows) + xs @ _weights(w_raw, weight_type, rows, cols).T


# ---- host kernels (the cpu backend): float32 BLAS products, float64 where the references are ------


def _product(dev: CpuDevice, w: int, weight_type: str, xs: np.ndarray, rows: int, cols: int) -> np.ndarray:
    """float32 [batch, rows] = xs @ W^T, W decoded a chunk of rows at a time."""
    raw = dev.view(w, np.uint8, (rows, row_bytes(weight_type, cols)))
    if weight_type == "f32":
        return xs @ raw.view(np.float32).T
    out = np.empty((xs.shape[0], rows), dtype=np.float32)
    for start in range(0, rows, HOST_ROWS_PER_CHUNK):
        chunk = dequantize_rows(raw[start:start + HOST_ROWS_PER_CHUNK], weight_type, cols)
        out[:, start:start + chunk.shape[0]] = xs @ chunk.T
    return out


def _normed(dev: CpuDevice, x: int, g: int, batch: int, cols: int, eps: float) -> np.ndarray:
    return rmsnorm.reference(dev.view(x, np.float32, (batch, cols)), dev.view(g, np.float32, cols), eps).astype(np.float32)


def _register(weight_type: str) -> None:
    @cpu_kernel(f"matvec_norm_rope_split_{weight_type}", SIGNATURES["matvec_norm_rope"])
    @cpu_kernel(f"matvec_norm_rope_{weight_type}", SIGNATURES["matvec_norm_rope"])
    def norm_rope(dev, grid, block, q, k, v, w, x, g, positions, freq_factors, q_rows, kv_rows, cols, batch, head_dim,
                  rope_dim, eps, theta, freq_scale):
        y = _product(dev, w, weight_type, _normed(dev, x, g, batch, cols, eps), q_rows + 2 * kv_rows, cols)
        pos = dev.view(positions, np.int32, batch)
        factors = rope.host_factors(dev, freq_factors, rope_dim)
        for out, lo, hi, rotate in ((q, 0, q_rows, True), (k, q_rows, q_rows + kv_rows, True),
                                    (v, q_rows + kv_rows, q_rows + 2 * kv_rows, False)):
            part = y[:, lo:hi]
            if rotate:
                part = rope.reference(part.reshape(batch, -1, head_dim), pos, rope_dim, theta, freq_scale,
                                      factors).reshape(batch, -1)
            dev.view(out, np.float32, (batch, hi - lo))[:] = part

    @cpu_kernel(f"matvec_norm_swiglu_split_{weight_type}", SIGNATURES["matvec_norm_swiglu"])
    @cpu_kernel(f"matvec_norm_swiglu_{weight_type}", SIGNATURES["matvec_norm_swiglu"])
    def norm_swiglu(dev, grid, block, y, w, x, g, rows, cols, batch, eps):
        both = _product(dev, w, weight_type, _normed(dev, x, g, batch, cols, eps), 2 * rows, cols)
        dev.view(y, np.float32, (batch, rows))[:] = silu_mul.reference(both[:, :rows], both[:, rows:])

    @cpu_kernel(f"matvec_add_split_{weight_type}", SIGNATURES["matvec_add"])
    @cpu_kernel(f"matvec_add_{weight_type}", SIGNATURES["matvec_add"])
    def add(dev, grid, block, y, w, x, rows, cols, batch):
        dev.view(y, np.float32, (batch, rows))[:] += _product(dev, w, weight_type, dev.view(x, np.float32, (batch, cols)),
                                                              rows, cols)

    @cpu_kernel(f"matvec_norm_{weight_type}", SIGNATURES["matvec_norm"])
    def norm(dev, grid, block, y, w, x, g, rows, cols, batch, eps):
        dev.view(y, np.float32, (batch, rows))[:] = _product(dev, w, weight_type, _normed(dev, x, g, batch, cols, eps),
                                                             rows, cols)


for _type in WEIGHT_TYPES:
    _register(_type)


# ---- launchers ---------------------------------------------------------------------------------


def geometry(arch: str, groups: int, split: bool = False) -> tuple[int, int]:
    """(grid, block) for `groups` row pairs on a device of architecture `arch` (split: a block per row pair)."""
    if split:
        return groups, SPLIT * wavefront_size(arch)
    threads = 256 if groups >= BIG_MATRIX_ROW_GROUPS else 64
    warps_per_block = max(1, threads // wavefront_size(arch))
    return -(-groups // warps_per_block), threads


def split_columns(groups: int, batch: int) -> bool:
    """Whether a product of `groups` row pairs (gate|up: rows) over `batch` rows takes the split entries."""
    return batch >= SPLIT_MIN_BATCH and groups < SPLIT_MAX_GROUPS


def _check_matrix(op: str, w: Any, weight_type: str, rows: int, cols: int, batch: int, x: Any, g: Any | None) -> None:
    if weight_type not in WEIGHT_TYPES:
        raise ValueError(f"{op}: no fused kernel for weight type {weight_type!r}; have {', '.join(WEIGHT_TYPES)}")
    check_sizes(op, rows=rows, cols=cols, batch=batch)
    if cols % 32:
        raise ValueError(f"{op}: cols must be a multiple of 32 (the GGUF block size), got {cols}")
    check_memory(op, "W", w, rows * row_bytes(weight_type, cols), WEIGHT_ALIGNMENT[weight_type])
    check_memory(op, "x", x, batch * cols * 4, VECTOR_ALIGNMENT)
    if g is not None:
        check_memory(op, "g", g, cols * 4, VECTOR_ALIGNMENT)


def _launch(device: Device, stream: Stream | None, entry: str, weight_type: str, groups: int, args: tuple,
            batch: int = 1) -> None:
    split = entry != "matvec_norm" and split_columns(groups, batch)
    grid, block = geometry(device.arch, groups, split)
    name = f"{entry}_split_{weight_type}" if split else f"{entry}_{weight_type}"
    # programmatic: the entries wait for the kernel ahead first (hip_compat.h: rf_grid_dependency_sync)
    kernel = get_kernel(device, OP, name, SIGNATURES[entry], programmatic=True)
    kernel.launch(grid, block, args, stream=stream)


def launch_norm_rope(device: Device, stream: Stream | None, q: Any, k: Any, v: Any, w: Any, x: Any, g: Any,
                     positions: Any, *, q_rows: int, kv_rows: int, cols: int, batch: int, head_dim: int, rope_dim: int,
                     eps: float, theta: float, freq_scale: float, weight_type: str, freq_factors: Any = None) -> None:
    op = f"matvec_norm_rope_{weight_type}"
    rows = q_rows + 2 * kv_rows
    _check_matrix(op, w, weight_type, rows, cols, batch, x, g)
    check_qkv_rope(op, q, k, v, x, positions, q_rows=q_rows, kv_rows=kv_rows, cols=cols, n_tokens=batch,
                   head_dim=head_dim, rope_dim=rope_dim)
    factors = rope.factors_arg(op, freq_factors, rope_dim)
    _launch(device, stream, "matvec_norm_rope", weight_type, -(-rows // 2),
            (q, k, v, w, x, g, positions, factors, q_rows, kv_rows, cols, batch, head_dim, rope_dim, eps, theta, freq_scale),
            batch)


def launch_norm_swiglu(device: Device, stream: Stream | None, y: Any, w: Any, x: Any, g: Any, *, rows: int, cols: int,
                       batch: int, eps: float, weight_type: str) -> None:
    op = f"matvec_norm_swiglu_{weight_type}"
    _check_matrix(op, w, weight_type, 2 * rows, cols, batch, x, g)
    check_memory(op, "y", y, batch * rows * 4)
    check_disjoint(op, ("y", y, batch * rows * 4), ("x", x, batch * cols * 4))
    _launch(device, stream, "matvec_norm_swiglu", weight_type, rows, (y, w, x, g, rows, cols, batch, eps), batch)


def launch_add(device: Device, stream: Stream | None, y: Any, w: Any, x: Any, *, rows: int, cols: int, batch: int,
               weight_type: str) -> None:
    op = f"matvec_add_{weight_type}"
    _check_matrix(op, w, weight_type, rows, cols, batch, x, None)
    check_memory(op, "y", y, batch * rows * 4)
    check_disjoint(op, ("y", y, batch * rows * 4), ("x", x, batch * cols * 4))
    _launch(device, stream, "matvec_add", weight_type, -(-rows // 2), (y, w, x, rows, cols, batch), batch)


def launch_norm(device: Device, stream: Stream | None, y: Any, w: Any, x: Any, g: Any, *, rows: int, cols: int,
                batch: int, eps: float, weight_type: str) -> None:
    op = f"matvec_norm_{weight_type}"
    _check_matrix(op, w, weight_type, rows, cols, batch, x, g)
    check_memory(op, "y", y, batch * rows * 4)
    check_disjoint(op, ("y", y, batch * rows * 4), ("x", x, batch * cols * 4))
    _launch(device, stream, "matvec_norm", weight_type, -(-rows // 2), (y, w, x, g, rows, cols, batch, eps))
