"""fused_qmatvec: the decode products of a layer on int8-quantized activations, small ops folded in, for
weights that each come as their own matrix of their own type (kernels/fused_qmatvec.hip).

A Q4_K_M file stores attn_q / attn_k in Q4_K and attn_v in Q6_K (ffn_down likewise in some layers), so q|k|v
cannot be one concatenated matrix and fused_matvec does not apply. These kernels take each matrix apart
(a pointer and a type code per matrix) and still do a layer's products in four launches:

  qmatvec_norm_rope_<v>(q, k, v, Wq, Wk, Wv, x, g, positions, freq_factors, bq, bk, bv, types, q_rows, kv_rows,
                        cols, batch, head_dim, rope_dim, eps, theta, freq_scale, k_pool, v_pool, slots, block_size,
                        num_blocks, kv_format, k_split, tile_groups)   (freq_factors: as rope.py's, or null;
                        bq, bk, bv: qwen2's biases, added before RoPE, or all three null;
                        k_pool .. kv_format: where k and v go when the epilogue stores them into the paged
                        cache, kv_store.EpilogueTarget, instead of the k and v buffers; kv_format 0 = not;
                        tile_groups: fused_qmatvec_geometry.py, MIN_TILE_GROUPS_SHARE)
  qmatvec_norm_swiglu_<v>(y, Wg, Wu, x, g, types, rows, cols, batch, eps)
                        (types: the gate's and up's type codes and the activation above them, ACTIVATION_SHIFT:
                        SwiGLU or Gemma's GeGLU; and qmatvec_norm_swiglu_split_1, SwiGLU at one token with its
                        last round of tiles split: fused_qmatvec_geometry.py, splits_last_round)
  qmatvec_add_<v>(y, W, x, type, rows, cols, batch, k_split)   (k_split: fused_qmatvec_geometry.py, MAX_K_SPLIT;
                        STORE_FLAG in type: y = x @ W^T instead of y += x @ W^T)
  qmatvec_norm_<v>(y, W, x, g, type, rows, cols, batch, eps)

<v> is "1" for one token (its own entries: fewer registers, see the kernel), "1b" for one token of Q4_1, Q5_0 or
Q5_1 (entries of their own: see BLOCK32_TYPES), "1m" and "nm" for MXFP4 alone (MXFP4_TYPES) and "n" for any number (passes
of up to MAX_TOKENS_PER_PASS tokens, each reading W once). The products are qmatvec's: x (times g when
normalizing) quantized per slice of 32 to int8 and one float scale, integer dot products with the weight
codes; each workgroup quantizes x once into shared memory for all its warps. rmsnorm(x) * g = s * (x * g) with s = 1 / sqrt(mean(x^2)
+ eps) per token, so the references below apply qmatvec.reference to x * g (float32, as the kernel forms
it) and scale by s: that is exactly the function the kernels compute, up to float32 rounding.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from hipcore.kvcache.dtypes import kv_dtype
from hipcore.ops import gelu_mul, kv_store, qmatvec, rope, silu_mul
from hipcore.ops.fused_qmatvec_geometry import SPLIT_ENTRIES, TILE_GROUP_ENTRIES, geometry, splits_last_round
from hipcore.ops.launch_checks import check_disjoint, check_memory, check_qkv_rope, check_sizes
from hipcore.ops.weight_formats import column_multiple, host_product, row_bytes
from hipcore.runtime.cpu import CpuDevice, cpu_kernel
from hipcore.runtime.device import Device, Stream
from hipcore.runtime.kernels import get_kernel

OP = "fused_qmatvec"
# qmatvec's types (the `_1` and `_n` entries), and, at one token only, the 32-element blocks with a min or a fifth
# bit (kernels/qmatvec_formats.h: Q4_1Format, Q5_0Format, Q5_1Format), which only these fused products read on int8
# activations: the `_1b` entries, whose type switch holds those with Q8_0 and Q4_0 (BLOCK32_TYPES; one switch of
# all eight types slowed the K-quant entries: kernels/fused_qmatvec_tiles.h, TypeSet). qmatvec's MXFP4 is in neither
# switch: it has entries of its own, `_1m` and `_nm`, for launches whose matrices are all MXFP4 (MXFP4_TYPES: no type
# switch, so the others keep the registers they were measured with).
KQUANT_TYPES = ("q4_k", "q5_k", "q6_k", "q8_0", "q4_0")
BLOCK32_TYPES = ("q4_1", "q5_0", "q5_1", "q8_0", "q4_0")
MXFP4_TYPES = ("mxfp4",)
WEIGHT_TYPES = KQUANT_TYPES + ("q4_1", "q5_0", "q5_1") + MXFP4_TYPES
WEIGHT_ALIGNMENT = {**qmatvec.WEIGHT_ALIGNMENT, "q4_1": 4, "q5_0": 2, "q5_1": 4}
TYPE_CODES = {"q4_k": 0, "q5_k": 1, "q6_k": 2, "q8_0": 3, "q4_0": 4, "q4_1": 5, "q5_0": 6, "q5_1": 7,
              "mxfp4": 8}  # WeightType
SIGNATURES = {
    # q, k, v, Wq, Wk, Wv, x, g, positions, freq_factors, bq, bk, bv, ..., kv_format, k_split, tile_groups
    "qmatvec_norm_rope": "pppppppppppppiiiiiiifffpppiiiii",
    "qmatvec_norm_swiglu": "pppppiiiif",
    "qmatvec_add": "pppiiiii",  # ... batch, k_split
    "qmatvec_norm": "ppppiiiif",
}
MAX_TOKENS_PER_PASS = 8  # kMaxBatchPerPass: a step of up to 8 tokens reads W once
VECTOR_ALIGNMENT = 16


def supports(*weight_types: str, tokens: int = 1) -> bool:
    """True when one launch of these kernels reads matrices of all these types for a step of `tokens` tokens:
    all of KQUANT_TYPES, or at one token all of BLOCK32_TYPES, or all of MXFP4_TYPES."""
    return all(t in KQUANT_TYPES for t in weight_types) or all(t in MXFP4_TYPES for t in weight_types) or (
        tokens == 1 and all(t in BLOCK32_TYPES for t in weight_types))


def pack_types(weight_types: Sequence[str]) -> int:
    """The kernels' `types` argument: one 4-bit code per matrix, the first in the low bits."""
    return sum(TYPE_CODES[t] << (4 * i) for i, t in enumerate(weight_types))


