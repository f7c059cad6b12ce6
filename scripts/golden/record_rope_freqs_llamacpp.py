"""Record llama.cpp's logits on a tiny llama carrying rope_freqs.weight, for tests/test_golden_rope_freqs.py.

Llama 3.1/3.2 files carry per-pair RoPE frequency divisors (the "llama3" scaling, baked in by llama.cpp's
converter); llama.cpp divides each angle's frequency by its factor. This writes the tiny model the test
writes (tests/support/gguf_factory.py, F32, factors far from 1: 1/4 .. 32) and records llama.cpp's logits
on a fixed token sequence, evaluated in one batch with every position's logits. Run it with a venv that
has llama-cpp-python 0.3.36 and the gguf package (never a dependency of rocmforge):

    <venv>/bin/python scripts/golden/record_rope_freqs_llamacpp.py

The file's SHA-256 is recorded: the test writes the model again and refuses to compare against data
recorded from other bytes. KV cache in F32 and F32 weights: llama.cpp's CPU path then quantizes nothing,
so the comparison sees RoPE and attention, not 8-bit rounding. The AMX workaround of llamacpp_recording.py
(use_extra_bufts = False) applies here too.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import sys
import tempfile
from pathlib import Path

import numpy as np

import llama_cpp
from llamacpp_recording import GOLDEN, without_amx_buffers

from support.gguf_factory import write_tiny_llama  # noqa: E402
from support.rope_factors import far_factors  # noqa: E402

DEFAULT_OUT = GOLDEN / "tiny_llama_rope_freqs_llamacpp.json"
# The model: tiny_llama_spec's defaults (2 layers, hidden 64, 4 heads of 16, 2 KV heads, vocab 384), seed 11,
# and 8 factors from far_factors(default_rng(FACTOR_SEED), 16). tests/test_golden_rope_freqs.py uses these.
MODEL_SEED, FACTOR_SEED, HEAD_DIM = 11, 7, 16
N_TOKENS = 96
TOP = 16
GGML_TYPE_F32 = 0


def model_kwargs() -> dict:
    return {"seed": MODEL_SEED, "rope_freqs": far_factors(np.random.default_rng(FACTOR_SEED), HEAD_DIM)}


def token_ids() -> list[int]:
    """A fixed sequence avoiding the special ids 0..2."""
    return [3 + (i * 131 + (i * i) % 17) % 381 for i in range(N_TOKENS)]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args()
    without_amx_buffers()
    with tempfile.TemporaryDirectory() as folder:
        path = write_tiny_llama(Path(folder) / "tiny-rope-freqs.gguf", **model_kwargs())
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
        llm = llama_cpp.Llama(str(path), n_ctx=256, n_batch=256, logits_all=True, n_threads=2, verbose=False,
                              type_k=GGML_TYPE_F32, type_v=GGML_TYPE_F32, flash_attn=False)
        tokens = token_ids()
        llm.reset()
        llm.eval(tokens)
        logits = np.array(llm.scores[:llm.n_tokens], dtype=np.float32)
    ids = np.argsort(-logits, axis=1, kind="stable")[:, :TOP]
    record = {
        "recorded": datetime.date.today().isoformat(),
        "llama_cpp_python": llama_cpp.__version__,
        "model_sha256": digest,
        "model": {"writer": "tests/support/gguf_factory.write_tiny_llama", "seed": MODEL_SEED,
                  "factor_seed": FACTOR_SEED, "head_dim": HEAD_DIM},
        "token_ids": tokens,
        "top_ids": ids.tolist(),
        "top_logits": np.round(np.take_along_axis(logits, ids, axis=1), 6).tolist(),
    }
    args.out.write_text(json.dumps(record, indent=1) + "\n")
    print(f"wrote {args.out}: {len(tokens)} positions, top {TOP} each, model {digest[:12]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
