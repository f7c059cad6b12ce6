"""rope: rotary position embedding, in place, in llama.cpp's NORM mode (llama) or NEOX mode (qwen2, qwen3).

Kernels `rope_f32` and `rope_neox_f32`, both (x p, positions p, freq_factors p, n_tokens i, n_heads i,
head_dim i, rope_dim i, theta_base f, freq_scale f) (kernels/rope.hip): x is float32
[n_tokens, n_heads, head_dim], positions int32 [n_tokens]. Pair i < rope_dim/2 turns by
angle = position * freq_scale * theta_base^(-2i / rope_dim) / freq_factors[i]; in NORM mode pair i is
(x[2i], x[2i+1]), in NEOX mode (x[i], x[i + rope_dim/2]) (the two halves of the rotated part). The rest
of each head is untouched. freq_factors is float32 [rope_dim / 2] or a null pointer (every factor 1): Llama 3.1/3.2
files carry them as rope_freqs.weight (the "llama3" RoPE scaling, which llama.cpp applies the same
way). One thread per pair, grid-stride.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from hipcore.ops.launch_checks import check_memory, check_sizes, elementwise_grid
from hipcore.runtime.cpu import CpuDevice, cpu_kernel
from hipcore.runtime.device import Device, Dim3, Stream
from hipcore.runtime.kernels import get_kernel

OP = "rope"
ENTRY = "rope_f32"
NEOX_ENTRY = "rope_neox_f32"
ENTRIES = {"norm": ENTRY, "neox": NEOX_ENTRY}  # ModelConfig.rope_type -> kernel
SIGNATURE = "pppiiiiff"


def angles(positions: np.ndarray, rope_dim: int, theta_base: float, freq_scale: float,
           freq_factors: np.ndarray | None = None) -> np.ndarray:
    """float64 [n_tokens, rope_dim // 2]: the angle of each pair at each position."""
    i = np.arange(rope_dim // 2, dtype=np.float64)
    freqs = float(np.float32(freq_scale)) * float(np.float32(theta_base)) ** (-2.0 * i / rope_dim)
    if freq_factors is not None:
        freqs = freqs / np.asarray(freq_factors, dtype=np.float32).astype(np.float64).reshape(rope_dim // 2)
    return np.asarray(positions, dtype=np.float64)[:, None] * freqs[None, :]


def pair_slices(rope_dim: int, rope_type: str = "norm") -> tuple[slice, slice]:
    """(first elements, second elements) of the pairs within a head, in pair order."""
    if rope_type == "neox":
        return slice(0, rope_dim // 2), slice(rope_dim // 2, rope_dim)
    if rope_type == "norm":
        return slice(0, rope_dim, 2), slice(1, rope_dim, 2)
    raise ValueError(f"{OP}: rope_type must be 'norm' or 'neox', not {rope_type!r}")


def reference(x: np.ndarray, positions: np.ndarray, rope_dim: int, theta_base: float, freq_scale: float,
              freq_factors: np.ndarray | None = None, rope_type: str = "norm") -> np.ndarray:
    """float64 copy of x [n_tokens, n_heads, head_dim] with the first rope_dim of each head rotated."""
    out = np.array(x, dtype=np.float64)
    theta = angles(positions, rope_dim, theta_base, freq_scale, freq_factors)[:, None, :]  # broadcast over heads
    cos, sin = np.cos(theta), np.sin(theta)
    first, second = pair_slices(rope_dim, rope_type)
    a, b = out[..., first].copy(), out[..., second].copy()
    out[..., first] = a * cos - b * sin
    out[..., second] = a * sin + b * cos
    return out


def host_factors(device: CpuDevice, freq_factors: int, rope_dim: int) -> np.ndarray | None:
    """The factors a host kernel was given: a view of rope_dim // 2 floats, or None for a null pointer."""
    return device.view(freq_factors, np.float32, rope_dim // 2) if freq_factors else None


def factors_arg(op: str, freq_factors: Any, rope_dim: int) -> Any:
    """The kernel argument for optional frequency factors: the checked Buffer/address, or 0 (none)."""
    if freq_factors is None:
        return 0
    check_memory(op, "freq_factors", freq_factors, (rope_dim // 2) * 4)
    return freq_factors


def _host(rope_type: str):
    def run(device: CpuDevice, grid: Dim3, block: Dim3, x: int, positions: int, freq_factors: int, n_tokens: int,
            n_heads: int, head_dim: int, rope_dim: int, theta_base: float, freq_scale: float) -> None:
        view = device.view(x, np.float32, (n_tokens, n_heads, head_dim))
        view[:] = reference(view, device.view(positions, np.int32, n_tokens), rope_dim, theta_base, freq_scale,
                            host_factors(device, freq_factors, rope_dim), rope_type)
    return run


for _rope_type, _entry in ENTRIES.items():
    cpu_kernel(_entry, SIGNATURE)(_host(_rope_type))


def launch(device: Device, stream: Stream | None, x: Any, positions: Any, n_tokens: int, n_heads: int, head_dim: int,
           rope_dim: int, theta_base: float, freq_scale: float = 1.0, freq_factors: Any = None,
           rope_type: str = "norm") -> None:
    """Rotate x [n_tokens, n_heads, head_dim] in place for the given int32 positions, in the rope_type layout
    ("norm" or "neox"); freq_factors (float32 [rope_dim // 2], a Buffer or an address) divide each pair's
    frequency, None for none."""
    if rope_type not in ENTRIES:
        raise ValueError(f"{OP}: rope_type must be 'norm' or 'neox', not {rope_type!r}")
    check_sizes(OP, n_tokens=n_tokens, n_heads=n_heads, head_dim=head_dim, rope_dim=rope_dim)
    if rope_dim % 2 or rope_dim > head_dim:
        raise ValueError(f"{OP}: rope_dim must be even and at most head_dim ({head_dim}), got {rope_dim}")
    if not theta_base > 0 or not freq_scale > 0:
        raise ValueError(f"{OP}: theta_base and freq_scale must be positive, got {theta_base} and {freq_scale}")
    check_memory(OP, "x", x, n_tokens * n_heads * head_dim * 4)
    check_memory(OP, "positions", positions, n_tokens * 4)
    factors = factors_arg(OP, freq_factors, rope_dim)
    grid, block = elementwise_grid(n_tokens * n_heads * (rope_dim // 2))
    kernel = get_kernel(device, OP, ENTRIES[rope_type], SIGNATURE, programmatic=True)
    kernel.launch(grid, block, (x, positions, factors, n_tokens, n_heads, head_dim, rope_dim, theta_base, freq_scale),
                  stream=stream)
