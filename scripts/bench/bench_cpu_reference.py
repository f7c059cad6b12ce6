"""CPU speed of our numpy reference forward pass beside llama.cpp's, on the same model and lengths.

    python scripts/bench/bench_cpu_reference.py --llama-python /work/scratch/llama-venv/bin/python

Two tests, as llama-bench names them: pp512 (one 512-token prompt evaluated in one batch) and
tg128 (128 tokens evaluated one at a time from an empty context, the logits of each computed);
tokens/s as mean ± sd over --repetitions runs after one warm-up, and the best run (the least
disturbed one, on a machine shared with other work). Token ids are fixed pseudo-random
ids from the vocabulary (speed does not depend on them). llama.cpp runs through llama-cpp-python in
a separate interpreter (it is a scratch tool, never a dependency of rocmforge), with --threads
threads; numpy uses its BLAS's default thread count (printed).

Without --llama-python only our numbers are measured.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))  # support.llama_reference lives there

PROMPT_TOKENS = 512
GENERATE_TOKENS = 128
TOKEN_SEED = 1234


def bench_tokens(vocab_size: int, n: int) -> list[int]:
    import numpy as np

    # Skip the first ids: special tokens in most vocabularies.
    return [int(t) for t in np.random.default_rng(TOKEN_SEED).integers(100, vocab_size, size=n)]


def timed(run, repetitions: int) -> list[float]:
    seconds = []
    for _ in range(repetitions):
        start = time.perf_counter()
        run()
        seconds.append(time.perf_counter() - start)
    return seconds


def rates(n_tokens: int, seconds: list[float]) -> dict:
    per_second = [n_tokens / s for s in seconds]
    return {"tokens_per_s": statistics.mean(per_second),
            "sd": statistics.stdev(per_second) if len(per_second) > 1 else 0.0,
            "best": max(per_second), "runs": len(per_second)}


def bench_ours(model_path: str, repetitions: int) -> dict:
    import numpy as np

    from hipcore.gguf.file import GGUFFile
    from support.llama_reference import LlamaReference

    start = time.perf_counter()
    with GGUFFile.open(model_path) as f:
        model = LlamaReference.from_gguf(f)
    load_s = time.perf_counter() - start
    prompt = np.array(bench_tokens(model.config.vocab_size, PROMPT_TOKENS))
    generate = bench_tokens(model.config.vocab_size, GENERATE_TOKENS)
    capacity = PROMPT_TOKENS + GENERATE_TOKENS

    def prefill():
        model.forward(prompt, model.new_cache(capacity))

    def decode():
        cache = model.new_cache(capacity)
        for token in generate:
            model.forward(np.array([token]), cache)

    model.forward(prompt[:16], model.new_cache(capacity))  # warm-up: BLAS threads, page faults
    return {"engine": "rocmforge cpu reference (numpy float32)", "load_s": load_s,
            "pp512": rates(PROMPT_TOKENS, timed(prefill, repetitions)),
            "tg128": rates(GENERATE_TOKENS, timed(decode, repetitions)),
            "blas_threads": _blas_threads()}


def bench_llamacpp(model_path: str, repetitions: int, threads: int) -> dict:
    import llama_cpp
    import llama_cpp.llama_cpp as llama_lowlevel

    # llama.cpp 0.3.36's AMX matmul crashes on this kind of CPU (see scripts/golden/record_llamacpp.py):
    # use the ordinary CPU kernels, as every machine without AMX does.
    original = llama_lowlevel.llama_model_default_params

    def params():
        p = original()
        p.use_extra_bufts = False
        return p

    llama_lowlevel.llama_model_default_params = params
    start = time.perf_counter()
    llm = llama_cpp.Llama(model_path, n_ctx=PROMPT_TOKENS + GENERATE_TOKENS, n_batch=PROMPT_TOKENS,
                          n_ubatch=PROMPT_TOKENS, n_threads=threads, n_threads_batch=threads,
                          logits_all=False, verbose=False)
    load_s = time.perf_counter() - start
    prompt = bench_tokens(llm.n_vocab(), PROMPT_TOKENS)
    generate = bench_tokens(llm.n_vocab(), GENERATE_TOKENS)

    def prefill():
        llm.reset()
        llm.eval(prompt)

    def decode():
        llm.reset()
        for token in generate:
            llm.eval([token])

    llm.reset()
    llm.eval(prompt[:16])
    return {"engine": f"llama.cpp CPU (llama-cpp-python {llama_cpp.__version__}, {threads} threads)",
            "load_s": load_s,
            "pp512": rates(PROMPT_TOKENS, timed(prefill, repetitions)),
            "tg128": rates(GENERATE_TOKENS, timed(decode, repetitions))}


def _blas_threads() -> str:
    try:
        from threadpoolctl import threadpool_info
        return ", ".join(f"{i['internal_api']} {i['num_threads']}" for i in threadpool_info())
    except ImportError:
        return os.environ.get("OPENBLAS_NUM_THREADS") or f"default (cores: {os.cpu_count()})"


def print_table(results: list[dict], model_path: str) -> None:
    print(f"model: {Path(model_path).name}   cpu: {platform.processor() or platform.machine()}, "
          f"{os.cpu_count()} cores   date: {time.strftime('%Y-%m-%d')}")
    print(f"| {'engine':<58} | {'test':<6} | {'t/s':>17} | {'best t/s':>8} |")
    print(f"|{'-' * 60}|{'-' * 8}|{'-' * 19}|{'-' * 10}|")
    for result in results:
        for test in ("pp512", "tg128"):
            r = result[test]
            print(f"| {result['engine']:<58} | {test:<6} | {r['tokens_per_s']:>8.2f} ± {r['sd']:>6.2f} "
                  f"| {r['best']:>8.2f} |")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", help="GGUF file (default: the demo model)")
    parser.add_argument("--repetitions", type=int, default=3, help="timed runs per test (after a warm-up)")
    parser.add_argument("--threads", type=int, default=2, help="llama.cpp threads")
    parser.add_argument("--llama-python", help="a Python with llama-cpp-python, to measure llama.cpp too")
    parser.add_argument("--engine", choices=("ours", "llamacpp"), help=argparse.SUPPRESS)
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    args = parser.parse_args()
    if args.repetitions < 1:
        parser.error("--repetitions must be at least 1")

    if args.engine == "llamacpp":       # the child process, inside the llama-cpp-python venv
        print(json.dumps(bench_llamacpp(args.model, args.repetitions, args.threads)))
        return 0

    model_path = args.model
    if model_path is None:
        from hipcore.gguf.demo_model import INSTALL_HINT, find_demo_model
        found = find_demo_model()
        if found is None:
            parser.error(f"no --model given and the demo model is not installed ({INSTALL_HINT})")
        model_path = str(found)
    results = [bench_ours(model_path, args.repetitions)]
    if args.llama_python:
        child = subprocess.run(
            [args.llama_python, __file__, "--engine", "llamacpp", "--model", model_path,
             "--repetitions", str(args.repetitions), "--threads", str(args.threads)],
            capture_output=True, text=True, check=False)
        if child.returncode != 0:
            print(f"llama.cpp run failed (exit {child.returncode}): {child.stderr.strip()[-500:]}", file=sys.stderr)
            return 1
        results.append(json.loads(child.stdout.strip().splitlines()[-1]))
    if args.json:
        print(json.dumps({"model": model_path, "results": results}, indent=1))
    else:
        print_table(results, model_path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