# ---- references: float64, x quantized exactly as the kernels do -----------------------------------


def norm_parts(x: np.ndarray, g: np.ndarray, eps: float, cols: int) -> tuple[np.ndarray, np.ndarray]:
    """(x * g in float32 [batch, cols], s float64 [batch]): rmsnorm(x) * g = s * (x * g)."""
    xs = np.asarray(x, dtype=np.float32).reshape(-1, cols)
    xg = xs * np.asarray(g, dtype=np.float32).reshape(1, cols)
    s = 1.0 / np.sqrt(np.mean(xs.astype(np.float64) ** 2, axis=1) + eps)
    return xg, s


def reference_norm(w_raw, weight_type, x, g, eps, rows, cols) -> np.ndarray:
    """float64 [batch, rows] = s * quantize(x * g) @ W^T."""
    xg, s = norm_parts(x, g, eps, cols)
    return s[:, None] * qmatvec.reference(w_raw, weight_type, xg, rows, cols)


def reference_norm_rope(weights, x, g, eps, positions, q_rows, kv_rows, cols, head_dim, rope_dim, theta, freq_scale,
                        freq_factors=None, biases=None):
    """(q, k, v) float64; `weights` = ((raw, type) of Wq, of Wk, of Wv); biases: (bq, bk, bv) added before RoPE, or
    None."""
    outs = []
    matrices = zip(weights, (q_rows, kv_rows, kv_rows), (True, True, False))
    for i, ((raw, weight_type), rows, rotate) in enumerate(matrices):
        y = reference_norm(raw, weight_type, x, g, eps, rows, cols)
        if biases is not None:
            y = y + np.asarray(biases[i], dtype=np.float64).reshape(1, rows)
        if rotate:
            y = rope.reference(y.reshape(y.shape[0], -1, head_dim), positions, rope_dim, theta, freq_scale, freq_factors)
        outs.append(y.reshape(-1, rows))
    return tuple(outs)


