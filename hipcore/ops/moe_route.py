"""moe_route: a mixture-of-experts router's choice, per token: the k experts and their weights.

Kernel `moe_route_f32(ids p, weights p, logits p, bias p, tokens i, n_expert i, k i, mode i, normalize i)`
(kernels/moe_route.hip): logits float32 [tokens, n_expert] (the router product) plus bias float32 [n_expert] where
given (gpt-oss's router bias, added as add_bias adds it: one launch fewer a layer) -> ids int32 [tokens, k] and
weights float32 [tokens, k], in llama.cpp's order (build_moe_ffn):

- "softmax_topk" (qwen3moe, qwen2moe): p = softmax over all experts, the k largest p; weights = those p,
  divided by their sum when `normalize` (the file's expert_weights_norm).
- "topk_softmax" (gpt-oss): the k largest logits; weights = softmax over those k alone.

The experts come in descending order. Both modes select on the logits: softmax is monotone, so the set is
llama.cpp's (which sorts the float32 probabilities) except where two different logits round to one
probability. Equal logits go to the lower expert index (ggml's sort leaves their order unspecified).
One warp per token (the kernel loops over tokens, so any grid is correct), n_expert <= 256 and
k <= MAX_K: a fixed launch shape with no host synchronization, capturable in the decode graph. Up to 8 choices the
warp merges its lanes' sorted lists, more take k rounds of an arg-max: the same choices and weights either way.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from hipcore.ops import add_bias
from hipcore.ops.launch_checks import check_disjoint, check_memory, check_sizes
from hipcore.runtime.cpu import CpuDevice, cpu_kernel
from hipcore.runtime.device import Device, Dim3, Stream
from hipcore.runtime.kernels import get_kernel, wavefront_size

OP = "moe_route"
ENTRY = "moe_route_f32"
SIGNATURE = "ppppiiiii"
MODES = {"softmax_topk": 0, "topk_softmax": 1}
MAX_EXPERTS = 256
MAX_K = 32
WARPS_PER_BLOCK = 4  # one token a warp


def select(logits: np.ndarray, k: int) -> np.ndarray:
    """int32 [tokens, k]: the k largest logits' indices, largest first, equal values lower index first."""
    logits = np.asarray(logits, dtype=np.float32)
    return np.argsort(-logits, axis=-1, kind="stable")[:, :k].astype(np.int32)


def reference(logits: np.ndarray, k: int, mode: str, normalize: bool) -> tuple[np.ndarray, np.ndarray]:
    """(ids int32 [tokens, k], weights float64 [tokens, k]) for float32 logits [tokens, n_expert]."""
    if mode not in MODES:
        raise ValueError(f"{OP}: mode must be one of {', '.join(MODES)}, not {mode!r}")
    logits = np.asarray(logits, dtype=np.float32)
    ids = select(logits, k)
    chosen = np.take_along_axis(logits, ids, axis=-1).astype(np.float64)
    if mode == "softmax_topk":
        full = logits.astype(np.float64)
        top = full.max(axis=-1, keepdims=True)
        weights = np.exp(chosen - top) / np.exp(full - top).sum(axis=-1, keepdims=True)
        if normalize:
            weights = weights / weights.sum(axis=-1, keepdims=True)
    else:
        e = np.exp(chosen - chosen[:, :1])
        weights = e / e.sum(axis=-1, keepdims=True)
    return ids, weights


def error_bound(logits: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """float64 [tokens, k]: how far the kernel's float32 weights may be from `reference`'s. Each exp(l - top) is off
    by u |l - top| from the difference's rounding and a few u from exp itself; the sums (a lane's 8 terms, at most
    6 shuffle levels) and the divisions add under 24 u: (4 spread + 48) u relative, spread = max - min of the
    token's finite logits (NaN counts as -inf and contributes nothing)."""
    finite = np.where(np.isfinite(logits), logits, np.nan)
    spread = (np.nanmax(finite, axis=-1) - np.nanmin(finite, axis=-1))[:, None].astype(np.float64)
    return (4 * spread + 48) * 2.0**-24 * np.abs(weights) + 1e-30


@cpu_kernel(ENTRY, SIGNATURE)
def _host(device: CpuDevice, grid: Dim3, block: Dim3, ids: int, weights: int, logits: int, bias: int, tokens: int,
          n_expert: int, k: int, mode: int, normalize: int) -> None:
    mode_name = next(name for name, value in MODES.items() if value == mode)
    rows = device.view(logits, np.float32, (tokens, n_expert))
    if bias:
        rows = add_bias.reference(rows, device.view(bias, np.float32, n_expert))
    got_ids, got_weights = reference(rows, k, mode_name, bool(normalize))
    device.view(ids, np.int32, (tokens, k))[:] = got_ids
    device.view(weights, np.float32, (tokens, k))[:] = got_weights


def geometry(arch: str, tokens: int) -> tuple[int, int]:
    """(grid, block): a warp per token, WARPS_PER_BLOCK warps a block."""
    return -(-tokens // WARPS_PER_BLOCK), WARPS_PER_BLOCK * wavefront_size(arch)


def launch(device: Device, stream: Stream | None, ids: Any, weights: Any, logits: Any, tokens: int, n_expert: int,
           k: int, mode: str, normalize: bool, bias: Any = None) -> None:
    """ids int32 [tokens, k] and weights float32 [tokens, k] from logits float32 [tokens, n_expert] plus bias
    float32 [n_expert] where given (logits itself is left as it is)."""
    if mode not in MODES:
        raise ValueError(f"{OP}: mode must be one of {', '.join(MODES)}, not {mode!r}")
    check_sizes(OP, tokens=tokens, n_expert=n_expert, k=k)
    if n_expert > MAX_EXPERTS or k > min(n_expert, MAX_K):
        raise ValueError(f"{OP}: n_expert must be at most {MAX_EXPERTS} and k at most min(n_expert, {MAX_K}); "
                         f"got n_expert {n_expert}, k {k}")
    check_memory(OP, "ids", ids, tokens * k * 4)
    check_memory(OP, "weights", weights, tokens * k * 4)
    check_memory(OP, "logits", logits, tokens * n_expert * 4)
    if bias is not None:
        check_memory(OP, "bias", bias, n_expert * 4)
    check_disjoint(OP, ("ids", ids, tokens * k * 4), ("weights", weights, tokens * k * 4))
    grid, block = geometry(device.arch, tokens)
    kernel = get_kernel(device, OP, ENTRY, SIGNATURE)
    kernel.launch(grid, block, (ids, weights, logits, 0 if bias is None else bias, tokens, n_expert, k, MODES[mode],
                                int(bool(normalize))), stream=stream)
