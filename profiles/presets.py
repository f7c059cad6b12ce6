"""Model shapes for KV planning: named presets of common models, or the shape of a real GGUF file.

Preset numbers are copied from each model's published Hugging Face config.json (cited per entry:
num_hidden_layers, num_attention_heads, num_key_value_heads, hidden_size / heads = head_dim,
intermediate_size, vocab_size, max_position_embeddings, tie_word_embeddings). The parameter count
is computed from the shape (llama layout; Qwen2 adds q/k/v biases) and equals the count each model
card publishes: tests/test_presets.py checks that, which checks the shapes too.
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

    def to_dict(self) -> dict[str, object]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


def llama_parameter_count(n_layers: int, n_heads: int, n_kv_heads: int, head_dim: int, hidden_size: int,
                          ffn_size: int, vocab_size: int, tie_embeddings: bool, qkv_bias: bool = False) -> int:
    """Weights of a llama-layout decoder: embeddings, per-layer attention + SwiGLU MLP + 2 RMSNorms,
    final norm, and the output projection unless tied to the embeddings."""
    q, kv = n_heads * head_dim, n_kv_heads * head_dim
    attention = hidden_size * q + 2 * hidden_size * kv + q * hidden_size + ((q + 2 * kv) if qkv_bias else 0)
    layer = attention + 3 * hidden_size * ffn_size + 2 * hidden_size
    embeddings = vocab_size * hidden_size * (1 if tie_embeddings else 2)
    return embeddings + n_layers * layer + hidden_size


def _preset(name: str, source: str, *, layers: int, heads: int, kv_heads: int, hidden: int, ffn: int, vocab: int,
            context: int, tied: bool, qkv_bias: bool = False) -> ModelShape:
    head_dim = hidden // heads
    params = llama_parameter_count(layers, heads, kv_heads, head_dim, hidden, ffn, vocab, tied, qkv_bias)
    return ModelShape(name, layers, heads, kv_heads, head_dim, hidden, ffn, vocab, context, params, source)


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
    _preset("Mistral-7B", _HF.format("mistralai/Mistral-7B-v0.1"),
            layers=32, heads=32, kv_heads=8, hidden=4096, ffn=14336, vocab=32000, context=32768, tied=False),
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
    return ModelShape(
        name=cfg.name or os.path.basename(os.fspath(path)), n_layers=cfg.n_layers, n_heads=cfg.n_heads,
        n_kv_heads=cfg.n_kv_heads, head_dim=cfg.head_dim, hidden_size=cfg.hidden_size, ffn_size=cfg.ffn_size,
        vocab_size=cfg.vocab_size, context_length=cfg.context_length,
        n_params=sum(t.n_elements for t in plan.tensors), source=os.fspath(path),
        weight_bytes=plan.total_tensor_bytes, weight_type=next(iter(by_type), ""),
    )


def resolve_shape(model: str | os.PathLike | None, preset: str | None) -> ModelShape:
    """Exactly one of a GGUF path or a preset name."""
    if (model is None) == (preset is None):
        raise UsageError(f"give either --model PATH or --preset NAME (presets: {', '.join(PRESETS)})")
    return shape_from_gguf(model) if model is not None else get_preset(preset)  # type: ignore[arg-type]
