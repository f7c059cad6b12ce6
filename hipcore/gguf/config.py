"""ModelConfig: a model's hyperparameters, read from GGUF metadata and checked against the tensors.

Accepted architectures: those of hipcore/gguf/architectures.py (llama, qwen2, qwen3, gemma2, gemma3, phi3, and the
mixtures of experts qwen3moe, qwen2moe and gpt-oss, whose expert keys hipcore/gguf/moe_keys.py reads), whose keys are `<architecture>.*`. Anything else is a valid but unsupported file (exit 4) and the error names the architecture. Supported RoPE scaling: "none",
"linear" (positions divided by the factor) and, for gpt-oss, "yarn" (llama.cpp's: per-pair frequencies between the
interpolated and the original ones, and a magnitude factor; hipcore/model/yarn.py); "longrope" and the rest (and
"yarn" elsewhere) are named and refused (exit 4) rather than silently computed wrong. Llama 3.1/3.2's "llama3" scaling needs no key: the
file carries it as the optional rope_freqs.weight tensor, which every RoPE launch divides by.

The checks here are what make a plan safe to allocate from: block_count, context and head counts
are capped, every tensor the architecture needs must exist with exactly the shape the config
implies, and nothing unexpected may be present (as llama.cpp, which refuses extra tensors).
"""

from __future__ import annotations

import math
import re
import struct
from dataclasses import dataclass
from typing import Iterable, Mapping, Protocol

from hipcore.gguf.architectures import ARCHITECTURES
from hipcore.gguf.header import GGUFError, Limits, show
from hipcore.gguf.metadata_keys import MetadataKeys
from hipcore.gguf.moe_keys import read_moe_keys, refuse_unsupported_moe
from hipcore.gguf.vocabulary_checks import check_tokenizer_metadata

SUPPORTED_ROPE_SCALING = ("none", "linear")
YARN = "yarn"  # for the architectures whose files use it (Architecture.yarn: gpt-oss), checked against llama.cpp there

LAYER_TENSORS = ("attn_norm", "attn_q", "attn_k", "attn_v", "attn_output",
                 "ffn_norm", "ffn_gate", "ffn_up", "ffn_down")
_LAYER_NAME = re.compile(r"blk\.(\d+)\.")
_MAX_DIM = 1 << 24  # hidden, ffn, heads and head_dim above this describe no real model
# What the paged KV cache can hold (hipcore.kvcache.config's MAX_LAYERS, MAX_KV_HEADS, MAX_HEAD_DIM;
# a test keeps them equal). A file past these but within the caps above is valid, only unsupported.
SUPPORTED_MAX_LAYERS = 1024
SUPPORTED_MAX_KV_HEADS = 1024
SUPPORTED_MAX_HEAD_DIM = 4096
# An architecture name as llama.cpp spells them (llama, command-r, gpt-oss, qwen3moe ...): printable
# ASCII without spaces, short. Anything else is a damaged file, not an unknown architecture.
_ARCHITECTURE_NAME = re.compile(r"[\x21-\x7e]{1,64}\Z")


class _Tensor(Protocol):
    name: str
    shape: tuple[int, ...]


