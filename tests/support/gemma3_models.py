"""The tiny gemma3 models whose llama.cpp outputs are recorded in tests/golden/gemma3_llamacpp.json (by
scripts/golden/record_llamacpp_gemma3.py) and compared in tests/test_golden_gemma3.py. Both sides write the
file with this code from the same seed, so it is the same file byte for byte (the golden data holds its
sha256 and the test checks it).

Shaped to make every part of Gemma 3 show: 7 layers, so that layers 0-4 and 6 are local and layer 5 is
global (llama.cpp's pattern: i % 6 == 5 is global); a sliding window of 16 keys, shorter than every
prompt, so a local layer that saw too much or too little would differ; RoPE base 1e6 for the global layer
against the local layers' 10000 (and, in the F16 model, linear RoPE scaling by 8 on the global layer, as the
4B and larger models have); a head size (32) other than hidden / heads (16), as Gemma's own. The output is
tied to the token embeddings, as in every Gemma file; the embeddings are scaled up by EMBEDDING_GAIN so the
logits spread over about +-8 and greedy choices mostly have clear margins, and the post-norm weights by
POST_NORM_GAIN so that the layers' outputs outweigh the scaled embedding in the residual stream (a tied
model otherwise mostly predicts its input token again).
"""

from __future__ import annotations

from pathlib import Path

from support.gguf_factory import write_tiny_llama

EMBEDDING_GAIN = 3.0
POST_NORM_GAIN = 4.0
_SHAPE = dict(architecture="gemma3", n_layers=7, hidden=64, n_heads=4, n_kv_heads=2, head_dim=32, ffn=128,
              vocab=384, context=256, tied=True, embedding_gain=EMBEDDING_GAIN,
              post_norm_gain=POST_NORM_GAIN, rope_theta=1e6, rms_eps=1e-6)
GEMMA3_MODELS: dict[str, dict] = {
    "gemma3-f32": dict(tensor_type="F32", seed=41, **_SHAPE),
    "gemma3-f16": dict(tensor_type="F16", seed=42, extra_metadata={"gemma3.rope.scaling.type": "linear",
                                                                   "gemma3.rope.scaling.factor": 8.0}, **_SHAPE),
}
# The prompts: the file's Gemma chat template, rendered by hand, and plain text. Both are longer than the
# sliding window (16 tokens), and generation takes them further past it.
PROMPTS = {
    "chat": "<start_of_turn>user\nHello there, how are you today?<end_of_turn>\n<start_of_turn>model\n",
    "text": "The quick brown fox jumps over the lazy dog, then it runs there and back again.",
}
GREEDY_TOKENS = 24


def write_gemma3_model(name: str, folder: Path) -> Path:
    """Write GEMMA3_MODELS[name] as <folder>/<name>.gguf and return its path."""
    return write_tiny_llama(Path(folder) / f"{name}.gguf", **GEMMA3_MODELS[name])
