"""The tiny mixture-of-experts models whose llama.cpp outputs are recorded in tests/golden/moe_llamacpp.json (by
scripts/golden/record_llamacpp_moe.py) and compared in tests/test_golden_moe.py. Both sides write the file with
this code from the same seed, so it is the same file byte for byte (the golden data holds its sha256 and the test
checks it).

qwen3moe: qwen3's tiny layer (tests/support/gguf_factory.py, per-head q/k norms, a head size of its own) with the
dense feed-forward replaced by N_EXPERTS experts of which N_USED are routed to: a router ffn_gate_inp (F32, as
llama.cpp's quantizer keeps it) whose logits spread over a few units (ROUTER_GAIN), so that tokens and layers pick
different experts, and 3-D expert tensors. "qwen3moe-f32" holds everything in F32 (the architecture alone);
"qwen3moe-q4km" is laid out as a Q4_K_M file is (Q4_K gate and up experts, Q6_K down experts, Q8_0 attention, an
F16 head and embedding), 256 wide so that the K-quants' super-blocks fit.
"""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import numpy as np

from support.gguf_factory import Meta, TensorSpec, _encode, tiny_llama_spec, write_gguf
from support.gguf_raw import STRING, UINT32

N_EXPERTS = 8
N_USED = 2
ROUTER_GAIN = 2.0
LOGIT_SCALE = 6.0
_BASE = dict(architecture="qwen3", n_layers=3, n_heads=4, n_kv_heads=2, head_dim=32, vocab=384, context=256,
             tied=False, logit_scale=LOGIT_SCALE, rope_theta=10000.0, rms_eps=1e-6, ffn=64)
MOE_MODELS: dict[str, dict] = {
    "qwen3moe-f32": dict(architecture="qwen3moe", seed=71, hidden=64, expert_ffn=64, tensor_type="F32",
                         expert_types={}),
    "qwen3moe-q4km": dict(architecture="qwen3moe", seed=72, hidden=256, expert_ffn=256, tensor_type="Q8_0",
                          embedding_type="F16", expert_types={"ffn_gate_exps": "Q4_K", "ffn_up_exps": "Q4_K",
                                                              "ffn_down_exps": "Q6_K"}),
}
# The prompts: the ChatML template every qwen GGUF embeds, rendered by hand, and plain text.
PROMPTS = {
    "chat": "<|im_start|>user\nHello there, how are you today?<|im_end|>\n<|im_start|>assistant\n",
    "text": "The quick brown fox jumps over the lazy dog, then it runs there and back again.",
}
GREEDY_TOKENS = 24


def moe_spec(name: str):
    """MOE_MODELS[name] as a gguf_factory model (TinyLlama): qwen3's tiny model with its feed-forward made experts."""
    spec = dict(MOE_MODELS[name])
    arch, seed, expert_ffn = spec.pop("architecture"), spec.pop("seed"), spec.pop("expert_ffn")
    expert_types = spec.pop("expert_types")
    embedding_type = spec.pop("embedding_type", None)
    base = tiny_llama_spec(**_BASE, seed=seed, embedding_type=embedding_type,
                           tensor_types={"output": "F16"} if embedding_type else {}, **spec)
    hidden, n_layers = spec["hidden"], _BASE["n_layers"]
    metadata = [replace(m, key=m.key.replace("qwen3.", f"{arch}.", 1)) if m.key.startswith("qwen3.") else m
                for m in base.metadata]
    metadata = [m for m in metadata if m.key not in ("general.architecture", "general.name")]
    metadata[:0] = [Meta("general.architecture", STRING, arch), Meta("general.name", STRING, f"tiny-{name}-test")]
    metadata += [Meta(f"{arch}.expert_count", UINT32, N_EXPERTS), Meta(f"{arch}.expert_used_count", UINT32, N_USED),
                 Meta(f"{arch}.expert_feed_forward_length", UINT32, expert_ffn)]
    rng = np.random.default_rng(seed + 1000)
    residual = 1.0 / math.sqrt(2 * n_layers)

    def linear(*shape, scale=1.0):
        return (rng.standard_normal(shape) * (scale / math.sqrt(shape[-1]))).astype(np.float32)

    experts = {}
    for i in range(n_layers):
        experts[i] = [
            _encode(f"blk.{i}.ffn_gate_inp.weight", linear(N_EXPERTS, hidden, scale=ROUTER_GAIN), "F32"),
            *(_encode(f"blk.{i}.{part}.weight", values, expert_types.get(part, spec["tensor_type"]))
              for part, values in (("ffn_gate_exps", linear(N_EXPERTS, expert_ffn, hidden)),
                                   ("ffn_up_exps", linear(N_EXPERTS, expert_ffn, hidden)),
                                   ("ffn_down_exps", linear(N_EXPERTS, hidden, expert_ffn, scale=residual))))]
    tensors: list[TensorSpec] = []
    for t in base.tensors:
        if t.name.endswith(("ffn_gate.weight", "ffn_up.weight", "ffn_down.weight")):
            if t.name.endswith("ffn_down.weight"):
                tensors += experts[int(t.name.split(".")[1])]
            continue
        tensors.append(t)
    return replace(base, metadata=tuple(metadata), tensors=tuple(tensors))


def write_moe_model(name: str, folder: Path) -> Path:
    """Write MOE_MODELS[name] as <folder>/<name>.gguf and return its path."""
    return write_gguf(Path(folder) / f"{name}.gguf", moe_spec(name))
