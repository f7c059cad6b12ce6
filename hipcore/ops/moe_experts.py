"""moe_experts: the selected experts' feed-forward products of a mixture-of-experts layer.

Expert tensors are the GGUF's 3-D [n_expert, rows, cols] in their block format (EXPERT_TYPES), one expert's
matrix after another: expert e's row r starts at byte (e * rows + r) * row_bytes(cols). ids int32 [tokens, k]
and weights float32 [tokens, k] come from moe_route. Biases (gpt-oss) are float32 [n_expert, rows], or None.

- gate|up, `moe_gate_up_<type>(h p, x p, gate p, up p, ids p, gate_bias p, up_bias p, tokens i, k i, ff i,
  hidden i, n_expert i, activation i)`: for every token t and slot j, e = ids[t, j],
  h[t, j] = act(gate_e . x[t] + gate_bias_e, up_e . x[t] + up_bias_e), float32 [tokens, k, ff], with
  act "swiglu" silu(g) * u, or "swiglu_oai" (gpt-oss; ggml's swiglu_oai): g' = min(g, 7), u' = clamp(u, -7, 7),
  g' * sigmoid(1.702 g') * (u' + 1).
- down, `moe_down_<type>(out p, h p, down p, ids p, weights p, down_bias p, tokens i, k i, hidden i, ff i,
  n_expert i)`: out[t] += sum_j weights[t, j] * (down_e . h[t, j] + down_bias_e), float32 [tokens, hidden],
  the k terms summed in slot order by one warp (no atomics: the same bits on every run).

Two paths, the same function: per pair (decode steps and small batches: gate|up a workgroup a token and a chunk of
rows, its warps the (slot, rows) units, a quantized x quantized once a workgroup into shared memory, at most
MAX_SLOTS slots and MAX_STAGED_COLUMNS columns of x; down in one of three forms, launch_down choosing: slot-serial
`moe_down_<type>`, the same with h staged `moe_down_staged_<type>` (`staged_down_fits`), slot-parallel
`moe_down_slots_<type>` (`slots_pay`); kernels/moe_experts.hip says what each does and measured) and
grouped (prompts and batches, `grouped_pays`, or a gate|up wider than the per-pair path takes: a workgroup takes one
expert's rows and gathers the pairs that chose it, so that each slice of an expert's weights is decoded once for 2
pairs; `moe_gate_up_grouped_<type>`, and for down `moe_down_grouped_<type>` writing each pair's weighted term into a
workspace float32 [tokens, k, hidden] that `moe_sum_slots_f32(out p, terms p, tokens i, k i, hidden i)` adds into out
in slot order: deterministic).

The quantized types (Q4_K, Q5_K, Q6_K, Q8_0, MXFP4) take qmatvec's integer path: the input (x, or h) quantized per
32-column slice to int8 as qmatvec.quantize_x does, which the references use too; F16, BF16 and F32 multiply the
float input. One launch a projection for every token of the step; each warp reads only its expert's rows.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from hipcore.ops.launch_checks import check_disjoint, check_memory, check_sizes
from hipcore.ops.moe_expert_cache import EXPERTS
from hipcore.ops.qmatvec import U32, quantize_x
from hipcore.ops.weight_formats import check_format, column_multiple, dequantize_rows, row_bytes
from hipcore.runtime import settings
from hipcore.runtime.cpu import CpuDevice, cpu_kernel
from hipcore.runtime.device import Device, Dim3, Stream
from hipcore.runtime.kernels import get_kernel, wavefront_size

OP = "moe_experts"
GATE_UP_SIGNATURE = "pppppppiiiiii"
DOWN_SIGNATURE = "ppppppiiiii"
SUM_SLOTS_ENTRY, SUM_SLOTS_SIGNATURE = "moe_sum_slots_f32", "ppiii"
QUANTIZED_X_TYPES = ("q4_k", "q5_k", "q6_k", "q8_0", "mxfp4")
FLOAT_TYPES = ("f16", "bf16", "f32")
EXPERT_TYPES = QUANTIZED_X_TYPES + FLOAT_TYPES
# The widest aligned load the kernels make of the experts (MXFP4's 17-byte blocks are read as aligned words).
WEIGHT_ALIGNMENT = {"q4_k": 16, "q5_k": 16, "q6_k": 2, "q8_0": 2, "mxfp4": 1, "f16": 16, "bf16": 16, "f32": 16}
ACTIVATIONS = {"swiglu": 0, "swiglu_oai": 1}
OAI_ALPHA, OAI_LIMIT = 1.702, 7.0
GATE_UP_ROWS, DOWN_ROWS, SLOT_ROWS = 2, 2, 4  # rows a warp of the per-pair entries computes together (kRows, kSlotRows)
MAX_SLOTS = 32  # kernels/moe_experts.hip kMaxSlots
MAX_STAGED_COLUMNS = 384 * 32  # kMaxStagedSlices: a quantized x the per-pair gate|up holds in shared memory
THREADS = 256
GROUPED_TILE_ROWS = 64  # rows of one expert a grouped workgroup takes (kernels/moe_experts_grouped.h kTileRows)
# The grouped path once the pairs average this many an expert (ROCMFORGE_MOE_GROUPED_MIN_PAIRS sets it for a
# measurement; moe_experts_mma takes over from its own threshold on matrix cores). On an NVIDIA H100 (5057825, t/s of
# batched decode): gpt-oss-20b at 8 sequences (1 pair an expert) 914 grouped against 751 per pair; Qwen3-30B-A3B at 8
# (0.5 an expert) 896 against 1,057, at 16 (1) 1,006 against 1,018.
GROUPED_MIN_PAIRS_PER_EXPERT = 1.0


def supports(weight_type: str) -> bool:
    return weight_type in EXPERT_TYPES


# ---- reference -------------------------------------------------------------------------------


def activation_reference(gate: np.ndarray, up: np.ndarray, activation: str) -> np.ndarray:
    """float64: the gated activation of (gate, up)."""
    g, u = np.asarray(gate, dtype=np.float64), np.asarray(up, dtype=np.float64)
    with np.errstate(over="ignore"):
        if activation == "swiglu":
            return g / (1.0 + np.exp(-g)) * u
        if activation == "swiglu_oai":
            g = np.minimum(g, OAI_LIMIT)
            return g / (1.0 + np.exp(-OAI_ALPHA * g)) * (np.clip(u, -OAI_LIMIT, OAI_LIMIT) + 1.0)
    raise ValueError(f"{OP}: activation must be one of {', '.join(ACTIVATIONS)}, not {activation!r}")


def expert_matrix(raw: np.ndarray, weight_type: str, expert: int, rows: int, cols: int, dtype=np.float64) -> np.ndarray:
    """[rows, cols] of `dtype`: expert `expert` of raw expert bytes (any shape holding n_expert * rows rows)."""
    per_row = row_bytes(weight_type, cols)
    flat = np.ascontiguousarray(raw, dtype=np.uint8).reshape(-1)
    start = expert * rows * per_row
    return dequantize_rows(flat[start:start + rows * per_row].reshape(rows, per_row), weight_type, cols, dtype)


def kernel_input(x: np.ndarray, weight_type: str) -> np.ndarray:
    """float64 [n, cols]: the input as the kernel multiplies it (quantized per slice for QUANTIZED_X_TYPES)."""
    x = np.asarray(x, dtype=np.float32)
    return quantize_x(x, weight_type) if weight_type in QUANTIZED_X_TYPES else x.astype(np.float64)


def _pair_groups(ids):
    """The (token, slot) pairs grouped by expert: (order, spans), order the pairs (i = t * k + j) sorted by expert,
    stable, and spans [(expert, start, end)] its runs."""
    flat_ids = np.asarray(ids, dtype=np.int64).reshape(-1)
    order = np.argsort(flat_ids, kind="stable")
    experts, starts = np.unique(flat_ids[order], return_index=True)
    ends = [*starts[1:].tolist(), flat_ids.size]
    return order, list(zip(experts.tolist(), starts.tolist(), ends))


def _products(matrix_of, groups, x_sorted, rows, with_magnitude=False):
    """float64 [pairs, rows] in pair order and, with_magnitude, |x| @ |W|^T (else None): x_sorted [pairs, cols] the
    inputs in groups' order (_pair_groups), each run multiplied by its expert's float64 [rows, cols] matrix_of(expert),
    one product an expert for all its pairs."""
    order, spans = groups
    done = np.empty((order.size, rows))
    magnitude = np.empty_like(done) if with_magnitude else None
    for expert, start, end in spans:
        w = matrix_of(expert)
        xs = x_sorted[start:end]
        done[start:end] = xs @ w.T
        if with_magnitude:
            magnitude[start:end] = np.abs(xs) @ np.abs(w).T
    return _unsorted(order, done), _unsorted(order, magnitude) if with_magnitude else None


def _unsorted(order, rows_sorted):
    out = np.empty_like(rows_sorted)
    out[order] = rows_sorted  # row i of the sorted rows is pair order[i]'s
    return out


def _raw_experts(raw, weight_type, rows, cols):
    """expert -> its float64 [rows, cols] from raw expert bytes (the references: decoded on every call)."""
    return lambda expert: expert_matrix(raw, weight_type, expert, rows, cols)


def gate_up_reference(x, gate_raw, up_raw, weight_type, ids, ff, hidden, activation, gate_bias=None, up_bias=None,
                      with_bound=False):
    """float64 [tokens, k, ff] (see the module docstring); with_bound: also a bound on the kernel's float32 error.

    The bound: each of gate and up is a dot product of cols terms, rounded at most cols / 32 + 10 times on
    any term's path (qmatvec.error_bound's count), so |error| <= (cols / 32 + 10) u |x| . |w| (plus the bias's
    rounding); the activation's factors move it by at most max |d act / dg| <= 1.2 and the other factor,
    and the activation's own evaluation adds 8 u of its result."""
    return _gate_up(x, _raw_experts(gate_raw, weight_type, ff, hidden), _raw_experts(up_raw, weight_type, ff, hidden),
                    weight_type, ids, ff, hidden, activation, gate_bias, up_bias, with_bound)


