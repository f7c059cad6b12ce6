"""Weight types a --plan may assume for a preset (which has no file to read the real tensor bytes from).

A single GGUF type (F16, Q8_0, Q4_K ...) costs its block's exact bytes per weight. llama.cpp's named mixes
(Q4_K_M and the like) keep some tensors at a higher type, so they are counted at the bits per weight
llama.cpp's quantize documentation gives for them on Llama 2 7B (tools/quantize/README.md).
"""

from __future__ import annotations

from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

from hipcore.errors import UsageError

DEFAULT_WEIGHTS_TYPE = "Q4_K_M"  # what most published GGUF files of a model are
SINGLE_TYPES = ("F32", "F16", "BF16", "Q8_0", "Q6_K", "Q5_K", "Q5_0", "Q4_K", "Q4_1", "Q4_0", "MXFP4", "Q3_K", "Q2_K")
MIX_BITS_PER_WEIGHT = {
    "Q2_K_MIX": 3.35, "Q3_K_S": 3.50, "Q3_K_M": 3.91, "Q3_K_L": 4.27, "Q4_K_S": 4.58, "Q4_K_M": 4.84,
    "Q5_K_S": 5.52, "Q5_K_M": 5.68,
}
WEIGHT_TYPES = tuple(MIX_BITS_PER_WEIGHT) + SINGLE_TYPES


def bits_per_weight(name: str) -> float:
    if name in MIX_BITS_PER_WEIGHT:
        return MIX_BITS_PER_WEIGHT[name]
    block_elems, block_bytes = GGML_QUANT_SIZES[GGMLQuantizationType[name]]
    return 8 * block_bytes / block_elems


def weights_as(n_params: int, weights_type: str | None) -> tuple[int, str]:
    """(bytes, how they were counted) for n_params weights of the type (default Q4_K_M)."""
    name = (weights_type or DEFAULT_WEIGHTS_TYPE).upper()
    if name not in WEIGHT_TYPES:
        raise UsageError(f"unknown weight type {weights_type!r} for --weights-type; choose one of {', '.join(t.lower() for t in WEIGHT_TYPES)}")
    if name in MIX_BITS_PER_WEIGHT:
        bpw = MIX_BITS_PER_WEIGHT[name]
        how = f"{n_params:,} parameters as {name} ({bpw} bits/weight, llama.cpp's mix)"
        return int(n_params * bpw / 8), how + ("; --weights-type to change" if weights_type is None else "")
    block_elems, block_bytes = GGML_QUANT_SIZES[GGMLQuantizationType[name]]
    how = f"{n_params:,} parameters as {name} ({bits_per_weight(name):g} bits/weight)"
    return -(-n_params // block_elems) * block_bytes, how
