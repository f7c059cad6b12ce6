"""CPU speed of a small mixture of experts: rocmforge's cpu backend beside llama.cpp's CPU build, the same file.

    python scripts/bench/bench_cpu_moe.py OUTDIR --llama-python /path/to/venv-with-llama-cpp-python/bin/python

    python scripts/bench/bench_cpu_moe.py OUTDIR --baseline /tmp/rocmforge-0e175d2 --baseline-commit 0e175d2 ...

Writes OUTDIR/model.gguf (once; reused when present): Qwen3-30B-A3B's shape (scripts/models/synthetic_models.py)
reduced to LAYERS layers of hidden HIDDEN, EXPERTS experts of which EXPERTS_USED are routed to, expert width
EXPERT_FFN, in Q4_K_M's mix (Q4_K gate/up experts, Q6_K down experts in some layers), random weights, a byte-level
tokenizer. Then, one process each, back to back, with --threads threads for both (OPENBLAS_NUM_THREADS for numpy,
-t for llama.cpp): a --prompt-token prompt evaluated in one step (pp) and --gen tokens decoded one at a time after
it (tg), --repetitions runs after a warm-up. Each run's tokens/s by process CPU time (user + sys, all threads;
the fair figure on a shared machine) and by wall time. --baseline DIR: another checkout of rocmforge (`git archive
COMMIT | tar -x -C DIR`) measured first the same way (its hipcore on PYTHONPATH), a before beside this one. Prints a markdown table and writes OUTDIR/results.json and
OUTDIR/table.md with the load average, CPU, commit and date.
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

ROOT = Path(__file__).resolve().parents[2]
HIDDEN, LAYERS, HEADS, KV_HEADS, HEAD_SIZE = 256, 4, 4, 2, 64
EXPERTS, EXPERTS_USED, EXPERT_FFN = 16, 8, 256
TOKEN_SEED = 1234


def write_model(path: Path) -> None:
    sys.path.insert(0, str(ROOT / "scripts" / "models"))
    sys.path.insert(0, str(ROOT / "tests"))
    import synthetic_models as sm
    from llama3_tokenizer import gguf_vocab
    from test_synthetic_models import SMALL, write_tiktoken

    tiktoken = write_tiktoken(path.parent / "tokenizer.model")
    shape = sm.reduced(sm.SHAPES["Qwen3-30B-A3B"], hidden=HIDDEN, layers=LAYERS, heads=HEADS, kv_heads=KV_HEADS,
                       ffn=2 * HIDDEN, vocab=SMALL["vocab"], head_size=HEAD_SIZE, experts=EXPERTS,
                       experts_used=EXPERTS_USED, expert_ffn=EXPERT_FFN)
    sm.write_model(path, shape, "Q4_K_M", gguf_vocab(tiktoken), name="bench moe", seed=5, log=None)


def tokens(vocab: int, n: int) -> list[int]:
    import numpy as np

    return [int(t) for t in np.random.default_rng(TOKEN_SEED).integers(10, vocab - 10, size=n)]


def clocks() -> tuple[float, float]:
    return time.process_time(), time.perf_counter()


def rate(n: int, start: tuple[float, float], end: tuple[float, float]) -> tuple[float, float]:
    """(tokens/s by process CPU time, tokens/s by wall time)."""
    return n / max(end[0] - start[0], 1e-9), n / max(end[1] - start[1], 1e-9)


def bench_rocmforge(model: str, prompt_n: int, gen_n: int, repetitions: int, label: str) -> dict:
    from hipcore.engine.loader import LoadOptions, load_model
    from hipcore.engine.sampler import SamplingParams

    loaded = load_model(model, LoadOptions(device="cpu", max_seqs=1, max_step_tokens=prompt_n, block_size=16,
                                           kv_dtype="f32"))
    engine = loaded.engine
    prompt = tokens(loaded.config.vocab_size, prompt_n)
    runs = []
    for run in range(repetitions + 1):  # the first is the warm-up
        engine.submit(prompt, SamplingParams(temperature=0.0, max_tokens=gen_n + 1, ignore_eos=True))
        start = clocks()
        engine.step()  # the prompt in one step, its first token sampled
        after_prompt = clocks()
        steps = 0
        while engine.has_work():
            engine.step()
            steps += 1
        end = clocks()
        if run:
            runs.append({"pp": rate(prompt_n, start, after_prompt), "tg": rate(steps, after_prompt, end)})
    loaded.close()
    return {"engine": f"rocmforge cpu backend ({label})", "runs": runs}


def bench_llamacpp(model: str, prompt_n: int, gen_n: int, repetitions: int, threads: int) -> dict:
    import llama_cpp
    import llama_cpp.llama_cpp as llama_lowlevel

    original = llama_lowlevel.llama_model_default_params

    def params():  # llama.cpp 0.3.36's AMX matmul crashes on some CPUs: the ordinary CPU kernels (record_llamacpp.py)
        p = original()
        p.use_extra_bufts = False
        return p

    llama_lowlevel.llama_model_default_params = params
    llm = llama_cpp.Llama(model, n_ctx=prompt_n + gen_n + 16, n_batch=prompt_n, n_ubatch=prompt_n,
                          n_threads=threads, n_threads_batch=threads, verbose=False)
    prompt = tokens(llm.n_vocab(), prompt_n)
    generate = tokens(llm.n_vocab(), gen_n)
    runs = []
    for run in range(repetitions + 1):
        llm.reset()
        start = clocks()
        llm.eval(prompt)
        after_prompt = clocks()
        for token in generate:
            llm.eval([token])
        end = clocks()
        if run:
            runs.append({"pp": rate(prompt_n, start, after_prompt), "tg": rate(gen_n, after_prompt, end)})
    return {"engine": f"llama.cpp CPU (llama-cpp-python {llama_cpp.__version__})", "runs": runs}


def summary(runs: list[dict], test: str, clock: int) -> str:
    values = [r[test][clock] for r in runs]
    sd = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{statistics.median(values):.1f} ± {sd:.1f}"


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def commit(tree: Path) -> str:
    done = subprocess.run(["git", "-C", str(tree), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    return done.stdout.strip() or tree.name


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("outdir", type=Path)
    ap.add_argument("--llama-python", help="a Python with llama-cpp-python, to measure llama.cpp too")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--prompt-tokens", type=int, default=64)
    ap.add_argument("--gen", type=int, default=32)
    ap.add_argument("--repetitions", type=int, default=3)
    ap.add_argument("--baseline", type=Path, help="another rocmforge checkout to measure first (a before)")
    ap.add_argument("--baseline-commit", help="the baseline's commit, for the table (default: its git HEAD)")
    ap.add_argument("--engine", choices=("rocmforge", "llamacpp"), help=argparse.SUPPRESS)
    ap.add_argument("--label", default="", help=argparse.SUPPRESS)
    ap.add_argument("--model", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.engine == "rocmforge":
        print(json.dumps(bench_rocmforge(args.model, args.prompt_tokens, args.gen, args.repetitions, args.label)))
        return 0
    if args.engine == "llamacpp":
        print(json.dumps(bench_llamacpp(args.model, args.prompt_tokens, args.gen, args.repetitions, args.threads)))
        return 0
    args.outdir.mkdir(parents=True, exist_ok=True)
    model = args.outdir / "model.gguf"
    if not model.exists():
        write_model(model)
    env = {**os.environ, "OPENBLAS_NUM_THREADS": str(args.threads), "OMP_NUM_THREADS": str(args.threads),
           "MKL_NUM_THREADS": str(args.threads)}
    common = ["--model", str(model), "--threads", str(args.threads), "--prompt-tokens", str(args.prompt_tokens),
              "--gen", str(args.gen), "--repetitions", str(args.repetitions), str(args.outdir)]
    children = []  # (command, environment)
    if args.baseline:
        label = args.baseline_commit or commit(args.baseline)
        children.append(([sys.executable, __file__, "--engine", "rocmforge", "--label", label, *common],
                         {**env, "PYTHONPATH": str(args.baseline.resolve())}))
    children.append(([sys.executable, __file__, "--engine", "rocmforge", "--label", commit(ROOT), *common], env))
    if args.llama_python:
        children.append(([args.llama_python, __file__, "--engine", "llamacpp", *common], env))
    results, load = [], [os.getloadavg()]
    for child, child_env in children:
        done = subprocess.run(child, capture_output=True, text=True, env=child_env, cwd=ROOT)
        if done.returncode:
            print(f"{child[3]} run failed (exit {done.returncode}): {done.stderr.strip()[-800:]}", file=sys.stderr)
            return 1
        results.append(json.loads(done.stdout.strip().splitlines()[-1]))
        load.append(os.getloadavg())
    head = (f"{model.name}: Qwen3-30B-A3B's shape reduced ({LAYERS} layers, hidden {HIDDEN}, {EXPERTS} experts, "
            f"{EXPERTS_USED} used, expert width {EXPERT_FFN}, Q4_K_M); {args.prompt_tokens}-token prompt, "
            f"{args.gen} decoded tokens, {args.threads} thread(s), median ± sd of {args.repetitions} runs\n"
            f"cpu: {cpu_name()}, {os.cpu_count()} cores; commit {commit(ROOT)}; "
            f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; load average (1 min) "
            f"{' -> '.join(f'{one:.1f}' for one, _, _ in load)}\n")
    lines = [head, "| engine | pp t/s (CPU time) | tg t/s (CPU time) | pp t/s (wall) | tg t/s (wall) |",
             "| --- | ---: | ---: | ---: | ---: |"]
    for result in results:
        lines.append(f"| {result['engine']} | {summary(result['runs'], 'pp', 0)} | {summary(result['runs'], 'tg', 0)} "
                     f"| {summary(result['runs'], 'pp', 1)} | {summary(result['runs'], 'tg', 1)} |")
    table = "\n".join(lines) + "\n"
    (args.outdir / "table.md").write_text(table)
    (args.outdir / "results.json").write_text(json.dumps({"results": results, "load": load, "commit": commit(ROOT)},
                                                         indent=1))
    print(table, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
