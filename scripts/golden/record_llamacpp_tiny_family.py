"""Record llama.cpp's logits and greedy tokens on the tiny models of one more family (phi3, gemma2), as
golden data for tests/test_golden_<family>.py, the family's models and prompts read from
tests/support/<family>_models.py.

    VENV/bin/python scripts/golden/record_llamacpp_tiny_family.py phi3 [--out FILE] [--threads N]

(VENV and what each record holds: scripts/golden/llamacpp_recording.py).
"""

from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path

from llamacpp_recording import GOLDEN, record_tiny_family

FAMILIES = ("phi3", "gemma2")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("family", choices=FAMILIES)
    parser.add_argument("--out", type=Path, help="where to write the JSON (tests/golden/<family>_llamacpp.json)")
    parser.add_argument("--threads", type=int, default=2, help="llama.cpp threads")
    args = parser.parse_args()
    models = importlib.import_module(f"support.{args.family}_models")
    specs = getattr(models, f"{models.FAMILY.upper()}_MODELS")
    return record_tiny_family(f"llama.cpp on the tiny {args.family} models", __file__,
                              args.out or GOLDEN / f"{args.family}_llamacpp.json", specs, models.write_model,
                              models.PROMPTS, models.GREEDY_TOKENS, args.threads)


if __name__ == "__main__":
    sys.exit(main())
