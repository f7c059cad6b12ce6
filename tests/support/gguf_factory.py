"""Tiny, valid llama (and qwen2, qwen3) GGUF files for tests, written with the gguf package's GGUFWriter.

    from support.gguf_factory import write_tiny_llama
    path = write_tiny_llama(tmp_path / "m.gguf", tensor_type="Q8_0", tokenizer="llama")

Random weights, scaled so that activations stay near unit size through every layer; 2-D weights in
`tensor_type` (norms stay F32, as llama.cpp's converters do); a small working tokenizer vocabulary
(tests/support/gguf_vocab.py). `tiny_llama_spec` gives the same model as data (the float32 originals and
the encoded bytes of every tensor) and `raw_tiny_llama` the same file as a RawGGUF (tests/support/gguf_raw.py)
ready to be corrupted field by field. `architecture="qwen2"` adds q/k/v biases and the qwen2 pre-tokenizer,
"qwen3" per-head q/k norm weights (and a head size of its own with head_dim=...), "gemma3" qwen3's norms
plus post-attention and post-feed-forward norms, attention.sliding_window (16 unless extra_metadata says
otherwise) and a Gemma-style chat template, "gemma2" the same without the q/k norms; "phi3" the llama tensors with q|k|v and gate|up concatenated as
Phi-3's files hold them (attn_qkv, ffn_up of twice the rows).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

import numpy as np
from gguf import GGUFValueType, GGUFWriter
from gguf.constants import GGMLQuantizationType

from support.gguf_quantize import quantize
from support.gguf_raw import ARRAY, BOOL, FLOAT32, INT32, STRING, UINT32, RawGGUF, RawKV, RawTensor
from support.gguf_vocab import gpt2_vocab, llama_vocab

LAYER_TENSORS = ("attn_norm", "attn_q", "attn_k", "attn_v", "attn_output",
                 "ffn_norm", "ffn_gate", "ffn_up", "ffn_down")
FILE_TYPES = {"F32": 0, "F16": 1, "Q4_0": 2, "Q4_1": 3, "Q8_0": 7, "Q5_0": 8, "Q5_1": 9, "Q4_K": 15, "Q5_K": 17, "Q6_K": 18, "BF16": 32}
# Gemma's turn markup (its files' templates add system-prompt handling and BOS; this keeps the turns).
GEMMA_TEMPLATE = (
    "{% for message in messages %}{% set role = 'model' if message['role'] == 'assistant' else message['role'] %}"
    "{{ '<start_of_turn>' + role + '\n' + message['content'] + '<end_of_turn>\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<start_of_turn>model\n' }}{% endif %}"
)
GEMMA_SLIDING_WINDOW = 16
CHATML_TEMPLATE = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + "
    "'<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


@dataclass(frozen=True)
class Meta:
    key: str
    value_type: int          # GGUF value type id (gguf_raw.UINT32, STRING, ARRAY ...)
    value: object
    element_type: int | None = None


@dataclass(frozen=True)
class TensorSpec:
    name: str
    type_name: str
    values: np.ndarray       # the float32 originals, numpy-order shape (out_features, in_features)
    data: np.ndarray         # the encoded bytes (uint8), what the file holds

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.values.shape)


@dataclass(frozen=True)
class TinyLlama:
    metadata: tuple[Meta, ...]
    tensors: tuple[TensorSpec, ...]
    alignment: int | None = None

    def tensor(self, name: str) -> TensorSpec:
        return next(t for t in self.tensors if t.name == name)


def tiny_llama_spec(
    *,
    n_layers: int = 2,
    hidden: int = 64,
    n_heads: int = 4,
    n_kv_heads: int = 2,
    ffn: int = 128,
    vocab: int = 384,
    tensor_type: str = "F32",
    embedding_type: str | None = None,
    tied: bool = True,
    context: int = 256,
    seed: int = 0,
    tokenizer: str | None = "gpt2",
    extra_metadata: Mapping[str, object] | None = None,
    rope_theta: float = 10000.0,
    rms_eps: float = 1e-5,
    alignment: int | None = None,
    tensor_types: Mapping[str, str] | None = None,
    architecture: str = "llama",
    head_dim: int | None = None,
    logit_scale: float = 1.0,
    rope_freqs: np.ndarray | None = None,
    embedding_gain: float = 1.0,
    post_norm_gain: float = 1.0,
) -> TinyLlama:
    """The model of write_tiny_llama as data. tensor_types: a matrix's part name ("attn_v", "ffn_down",
    "output" ...) -> its type where it differs from tensor_type (Q4_K_M: {"attn_v": "Q6_K", ...}). extra_metadata: key -> value (type inferred: bool, int as
    uint32, float as float32, str, lists of str/int/float) or key -> Meta; a value of None removes the key.
    head_dim: the size of a head where it is not hidden / n_heads (written as attention.key_length and
    value_length). logit_scale: the output matrix is multiplied by it (untied models), so that the logits
    spread wider and greedy choices have clear margins. embedding_gain: the token embeddings are multiplied
    by it (for tied models, the same end). post_norm_gain: gemma3's post-norm weights are multiplied by it (a
    larger layer output against the scaled embedding in the residual stream).
    rope_freqs: head_dim / 2 RoPE frequency divisors, written first as F32 rope_freqs.weight (where llama.cpp's
    converter puts them in Llama 3.1/3.2 files); the other tensors are the same with or without them."""
    if architecture not in FAMILY_EXTRAS:
        raise ValueError(f"architecture must be one of {sorted(FAMILY_EXTRAS)}, not {architecture!r}")
    if n_heads % n_kv_heads or (head_dim is None and hidden % n_heads):
        raise ValueError("hidden must divide by n_heads (or head_dim be given) and n_heads by n_kv_heads")
    own_head_dim = head_dim is not None
    head_dim = head_dim or hidden // n_heads
    a = architecture
    meta = [
        Meta("general.architecture", STRING, a),
        Meta("general.name", STRING, f"tiny-{a}-test"),
        Meta("general.file_type", UINT32, FILE_TYPES.get(tensor_type, 0)),
        Meta(f"{a}.vocab_size", UINT32, vocab),
        Meta(f"{a}.context_length", UINT32, context),
        Meta(f"{a}.embedding_length", UINT32, hidden),
        Meta(f"{a}.block_count", UINT32, n_layers),
        Meta(f"{a}.feed_forward_length", UINT32, ffn),
        Meta(f"{a}.attention.head_count", UINT32, n_heads),
        Meta(f"{a}.attention.head_count_kv", UINT32, n_kv_heads),
        Meta(f"{a}.rope.freq_base", FLOAT32, rope_theta),
        Meta(f"{a}.rope.dimension_count", UINT32, head_dim),
        Meta(f"{a}.attention.layer_norm_rms_epsilon", FLOAT32, rms_eps),
    ]
    if own_head_dim:
        meta += [Meta(f"{a}.attention.key_length", UINT32, head_dim), Meta(f"{a}.attention.value_length", UINT32, head_dim)]
    if alignment is not None:
        meta.append(Meta("general.alignment", UINT32, alignment))
    if a in ("gemma2", "gemma3"):
        meta.append(Meta(f"{a}.attention.sliding_window", UINT32, GEMMA_SLIDING_WINDOW))
    meta += _tokenizer_metadata(tokenizer, vocab, pre="qwen2" if a in ("qwen2", "qwen3") else "smollm")
    if a in ("gemma2", "gemma3") and tokenizer == "gpt2":
        meta = [Meta(m.key, STRING, GEMMA_TEMPLATE) if m.key == "tokenizer.chat_template" else m for m in meta]
    meta = _apply_extra(meta, extra_metadata or {})
    shape = _Shape(n_layers, hidden, n_heads, n_kv_heads, head_dim, ffn, vocab)
    tensors = _tensors(shape, tensor_type, embedding_type or tensor_type, tied, seed, dict(tensor_types or {}),
                       FAMILY_EXTRAS[a], logit_scale, embedding_gain, post_norm_gain)
    if rope_freqs is not None:
        tensors = [_encode("rope_freqs.weight", np.asarray(rope_freqs, dtype=np.float32), "F32"), *tensors]
    return TinyLlama(tuple(meta), tuple(tensors), alignment)


def write_tiny_llama(path: str | Path, **kwargs) -> Path:
    """Write a valid tiny llama GGUF (see tiny_llama_spec for the arguments) and return its path."""
    return write_gguf(path, tiny_llama_spec(**kwargs))


def write_gguf(path: str | Path, model: TinyLlama) -> Path:
    """Write any metadata + tensors through the gguf package's writer (an independent implementation)."""
    path = Path(path)
    arch = next((m.value for m in model.metadata if m.key == "general.architecture"), "llama")
    writer = GGUFWriter(str(path), str(arch))
    if model.alignment is not None:
        writer.data_alignment = model.alignment
    for m in model.metadata:
        if m.key == "general.architecture":
            continue  # GGUFWriter writes it first by itself
        sub = GGUFValueType(m.element_type) if m.element_type is not None else None
        writer.add_key_value(m.key, m.value, GGUFValueType(m.value_type), sub_type=sub)
    for t in model.tensors:
        qtype = GGMLQuantizationType[t.type_name]
        writer.add_tensor(t.name, t.data, raw_shape=t.data.shape, raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def raw_tiny_llama(**kwargs) -> RawGGUF:
    """The same file as write_tiny_llama, as a RawGGUF whose every field a test may then corrupt."""
    model = tiny_llama_spec(**kwargs)
    kvs = [RawKV(m.key, m.value_type, m.value, m.element_type) for m in model.metadata]
    tensors = [RawTensor(t.name, tuple(reversed(t.shape)), int(GGMLQuantizationType[t.type_name]),
                         data=t.data.tobytes()) for t in model.tensors]
    return RawGGUF(kvs=kvs, tensors=tensors, alignment=model.alignment or 32)


def _tokenizer_metadata(kind: str | None, vocab: int, pre: str = "smollm") -> list[Meta]:
    if kind is None:  # llama.cpp insists on a tokenizer.ggml.model; "no_vocab" is its "none"
        return [Meta("tokenizer.ggml.model", STRING, "no_vocab")]
    if kind == "gpt2":
        tokens, types, merges = _gpt2(vocab)
        return [
            Meta("tokenizer.ggml.model", STRING, "gpt2"),
            Meta("tokenizer.ggml.pre", STRING, pre),
            Meta("tokenizer.ggml.tokens", ARRAY, tokens, STRING),
            Meta("tokenizer.ggml.token_type", ARRAY, types, INT32),
            Meta("tokenizer.ggml.merges", ARRAY, merges, STRING),
            Meta("tokenizer.ggml.bos_token_id", UINT32, 1),
            Meta("tokenizer.ggml.eos_token_id", UINT32, 2),
            Meta("tokenizer.ggml.unknown_token_id", UINT32, 0),
            Meta("tokenizer.ggml.padding_token_id", UINT32, 2),
            Meta("tokenizer.ggml.add_bos_token", BOOL, False),
            Meta("tokenizer.chat_template", STRING, CHATML_TEMPLATE),
        ]
    if kind == "llama":
        tokens, scores, types = _llama(vocab)
        return [
            Meta("tokenizer.ggml.model", STRING, "llama"),
            Meta("tokenizer.ggml.pre", STRING, "default"),
            Meta("tokenizer.ggml.tokens", ARRAY, tokens, STRING),
            Meta("tokenizer.ggml.scores", ARRAY, scores, FLOAT32),
            Meta("tokenizer.ggml.token_type", ARRAY, types, INT32),
            Meta("tokenizer.ggml.bos_token_id", UINT32, 1),
            Meta("tokenizer.ggml.eos_token_id", UINT32, 2),
            Meta("tokenizer.ggml.unknown_token_id", UINT32, 0),
            Meta("tokenizer.ggml.add_bos_token", BOOL, True),
            Meta("tokenizer.ggml.add_eos_token", BOOL, False),
            Meta("tokenizer.ggml.add_space_prefix", BOOL, True),
        ]
    raise ValueError(f"tokenizer must be 'gpt2', 'llama' or None, not {kind!r}")


@functools.lru_cache(maxsize=8)
def _gpt2(vocab: int):
    tokens, types, merges = gpt2_vocab(vocab)
    return tuple(tokens), tuple(types), tuple(merges)


@functools.lru_cache(maxsize=8)
def _llama(vocab: int):
    tokens, scores, types = llama_vocab(vocab)
    return tuple(tokens), tuple(scores), tuple(types)


def _apply_extra(meta: list[Meta], extra: Mapping[str, object]) -> list[Meta]:
    by_key = {m.key: m for m in meta}
    for key, value in extra.items():
        if value is None:
            by_key.pop(key, None)
        else:
            by_key[key] = value if isinstance(value, Meta) else _infer(key, value)
    return list(by_key.values())


def _infer(key: str, value: object) -> Meta:
    if isinstance(value, bool):
        return Meta(key, BOOL, value)
    if isinstance(value, int):
        return Meta(key, UINT32 if value >= 0 else INT32, value)
    if isinstance(value, float):
        return Meta(key, FLOAT32, value)
    if isinstance(value, str):
        return Meta(key, STRING, value)
    if isinstance(value, (list, tuple)) and value:
        element = _infer(key, value[0]).value_type
        return Meta(key, ARRAY, tuple(value), INT32 if element == UINT32 else element)
    raise ValueError(f"cannot infer a GGUF type for {key}={value!r}; pass a Meta")


@dataclass(frozen=True)
class _Shape:
    n_layers: int
    hidden: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    ffn: int
    vocab: int


# Per-layer vectors each family adds to the llama layout: "bias" (q, k, v biases) and/or "qk_norm".
# "fused": q|k|v written as one attn_qkv matrix and gate|up as one ffn_up of twice the rows, gate first (phi3).
FAMILY_EXTRAS = {"llama": (), "qwen2": ("bias",), "qwen3": ("qk_norm",), "gemma2": ("post_norm",),
                 "gemma3": ("qk_norm", "post_norm"), "phi3": ("fused",)}


def _tensors(shape: _Shape, tensor_type, embedding_type, tied, seed, tensor_types, extras=(), logit_scale=1.0,
             embedding_gain=1.0, post_norm_gain=1.0):
    rng = np.random.default_rng(seed)
    n_layers, hidden, ffn, vocab = shape.n_layers, shape.hidden, shape.ffn, shape.vocab
    q_size, kv_size = shape.n_heads * shape.head_dim, shape.n_kv_heads * shape.head_dim
    # Weights ~ N(0, 1/fan_in) keep each projection's output near unit size; the two projections
    # that write into the residual stream are further shrunk so that it grows slowly with depth.
    residual = 1.0 / math.sqrt(2 * n_layers)

    def linear(out_f, in_f, scale=1.0):
        return (rng.standard_normal((out_f, in_f)) * (scale / math.sqrt(in_f))).astype(np.float32)

    def norm(n):
        return (1.0 + 0.05 * rng.standard_normal(n)).astype(np.float32)

    def bias(n):  # large enough that a dropped bias moves the logits far past any rounding
        return (0.5 * rng.standard_normal(n)).astype(np.float32)

    out = [_encode("token_embd.weight", linear(vocab, hidden, embedding_gain), embedding_type)]
    for i in range(n_layers):
        parts = {
            "attn_norm": norm(hidden),
            "attn_q": linear(q_size, hidden),
            "attn_k": linear(kv_size, hidden),
            "attn_v": linear(kv_size, hidden),
            "attn_output": linear(hidden, q_size, residual),
            "ffn_norm": norm(hidden),
            "ffn_gate": linear(ffn, hidden),
            "ffn_up": linear(ffn, hidden),
            "ffn_down": linear(hidden, ffn, residual),
        }
        names = LAYER_TENSORS
        if "fused" in extras:  # the same draws, concatenated as Phi-3's converter writes them
            parts["attn_qkv"] = np.concatenate([parts.pop("attn_q"), parts.pop("attn_k"), parts.pop("attn_v")])
            parts["ffn_up"] = np.concatenate([parts.pop("ffn_gate"), parts["ffn_up"]])
            names = ("attn_norm", "attn_qkv", "attn_output", "ffn_norm", "ffn_up", "ffn_down")
        for part in names:
            values = parts[part]
            kind = tensor_types.get(part, tensor_type) if values.ndim == 2 else "F32"
            out.append(_encode(f"blk.{i}.{part}.weight", values, kind))
        if "bias" in extras:
            for part, n in (("attn_q", q_size), ("attn_k", kv_size), ("attn_v", kv_size)):
                out.append(_encode(f"blk.{i}.{part}.bias", bias(n), "F32"))
        if "qk_norm" in extras:  # wider than the layer norms: a skipped per-head norm must show
            for part in ("attn_q_norm", "attn_k_norm"):
                out.append(_encode(f"blk.{i}.{part}.weight", (1.0 + 0.5 * rng.standard_normal(shape.head_dim))
                                   .astype(np.float32), "F32"))
        if "post_norm" in extras:  # wide as well: a skipped post-norm must show
            for part in ("post_attention_norm", "post_ffw_norm"):
                out.append(_encode(f"blk.{i}.{part}.weight", (post_norm_gain * (1.0 + 0.5 * rng.standard_normal(hidden)))
                                   .astype(np.float32), "F32"))
    out.append(_encode("output_norm.weight", norm(hidden), "F32"))
    if not tied:
        out.append(_encode("output.weight", linear(vocab, hidden, logit_scale), tensor_types.get("output", tensor_type)))
    return out


def _encode(name: str, values: np.ndarray, type_name: str) -> TensorSpec:
    try:
        data = quantize(values, type_name)
    except ValueError as exc:
        raise ValueError(f"{name} {values.shape}: {exc} (K-quants need hidden and ffn multiples of 256)") from None
    return TensorSpec(name, type_name, values, np.ascontiguousarray(data))
