"""Record llama.cpp's logits and greedy tokens on the tiny gpt-oss whose every layer has a sliding window (one layer:
tests/support/moe_models.py's WINDOW_ONLY_MODELS), as golden data for tests/test_golden_gpt_oss_window_only.py, with
the other tiny families' fields and settings.

    VENV/bin/python scripts/golden/record_llamacpp_gpt_oss_window_only.py --out tests/golden/gpt_oss_window_only_llamacpp.json

(VENV and what each record holds: scripts/golden/llamacpp_recording.py.)
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from llamacpp_recording import record_tiny_family

from support import moe_models


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True,
                        help="where to write the JSON (tests/golden/gpt_oss_window_only_llamacpp.json)")
    parser.add_argument("--threads", type=int, default=2, help="llama.cpp threads")
    args = parser.parse_args()
    return record_tiny_family("llama.cpp on the tiny gpt-oss whose only layer slides", __file__, args.out,
                              moe_models.WINDOW_ONLY_MODELS, moe_models.write_moe_model, moe_models.PROMPTS,
                              moe_models.GREEDY_TOKENS, args.threads)


if __name__ == "__main__":
    sys.exit(main())
