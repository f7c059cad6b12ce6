"""Record llama.cpp's logits on the demo model as golden data for tests/test_golden_llamacpp.py.

    VENV/bin/python scripts/golden/record_llamacpp.py \
        --model "$(python -c 'from hipcore.gguf.demo_model import find_demo_model; print(find_demo_model())')"

For each prompt, record_prompt's fields from llama.cpp's own tokenization: every prompt position's top-4, the
last position's top-64, a greedy continuation with each step's top-10, and the teacher-forced view (VENV, the
fields and the numerics to know when reading them: scripts/golden/llamacpp_recording.py).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from llamacpp_recording import GOLDEN, golden_file, open_model, record_prompt, settings, sha256, write_golden

SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"
PROMPTS = {
    # The model's own chat template, rendered by hand (SmolLM2's ChatML), with the generation prompt.
    "chat": (f"<|im_start|>system\n{SYSTEM}<|im_end|>\n"
             "<|im_start|>user\nWhy is the sky blue? Explain it to a child.<|im_end|>\n"
             "<|im_start|>assistant\n"),
    "english": "The old lighthouse keeper climbed the stairs every evening, and on the night of the storm he",
    "code": 'def fibonacci(n):\n    """Return the n-th Fibonacci number."""\n',
}
N_CTX = 512


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, type=Path, help="the demo GGUF (SmolLM2-135M-Instruct Q4_1)")
    parser.add_argument("--out", type=Path, default=GOLDEN / "smollm2_135m_q4_1_llamacpp.json",
                        help="where to write the JSON")
    parser.add_argument("--generate", type=int, default=32, help="greedy tokens per prompt")
    parser.add_argument("--threads", type=int, default=2, help="llama.cpp threads")
    args = parser.parse_args()

    llm = open_model(args.model, N_CTX, args.threads)
    golden = golden_file("llama.cpp logits on the demo model", __file__,
                         model={"model_file": args.model.name, "model_sha256": sha256(args.model)},
                         settings=settings(args.threads, n_batch=N_CTX),
                         prompts={name: record_prompt(llm, text, args.generate) for name, text in PROMPTS.items()})
    for name, item in golden["prompts"].items():
        print(f"{name}: {len(item['prompt_ids'])} prompt tokens -> {item['greedy_text']!r}", file=sys.stderr)
    write_golden(args.out, golden, ensure_ascii=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
