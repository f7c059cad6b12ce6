"""The tiny phi3 models whose llama.cpp outputs are recorded in tests/golden/phi3_llamacpp.json (by
scripts/golden/record_llamacpp_tiny_family.py phi3) and compared in tests/test_golden_phi3.py. Both sides write the file
with this code from the same seed, so it is the same file byte for byte (the golden data holds its sha256
and the test checks it).

The llama tensors drawn as for the other families, written as Phi-3's files hold them: q|k|v as one attn_qkv
matrix, gate|up as one ffn_up of twice the rows (gate first). Untied with the output scaled by LOGIT_SCALE
(logits over about +-15), as the qwen models, so that greedy choices mostly have clear margins. The F16
model carries an attention.sliding_window of 8 keys, shorter than every prompt: llama.cpp switches Phi-3's
window off, so a runner that applied it would differ. The name must not contain "phi3": llama.cpp then
sets attributes on Phi-3's own special tokens ("</s>" ...), which a tiny vocabulary lacks, and fails to load.
"""

from __future__ import annotations

from pathlib import Path

from support.gguf_factory import write_tiny_llama

FAMILY = "phi3"
LOGIT_SCALE = 6.0
_SHAPE = dict(architecture="phi3", n_layers=2, hidden=64, n_heads=4, n_kv_heads=2, ffn=128, vocab=384, context=256,
              tied=False, logit_scale=LOGIT_SCALE, rope_theta=10000.0, rms_eps=1e-5)
_NAME = {"general.name": "tiny-fused-test"}
PHI3_MODELS: dict[str, dict] = {
    "phi3-f32": dict(tensor_type="F32", seed=51, extra_metadata=_NAME, **_SHAPE),
    "phi3-f16": dict(tensor_type="F16", seed=52, extra_metadata={**_NAME, "phi3.attention.sliding_window": 8}, **_SHAPE),
}
# Phi-3's turn markup, rendered by hand, and plain text.
PROMPTS = {
    "chat": "<|user|>\nHello there, how are you today?<|end|>\n<|assistant|>\n",
    "text": "The quick brown fox jumps over the lazy dog, then it runs there and back again.",
}
GREEDY_TOKENS = 24


def write_model(name: str, folder: Path) -> Path:
    """Write PHI3_MODELS[name] as <folder>/<name>.gguf and return its path."""
    return write_tiny_llama(Path(folder) / f"{name}.gguf", **PHI3_MODELS[name])
