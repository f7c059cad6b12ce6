"""Which type each tensor of a llama file gets, for a file type, as llama.cpp's quantize chooses it.

The rule is llama.cpp's llama_tensor_get_type (src/llama-quant.cpp) for a dense llama model with row
lengths that are multiples of 256:
  - the output matrix (and the token embeddings when they are tied to it) becomes Q6_K unless the file
    type is Q8_0 (then it stays Q8_0), F16 or BF16;
  - Q4_K_M: attn_v and ffn_down become Q6_K in the layers where use_more_bits says so (the first and the
    last eighth of the layers, and every third layer between), a concatenated attn_qkv (Phi-3's) Q5_K, the
    other matrices Q4_K;
  - Q8_0, Q4_0, Q5_0, Q5_1, F16, BF16: every other matrix is of the file type.
Mixtures of experts: the routers (ffn_gate_inp) are never quantized (F32); the 3-D expert tensors (*_exps) follow
their 2-D kin, so Q4_K_M gives ffn_down_exps Q6_K in use_more_bits' layers (Qwen3-30B-A3B has 128 experts: the
8-expert rules, which make attn_k/attn_v Q8_0 and attn_output Q5_K, do not apply); MXFP4_MOE (the published
gpt-oss files' type 38) gives the expert tensors MXFP4 and every other matrix, output and embeddings included, Q8_0.
Norms, biases, sinks and rope_freqs stay F32 (the caller's business).
"""

from __future__ import annotations

import re

# general.file_type values (llama_ftype)
FILE_TYPES = {"F16": 1, "Q4_0": 2, "Q8_0": 7, "Q5_0": 8, "Q5_1": 9, "Q4_K_M": 15, "BF16": 32, "MXFP4_MOE": 38}
_BASE = {"F16": "F16", "Q4_0": "Q4_0", "Q8_0": "Q8_0", "Q5_0": "Q5_0", "Q5_1": "Q5_1", "Q4_K_M": "Q4_K", "BF16": "BF16",
         "MXFP4_MOE": "Q8_0"}


def use_more_bits(i_layer: int, n_layers: int) -> bool:
    """llama.cpp's choice of the layers that get more bits (integer division as in C++; i >= n/8 where
    the modulo is reached, so Python's % agrees)."""
    return i_layer < n_layers // 8 or i_layer >= 7 * n_layers // 8 or (i_layer - n_layers // 8) % 3 == 2


def tensor_type(name: str, file_type: str, n_layers: int, tied_embeddings: bool) -> str:
    if file_type not in FILE_TYPES:
        raise ValueError(f"file type {file_type!r}: one of {', '.join(FILE_TYPES)}")
    base = _BASE[file_type]
    if re.fullmatch(r"blk\.\d+\.ffn_gate_inp\.weight", name):
        return "F32"
    if file_type == "MXFP4_MOE":
        return "MXFP4" if re.fullmatch(r"blk\.\d+\.ffn_(gate|up|down)_exps\.weight", name) else "Q8_0"
    if name == "output.weight" or (tied_embeddings and name == "token_embd.weight"):
        return base if base in ("F16", "BF16", "Q8_0") else "Q6_K"
    if file_type != "Q4_K_M":
        return base
    if re.fullmatch(r"blk\.\d+\.attn_qkv\.weight", name):
        return "Q5_K"
    match = re.fullmatch(r"blk\.(\d+)\.(attn_v|ffn_down|ffn_down_exps)\.weight", name)
    if match and use_more_bits(int(match.group(1)), n_layers):
        return "Q6_K"
    return base
