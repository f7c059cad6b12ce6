"""The tiny mixture-of-experts models whose llama.cpp outputs are recorded in tests/golden/moe_llamacpp.json (by
scripts/golden/record_llamacpp_moe.py) and compared in tests/test_golden_moe.py. Both sides write the file with
this code from the same seed, so it is the same file byte for byte (the golden data holds its sha256 and the test
checks it).

qwen3moe: qwen3's tiny layer (tests/support/gguf_factory.py, per-head q/k norms, a head size of its own) with the
dense feed-forward replaced by N_EXPERTS experts of which N_USED are routed to: a router ffn_gate_inp (F32, as
llama.cpp's quantizer keeps it) whose logits spread over a few units (ROUTER_GAIN), so that tokens and layers pick
different experts, and 3-D expert tensors. qwen2moe: qwen2's tiny layer (q/k/v biases) with qwen3moe's experts and a shared expert SHARED_FFN wide whose gate's
logits spread over a few units (SHARED_GATE_GAIN), all F32. "qwen3moe-f32" holds everything in F32 (the architecture alone);
"qwen3moe-q4km" is laid out as a Q4_K_M file is (Q4_K gate and up experts, Q6_K down experts, Q8_0 attention, an
F16 head and embedding), 256 wide so that the K-quants' super-blocks fit.

gpt-oss: qwen2's tiny layer (q/k/v biases) plus an o bias, a sink logit per head (SINK_MEAN, of the scores' size, so
that the sinks take a visible share of each softmax), the pre-feed-forward norm named post_attention_norm, a sliding
window of GPT_OSS_WINDOW keys on the even layers (shorter than every prompt), YaRN RoPE (factor 4 over an original
context of 64, so that the ramp between interpolated and original frequencies falls inside the head), a router and
experts with biases, and expert gates and ups scaled by EXPERT_GAIN so that gpt-oss's SwiGLU clamp at 7 bites.
Its tokenizer declares gpt-oss's pre-tokenizer ("gpt-4o").
"gpt-oss-mxfp4" holds its experts in MXFP4 (GGML type 39, as the published files), "gpt-oss-f16" in F16, everything
else F32 in both: a failure in one alone points at MXFP4's decoding rather than the architecture.
"""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import numpy as np

from support.gguf_factory import Meta, TensorSpec, _encode, tiny_llama_spec, write_gguf
from support.gguf_raw import FLOAT32, STRING, UINT32

N_EXPERTS = 8
N_USED = 2
ROUTER_GAIN = 2.0
LOGIT_SCALE = 6.0
_BASE = dict(architecture="qwen3", n_layers=3, n_heads=4, n_kv_heads=2, head_dim=32, vocab=384, context=256,
             tied=False, logit_scale=LOGIT_SCALE, rope_theta=10000.0, rms_eps=1e-6, ffn=64)
