"""Record llama.cpp's logits and greedy tokens on the tiny mixture-of-experts models of tests/support/moe_models.py
(qwen3moe, gpt-oss), as golden data for tests/test_golden_moe.py, with the other tiny families' fields and settings.

    VENV/bin/python scripts/golden/record_llamacpp_moe.py --out tests/golden/moe_llamacpp.json [--speed]

(VENV and what each record holds: scripts/golden/llamacpp_recording.py). --speed also prints llama.cpp's decode
speed on each model (one thread, the "text" prompt, GREEDY_TOKENS tokens), for the cpu backend's figure beside it
(tests/test_golden_moe.py prints ours).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

from llamacpp_recording import open_model, record_tiny_family

from support import moe_models


def decode_speed(name: str, folder: Path) -> float:
    """llama.cpp's tokens per second decoding GREEDY_TOKENS tokens one at a time after the "text" prompt, 1 thread."""
    llm = open_model(moe_models.write_moe_model(name, folder), 256, 1)
    tokens = llm.tokenize(moe_models.PROMPTS["text"].encode("utf-8"), add_bos=True, special=True)
    llm.reset()
    llm.eval(tokens)
    start = time.perf_counter()
    for _ in range(moe_models.GREEDY_TOKENS):
        llm.eval([0])
    return moe_models.GREEDY_TOKENS / (time.perf_counter() - start)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="where to write the JSON (tests/golden/moe_llamacpp.json)")
    parser.add_argument("--threads", type=int, default=2, help="llama.cpp threads")
    parser.add_argument("--speed", action="store_true", help="also print llama.cpp's one-thread decode speed")
    args = parser.parse_args()
    status = record_tiny_family("llama.cpp on the tiny mixture-of-experts models", __file__, args.out,
                                moe_models.MOE_MODELS, moe_models.write_moe_model, moe_models.PROMPTS,
                                moe_models.GREEDY_TOKENS, args.threads)
    if args.speed:
        with tempfile.TemporaryDirectory() as folder:
            for name in moe_models.MOE_MODELS:
                speed = decode_speed(name, Path(folder))
                print(f"{name}: llama.cpp decode {speed:.1f} tokens/s (1 thread)", file=sys.stderr)
    return status


if __name__ == "__main__":
    sys.exit(main())
