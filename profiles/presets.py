"""Model shapes for KV planning: named presets of common models, or the shape of a real GGUF file.

Preset numbers are copied from each model's published Hugging Face config.json (cited per entry:
num_hidden_layers, num_attention_heads, num_key_value_heads, hidden_size / heads = head_dim,
intermediate_size, vocab_size, max_position_embeddings, tie_word_embeddings). The parameter count
is computed from the shape (llama layout; Qwen2 adds q/k/v biases, Qwen3 a per-head q/k norm) and
equals the count each model card publishes: tests/test_presets.py checks that, which checks the shapes too.

Gemma 3 (text decoder only; the published 4B/12B/27B counts include the SigLIP vision tower, so its
parameter count is the text decoder's, computed in gemma3_parameter_count) sets head_dim itself
(config.json's head_dim, not hidden / heads) and slides: `layer_windows` is llama.cpp's
set_swa_pattern(6) for gemma3 (src/llama-hparams.cpp: layer il is a sliding-window layer when
il % 6 < 5, i.e. 5 local layers then 1 global) with config.json's sliding_window of 1024 tokens.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from hipcore.errors import UsageError
from hipcore.gguf.file import read_plan


@dataclass(frozen=True)
class ModelShape:
    """What KV planning needs to know about a model. Field names match hipcore's ModelConfig."""

    name: str
    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    hidden_size: int
    ffn_size: int
    vocab_size: int
    context_length: int
    n_params: int
    source: str  # a config.json address for a preset; the file path for a GGUF
    weight_bytes: int | None = None  # exact, for a real file; presets estimate it per weight type
    weight_type: str = ""  # a file's dominant tensor type, e.g. "Q4_1"
    layer_windows: tuple[int, ...] = ()  # per layer: 0 global, W a sliding window (KvCacheConfig.layer_windows)
    # A mixture of experts (0 experts: dense). n_active_params: the weights one token's forward pass reads (the routed
    # experts and every other matrix; not the embedding table, of which it reads a row). expert_type: the experts'
    # type in the published GGUF where it differs from the rest (gpt-oss: MXFP4); the rest then counts as Q8_0.
    n_experts: int = 0
    n_experts_used: int = 0
    expert_ffn_size: int = 0
    n_active_params: int = 0
    expert_params: int = 0
    expert_type: str = ""

    @property
    def is_moe(self) -> bool:
        return self.n_experts > 0

    def to_dict(self) -> dict[str, object]:
        out = {k: getattr(self, k) for k in self.__dataclass_fields__}
        out["layer_windows"] = list(self.layer_windows)
        return out


def llama_parameter_count(n_layers: int, n_heads: int, n_kv_heads: int, head_dim: int, hidden_size: int,
                          ffn_size: int, vocab_size: int, tie_embeddings: bool, qkv_bias: bool = False,
                          qk_norm: bool = False, norms_per_layer: int = 2) -> int:
    """Weights of a llama-layout decoder: embeddings, per-layer attention + gated MLP + RMSNorms (2, or 4
    for Gemma 3's norms before and after attention and MLP), final norm, and the output projection
    unless tied to the embeddings. qk_norm: a head_dim-wide RMSNorm weight on q and on k."""
    q, kv = n_heads * head_dim, n_kv_heads * head_dim
    attention = hidden_size * q + 2 * hidden_size * kv + q * hidden_size + ((q + 2 * kv) if qkv_bias else 0)
    attention += 2 * head_dim if qk_norm else 0
    layer = attention + 3 * hidden_size * ffn_size + norms_per_layer * hidden_size
    embeddings = vocab_size * hidden_size * (1 if tie_embeddings else 2)
    return embeddings + n_layers * layer + hidden_size