@dataclass(frozen=True)
class ModelConfig:
    architecture: str
    name: str
    vocab_size: int
    context_length: int
    hidden_size: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    ffn_size: int
    rms_norm_eps: float
    rope_theta: float
    rope_dim: int                 # dimensions of each head that RoPE rotates (== head_dim for llama)
    rope_scaling: str             # one of SUPPORTED_ROPE_SCALING
    rope_scaling_factor: float    # 1.0 unless rope_scaling is "linear" or "yarn"
    rope_original_context: int
    tie_embeddings: bool          # output.weight absent: the output projection is token_embd.weight
    file_type: int | None
    # What the family adds to the llama layout (hipcore/gguf/architectures.py).
    rope_type: str = "norm"       # "norm": RoPE pairs (2i, 2i+1); "neox": pairs (i, i + rope_dim/2)
    qkv_bias: bool = False        # q, k and v products each add a bias
    qk_norm: bool = False         # q and k are RMS-normalized per head (head_dim weights) before RoPE
    post_norms: bool = False      # attention and feed-forward outputs RMS-normalized before the residual add
    activation: str = "silu"      # the feed-forward's gate: "silu" (SwiGLU) or "gelu" (GeGLU)
    embedding_scale: float = 1.0  # token embeddings are multiplied by this (Gemma: sqrt(hidden_size))
    query_scale: float = 0.0      # attention's score scale; 0: 1/sqrt(head_dim)
    sliding_window: int = 0       # keys a local layer sees, the current one included; 0: no local layers
    swa_period: int = 0           # layer i is local when i % swa_period < swa_period - 1 (and a window is set)
    swa_rope_theta: float = 0.0   # the local layers' RoPE base (they use no RoPE scaling unless swa_rope_scaled)
    swa_rope_scaled: bool = False  # local layers keep the model's RoPE scaling (gemma2)
    attn_softcap: float = 0.0     # attention scores capped at c tanh(S / c) before the softmax; 0: none
    final_softcap: float = 0.0    # output logits capped at f tanh(logits / f); 0: none
    rope_attn_factor: float = 1.0  # rope.scaling.attn_factor: YaRN's magnitude factor is multiplied by it
    # A mixture of experts in every layer's feed-forward (moe_keys.py; 0 experts: a dense model).
    n_experts: int = 0            # experts per layer
    n_experts_used: int = 0       # experts each token is routed to (top-k)
    expert_ffn_size: int = 0      # rows of each expert's gate and up
    expert_gating: str = ""       # "softmax_topk" (qwen3moe) or "topk_softmax" (gpt-oss)
    expert_weights_norm: bool = False  # the k kept softmax weights renormalized to sum 1
    expert_activation: str = "swiglu"  # "swiglu" or "swiglu_oai"
    moe_biases: bool = False      # router and expert products add biases
    shared_ffn_size: int = 0      # rows of the shared expert's gate and up (qwen2moe); 0: none

    @property
    def is_moe(self) -> bool:
        return self.n_experts > 0

    @property
    def attention_scale(self) -> float:
        return self.query_scale or 1.0 / math.sqrt(self.head_dim)

    def is_local_layer(self, i: int) -> bool:
        """Whether layer i attends through the sliding window (llama.cpp's set_swa_pattern, dense last)."""
        return self.sliding_window > 0 and self.swa_period > 0 and i % self.swa_period < self.swa_period - 1

    def layer_window(self, i: int) -> int:
        """The keys layer i attends to, the current one included (0: the whole context)."""
        return self.sliding_window if self.is_local_layer(i) else 0

    def layer_rope(self, i: int, freq_scale: float) -> tuple[float, float]:
        """(RoPE base, frequency scale) of layer i: a local layer's own base without scaling, else the model's
        base with `freq_scale` (the file's linear scaling)."""
        if not self.is_local_layer(i):
            return self.rope_theta, freq_scale
        return self.swa_rope_theta, freq_scale if self.swa_rope_scaled else 1.0

    @property
    def q_size(self) -> int:
        return self.n_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.n_kv_heads * self.head_dim

    def expected_tensor_shapes(self) -> dict[str, tuple[int, ...]]:
        """Numpy-order shapes of every tensor this config needs (a weight is (out_features, in_features))."""
        h, v, f = self.hidden_size, self.vocab_size, self.ffn_size
        shapes: dict[str, tuple[int, ...]] = {"token_embd.weight": (v, h), "output_norm.weight": (h,)}
        if not self.tie_embeddings:
            shapes["output.weight"] = (v, h)
        family = ARCHITECTURES[self.architecture]
        e, ef = self.n_experts, self.expert_ffn_size
        layer = {"attn_norm": (h,), family.ffn_norm_name: (h,),
                 **family.layer_matrices(self.q_size, self.kv_size, h, f, e, ef, self.shared_ffn_size)}
        layer = {f"{part}.weight": shape for part, shape in layer.items()}
        layer.update(family.layer_vectors(self.q_size, self.kv_size, self.head_dim, h, self.n_heads, e, ef))
        for i in range(self.n_layers):
            for part, shape in layer.items():
                shapes[f"blk.{i}.{part}"] = shape
        return shapes

    def optional_tensor_shapes(self) -> dict[str, tuple[int, ...]]:
        """Tensors a file may carry: per-frequency RoPE factors (llama 3.1-style long context), for llama."""
        if ARCHITECTURES[self.architecture].rope_freq_factors:
            return {"rope_freqs.weight": (self.rope_dim // 2,)}
        return {}

    def kv_bytes_per_token(self, dtype_bytes: int) -> int:
        """KV-cache bytes one token occupies across all layers (K and V; GQA: KV heads, not query heads)."""
        return 2 * self.n_layers * self.n_kv_heads * self.head_dim * dtype_bytes


def config_from_metadata(
    metadata: Mapping[str, object],
    tensors: Iterable[_Tensor],
    *,
    types: Mapping[str, str] | None = None,
    offsets: Mapping[str, int] | None = None,
    limits: Limits = Limits(),
) -> ModelConfig:
    """Build and validate the config; also checks every tensor's presence and shape against it.

    `types`/`offsets` (GGUF value type names and byte offsets per key, from the header parser) make
    type checks exact and errors point at bytes; without them, Python types are checked.
    """
    tensors = list(tensors)
    keys = MetadataKeys(metadata, types, offsets)
    arch = keys.string("general.architecture")
    if not _ARCHITECTURE_NAME.match(arch):
        raise keys.error("general.architecture", arch, "1 to 64 printable ASCII characters without spaces",
                         problem=f"{show(arch)} is not an architecture name")
    if arch not in ARCHITECTURES:
        refuse_unsupported_moe(keys, arch)
        raise keys.error("general.architecture", arch, " or ".join(map(repr, ARCHITECTURES)), unsupported=True,
                         problem=f"architecture {show(arch)} is not supported")
    n_layers = keys.uint32(f"{arch}.block_count", lo=1, hi=limits.max_layers)
    _check_supported(keys, f"{arch}.block_count", n_layers, SUPPORTED_MAX_LAYERS, "layers")
    context = keys.uint32(f"{arch}.context_length", lo=1, hi=limits.max_context)
    hidden = keys.uint32(f"{arch}.embedding_length", lo=1, hi=_MAX_DIM)
    family = ARCHITECTURES[arch]
    ffn = keys.uint32_or_uniform_array(f"{arch}.feed_forward_length", n_layers, lo=1, hi=_MAX_DIM,
                                       default=1 if family.moe else None)  # a MoE's dense width is unused
    moe = read_moe_keys(keys, arch, family, n_layers, ffn)
    n_heads = keys.uint32_or_uniform_array(f"{arch}.attention.head_count", n_layers, lo=1, hi=_MAX_DIM)
    n_kv = keys.uint32_or_uniform_array(f"{arch}.attention.head_count_kv", n_layers, lo=1, hi=n_heads,
                                        default=n_heads)
    if n_heads % n_kv:
        raise keys.error(f"{arch}.attention.head_count_kv", n_kv, f"a divisor of head_count ({n_heads})",
                         problem=f"head_count {n_heads} is not divisible by head_count_kv {n_kv}")
    _check_supported(keys, f"{arch}.attention.head_count_kv", n_kv, SUPPORTED_MAX_KV_HEADS, "KV heads")
    head_dim = _head_dim(keys, arch, hidden, n_heads)
    _check_supported(keys, f"{arch}.attention.key_length", head_dim, SUPPORTED_MAX_HEAD_DIM, "dimensions per head")
    # llama.cpp rotates whole heads for llama ("invalid n_rot" otherwise): partial RoPE is another architecture.
    rope_dim = keys.uint32(f"{arch}.rope.dimension_count", lo=head_dim, hi=head_dim, default=head_dim)
    if rope_dim % 2:
        raise keys.error(f"{arch}.rope.dimension_count", rope_dim, "an even head size",
                         problem=f"RoPE needs an even head size, not {rope_dim}")
    scaling, factor, original = _rope_scaling(keys, arch, context, ARCHITECTURES[arch].yarn)
    names = {t.name for t in tensors}
    window = period = 0
    if family.swa_period:  # required where llama.cpp requires it (gemma3); else its default (gemma2: 4096)
        window = keys.uint32(f"{arch}.attention.sliding_window", lo=1, hi=limits.max_context,
                             default=family.default_sliding_window or None)
        period = _swa_period(keys, arch, family) if window else 0
    rope_theta = keys.float32(f"{arch}.rope.freq_base", lo=0.0, hi=1e12, default=10000.0)
    swa_rope_theta = family.swa_rope_theta
    if family.swa_period and not swa_rope_theta:  # local layers rotate with the model's base unless told
        swa_rope_theta = keys.float32(f"{arch}.rope.freq_base_swa", lo=0.0, hi=1e12, default=rope_theta)
    softcaps = {which: keys.float32(f"{arch}.{which}_logit_softcapping", lo=0.0, hi=1e6, default=default)
                for which, default in (("attn", family.attn_softcap), ("final", family.final_softcap)) if default}
    config = ModelConfig(
        architecture=arch,
        name=keys.string("general.name", default=""),
        vocab_size=_vocab_size(keys, arch, tensors, limits),
        context_length=context, hidden_size=hidden, n_layers=n_layers,
        n_heads=n_heads, n_kv_heads=n_kv, head_dim=head_dim, ffn_size=ffn,
        rms_norm_eps=keys.float32(f"{arch}.attention.layer_norm_rms_epsilon", lo=0.0, hi=1.0),
        rope_theta=rope_theta,
        rope_dim=rope_dim, rope_scaling=scaling, rope_scaling_factor=factor, rope_original_context=original,
        tie_embeddings=family.tied_output or "output.weight" not in names,
        file_type=keys.uint32("general.file_type", required=False),
        rope_type=family.rope_type, qkv_bias=family.qkv_bias, qk_norm=family.qk_norm,
        post_norms=family.post_norms, activation=family.activation,
        # float32, as llama.cpp computes sqrtf(n_embd)
        embedding_scale=_float32(math.sqrt(hidden)) if family.scaled_embedding else 1.0,
        query_scale=_query_scale(arch, n_layers, hidden, n_heads),
        sliding_window=window, swa_period=period, swa_rope_theta=swa_rope_theta, swa_rope_scaled=family.swa_rope_scaled,
        attn_softcap=softcaps.get("attn", 0.0), final_softcap=softcaps.get("final", 0.0), **moe,
        rope_attn_factor=keys.float32(f"{arch}.rope.scaling.attn_factor", lo=0.0, hi=1e3, default=1.0),
    )
    _refuse_long_rope(arch, tensors)
    check_tensor_shapes(config, tensors, offsets=offsets)
    return config


# Phi-3's 128k variants rescale RoPE's frequencies per pair (LongRoPE: one set of factors below the original
# context, another beyond it, plus an attention factor); the 4k variants rotate plainly.
_LONG_ROPE_TENSORS = ("rope_factors_long.weight", "rope_factors_short.weight")


def _refuse_long_rope(arch: str, tensors: list[_Tensor]) -> None:
    for tensor in tensors:
        if tensor.name in _LONG_ROPE_TENSORS:
            raise GGUFError(f"tensor {show(tensor.name)}", getattr(tensor, "header_offset", None), tensor.name,
                            "no LongRoPE factors", unsupported=True,
                            problem=f"{arch}: LongRoPE scaling ({tensor.name}, the 128k-context variants) is not "
                                    "supported; the 4k-context variants are")


def _float32(x: float) -> float:
    """x rounded to float32 (what llama.cpp computes these constants in)."""
    return struct.unpack("<f", struct.pack("<f", x))[0]


def _query_scale(arch: str, n_layers: int, hidden: int, n_heads: int) -> float:
    """Attention's score scale where a family departs from 1/sqrt(head_dim), else 0. llama.cpp gives Gemma 3
    27B (the only gemma3 of 62 layers) and Gemma 2 27B (the only gemma2 of 46) 1/sqrt(embedding_length /
    head_count), as Google's reference does (query_pre_attn_scalar = hidden / heads there), and every other
    gemma2 and gemma3 1/sqrt(head_dim)."""
    if (arch, n_layers) in (("gemma3", 62), ("gemma2", 46)):
        return _float32(1.0 / math.sqrt(hidden // n_heads))
    return 0.0


def _swa_period(keys: MetadataKeys, arch: str, family) -> int:
    """Every how many layers the global one comes: the family's, or attention.sliding_window_pattern's where
    the family reads that key (gemma2) and it is a period. llama.cpp also takes a per-layer array there,
    and 0 for "every layer local"; neither is implemented here."""
    key = f"{arch}.attention.sliding_window_pattern"
    if not family.swa_pattern_key or key not in keys:
        return family.swa_period
    if isinstance(keys.metadata[key], tuple):
        raise keys.error(key, keys.metadata[key], "a uint32 period", unsupported=True,
                         problem="a per-layer sliding-window pattern is not supported")
    period = keys.uint32(key)
    if period == 0:
        raise keys.error(key, 0, "a period of at least 1", unsupported=True,
                         problem="a sliding window on every layer (pattern 0) is not supported")
    return period


def _check_supported(keys: MetadataKeys, key: str, value: int, most: int, what: str) -> None:
    if value > most:
        raise keys.error(key, value, f"at most {most}", unsupported=True,
                         problem=f"a model with {value} {what} is not supported: the KV cache holds at most {most}")


def _head_dim(keys: MetadataKeys, arch: str, hidden: int, n_heads: int) -> int:
    key_length = keys.uint32(f"{arch}.attention.key_length", lo=1, hi=_MAX_DIM, required=False)
    if key_length is None:
        if hidden % n_heads:
            raise keys.error(f"{arch}.attention.head_count", n_heads, f"a divisor of embedding_length ({hidden})",
                             problem=f"embedding_length {hidden} is not divisible by head_count {n_heads}")
        key_length = hidden // n_heads
    value_length = keys.uint32(f"{arch}.attention.value_length", lo=1, hi=_MAX_DIM, default=key_length)
    if value_length != key_length:
        raise keys.error(f"{arch}.attention.value_length", value_length, f"equal to key_length ({key_length})",
                         unsupported=True, problem="different key and value head sizes are not supported")
    return key_length


def _rope_scaling(keys: MetadataKeys, arch: str, context: int, yarn: bool) -> tuple[str, float, int]:
    type_key = f"{arch}.rope.scaling.type"
    factor_key = f"{arch}.rope.scaling.factor"
    if factor_key not in keys and f"{arch}.rope.scale_linear" in keys:
        factor_key = f"{arch}.rope.scale_linear"  # the older name of the linear factor
    factor = keys.float32(factor_key, lo=0.0, hi=1024.0, default=1.0)
    kind = keys.string(type_key, default="linear" if factor != 1.0 else "none")
    supported = SUPPORTED_ROPE_SCALING + ((YARN,) if yarn else ())
    if kind not in supported:
        raise keys.error(type_key, kind, " or ".join(supported), unsupported=True,
                         problem=f"RoPE scaling {show(kind)} is not supported")
    if kind == "none" and factor != 1.0:
        raise keys.error(factor_key, factor, "1.0 when rope.scaling.type is 'none'",
                         problem=f"factor {factor:g} contradicts scaling type 'none'")
    if kind == "yarn" and factor < 1.0:
        raise keys.error(factor_key, factor, "at least 1.0 for YaRN", unsupported=True,
                         problem=f"YaRN scaling by {factor:g} (a shorter context) is not supported")
    original = keys.uint32(f"{arch}.rope.scaling.original_context_length", lo=1, hi=context, default=context)
    return kind, factor, original


def _vocab_size(keys: MetadataKeys, arch: str, tensors: list[_Tensor], limits: Limits) -> int:
    n_tokens = check_tokenizer_metadata(keys, max_token_chars=limits.max_token_chars)
    declared = keys.uint32(f"{arch}.vocab_size", lo=1, hi=_MAX_DIM, required=False)
    if n_tokens is not None and declared is not None and declared != n_tokens:
        raise keys.error(f"{arch}.vocab_size", declared, f"the number of tokenizer.ggml.tokens ({n_tokens})",
                         problem=f"{declared} disagrees with the {n_tokens} entries of tokenizer.ggml.tokens")
    if n_tokens is not None:
        return n_tokens
    if declared is not None:
        return declared
    embedding = next((t for t in tensors if t.name == "token_embd.weight"), None)
    if embedding is None:
        raise GGUFError("token_embd.weight", None, None, "a [vocab, hidden] tensor", problem="the tensor is missing")
    return embedding.shape[0]


def check_tensor_shapes(config: ModelConfig, tensors: Iterable[_Tensor], *,
                        offsets: Mapping[str, int] | None = None) -> None:
    """Every needed tensor present with the config's shape; nothing the architecture does not use."""
    present = {t.name: t for t in tensors}
    expected = config.expected_tensor_shapes()
    optional = config.optional_tensor_shapes()
    arch = config.architecture
    for name, tensor in present.items():
        if name in expected or name in optional:
            continue
        layer = _LAYER_NAME.match(name)
        if layer and int(layer.group(1)) >= config.n_layers:
            block_count_at = (offsets or {}).get(f"{arch}.block_count")
            raise GGUFError(f"{arch}.block_count", block_count_at, config.n_layers, f"more than {layer.group(1)}",
                            problem=f"block_count is {config.n_layers} but tensor {show(name)} "
                                    f"belongs to layer {layer.group(1)}")
        raise GGUFError(f"tensor {show(name)}", getattr(tensor, "header_offset", None), name,
                        f"the tensors of the {arch} architecture", unsupported=True,
                        problem=f"tensor {show(name)} is not part of the {arch} architecture as rocmforge implements it")
    for name, shape in expected.items():
        if name not in present:
            layer = _LAYER_NAME.match(name)
            hint = f" (block_count is {config.n_layers})" if layer else ""
            raise GGUFError(f"tensor {name!r}", None, None, f"a tensor of shape {shape}",
                            problem=f"required tensor {name!r} is missing{hint}")
    for name, tensor in present.items():
        shape = expected.get(name) or optional[name]
        if tuple(tensor.shape) != shape:
            raise GGUFError(f"tensor {name!r} shape", getattr(tensor, "header_offset", None), tuple(tensor.shape),
                            f"{shape} from the model config",
                            problem=f"shape {tuple(tensor.shape)} disagrees with the config, which implies {shape}")