# The gate's activation (kernels/fused_qmatvec.hip: kActivationShift, gated): its code in `types` above the two
# type codes, and the reference of activation(gate) * up.
ACTIVATION_SHIFT = 8
ACTIVATIONS = {"silu": (0, silu_mul.reference), "gelu": (1, gelu_mul.reference)}
_ACTIVATION_OF_CODE = {code: ref for code, ref in ACTIVATIONS.values()}


def reference_norm_swiglu(weights, x, g, eps, rows, cols, activation: str = "silu") -> np.ndarray:
    """float64 [batch, rows] = silu(gate) * up (SwiGLU), or gelu(gate) * up (GeGLU, activation "gelu"); `weights` =
    ((raw, type) of W_gate, of W_up)."""
    (wg, tg), (wu, tu) = weights
    gated = ACTIVATIONS[activation][1]
    return gated(reference_norm(wg, tg, x, g, eps, rows, cols), reference_norm(wu, tu, x, g, eps, rows, cols))


def reference_add(w_raw, weight_type, x, y, rows, cols) -> np.ndarray:
    """float64 [batch, rows] = y + quantize(x) @ W^T."""
    return np.asarray(y, dtype=np.float64).reshape(-1, rows) + qmatvec.reference(w_raw, weight_type, x, rows, cols)


# ---- host kernels (the cpu backend): the same function in float32 ---------------------------------

_TYPE_NAMES = {code: name for name, code in TYPE_CODES.items()}


def _host_product(dev: CpuDevice, w: int, type_code: int, xs: np.ndarray, rows: int, cols: int) -> np.ndarray:
    weight_type = _TYPE_NAMES[type_code]
    raw = dev.view(w, np.uint8, (rows, row_bytes(weight_type, cols)))
    out = np.empty((xs.shape[0], rows), dtype=np.float32)
    host_product(raw, weight_type, qmatvec.quantize_x(xs, weight_type).astype(np.float32), cols, out)
    return out


def _host_normed(dev: CpuDevice, w: int, type_code: int, x: int, g: int, rows: int, cols: int, batch: int, eps: float):
    xg, s = norm_parts(dev.view(x, np.float32, (batch, cols)), dev.view(g, np.float32, cols), eps, cols)
    return _host_product(dev, w, type_code, xg, rows, cols) * s.astype(np.float32)[:, None]


