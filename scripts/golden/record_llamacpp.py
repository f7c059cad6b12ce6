"""Record llama.cpp's logits on the demo model as golden data for tests/test_golden_llamacpp.py.

Run it with the scratch venv that has llama-cpp-python (never a dependency of rocmforge):

    /work/scratch/llama-venv/bin/python scripts/golden/record_llamacpp.py \
        --model "$(python -c 'from hipcore.gguf.demo_model import find_demo_model; print(find_demo_model())')"

(build that venv with `pip install llama-cpp-python==0.3.36` from its PyPI source distribution).

For each prompt it records, from llama.cpp's own tokenization:
  - the prompt token ids;
  - at every prompt position: the top-4 ids and logits (argmax, its margin, and the other
    candidates of a near-tie);
  - at the last prompt position: the top-64 ids and logits (the test compares the top-10 and needs
    the next ones to tell a boundary swap from a real disagreement);
  - llama.cpp's greedy continuation of N tokens, generated one token at a time as llama-cli does,
    with each step's top-10 ids/logits;
  - the same prompt + continuation evaluated again in ONE batch (logits_all), with every
    continuation position's top-10: the teacher-forced view our test reproduces.

Numerics worth knowing when reading the data: llama.cpp's CPU matmuls quantize the activations
(to Q8_1 for Q4_1 weights, Q8_0 for the Q8_0 embedding/output) and keep the KV cache, Q and the
attention probabilities in float16; our reference is float32 throughout.

AMX: on CPUs with AMX tiles (this machine) llama.cpp 0.3.36's AMX matmul path crashes inside
llama_decode (SIGSEGV in ggml_backend_amx_mul_mat). We turn off the "extra buffer types"
(use_extra_bufts = False), which selects the ordinary CPU kernels every non-AMX machine uses.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import sys
from pathlib import Path

import numpy as np

import llama_cpp
import llama_cpp.llama_cpp as llama_lowlevel

SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"
PROMPTS = {
    # The model's own chat template, rendered by hand (SmolLM2's ChatML), with the generation prompt.
    "chat": (f"<|im_start|>system\n{SYSTEM}<|im_end|>\n"
             "<|im_start|>user\nWhy is the sky blue? Explain it to a child.<|im_end|>\n"
             "<|im_start|>assistant\n"),
    "english": "The old lighthouse keeper climbed the stairs every evening, and on the night of the storm he",
    "code": 'def fibonacci(n):\n    """Return the n-th Fibonacci number."""\n',
}
TOP_PROMPT = 4
TOP_LAST = 64
TOP_STEP = 10
DEFAULT_OUT = Path(__file__).resolve().parents[2] / "tests" / "golden" / "smollm2_135m_q4_1_llamacpp.json"


def without_amx_buffers():
    """Make every model load with use_extra_bufts = False (see the module docstring)."""
    original = llama_lowlevel.llama_model_default_params

    def params():
        p = original()
        p.use_extra_bufts = False
        return p

    llama_lowlevel.llama_model_default_params = params


def top(logits: np.ndarray, k: int) -> tuple[list[int], list[float]]:
    ids = np.argsort(-logits, kind="stable")[:k]
    return [int(i) for i in ids], [round(float(logits[i]), 5) for i in ids]


def record_prompt(llm: llama_cpp.Llama, text: str, n_generate: int) -> dict:
    tokens = llm.tokenize(text.encode("utf-8"), add_bos=True, special=True)
    llm.reset()
    llm.eval(tokens)
    prompt_logits = np.array(llm.scores[:llm.n_tokens], dtype=np.float32)
    positions = [top(row, TOP_PROMPT) for row in prompt_logits]
    last_ids, last_logits = top(prompt_logits[-1], TOP_LAST)

    # Greedy generation one token at a time, as llama-cli runs after the prompt.
    generated, step_top = [], []
    logits = prompt_logits[-1]
    for _ in range(n_generate):
        ids, values = top(logits, TOP_STEP)
        step_top.append({"ids": ids, "logits": values})
        generated.append(ids[0])
        llm.eval([ids[0]])
        logits = np.array(llm.scores[llm.n_tokens - 1], dtype=np.float32)

    # The whole sequence again in one batch: the teacher-forced logits.
    llm.reset()
    llm.eval(tokens + generated)
    batched = np.array(llm.scores[:llm.n_tokens], dtype=np.float32)
    forced_top = []
    for row in batched[len(tokens) - 1:len(tokens) - 1 + n_generate]:
        ids, values = top(row, TOP_STEP)
        forced_top.append({"ids": ids, "logits": values})

    return {
        "text": text,
        "prompt_ids": [int(t) for t in tokens],
        "prompt_top_ids": [p[0] for p in positions],
        "prompt_top_logits": [p[1] for p in positions],
        "last_top_ids": last_ids,
        "last_top_logits": last_logits,
        "greedy_ids": generated,
        "greedy_text": llm.detokenize(generated).decode("utf-8", errors="replace"),
        "greedy_step_top": step_top,
        "forced_step_top": forced_top,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, type=Path, help="the demo GGUF (SmolLM2-135M-Instruct Q4_1)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="where to write the JSON")
    parser.add_argument("--generate", type=int, default=32, help="greedy tokens per prompt")
    parser.add_argument("--threads", type=int, default=2, help="llama.cpp threads")
    args = parser.parse_args()

    without_amx_buffers()
    llm = llama_cpp.Llama(str(args.model), n_ctx=512, n_batch=512, n_ubatch=512, logits_all=True,
                          n_threads=args.threads, n_threads_batch=args.threads, verbose=False)
    digest = hashlib.sha256(args.model.read_bytes()).hexdigest()
    golden = {
        "about": "llama.cpp logits on the demo model; written by scripts/golden/record_llamacpp.py",
        "llama_cpp_python_version": llama_cpp.__version__,
        "model_file": args.model.name,
        "model_sha256": digest,
        "recorded_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "settings": {"n_threads": args.threads, "kv_cache": "f16", "flash_attn": False,
                     "use_extra_bufts": False, "n_batch": 512},
        "prompts": {name: record_prompt(llm, text, args.generate) for name, text in PROMPTS.items()},
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(golden, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    for name, item in golden["prompts"].items():
        print(f"{name}: {len(item['prompt_ids'])} prompt tokens -> {item['greedy_text']!r}", file=sys.stderr)
    print(f"wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
