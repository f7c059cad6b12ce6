"""The tiny gemma2 models whose llama.cpp outputs are recorded in tests/golden/gemma2_llamacpp.json (by
scripts/golden/record_llamacpp_tiny_family.py gemma2) and compared in tests/test_golden_gemma2.py. Both sides
write the file with this code from the same seed, so it is the same file byte for byte (the golden data
holds its sha256 and the test checks it).

Shaped to make every part of Gemma 2 show: 4 layers, so that layers 0 and 2 are local and 1 and 3 global
(llama.cpp's pattern for gemma2: i % 2 == 0 is local); a sliding window of 16 keys, shorter than every
prompt; soft caps low enough to bite on these weights: attention at ATTN_SOFTCAP (the scaled scores
reach several units) and the final logits at FINAL_SOFTCAP (they spread over about +-9 before it), so that a
runner without either cap differs by far more than the tolerance; a head size (32) other than hidden /
heads (16). The F16 model leaves both caps' keys out (llama.cpp's defaults then: 50 and 30), and has linear
RoPE scaling by 4, which gemma2's local layers keep (unlike gemma3's). Tied output, embeddings and post-norm
weights scaled up as for the gemma3 models (tests/support/gemma3_models.py says why).
"""

from __future__ import annotations

from pathlib import Path

from support.gguf_factory import write_tiny_llama

FAMILY = "gemma2"
EMBEDDING_GAIN = 3.0
POST_NORM_GAIN = 12.0
ATTN_SOFTCAP = 2.0
FINAL_SOFTCAP = 15.0
_SHAPE = dict(architecture="gemma2", n_layers=4, hidden=64, n_heads=4, n_kv_heads=2, head_dim=32, ffn=128,
              vocab=384, context=256, tied=True, embedding_gain=EMBEDDING_GAIN, post_norm_gain=POST_NORM_GAIN,
              rope_theta=10000.0, rms_eps=1e-6)
GEMMA2_MODELS: dict[str, dict] = {
    "gemma2-f32": dict(tensor_type="F32", seed=61, extra_metadata={"gemma2.attn_logit_softcapping": ATTN_SOFTCAP,
                                                                   "gemma2.final_logit_softcapping": FINAL_SOFTCAP},
                       **_SHAPE),
    "gemma2-f16": dict(tensor_type="F16", seed=62, extra_metadata={"gemma2.rope.scaling.type": "linear",
                                                                   "gemma2.rope.scaling.factor": 4.0}, **_SHAPE),
}
# The prompts: the file's Gemma chat template, rendered by hand, and plain text; both longer than the window.
PROMPTS = {
    "chat": "<start_of_turn>user\nHello there, how are you today?<end_of_turn>\n<start_of_turn>model\n",
    "text": "The quick brown fox jumps over the lazy dog, then it runs there and back again.",
}
GREEDY_TOKENS = 24


def write_model(name: str, folder: Path) -> Path:
    """Write GEMMA2_MODELS[name] as <folder>/<name>.gguf and return its path."""
    return write_tiny_llama(Path(folder) / f"{name}.gguf", **GEMMA2_MODELS[name])