def _register(variant: str) -> None:
    @cpu_kernel(f"qmatvec_norm_rope_{variant}", SIGNATURES["qmatvec_norm_rope"])
    def norm_rope(dev, grid, block, q, k, v, wq, wk, wv, x, g, positions, freq_factors, bq, bk, bv, types, q_rows,
                  kv_rows, cols, batch, head_dim, rope_dim, eps, theta, freq_scale, k_pool, v_pool, slots, block_size,
                  num_blocks, kv_format, k_split, tile_groups):
        pos = dev.view(positions, np.int32, batch)
        factors = rope.host_factors(dev, freq_factors, rope_dim)
        made = []
        for i, (w, rows, rotate, bias) in enumerate(((wq, q_rows, True, bq), (wk, kv_rows, True, bk),
                                                     (wv, kv_rows, False, bv))):
            y = _host_normed(dev, w, (types >> (4 * i)) & 15, x, g, rows, cols, batch, eps)
            if bias:
                y = y + dev.view(bias, np.float32, rows)[None, :]
            if rotate:
                y = rope.reference(y.reshape(batch, -1, head_dim), pos, rope_dim, theta, freq_scale,
                                   factors).reshape(batch, rows)
            made.append(y)
        dev.view(q, np.float32, (batch, q_rows))[:] = made[0]
        if kv_format:  # k and v into the cache, as the kernels' epilogue stores them
            kv_store.store_host_rows(dev, k_pool, v_pool, slots, block_size, num_blocks, kv_format, made[1], made[2],
                                     head_dim)
            return
        for out, y in ((k, made[1]), (v, made[2])):
            dev.view(out, np.float32, (batch, kv_rows))[:] = y

    def norm_swiglu(dev, grid, block, y, wg, wu, x, g, types, rows, cols, batch, eps):
        gate = _host_normed(dev, wg, types & 15, x, g, rows, cols, batch, eps)
        up = _host_normed(dev, wu, (types >> 4) & 15, x, g, rows, cols, batch, eps)
        gated = _ACTIVATION_OF_CODE[(types >> ACTIVATION_SHIFT) & 15]
        dev.view(y, np.float32, (batch, rows))[:] = gated(gate, up)

    for name in [f"qmatvec_norm_swiglu_{variant}"] + (["qmatvec_norm_swiglu_split_1"] if variant == "1" else []):
        cpu_kernel(name, SIGNATURES["qmatvec_norm_swiglu"])(norm_swiglu)

    @cpu_kernel(f"qmatvec_add_{variant}", SIGNATURES["qmatvec_add"])
    def add(dev, grid, block, y, w, x, type_code, rows, cols, batch, k_split):
        made = _host_product(dev, w, type_code & 15, dev.view(x, np.float32, (batch, cols)), rows, cols)
        out = dev.view(y, np.float32, (batch, rows))
        out[:] = made if type_code & STORE_FLAG else out + made

    @cpu_kernel(f"qmatvec_norm_{variant}", SIGNATURES["qmatvec_norm"])
    def norm(dev, grid, block, y, w, x, g, type_code, rows, cols, batch, eps):
        dev.view(y, np.float32, (batch, rows))[:] = _host_normed(dev, w, type_code, x, g, rows, cols, batch, eps)


for _variant in ("1", "n", "1b", "1m", "nm"):
    _register(_variant)


# ---- launchers ---------------------------------------------------------------------------------


def variant(batch: int) -> str:
    """The entries' shape for a step of `batch` tokens: "1" (one token) or "n" (passes of up to eight)."""
    return "1" if batch == 1 else "n"


def entry_suffix(batch: int, weight_types: Sequence[str]) -> str:
    """The suffix of the entry that reads these types for `batch` tokens: variant(batch), or "1b" for one token of
    a type outside KQUANT_TYPES (BLOCK32_TYPES), variant(batch) + "m" for MXFP4_TYPES; ValueError where no entry reads
    them together."""
    if not supports(*weight_types, tokens=batch):
        raise ValueError(f"fused_qmatvec: no entry reads {', '.join(weight_types)} together at {batch} tokens "
                         f"({', '.join(KQUANT_TYPES)} at any count; {', '.join(BLOCK32_TYPES)} at one token)")
    if all(t in MXFP4_TYPES for t in weight_types):
        return variant(batch) + "m"
    return "1b" if not all(t in KQUANT_TYPES for t in weight_types) else variant(batch)


def _check_matrix(op: str, name: str, w: Any, weight_type: str, rows: int, cols: int) -> None:
    if weight_type not in WEIGHT_TYPES:
        raise ValueError(f"{op}: {name} has weight type {weight_type!r}; these kernels read {', '.join(WEIGHT_TYPES)}")
    if cols % column_multiple(weight_type):
        raise ValueError(f"{op}: cols must be a multiple of {column_multiple(weight_type)} for {name} "
                         f"({weight_type}), got {cols}")
    check_memory(op, name, w, rows * row_bytes(weight_type, cols), WEIGHT_ALIGNMENT[weight_type])


def _check_vectors(op: str, x: Any, g: Any | None, batch: int, cols: int) -> None:
    check_memory(op, "x", x, batch * cols * 4, VECTOR_ALIGNMENT)
    if g is not None:
        check_memory(op, "g", g, cols * 4, VECTOR_ALIGNMENT)


