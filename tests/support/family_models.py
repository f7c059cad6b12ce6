"""The tiny qwen2 and qwen3 models whose llama.cpp outputs are recorded in tests/golden/ (by
scripts/golden/record_llamacpp_families.py) and compared in tests/test_golden_families.py. Both sides write
the file with this code from the same seed, so it is the same file byte for byte (the golden data holds its
sha256 and the test checks it).

Untied, with the output matrix scaled by LOGIT_SCALE so the logits spread over about +-15: greedy choices are
then mostly clear of the rounding differences between two correct implementations. qwen3's head size (32)
differs from hidden / n_heads (16), as Qwen3's own does, so key_length is read rather than derived.
"""

from __future__ import annotations

from pathlib import Path

from support.gguf_factory import write_tiny_llama

LOGIT_SCALE = 6.0
_SHAPE = dict(n_layers=2, hidden=64, n_heads=4, n_kv_heads=2, ffn=128, vocab=384, context=256, tied=False,
              logit_scale=LOGIT_SCALE, rope_theta=10000.0, rms_eps=1e-6)
FAMILY_MODELS: dict[str, dict] = {
    "qwen2-f32": dict(architecture="qwen2", tensor_type="F32", seed=21, **_SHAPE),
    "qwen2-f16": dict(architecture="qwen2", tensor_type="F16", seed=22, **_SHAPE),
    "qwen3-f32": dict(architecture="qwen3", tensor_type="F32", seed=31, head_dim=32, **_SHAPE),
    "qwen3-f16": dict(architecture="qwen3", tensor_type="F16", seed=32, head_dim=32, **_SHAPE),
}
# The prompts: the ChatML template every qwen GGUF embeds, rendered by hand, and plain text.
PROMPTS = {
    "chat": "<|im_start|>user\nHello there, how are you today?<|im_end|>\n<|im_start|>assistant\n",
    "text": "The quick brown fox jumps over the lazy dog, then it runs there and back again.",
}
GREEDY_TOKENS = 24


def write_family_model(name: str, folder: Path) -> Path:
    """Write FAMILY_MODELS[name] as <folder>/<name>.gguf and return its path."""
    return write_tiny_llama(Path(folder) / f"{name}.gguf", **FAMILY_MODELS[name])