EXPERT_GAIN = 4.0
SINK_MEAN = 1.0
GPT_OSS_WINDOW = 16
_GPT_OSS = dict(architecture="gpt-oss", hidden=64, expert_ffn=64, tensor_type="F32")
MOE_MODELS: dict[str, dict] = {
    "qwen3moe-f32": dict(architecture="qwen3moe", seed=71, hidden=64, expert_ffn=64, tensor_type="F32",
                         expert_types={}),
    "qwen3moe-q4km": dict(architecture="qwen3moe", seed=72, hidden=256, expert_ffn=256, tensor_type="F32",
                          expert_types={"ffn_gate_exps": "Q4_K", "ffn_up_exps": "Q4_K", "ffn_down_exps": "Q6_K"}),
    # llama.cpp's qwen2moe takes q and o as hidden x hidden: heads of hidden / n_heads
    "qwen2moe-f32": dict(architecture="qwen2moe", seed=92, hidden=64, head_dim=16, expert_ffn=64, tensor_type="F32",
                         expert_types={}),
    "gpt-oss-mxfp4": dict(seed=81, expert_types={part: "MXFP4" for part in ("ffn_gate_exps", "ffn_up_exps",
                                                                            "ffn_down_exps")}, **_GPT_OSS),
    "gpt-oss-f16": dict(seed=82, expert_types={part: "F16" for part in ("ffn_gate_exps", "ffn_up_exps",
                                                                        "ffn_down_exps")}, **_GPT_OSS),
}
# gpt-oss of one layer: llama.cpp's gpt-oss slides on the even layers, so its only layer has a window and no layer is
# global (the KV cache's window-only case: docs/architecture.md, "The release path of a KV block"). F16 experts, so
# that its comparison with llama.cpp takes the float models' tolerances. Recorded apart (gpt_oss_window_only_llamacpp.json).
WINDOW_ONLY_MODELS: dict[str, dict] = {
    "gpt-oss-window-only": dict(seed=83, n_layers=1, expert_types={part: "F16" for part in (
        "ffn_gate_exps", "ffn_up_exps", "ffn_down_exps")}, **_GPT_OSS),
}
_BASE_ARCHITECTURE = {"qwen3moe": "qwen3", "qwen2moe": "qwen2", "gpt-oss": "qwen2"}
SHARED_FFN = 96  # qwen2moe's shared expert: wider than the routed ones, as Qwen1.5-MoE's (5632 against 1408)
SHARED_GATE_GAIN = 2.0  # its gate's logits spread over a few units: sigmoid from near 0 to near 1  # the dense tiny layer each starts from
_GPT_OSS_KEYS = {"attention.sliding_window": (UINT32, GPT_OSS_WINDOW), "rope.scaling.type": (STRING, "yarn"),
                 "rope.scaling.factor": (FLOAT32, 4.0), "rope.scaling.original_context_length": (UINT32, 64)}
# The prompts: the ChatML template every qwen GGUF embeds, rendered by hand, and plain text.
PROMPTS = {
    "chat": "<|im_start|>user\nHello there, how are you today?<|im_end|>\n<|im_start|>assistant\n",
    # capitals, contractions, digits, letters beyond ASCII, a slash: what the pre-tokenizers split differently
    "text": "The quick brown fox jumps over the lazy dog; it's 2024, DON'T panic: über-Café/x 12345 runs back again.",
}
GREEDY_TOKENS = 24


