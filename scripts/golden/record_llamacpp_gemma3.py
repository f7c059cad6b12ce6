"""Record llama.cpp's logits and greedy tokens on the tiny gemma3 models of tests/support/gemma3_models.py,
as golden data for tests/test_golden_gemma3.py.

    VENV/bin/python scripts/golden/record_llamacpp_gemma3.py [--out FILE] [--threads N]

(VENV and what each record holds: scripts/golden/llamacpp_recording.py).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from llamacpp_recording import GOLDEN, record_tiny_family

from support.gemma3_models import GEMMA3_MODELS, GREEDY_TOKENS, PROMPTS, write_gemma3_model


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=GOLDEN / "gemma3_llamacpp.json", help="where to write the JSON")
    parser.add_argument("--threads", type=int, default=2, help="llama.cpp threads")
    args = parser.parse_args()
    return record_tiny_family("llama.cpp on the tiny gemma3 models", __file__, args.out, GEMMA3_MODELS,
                              write_gemma3_model, PROMPTS, GREEDY_TOKENS, args.threads)


if __name__ == "__main__":
    sys.exit(main())
