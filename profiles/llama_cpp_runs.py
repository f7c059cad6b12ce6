"""llama.cpp's own benchmarks on the same model, for the ratio column of `rocmforge bench`.

    llama-bench           pp<P> and tg<N>: the same tests as ours (-r repetitions, flash attention on)
    llama-batched-bench   b<B>x<N>: -npp 1 -ntg N -npl B -fa on; each of B sequences gets a one-token
                          prompt and then decodes N tokens, all B together per step; its S_TG t/s
                          (B * N / decode time) is what our b<B>x<N> measures. It runs each B once per
                          listed value, so every B is listed `repetitions` times (plus one warm-up run of
                          the first) and the mean and standard deviation are taken over those runs.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
from pathlib import Path

from hipcore.errors import UsageError

BATCHED_BENCH_NAME = "llama-batched-bench"


def _executable(path: str, option: str) -> str:
    exe = shutil.which(path) or path
    if not os.path.isfile(exe) or not os.access(exe, os.X_OK):
        raise UsageError(f"{option} {path}: not an executable file")
    return exe


def _run(cmd: list[str], option: str, timeout: float) -> subprocess.CompletedProcess:
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.SubprocessError) as exc:
        raise UsageError(f"{option}: could not run {cmd[0]}: {exc}") from None
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
        raise UsageError(f"{option}: {cmd[0]} exited with {proc.returncode}: {tail[0][:200]!r}")
    return proc


def run_llama_bench(path: str, cfg, *, gpu: bool, timeout: float = 1800) -> list[dict]:
    """llama-bench's JSON records (avg_ts, stddev_ts, n_prompt, n_gen ...) for the pp and tg tests of
    `cfg` (a BenchConfig). A missing or failing binary is a UsageError naming what went wrong."""
    exe = _executable(path, "--llama-bench")
    cmd = [exe, "-m", cfg.model, "-r", str(cfg.repetitions), "-o", "json",
           "-p", ",".join(map(str, cfg.prompt_tokens)) or "0", "-n", ",".join(map(str, cfg.gen_tokens)) or "0"]
    if tuple(cfg.depths) != (0,):
        cmd += ["-d", ",".join(map(str, cfg.depths))]
    if gpu:
        cmd += ["-ngl", "99", "-fa", "on"]
    proc = _run(cmd, "--llama-bench", timeout)
    try:
        records = json.loads(proc.stdout)
    except json.JSONDecodeError:
        raise UsageError(f"--llama-bench: {exe} did not print JSON (is it llama.cpp's llama-bench?)") from None
    return [r for r in records if isinstance(r, dict)]


def llama_bench_test_name(record: dict) -> str:
    n_prompt, n_gen = int(record.get("n_prompt", 0)), int(record.get("n_gen", 0))
    depth = int(record.get("n_depth", 0) or 0)
    at = f" @ d{depth}" if depth else ""
    if n_prompt and n_gen:
        return f"pp{n_prompt}+tg{n_gen}{at}"
    return f"pp{n_prompt}{at}" if n_prompt else f"tg{n_gen}{at}"


def batched_bench_beside(llama_bench: str) -> str | None:
    """llama-batched-bench in the folder of llama-bench (llama.cpp builds both into build/bin)."""
    exe = shutil.which(llama_bench) or llama_bench
    candidate = Path(exe).resolve().parent / BATCHED_BENCH_NAME
    return str(candidate) if candidate.is_file() and os.access(candidate, os.X_OK) else None


def batched_context(batches: tuple[int, ...], gen_tokens: int) -> int:
    """KV cells llama-batched-bench needs for its largest B: B sequences of 1 + N tokens (rounded up)."""
    need = max(batches) * (1 + gen_tokens)
    return -(-need // 256) * 256


def run_llama_batched_bench(path: str, cfg, *, gpu: bool, timeout: float = 1800) -> list[dict]:
    """One record per B of cfg.batches: {"test": "b8x128", "pl": 8, "tg": 128, "avg_ts", "stddev_ts",
    "runs": [S_TG t/s of each run]}."""
    exe = _executable(path, "--llama-batched-bench")
    if not cfg.batches:
        return []
    reps = cfg.repetitions
    order = [cfg.batches[0]] + [b for b in cfg.batches for _ in range(reps)]  # the first: warm-up
    cmd = [exe, "-m", cfg.model, "-c", str(batched_context(cfg.batches, cfg.batch_gen_tokens)), "-b", "2048",
           "-ub", "512", "-npp", "1", "-ntg", str(cfg.batch_gen_tokens), "-npl", ",".join(map(str, order)),
           "--output-format", "jsonl"]
    if gpu:
        cmd += ["-ngl", "99", "-fa", "on"]
    proc = _run(cmd, "--llama-batched-bench", timeout)
    lines = [line for line in (proc.stdout + "\n" + proc.stderr).splitlines() if line.startswith("{")]
    rows = []
    for line in lines:
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    if len(rows) != len(order):
        raise UsageError(f"--llama-batched-bench: {exe} printed {len(rows)} results for {len(order)} runs "
                         "(is it llama.cpp's llama-batched-bench?)")
    out = []
    for b in cfg.batches:
        runs = [float(r["speed_tg"]) for r in rows[1:] if int(r["pl"]) == b]
        out.append({"test": f"b{b}x{cfg.batch_gen_tokens}", "pl": b, "tg": cfg.batch_gen_tokens,
                    "avg_ts": statistics.fmean(runs), "stddev_ts": statistics.stdev(runs) if len(runs) > 1 else 0.0,
                    "runs": runs})
    return out
