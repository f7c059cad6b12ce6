"""YaRN RoPE scaling as llama.cpp computes it (ggml-cpu/ops.cpp: rope_yarn, rope_yarn_ramp; ggml.c:
ggml_rope_yarn_corr_dims; src/llama-context.cpp: the magnitude factor), expressed in what every RoPE launch already
takes: a per-pair frequency divisor and the attention's score scale.

For pair i of a rotated head (rope_dim dimensions, base b, original context n, factor f, freq_scale s = 1 / f):
    low  = max(0, floor(d(32))), high = min(rope_dim - 1, ceil(d(1))),  d(r) = rope_dim ln(n / (2 pi r)) / (2 ln b)
    ramp = 1 - clamp((i - low) / max(0.001, high - low), 0, 1)
    theta = theta_extrap (s (1 - ramp) + ramp)     -> divisor_i = 1 / (s (1 - ramp) + ramp)
and cos and sin are multiplied by m = attn_factor (1 + 0.1 ln f) (llama.cpp's yarn_attn_factor, get_mscale(f) over
its own 1 + 0.1 ln f, times the 1 + 0.1 ln(1 / s) of rope_yarn): q and k each scaled by m, so their products by m^2,
which the attention's score scale takes (the keys are cached unscaled). beta_fast 32 and beta_slow 1 are llama.cpp's
defaults (gpt-oss's files set no others). Computed in float32, as ggml does.
"""

from __future__ import annotations

import math

import numpy as np

BETA_FAST = 32.0
BETA_SLOW = 1.0


def _corr_dim(rope_dim: int, original_context: int, n_rot: float, base: float) -> float:
    f32 = np.float32
    return float(f32(rope_dim) * np.log(f32(original_context) / (f32(n_rot) * f32(2) * f32(math.pi)), dtype=f32)
                 / (f32(2) * np.log(f32(base), dtype=f32)))


def divisors(config, file_factors: np.ndarray | None = None) -> np.ndarray:
    """float32 [rope_dim / 2]: YaRN's per-pair frequency divisors (times the file's rope_freqs where it has them)."""
    n = config.rope_dim
    low = max(0.0, math.floor(_corr_dim(n, config.rope_original_context, BETA_FAST, config.rope_theta)))
    high = min(n - 1.0, math.ceil(_corr_dim(n, config.rope_original_context, BETA_SLOW, config.rope_theta)))
    pair = np.arange(n // 2, dtype=np.float32)
    ramp = np.float32(1) - np.clip((pair - np.float32(low)) / np.float32(max(0.001, high - low)), 0, 1)
    scale = np.float32(1.0 / config.rope_scaling_factor)
    out = np.float32(1) / (scale * (np.float32(1) - ramp) + ramp)
    if file_factors is not None:
        out = out * np.asarray(file_factors, dtype=np.float32)
    return out.astype(np.float32)


def magnitude(config) -> float:
    """m: cos and sin of every pair are multiplied by it (1 without YaRN)."""
    if config.rope_scaling != "yarn":
        return 1.0
    return config.rope_attn_factor * (1.0 + 0.1 * math.log(config.rope_scaling_factor))