def moe_parameter_counts(n_layers: int, n_heads: int, n_kv_heads: int, head_dim: int, hidden_size: int, vocab_size: int,
                         experts: int, used: int, expert_ffn: int, *, qk_norm: bool = False,
                         biases: bool = False) -> tuple[int, int, int]:
    """(total, active, expert) parameters of a mixture-of-experts decoder with untied embeddings: qwen3moe's layer
    (qwen3's attention, a router, 3-D gate/up/down experts) or, with biases, gpt-oss's (q/k/v/o biases, a sink per
    head, router and expert biases). Active: what one token reads (module docstring of ModelShape's fields)."""
    q, kv = n_heads * head_dim, n_kv_heads * head_dim
    attention = 2 * hidden_size * q + 2 * hidden_size * kv + (2 * head_dim if qk_norm else 0)
    attention += (q + 2 * kv + hidden_size + n_heads) if biases else 0
    router = experts * hidden_size + (experts if biases else 0)
    expert = 3 * expert_ffn * hidden_size + ((2 * expert_ffn + hidden_size) if biases else 0)
    dense = attention + router + 2 * hidden_size
    embedding = vocab_size * hidden_size
    total = n_layers * (dense + experts * expert) + 2 * embedding + hidden_size
    active = n_layers * (dense + used * expert) + embedding + hidden_size
    return total, active, n_layers * experts * expert


def _moe(name: str, source: str, *, layers: int, heads: int, kv_heads: int, head_dim: int, hidden: int, vocab: int,
         context: int, experts: int, used: int, expert_ffn: int, qk_norm: bool = False, biases: bool = False,
         window: int = 0, expert_type: str = "") -> ModelShape:
    total, active, expert = moe_parameter_counts(layers, heads, kv_heads, head_dim, hidden, vocab, experts, used,
                                                 expert_ffn, qk_norm=qk_norm, biases=biases)
    windows = tuple(window if il % 2 == 0 else 0 for il in range(layers)) if window else ()  # set_swa_pattern(2)
    return ModelShape(name, layers, heads, kv_heads, head_dim, hidden, expert_ffn, vocab, context, total, source,
                      layer_windows=windows, n_experts=experts, n_experts_used=used, expert_ffn_size=expert_ffn,
                      n_active_params=active, expert_params=expert, expert_type=expert_type)


def _preset(name: str, source: str, *, layers: int, heads: int, kv_heads: int, hidden: int, ffn: int, vocab: int,
            context: int, tied: bool, qkv_bias: bool = False, qk_norm: bool = False) -> ModelShape:
    head_dim = hidden // heads
    params = llama_parameter_count(layers, heads, kv_heads, head_dim, hidden, ffn, vocab, tied, qkv_bias, qk_norm)
    return ModelShape(name, layers, heads, kv_heads, head_dim, hidden, ffn, vocab, context, params, source)


GEMMA3_SWA_PATTERN = 6  # llama.cpp: hparams.set_swa_pattern(6) for LLM_ARCH_GEMMA3


def gemma3_layer_windows(n_layers: int, window: int) -> tuple[int, ...]:
    """llama.cpp's set_swa_pattern(6): layer il slides when il % 6 < 5 (5 local, then 1 global)."""
    return tuple(window if il % GEMMA3_SWA_PATTERN < GEMMA3_SWA_PATTERN - 1 else 0 for il in range(n_layers))


def _gemma3(name: str, source: str, *, layers: int, heads: int, kv_heads: int, head_dim: int, hidden: int, ffn: int,
            vocab: int, context: int, window: int) -> ModelShape:
    # Gemma 3: tied embeddings, q/k norms, 4 norms a layer (before and after attention and MLP).
    params = llama_parameter_count(layers, heads, kv_heads, head_dim, hidden, ffn, vocab, tie_embeddings=True,
                                   qk_norm=True, norms_per_layer=4)
    return ModelShape(name, layers, heads, kv_heads, head_dim, hidden, ffn, vocab, context, params, source,
                      layer_windows=gemma3_layer_windows(layers, window))


_HF = "https://huggingface.co/{}/blob/main/config.json"

