"""Rotary position embedding as llama.cpp applies it to the llama architecture (numpy reference).

llama.cpp uses LLAMA_ROPE_TYPE_NORM for llama: the rotation acts on ADJACENT pairs
(x[2i], x[2i+1]) of each head, with angle  pos * freq_scale * theta_base^(-2i / rope_dim)
(divided by an optional per-pair frequency factor, the `rope_freqs.weight` tensor of llama-3
style files). Dimensions past rope_dim pass through unchanged. Hugging Face llama checkpoints
rotate the two HALVES of a head instead; llama.cpp's GGUF converter permutes the rows of the Q and
K weights so that adjacent-pair rotation on the GGUF weights equals half rotation on the original
ones (tests/test_llama_reference.py checks that equivalence).

Linear rope scaling ("rope.scaling.type = linear") multiplies every angle by 1/factor. YaRN and
the other scaling schemes change more than the angle (a magnitude correction and a ramp between
interpolation and extrapolation) and are refused by name rather than half-supported.
"""

from __future__ import annotations

import numpy as np

from hipcore.errors import UnsupportedModelError

SUPPORTED_SCALING = ("none", "linear")


def rope_freq_scale(scaling: str | None, factor: float | None) -> float:
    """The factor every angle is multiplied by, from the GGUF's rope scaling settings."""
    kind = (scaling or "none").lower()
    if kind not in SUPPORTED_SCALING:
        raise UnsupportedModelError(
            f"rope scaling type {kind!r} is not supported (supported: {', '.join(SUPPORTED_SCALING)})")
    if kind == "none" or not factor:
        return 1.0
    if not factor > 0:
        raise UnsupportedModelError(f"rope scaling factor must be positive, got {factor!r}")
    return 1.0 / float(factor)


class RotaryEmbedding:
    """Precomputed inverse frequencies of one model; cos/sin tables for any positions."""

    def __init__(self, *, rope_dim: int, theta_base: float, freq_scale: float = 1.0,
                 freq_factors: np.ndarray | None = None):
        if rope_dim <= 0 or rope_dim % 2:
            raise UnsupportedModelError(f"rope dimension must be a positive even number, got {rope_dim}")
        self.rope_dim = int(rope_dim)
        exponents = np.arange(0, rope_dim, 2, dtype=np.float64) / rope_dim
        inv_freq = float(freq_scale) * float(theta_base) ** -exponents
        if freq_factors is not None:
            factors = np.asarray(freq_factors, dtype=np.float64).reshape(-1)
            if factors.shape[0] != rope_dim // 2:
                raise UnsupportedModelError(
                    f"rope_freqs has {factors.shape[0]} factors, expected {rope_dim // 2}")
            inv_freq = inv_freq / factors
        self.inv_freq = inv_freq

    def tables(self, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """cos and sin of every (position, pair) angle, float32, shape (len(positions), rope_dim/2)."""
        angles = np.asarray(positions, dtype=np.float64)[:, None] * self.inv_freq[None, :]
        return np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)

    def apply(self, x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
        """Rotate x of shape (tokens, heads, head_dim) in adjacent pairs; returns a new array."""
        out = np.array(x, dtype=np.float32, copy=True)
        even = x[..., 0:self.rope_dim:2]
        odd = x[..., 1:self.rope_dim:2]
        c = cos[:, None, :]
        s = sin[:, None, :]
        out[..., 0:self.rope_dim:2] = even * c - odd * s
        out[..., 1:self.rope_dim:2] = even * s + odd * c
        return out