def _gate_up(x, gate_of, up_of, weight_type, ids, ff, hidden, activation, gate_bias, up_bias, with_bound):
    tokens, k = np.asarray(ids).shape
    xq = kernel_input(np.asarray(x, dtype=np.float32).reshape(tokens, hidden), weight_type)
    groups = _pair_groups(ids)
    x_sorted = xq[groups[0] // k]  # pair i is token i // k's
    g, g_mag = _products(gate_of, groups, x_sorted, ff, with_bound)
    u, u_mag = _products(up_of, groups, x_sorted, ff, with_bound)
    flat_ids = np.asarray(ids, dtype=np.int64).reshape(-1)
    if gate_bias is not None:
        g = g + np.asarray(gate_bias, dtype=np.float32).reshape(-1, ff)[flat_ids]
    if up_bias is not None:
        u = u + np.asarray(up_bias, dtype=np.float32).reshape(-1, ff)[flat_ids]
    h = activation_reference(g, u, activation)
    if not with_bound:
        return h.reshape(tokens, k, ff)
    steps = (hidden // 32 + 10) * U32
    eg, eu = steps * (g_mag + np.abs(g)), steps * (u_mag + np.abs(u))
    act_u = np.abs(u) + 1.0 if activation == "swiglu_oai" else np.abs(u)
    bound = 1.2 * eg * (act_u + eu) + np.abs(g) * eu + 8 * U32 * np.abs(h) + 1e-30
    return h.reshape(tokens, k, ff), bound.reshape(tokens, k, ff)


def down_reference(h, down_raw, weight_type, ids, weights, hidden, ff, down_bias=None, with_bound=False):
    """float64 [tokens, hidden]: what the kernel adds to out; with_bound: also a bound on its float32 error
    (each product's as gate|up's, times |weight|, and k + 2 roundings of the weighted sum)."""
    return _down(h, _raw_experts(down_raw, weight_type, hidden, ff), weight_type, ids, weights, hidden, ff, down_bias,
                 with_bound)


def _down_products(h, down_of, weight_type, ids, hidden, ff, down_bias, with_bound):
    """float64 [tokens * k, hidden]: each pair's down product plus its bias, and the magnitudes (with_bound)."""
    tokens, k = np.asarray(ids).shape
    hq = kernel_input(np.asarray(h, dtype=np.float32).reshape(tokens * k, ff), weight_type)
    groups = _pair_groups(ids)
    y, y_mag = _products(down_of, groups, hq[groups[0]], hidden, with_bound)
    if down_bias is not None:
        y = y + np.asarray(down_bias, dtype=np.float32).reshape(-1, hidden)[np.asarray(ids, dtype=np.int64).reshape(-1)]
    return y, y_mag


def _down(h, down_of, weight_type, ids, weights, hidden, ff, down_bias, with_bound):
    tokens, k = np.asarray(ids).shape
    y, y_mag = _down_products(h, down_of, weight_type, ids, hidden, ff, down_bias, with_bound)
    w = np.asarray(weights, dtype=np.float32).astype(np.float64).reshape(tokens, k, 1)
    terms = w * y.reshape(tokens, k, hidden)
    out = terms.sum(axis=1)
    if not with_bound:
        return out
    each = (ff // 32 + 10) * U32 * (y_mag + np.abs(y)).reshape(tokens, k, hidden)
    bound = (np.abs(w) * each).sum(axis=1) + (k + 2) * U32 * np.abs(terms).sum(axis=1) + 1e-30
    return out, bound


# ---- host implementation (the cpu backend) ---------------------------------------------------


def _optional(device: CpuDevice, ptr: int, shape) -> np.ndarray | None:
    return device.view(ptr, np.float32, shape) if ptr else None


def _cached_experts(device: CpuDevice, ptr: int, weight_type: str, n_expert: int, rows: int, cols: int):
    """expert -> its float64 [rows, cols] from the experts at device address ptr, through the cache of decoded
    experts (moe_expert_cache: decoded once while they fit, never a different result)."""
    per_row = row_bytes(weight_type, cols)
    raw = device.view(ptr, np.uint8, (n_expert * rows, per_row))
    return lambda expert: EXPERTS.matrix((id(device), ptr + expert * rows * per_row),
                                         raw[expert * rows:(expert + 1) * rows], weight_type, cols)


def _check_ids(ids: np.ndarray, n_expert: int, entry: str) -> None:
    if ids.size and (ids.min() < 0 or ids.max() >= n_expert):
        raise ValueError(f"{entry}: expert id out of range [0, {n_expert}): {int(ids.min())}..{int(ids.max())}")


def _host_gate_up(weight_type: str):
    def run(device: CpuDevice, grid: Dim3, block: Dim3, h: int, x: int, gate: int, up: int, ids: int, gate_bias: int,
            up_bias: int, tokens: int, k: int, ff: int, hidden: int, n_expert: int, activation: int) -> None:
        chosen = device.view(ids, np.int32, (tokens, k))
        _check_ids(chosen, n_expert, f"moe_gate_up_{weight_type}")
        act = next(name for name, value in ACTIVATIONS.items() if value == activation)
        gate_of = _cached_experts(device, gate, weight_type, n_expert, ff, hidden)
        up_of = _cached_experts(device, up, weight_type, n_expert, ff, hidden)
        device.view(h, np.float32, (tokens, k, ff))[:] = _gate_up(
            device.view(x, np.float32, (tokens, hidden)), gate_of, up_of, weight_type, chosen, ff, hidden, act,
            _optional(device, gate_bias, (n_expert, ff)), _optional(device, up_bias, (n_expert, ff)), False)

    return run


def _host_down(weight_type: str):
    def run(device: CpuDevice, grid: Dim3, block: Dim3, out: int, h: int, down: int, ids: int, weights: int,
            down_bias: int, tokens: int, k: int, hidden: int, ff: int, n_expert: int) -> None:
        chosen = device.view(ids, np.int32, (tokens, k))
        _check_ids(chosen, n_expert, f"moe_down_{weight_type}")
        added = _down(device.view(h, np.float32, (tokens, k, ff)),
                      _cached_experts(device, down, weight_type, n_expert, hidden, ff), weight_type, chosen,
                      device.view(weights, np.float32, (tokens, k)), hidden, ff,
                      _optional(device, down_bias, (n_expert, hidden)), False)
        view = device.view(out, np.float32, (tokens, hidden))
        view[:] = view + added.astype(np.float32)

    return run


def _host_down_terms(weight_type: str):
    def run(device: CpuDevice, grid: Dim3, block: Dim3, terms: int, h: int, down: int, ids: int, weights: int,
            down_bias: int, tokens: int, k: int, hidden: int, ff: int, n_expert: int) -> None:
        chosen = device.view(ids, np.int32, (tokens, k))
        _check_ids(chosen, n_expert, f"moe_down_grouped_{weight_type}")
        y, _ = _down_products(device.view(h, np.float32, (tokens, k, ff)),
                              _cached_experts(device, down, weight_type, n_expert, hidden, ff), weight_type, chosen,
                              hidden, ff, _optional(device, down_bias, (n_expert, hidden)), False)
        w = device.view(weights, np.float32, tokens * k).astype(np.float64)[:, None]
        device.view(terms, np.float32, (tokens * k, hidden))[:] = w * y

    return run


@cpu_kernel(SUM_SLOTS_ENTRY, SUM_SLOTS_SIGNATURE)
def _host_sum_slots(device: CpuDevice, grid: Dim3, block: Dim3, out: int, terms: int, tokens: int, k: int,
                    hidden: int) -> None:
    view = device.view(out, np.float32, (tokens, hidden))
    view[:] = view + device.view(terms, np.float32, (tokens, k, hidden)).sum(axis=1, dtype=np.float32)


for _type in EXPERT_TYPES:
    cpu_kernel(f"moe_gate_up_{_type}", GATE_UP_SIGNATURE)(_host_gate_up(_type))
    cpu_kernel(f"moe_gate_up_grouped_{_type}", GATE_UP_SIGNATURE)(_host_gate_up(_type))
    cpu_kernel(f"moe_down_{_type}", DOWN_SIGNATURE)(_host_down(_type))
    cpu_kernel(f"moe_down_slots_{_type}", DOWN_SIGNATURE)(_host_down(_type))
    if _type in QUANTIZED_X_TYPES:
        cpu_kernel(f"moe_down_staged_{_type}", DOWN_SIGNATURE)(_host_down(_type))
    cpu_kernel(f"moe_down_grouped_{_type}", DOWN_SIGNATURE)(_host_down_terms(_type))


# ---- launchers ---------------------------------------------------------------------------------


def geometry(arch: str, tokens: int, k: int, rows: int, rows_per_unit: int) -> tuple[int, int]:
    """(grid, block) of the per-pair entries that give a workgroup a token and a chunk of rows, its warps the (slot,
    rows_per_unit rows) units (gate|up: GATE_UP_ROWS; moe_down_slots: SLOT_ROWS); the kernel loops past the grid."""
    warps = THREADS // wavefront_size(arch)
    chunk = rows_per_unit * max(1, warps // k)
    return max(1, min(tokens * -(-rows // chunk), 65_535)), THREADS


def serial_geometry(arch: str, tokens: int, rows: int) -> tuple[int, int]:
    """(grid, block) of the slot-serial down (moe_down_<type>): a warp DOWN_ROWS rows of one token."""
    warps = tokens * -(-rows // DOWN_ROWS)
    return max(1, min(-(-warps // (THREADS // wavefront_size(arch))), 65_535)), THREADS


def staged_geometry(arch: str, tokens: int, rows: int) -> tuple[int, int]:
    """(grid, block) of moe_down_staged: a workgroup a token's chunk of its warps' DOWN_ROWS rows each (the kernel
    takes the chunk from the grid: its share of a token's rows)."""
    chunk = DOWN_ROWS * (THREADS // wavefront_size(arch))
    return max(1, min(tokens * -(-rows // chunk), 65_535)), THREADS


def staged_down_fits(weight_type: str, k: int, ff: int) -> bool:
    """The slot-serial down with h staged (moe_down_staged) takes a quantized type whose k slices of h fit the staged
    slices (Qwen3-30B-A3B's 8 x 768 columns take 192 of 384); moe_down_<type> keeps the float types and wider h."""
    return weight_type in QUANTIZED_X_TYPES and k * ff <= MAX_STAGED_COLUMNS


def pairs_fit(weight_type: str, k: int, cols: int) -> bool:
    """Whether the per-pair path's staged entries (gate|up, moe_down_slots) take a product of `cols` input columns for
    k slots: at most MAX_SLOTS slots, a quantized type's input at most MAX_STAGED_COLUMNS (its slices staged)."""
    return k <= MAX_SLOTS and (weight_type not in QUANTIZED_X_TYPES or cols <= MAX_STAGED_COLUMNS)


def slots_pay(arch: str, weight_type: str, k: int, ff: int) -> bool:
    """The slot-parallel down (moe_down_slots) where a lane walks more than one step of a slot's ff columns (32 a step
    for the quantized types, 8 for the float ones) and it takes the product (pairs_fit); a slot-serial one where a
    slot's product is one step a lane (kernels/moe_experts.hip: gpt-oss-20b's and Qwen3-30B-A3B's downs measured)."""
    step = 32 if weight_type in QUANTIZED_X_TYPES else 8
    return ff > step * wavefront_size(arch) and pairs_fit(weight_type, k, ff)


def grouped_pays(tokens: int, k: int, n_expert: int) -> bool:
    """The grouped path once the (token, slot) pairs average GROUPED_MIN_PAIRS_PER_EXPERT an expert: below that few
    pairs share an expert and the per-pair path's finer grid wins."""
    return tokens * k >= grouped_min_pairs() * n_expert


def grouped_min_pairs() -> float:
    """GROUPED_MIN_PAIRS_PER_EXPERT, or ROCMFORGE_MOE_GROUPED_MIN_PAIRS where set."""
    return settings.number("ROCMFORGE_MOE_GROUPED_MIN_PAIRS", GROUPED_MIN_PAIRS_PER_EXPERT)


def grouped_geometry(n_expert: int, rows: int) -> tuple[int, int]:
    """(grid, block) of the grouped entries: a workgroup an (expert, tile of GROUPED_TILE_ROWS rows)."""
    return max(1, min(n_expert * -(-rows // GROUPED_TILE_ROWS), 65_535)), THREADS


def down_workspace_bytes(tokens: int, k: int, hidden: int) -> int:
    """Bytes of the workspace the grouped down path takes: each pair's weighted term, float32 [tokens, k, hidden]."""
    return tokens * k * hidden * 4


def _grouped(path: str | None, tokens: int, k: int, n_expert: int, fits: bool = True) -> bool:
    """Whether the grouped path runs: forced, or chosen (grouped_pays, or a product the per-pair path does not take:
    fits is pairs_fit's answer)."""
    if path not in (None, "pairs", "grouped"):
        raise ValueError(f"{OP}: path must be None (chosen), 'pairs' or 'grouped', not {path!r}")
    if path == "pairs" and not fits:
        raise ValueError(f"{OP}: the per-pair path takes at most {MAX_SLOTS} slots and {MAX_STAGED_COLUMNS} columns "
                         f"of a quantized type's input")
    return path == "grouped" or (path is None and (not fits or grouped_pays(tokens, k, n_expert)))


def _check_experts(weight_type: str, n_expert: int, rows: int, cols: int, **tensors: Any) -> None:
    check_format(OP, weight_type, EXPERT_TYPES)
    if cols % column_multiple(weight_type):
        raise ValueError(f"{OP}: {weight_type} experts need a multiple of {column_multiple(weight_type)} columns, "
                         f"got {cols}")
    for name, tensor in tensors.items():
        check_memory(OP, name, tensor, n_expert * rows * row_bytes(weight_type, cols),
                     alignment=WEIGHT_ALIGNMENT[weight_type])


def _bias_arg(name: str, bias: Any, n_expert: int, rows: int) -> Any:
    if bias is None:
        return 0
    check_memory(OP, name, bias, n_expert * rows * 4)
    return bias


def launch_gate_up(device: Device, stream: Stream | None, h: Any, x: Any, gate_exps: Any, up_exps: Any, ids: Any,
                   tokens: int, k: int, activation: str, gate_bias: Any = None, up_bias: Any = None, *, weight_type: str,
                   n_expert: int, ff: int, hidden: int, path: str | None = None) -> None:
    """h float32 [tokens, k, ff] from x float32 [tokens, hidden] through the experts ids [tokens, k] name. path: None
    picks (grouped_pays), "pairs" or "grouped" forces one (the tests and measurements)."""
    if activation not in ACTIVATIONS:
        raise ValueError(f"{OP}: activation must be one of {', '.join(ACTIVATIONS)}, not {activation!r}")
    check_sizes(OP, tokens=tokens, k=k, ff=ff, hidden=hidden, n_expert=n_expert, pairs=tokens * k)
    _check_experts(weight_type, n_expert, ff, hidden, gate_exps=gate_exps, up_exps=up_exps)
    check_memory(OP, "h", h, tokens * k * ff * 4)
    check_memory(OP, "x", x, tokens * hidden * 4, alignment=16)
    check_memory(OP, "ids", ids, tokens * k * 4)
    check_disjoint(OP, ("h", h, tokens * k * ff * 4), ("x", x, tokens * hidden * 4))
    biases = _bias_arg("gate_bias", gate_bias, n_expert, ff), _bias_arg("up_bias", up_bias, n_expert, ff)
    grouped = _grouped(path, tokens, k, n_expert, pairs_fit(weight_type, k, hidden))
    grid, block = (grouped_geometry(n_expert, ff) if grouped
                   else geometry(device.arch, tokens, k, ff, GATE_UP_ROWS))
    entry = f"moe_gate_up_grouped_{weight_type}" if grouped else f"moe_gate_up_{weight_type}"
    kernel = get_kernel(device, OP, entry, GATE_UP_SIGNATURE)
    kernel.launch(grid, block, (h, x, gate_exps, up_exps, ids, *biases, tokens, k, ff, hidden, n_expert,
                                ACTIVATIONS[activation]), stream=stream)


def launch_down(device: Device, stream: Stream | None, out: Any, h: Any, down_exps: Any, ids: Any, weights: Any,
                tokens: int, k: int, down_bias: Any = None, *, weight_type: str, n_expert: int, hidden: int,
                ff: int, workspace: Any = None, path: str | None = None) -> None:
    """out float32 [tokens, hidden] += sum_j weights[t, j] (down_{ids[t, j]} . h[t, j] + bias). The grouped path
    (path None and grouped_pays, or "grouped") needs `workspace` (down_workspace_bytes); without one, the per-pair
    path runs."""
    check_sizes(OP, tokens=tokens, k=k, ff=ff, hidden=hidden, n_expert=n_expert, pairs=tokens * k)
    _check_experts(weight_type, n_expert, hidden, ff, down_exps=down_exps)
    check_memory(OP, "out", out, tokens * hidden * 4)
    check_memory(OP, "h", h, tokens * k * ff * 4, alignment=16)
    check_memory(OP, "ids", ids, tokens * k * 4)
    check_memory(OP, "weights", weights, tokens * k * 4)
    check_disjoint(OP, ("out", out, tokens * hidden * 4), ("h", h, tokens * k * ff * 4))
    bias = _bias_arg("down_bias", down_bias, n_expert, hidden)
    if path == "grouped" and workspace is None:
        raise ValueError(f"{OP}: the grouped down path needs a workspace of {down_workspace_bytes(tokens, k, hidden)} bytes")
    if workspace is not None and _grouped(path, tokens, k, n_expert):
        terms = down_workspace_bytes(tokens, k, hidden)
        check_memory(OP, "workspace", workspace, terms)
        check_disjoint(OP, ("workspace", workspace, terms), ("h", h, tokens * k * ff * 4))
        check_disjoint(OP, ("workspace", workspace, terms), ("out", out, tokens * hidden * 4))
        grid, block = grouped_geometry(n_expert, hidden)
        kernel = get_kernel(device, OP, f"moe_down_grouped_{weight_type}", DOWN_SIGNATURE)
        kernel.launch(grid, block, (workspace, h, down_exps, ids, weights, bias, tokens, k, hidden, ff, n_expert),
                      stream=stream)
        launch_sum_slots(device, stream, out, workspace, tokens, k, hidden)
        return
    _grouped(path, tokens, k, n_expert)  # checks the name
    if slots_pay(device.arch, weight_type, k, ff):
        (grid, block), entry = geometry(device.arch, tokens, k, hidden, SLOT_ROWS), f"moe_down_slots_{weight_type}"
    elif staged_down_fits(weight_type, k, ff):
        (grid, block), entry = staged_geometry(device.arch, tokens, hidden), f"moe_down_staged_{weight_type}"
    else:
        (grid, block), entry = serial_geometry(device.arch, tokens, hidden), f"moe_down_{weight_type}"
    kernel = get_kernel(device, OP, entry, DOWN_SIGNATURE)
    kernel.launch(grid, block, (out, h, down_exps, ids, weights, bias, tokens, k, hidden, ff, n_expert), stream=stream)


def launch_sum_slots(device: Device, stream: Stream | None, out: Any, terms: Any, tokens: int, k: int,
                     hidden: int) -> None:
    """out float32 [tokens, hidden] += the k terms float32 [tokens, k, hidden] of each token, in slot order (the
    grouped down path's second launch; moe_experts_mma's down too)."""
    check_memory(OP, "out", out, tokens * hidden * 4)
    check_memory(OP, "terms", terms, tokens * k * hidden * 4)
    grid = min(-(-tokens * hidden // THREADS), 65_535)
    get_kernel(device, OP, SUM_SLOTS_ENTRY, SUM_SLOTS_SIGNATURE).launch(grid, THREADS, (out, terms, tokens, k, hidden),
                                                                        stream=stream)
