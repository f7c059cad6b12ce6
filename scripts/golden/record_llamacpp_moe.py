"""Record llama.cpp's logits and greedy tokens on the tiny mixture-of-experts models of tests/support/moe_models.py
(qwen3moe, gpt-oss), as golden data for tests/test_golden_moe.py; the sibling of record_llamacpp_tiny_family.py,
with the same fields and settings.

    /tmp/lcpp-venv/bin/python scripts/golden/record_llamacpp_moe.py --out tests/golden/moe_llamacpp.json

(the scratch venv with llama-cpp-python 0.3.36 built from its sdist, CPU, and the gguf package; see
record_llamacpp_families.py). The models are written by the tests' own code from fixed seeds, so the test
rebuilds the identical file and checks its sha256 against the one recorded. --speed also prints llama.cpp's
decode speed on each model (one thread, the "text" prompt, GREEDY_TOKENS tokens), for the cpu backend's figure
beside it (tests/test_golden_moe.py prints ours).
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import sys
import tempfile
import time
from pathlib import Path

import llama_cpp

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from record_llamacpp import record_prompt, without_amx_buffers  # noqa: E402
from support import moe_models  # noqa: E402


def open_model(path: Path, threads: int) -> llama_cpp.Llama:
    return llama_cpp.Llama(str(path), n_ctx=256, n_batch=256, n_ubatch=256, logits_all=True,
                           n_threads=threads, n_threads_batch=threads, verbose=False)


def record_model(name: str, folder: Path, threads: int) -> dict:
    path = moe_models.write_moe_model(name, folder)
    llm = open_model(path, threads)
    prompts = {}
    for prompt, text in moe_models.PROMPTS.items():
        rec = record_prompt(llm, text, moe_models.GREEDY_TOKENS)
        for key in ("prompt_top_ids", "prompt_top_logits", "greedy_text"):  # not compared; random weights
            rec.pop(key)
        prompts[prompt] = rec
    return {"spec": dict(moe_models.MOE_MODELS[name]), "model_sha256": hashlib.sha256(path.read_bytes()).hexdigest(),
            "prompts": prompts}


def decode_speed(name: str, folder: Path) -> float:
    """llama.cpp's tokens per second decoding GREEDY_TOKENS tokens one at a time after the "text" prompt, 1 thread."""
    llm = open_model(moe_models.write_moe_model(name, folder), 1)
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
    without_amx_buffers()
    with tempfile.TemporaryDirectory() as folder:
        recorded = {name: record_model(name, Path(folder), args.threads) for name in moe_models.MOE_MODELS}
        speeds = {name: decode_speed(name, Path(folder)) for name in moe_models.MOE_MODELS} if args.speed else {}
    golden = {
        "about": "llama.cpp on the tiny mixture-of-experts models; written by scripts/golden/record_llamacpp_moe.py",
        "llama_cpp_python_version": llama_cpp.__version__,
        "recorded_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "settings": {"n_threads": args.threads, "kv_cache": "f16", "flash_attn": False, "use_extra_bufts": False},
        "models": recorded,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(golden, indent=1) + "\n", encoding="utf-8")
    for name, model in recorded.items():
        for prompt, rec in model["prompts"].items():
            print(f"{name} {prompt}: {len(rec['prompt_ids'])} prompt tokens -> {rec['greedy_ids']}", file=sys.stderr)
    for name, speed in speeds.items():
        print(f"{name}: llama.cpp decode {speed:.1f} tokens/s (1 thread)", file=sys.stderr)
    print(f"wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