def _launch(device: Device, stream: Stream | None, entry: str, batch: int, cols: int, matrix_rows: tuple[int, ...],
            weight_types: Sequence[str], args: tuple, gelu: bool = False) -> None:
    geo = geometry(device.arch, entry, variant(batch), cols, *matrix_rows, multiprocessors=device.multiprocessors)
    suffix = entry_suffix(batch, weight_types)  # "1b": the same geometry as "1" (one token)
    name = f"{entry}_{suffix}"
    if entry == "qmatvec_norm_swiglu" and suffix == "1" and splits_last_round(device.arch, matrix_rows[0], geo.grid) \
            and not gelu:  # the split entry computes SwiGLU only (fused_qmatvec.hip: GELU_OK)
        name = "qmatvec_norm_swiglu_split_1"
    # programmatic: the entries wait for the kernel ahead first (hip_compat.h: rf_grid_dependency_sync)
    kernel = get_kernel(device, OP, name, SIGNATURES[entry], programmatic=True)
    if entry in SPLIT_ENTRIES:
        args = (*args, geo.k_split)
    if entry in TILE_GROUP_ENTRIES:
        args = (*args, geo.tile_groups)
    kernel.launch(geo.grid, geo.block, args, stream=stream)


def launch_norm_rope(device: Device, stream: Stream | None, q: Any, k: Any, v: Any, weights: Sequence[tuple[Any, str]],
                     x: Any, g: Any, positions: Any, *, q_rows: int, kv_rows: int, cols: int, batch: int,
                     head_dim: int, rope_dim: int, eps: float, theta: float, freq_scale: float,
                     freq_factors: Any = None, kv_target: kv_store.EpilogueTarget | None = None,
                     biases: Sequence[Any] | None = None) -> None:
    """q, k, v = rope(n @ Wq^T + bq), rope(n @ Wk^T + bk), n @ Wv^T + bv; `weights` = ((Wq, type), (Wk, type),
    (Wv, type)); biases = (bq, bk, bv) float32 vectors of q_rows, kv_rows, kv_rows (qwen2's), or None for none;
    freq_factors as rope.launch's. With kv_target, k and v are stored into its pools at its slots (the bytes
    kv_store.launch would write) and the k and v buffers are left alone."""
    op = "qmatvec_norm_rope"
    check_sizes(op, q_rows=q_rows, kv_rows=kv_rows, cols=cols, batch=batch)
    if head_dim % 4:  # a warp's rows are whole RoPE pairs of one matrix: 4 rows at a time
        raise ValueError(f"{op}: head_dim must be a multiple of 4, got {head_dim}")
    for (w, weight_type), name, rows in zip(weights, ("Wq", "Wk", "Wv"), (q_rows, kv_rows, kv_rows)):
        _check_matrix(op, name, w, weight_type, rows, cols)
    _check_vectors(op, x, g, batch, cols)
    check_qkv_rope(op, q, k, v, x, positions, q_rows=q_rows, kv_rows=kv_rows, cols=cols, n_tokens=batch,
                   head_dim=head_dim, rope_dim=rope_dim)
    (wq, tq), (wk, tk), (wv, tv) = weights
    factors = rope.factors_arg(op, freq_factors, rope_dim)
    bias_args = (0, 0, 0)
    if biases is not None:
        if len(biases) != 3:
            raise ValueError(f"{op}: biases must be (bq, bk, bv), got {len(biases)}")
        for b, name, rows in zip(biases, ("bq", "bk", "bv"), (q_rows, kv_rows, kv_rows)):
            check_memory(op, name, b, rows * 4, 4)
        bias_args = tuple(biases)
    target = kv_store.NO_EPILOGUE_TARGET_ARGS
    if kv_target is not None:
        _check_kv_target(op, kv_target, kv_rows, head_dim, batch)
        target = kv_target.args()
    _launch(device, stream, op, batch, cols, (q_rows, kv_rows, kv_rows), (tq, tk, tv),
            (q, k, v, wq, wk, wv, x, g, positions, factors, *bias_args, pack_types((tq, tk, tv)), q_rows, kv_rows, cols,
             batch, head_dim, rope_dim, eps, theta, freq_scale, *target))