def moe_spec(name: str, **overrides):
    """MOE_MODELS[name] as a gguf_factory model (TinyLlama): qwen3's tiny model with its feed-forward made experts.
    overrides: tiny_llama_spec's arguments that differ (a longer context, another vocabulary: extra_metadata)."""
    spec = {**(MOE_MODELS.get(name) or WINDOW_ONLY_MODELS[name]), **overrides}
    arch, seed, expert_ffn = spec.pop("architecture"), spec.pop("seed"), spec.pop("expert_ffn")
    expert_types = spec.pop("expert_types")
    embedding_type = spec.pop("embedding_type", None)
    base_arch = _BASE_ARCHITECTURE[arch]
    base = tiny_llama_spec(**{**_BASE, "architecture": base_arch, **spec}, seed=seed, embedding_type=embedding_type,
                           tensor_types={"output": "F16"} if embedding_type else {})
    hidden, n_layers = spec["hidden"], spec.get("n_layers", _BASE["n_layers"])
    metadata = [replace(m, key=m.key.replace(f"{base_arch}.", f"{arch}.", 1)) if m.key.startswith(f"{base_arch}.")
                else m for m in base.metadata]
    metadata = [m for m in metadata if m.key not in ("general.architecture", "general.name")]
    metadata[:0] = [Meta("general.architecture", STRING, arch), Meta("general.name", STRING, f"tiny-{name}-test")]
    metadata += [Meta(f"{arch}.expert_count", UINT32, N_EXPERTS), Meta(f"{arch}.expert_used_count", UINT32, N_USED),
                 Meta(f"{arch}.expert_feed_forward_length", UINT32, expert_ffn)]
    if arch == "qwen2moe":
        metadata.append(Meta(f"{arch}.expert_shared_feed_forward_length", UINT32, SHARED_FFN))
    if arch == "gpt-oss":  # its keys, and the o200k pre-tokenizer's name as its files have it
        metadata += [Meta(f"{arch}.{key}", kind, value) for key, (kind, value) in _GPT_OSS_KEYS.items()]
        metadata = [Meta(m.key, STRING, "gpt-4o") if m.key == "tokenizer.ggml.pre" else m for m in metadata]
    rng = np.random.default_rng(seed + 1000)
    residual = 1.0 / math.sqrt(2 * n_layers)

    def linear(*shape, scale=1.0):
        return (rng.standard_normal(shape) * (scale / math.sqrt(shape[-1]))).astype(np.float32)

    oss = arch == "gpt-oss"
    gain = EXPERT_GAIN if oss else 1.0

    def bias(*shape):
        return _encode("", (0.5 * rng.standard_normal(shape)).astype(np.float32), "F32")

    def named(name, spec_):
        return replace(spec_, name=name)

    experts, extras = {}, {}
    for i in range(n_layers):
        experts[i] = [
            _encode(f"blk.{i}.ffn_gate_inp.weight", linear(N_EXPERTS, hidden, scale=ROUTER_GAIN), "F32"),
            *(_encode(f"blk.{i}.{part}.weight", values, expert_types.get(part, spec["tensor_type"]))
              for part, values in (("ffn_gate_exps", linear(N_EXPERTS, expert_ffn, hidden, scale=gain)),
                                   ("ffn_up_exps", linear(N_EXPERTS, expert_ffn, hidden, scale=gain)),
                                   ("ffn_down_exps", linear(N_EXPERTS, hidden, expert_ffn, scale=residual / gain))))]
        if arch == "qwen2moe":
            experts[i] += [_encode(f"blk.{i}.ffn_gate_inp_shexp.weight",
                                   (rng.standard_normal(hidden) * SHARED_GATE_GAIN / math.sqrt(hidden)).astype(np.float32),
                                   "F32"),
                           _encode(f"blk.{i}.ffn_gate_shexp.weight", linear(SHARED_FFN, hidden), "F32"),
                           _encode(f"blk.{i}.ffn_up_shexp.weight", linear(SHARED_FFN, hidden), "F32"),
                           _encode(f"blk.{i}.ffn_down_shexp.weight", linear(hidden, SHARED_FFN, scale=residual), "F32")]
        if oss:
            experts[i] += [named(f"blk.{i}.ffn_gate_inp.bias", bias(N_EXPERTS)),
                           named(f"blk.{i}.ffn_gate_exps.bias", bias(N_EXPERTS, expert_ffn)),
                           named(f"blk.{i}.ffn_up_exps.bias", bias(N_EXPERTS, expert_ffn)),
                           named(f"blk.{i}.ffn_down_exps.bias", bias(N_EXPERTS, hidden))]
            extras[i] = [named(f"blk.{i}.attn_output.bias", bias(hidden)),
                         _encode(f"blk.{i}.attn_sinks.weight", (SINK_MEAN + rng.standard_normal(_BASE["n_heads"]))
                                 .astype(np.float32), "F32")]
    tensors: list[TensorSpec] = []
    for t in base.tensors:
        if t.name.endswith(("ffn_gate.weight", "ffn_up.weight", "ffn_down.weight")):
            if t.name.endswith("ffn_down.weight"):
                tensors += experts[int(t.name.split(".")[1])]
            continue
        if oss and t.name.endswith("ffn_norm.weight"):  # gpt-oss's files name the pre-feed-forward norm so
            t = named(t.name.replace("ffn_norm", "post_attention_norm"), t)
        tensors.append(t)
        if oss and t.name.endswith("attn_output.weight"):
            tensors += extras[int(t.name.split(".")[1])]
    return replace(base, metadata=tuple(metadata), tensors=tuple(tensors))


def write_moe_model(name: str, folder: Path) -> Path:
    """Write MOE_MODELS[name] (or WINDOW_ONLY_MODELS[name]) as <folder>/<name>.gguf and return its path."""
    return write_gguf(Path(folder) / f"{name}.gguf", moe_spec(name))