PRESETS: dict[str, ModelShape] = {p.name: p for p in (
    _preset("SmolLM2-135M", _HF.format("HuggingFaceTB/SmolLM2-135M"),
            layers=30, heads=9, kv_heads=3, hidden=576, ffn=1536, vocab=49152, context=8192, tied=True),
    _preset("Llama-3.2-1B", _HF.format("meta-llama/Llama-3.2-1B"),
            layers=16, heads=32, kv_heads=8, hidden=2048, ffn=8192, vocab=128256, context=131072, tied=True),
    _preset("Llama-3.1-8B", _HF.format("meta-llama/Llama-3.1-8B"),
            layers=32, heads=32, kv_heads=8, hidden=4096, ffn=14336, vocab=128256, context=131072, tied=False),
    _preset("Llama-2-7B", _HF.format("meta-llama/Llama-2-7b-hf"),
            layers=32, heads=32, kv_heads=32, hidden=4096, ffn=11008, vocab=32000, context=4096, tied=False),
    _preset("Llama-2-13B", _HF.format("meta-llama/Llama-2-13b-hf"),
            layers=40, heads=40, kv_heads=40, hidden=5120, ffn=13824, vocab=32000, context=4096, tied=False),
    _preset("Llama-2-70B", _HF.format("meta-llama/Llama-2-70b-hf"),
            layers=80, heads=64, kv_heads=8, hidden=8192, ffn=28672, vocab=32000, context=4096, tied=False),
    _preset("Qwen2.5-7B", _HF.format("Qwen/Qwen2.5-7B"),
            layers=28, heads=28, kv_heads=4, hidden=3584, ffn=18944, vocab=152064, context=131072, tied=False,
            qkv_bias=True),
    # Qwen3-8B config.json: 36 layers, 32 heads of head_dim 128 (= 4096 / 32), 8 KV heads, intermediate 12288,
    # vocab 151936, max_position_embeddings 40960, untied; q_norm / k_norm per head. Model card: 8.2B
    # parameters, 6.95B without embeddings.
    _preset("Qwen3-8B", _HF.format("Qwen/Qwen3-8B"),
            layers=36, heads=32, kv_heads=8, hidden=4096, ffn=12288, vocab=151936, context=40960, tied=False,
            qk_norm=True),
    # Gemma 3 text_config of each config.json: num_hidden_layers, num_attention_heads, num_key_value_heads,
    # head_dim, hidden_size, intermediate_size, vocab_size 262208, max_position_embeddings 131072,
    # sliding_window 1024, sliding_window_pattern 6 (llama.cpp: gemma3.attention.sliding_window, pattern 6).
    _gemma3("Gemma-3-4B", _HF.format("google/gemma-3-4b-it"),
            layers=34, heads=8, kv_heads=4, head_dim=256, hidden=2560, ffn=10240, vocab=262208, context=131072,
            window=1024),
    _gemma3("Gemma-3-12B", _HF.format("google/gemma-3-12b-it"),
            layers=48, heads=16, kv_heads=8, head_dim=256, hidden=3840, ffn=15360, vocab=262208, context=131072,
            window=1024),
    _gemma3("Gemma-3-27B", _HF.format("google/gemma-3-27b-it"),
            layers=62, heads=32, kv_heads=16, head_dim=128, hidden=5376, ffn=21504, vocab=262208, context=131072,
            window=1024),
    _preset("Mistral-7B", _HF.format("mistralai/Mistral-7B-v0.1"),
            layers=32, heads=32, kv_heads=8, hidden=4096, ffn=14336, vocab=32000, context=32768, tied=False),
    # Qwen3-30B-A3B config.json: 48 layers, 32 heads of head_dim 128, 4 KV heads, hidden 2048, 128 experts of which
    # 8 are routed to (num_experts_per_tok), moe_intermediate_size 768, vocab 151936, max_position_embeddings 40960,
    # untied. Model card: 30.5B parameters, 3.3B activated (counting the embedding).
    _moe("Qwen3-30B-A3B", _HF.format("Qwen/Qwen3-30B-A3B"), layers=48, heads=32, kv_heads=4, head_dim=128,
         hidden=2048, vocab=151936, context=40960, experts=128, used=8, expert_ffn=768, qk_norm=True),
    # gpt-oss config.json: hidden 2880, 64 heads of head_dim 64, 8 KV heads, intermediate_size (each expert) 2880,
    # 4 experts per token, vocab 201088, max_position_embeddings 131072, sliding_window 128 on every other layer
    # (llama.cpp: set_swa_pattern(2), even layers); 20b: 24 layers, 32 experts; 120b: 36 layers, 128 experts. Model
    # cards: 21B / 3.6B active and 117B / 5.1B active (llama.cpp: 20.91 B and 116.83 B). Experts in MXFP4 as
    # published (ggml-org/gpt-oss-*-GGUF: 12.1 GB and 59.02 GiB).
    _moe("gpt-oss-20b", _HF.format("openai/gpt-oss-20b"), layers=24, heads=64, kv_heads=8, head_dim=64, hidden=2880,
         vocab=201088, context=131072, experts=32, used=4, expert_ffn=2880, biases=True, window=128,
         expert_type="MXFP4"),
    _moe("gpt-oss-120b", _HF.format("openai/gpt-oss-120b"), layers=36, heads=64, kv_heads=8, head_dim=64, hidden=2880,
         vocab=201088, context=131072, experts=128, used=4, expert_ffn=2880, biases=True, window=128,
         expert_type="MXFP4"),
)}