def _check_kv_target(op: str, kv: kv_store.EpilogueTarget, kv_rows: int, head_dim: int, batch: int) -> None:
    if not kv_store.epilogue_fusable(kv.dtype):
        raise ValueError(f"{op}: the epilogue cannot store KV dtype {kv.dtype}")
    check_sizes(op, block_size=kv.block_size, num_blocks=kv.num_blocks)
    pool_bytes = kv.num_blocks * kv.block_size * (kv_rows // head_dim) * kv_dtype(kv.dtype).row_bytes(head_dim)
    for name, pool in (("k_pool", kv.k_pool), ("v_pool", kv.v_pool)):
        check_memory(op, name, pool, pool_bytes, 4)
    check_memory(op, "slots", kv.slots, batch * 4, 4)


def launch_norm_swiglu(device: Device, stream: Stream | None, y: Any, weights: Sequence[tuple[Any, str]], x: Any, g: Any,
                       *, rows: int, cols: int, batch: int, eps: float, activation: str = "silu") -> None:
    """y = silu(n @ Wg^T) * (n @ Wu^T), or gelu(...) * (...) with activation "gelu" (Gemma's GeGLU); `weights` =
    ((Wg, type), (Wu, type))."""
    op = "qmatvec_norm_swiglu"
    if activation not in ACTIVATIONS:
        raise ValueError(f"{op}: activation must be one of {', '.join(ACTIVATIONS)}, not {activation!r}")
    check_sizes(op, rows=rows, cols=cols, batch=batch)
    for (w, weight_type), name in zip(weights, ("W_gate", "W_up")):
        _check_matrix(op, name, w, weight_type, rows, cols)
    _check_vectors(op, x, g, batch, cols)
    check_memory(op, "y", y, batch * rows * 4)
    check_disjoint(op, ("y", y, batch * rows * 4), ("x", x, batch * cols * 4))
    (wg, tg), (wu, tu) = weights
    types = pack_types((tg, tu)) | ACTIVATIONS[activation][0] << ACTIVATION_SHIFT
    _launch(device, stream, op, batch, cols, (rows,), (tg, tu), (y, wg, wu, x, g, types, rows, cols, batch, eps),
            gelu=activation == "gelu")


# qmatvec_add's `type` with this bit: y = x @ W^T instead of y += x @ W^T (kernels/fused_qmatvec.hip: kStoreFlag).
STORE_FLAG = 1 << 8


def launch_add(device: Device, stream: Stream | None, y: Any, w: Any, x: Any, *, rows: int, cols: int, batch: int,
               weight_type: str, store: bool = False) -> None:
    """y += quantize(x) @ W^T; store: y = quantize(x) @ W^T (a product normalized before its residual add, Gemma's o
    and down)."""
    op = "qmatvec_add"
    check_sizes(op, rows=rows, cols=cols, batch=batch)
    _check_matrix(op, "W", w, weight_type, rows, cols)
    _check_vectors(op, x, None, batch, cols)
    check_memory(op, "y", y, batch * rows * 4)
    check_disjoint(op, ("y", y, batch * rows * 4), ("x", x, batch * cols * 4))
    code = TYPE_CODES[weight_type] | (STORE_FLAG if store else 0)
    _launch(device, stream, op, batch, cols, (rows,), (weight_type,), (y, w, x, code, rows, cols, batch))


def launch_norm(device: Device, stream: Stream | None, y: Any, w: Any, x: Any, g: Any, *, rows: int, cols: int,
                batch: int, eps: float, weight_type: str) -> None:
    """y = n @ W^T (the output head)."""
    op = "qmatvec_norm"
    check_sizes(op, rows=rows, cols=cols, batch=batch)
    _check_matrix(op, "W", w, weight_type, rows, cols)
    _check_vectors(op, x, g, batch, cols)
    check_memory(op, "y", y, batch * rows * 4)
    check_disjoint(op, ("y", y, batch * rows * 4), ("x", x, batch * cols * 4))
    _launch(device, stream, op, batch, cols, (rows,), (weight_type,),
            (y, w, x, g, TYPE_CODES[weight_type], rows, cols, batch, eps))