def preset_names() -> tuple[str, ...]:
    return tuple(PRESETS)


def get_preset(name: str) -> ModelShape:
    """The preset called `name` (case-insensitive), or a UsageError listing them."""
    wanted = name.strip().lower()
    for key, shape in PRESETS.items():
        if key.lower() == wanted:
            return shape
    raise UsageError(f"unknown preset {name!r}; presets: {', '.join(PRESETS)}")


def shape_from_gguf(path: str | os.PathLike) -> ModelShape:
    """The shape of a GGUF model, read (and validated) by hipcore.gguf.file without loading weights."""
    plan = read_plan(path)
    cfg = plan.config
    by_type = plan.bytes_by_type()
    expert = sum(t.n_elements for t in plan.tensors if "_exps." in t.name)
    active = (sum(t.n_elements for t in plan.tensors if "_exps." not in t.name and t.name != "token_embd.weight")
              + expert * cfg.n_experts_used // max(cfg.n_experts, 1))
    return ModelShape(
        name=cfg.name or os.path.basename(os.fspath(path)), n_layers=cfg.n_layers, n_heads=cfg.n_heads,
        n_kv_heads=cfg.n_kv_heads, head_dim=cfg.head_dim, hidden_size=cfg.hidden_size, ffn_size=cfg.ffn_size,
        vocab_size=cfg.vocab_size, context_length=cfg.context_length,
        n_params=sum(t.n_elements for t in plan.tensors), source=os.fspath(path),
        weight_bytes=plan.total_tensor_bytes, weight_type=next(iter(by_type), ""),
        layer_windows=tuple(cfg.layer_window(i) for i in range(cfg.n_layers)) if cfg.sliding_window else (),
        n_experts=cfg.n_experts, n_experts_used=cfg.n_experts_used, expert_ffn_size=cfg.expert_ffn_size,
        n_active_params=active if cfg.is_moe else 0, expert_params=expert,
    )


def resolve_shape(model: str | os.PathLike | None, preset: str | None) -> ModelShape:
    """Exactly one of a GGUF path or a preset name."""
    if (model is None) == (preset is None):
        raise UsageError(f"give either --model PATH or --preset NAME (presets: {', '.join(PRESETS)})")
    return shape_from_gguf(model) if model is not None else get_preset(preset)  # type: ignore[arg-type]
