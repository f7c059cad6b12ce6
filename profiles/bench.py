"""The `rocmforge bench` workloads, modelled on llama.cpp's llama-bench.

    pp<P>      prompt processing: one request of P prompt tokens evaluated (tokens/s = P / time)
    tg<N>      text generation: one sequence decoding N tokens, one per step (tokens/s = N / time)
    b<B>x<N>   batched decode: B sequences decoding together, N tokens each (tokens/s summed over them)

Everything runs through the Engine as a user's requests do: scheduling, the batch, the upload, the
forward pass (graph replay for decode steps), sampling on the device (greedy) and detokenizing are
all inside the time. End-of-generation tokens are ignored so every run decodes exactly N tokens.
Only decode steps count for tg and b (a step in which no prompt token was evaluated); only the prompt
step counts for pp. Each test first runs to warm up (kernels load, graphs are captured, the GPU
reaches its clocks: at least once and for WARMUP_SECONDS) and then `repetitions` times; results are mean and sample standard deviation of the runs' tokens/s.
"""

from __future__ import annotations

import datetime
import json
import math
import os
import shutil
import statistics
import subprocess
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

from hipcore.engine.engine import Engine
from hipcore.errors import UsageError
from hipcore.engine.loader import LoadedModel, LoadOptions, load_model
from hipcore.engine.sampler import SamplingParams
from hipcore.runtime.kernels import runtime_compiled_ops
from profiles.llama_cpp_runs import llama_bench_test_name

StatusFn = Callable[[str], None]

GPU_DEFAULTS = dict(prompt_tokens=(512,), gen_tokens=(128,), batches=(8, 32, 64, 128), batch_gen_tokens=128, repetitions=5)
CPU_DEFAULTS = dict(prompt_tokens=(32,), gen_tokens=(8,), batches=(4,), batch_gen_tokens=4, repetitions=2)


@dataclass(frozen=True)
class BenchConfig:
    model: str
    device: str = "auto"
    kv_dtype: str = "f16"
    prompt_tokens: tuple[int, ...] = (512,)
    gen_tokens: tuple[int, ...] = (128,)
    batches: tuple[int, ...] = (8, 32, 64, 128)
    batch_gen_tokens: int = 128
    depths: tuple[int, ...] = (0,)  # tokens already in the context before each tg test (llama-bench's -d)
    repetitions: int = 5
    use_graphs: bool = True
    seed: int = 0
    profile_batch: int = 0  # sequences of the profiled decode step (0: no profile)
    profile_depth: int = 128  # tokens already in each of its sequences' context

    def validate(self) -> None:
        for name, values in (("-p", self.prompt_tokens), ("-n", self.gen_tokens), ("-b", self.batches)):
            if any(v < 1 for v in values):
                raise UsageError(f"{name} values must be at least 1, got {', '.join(map(str, values))}")
        if not (self.prompt_tokens or self.gen_tokens or self.batches or self.profile_batch):
            raise UsageError("nothing to run: give at least one of -p, -n, -b a value, or --profile")
        if self.repetitions < 1:
            raise UsageError(f"-r must be at least 1, got {self.repetitions}")
        if self.batch_gen_tokens < 1:
            raise UsageError(f"--batch-gen must be at least 1, got {self.batch_gen_tokens}")
        if not self.depths or any(d < 0 for d in self.depths):
            raise UsageError(f"--n-depth values must be 0 or more, got {', '.join(map(str, self.depths)) or 'none'}")
        if self.profile_depth < 1:
            raise UsageError(f"--profile-depth must be at least 1, got {self.profile_depth}")

    @property
    def test_count(self) -> int:
        return len(self.prompt_tokens) + len(self.gen_tokens) * len(self.depths) + len(self.batches)

    @property
    def max_seqs(self) -> int:
        return max((1, self.profile_batch, *self.batches))

    @property
    def context(self) -> int:
        """Tokens a sequence may hold: the longest prompt and its sampled token, or a one-token prompt and
        the longest generation, with one spare (the engine refuses a prompt as long as the context)."""
        depth = max(self.depths)
        profiled = self.profile_depth + 2 if self.profile_batch else 0
        need = max((*(p + 2 for p in self.prompt_tokens), *(max(depth, 1) + n + 1 for n in self.gen_tokens),
                    self.batch_gen_tokens + 2, profiled, 16))
        return -(-need // 64) * 64


@dataclass
class TestResult:
    test: str  # "pp512", "tg128", "b64x128"
    n_prompt: int
    n_gen: int
    batch: int
    tokens_per_second: list[float]  # one per repetition

    @property
    def mean(self) -> float:
        return statistics.fmean(self.tokens_per_second)

    @property
    def sd(self) -> float:
        return statistics.stdev(self.tokens_per_second) if len(self.tokens_per_second) > 1 else 0.0

    def to_dict(self) -> dict:
        return {**asdict(self), "mean": self.mean, "sd": self.sd}


@dataclass
class BenchReport:
    model: str
    model_path: str
    quant: str
    model_bytes: int
    params: int
    device: str
    backend: str
    kv_dtype: str
    graphs: bool
    commit: str
    date: str
    results: list[TestResult] = field(default_factory=list)
    llama_bench: list[dict] = field(default_factory=list)  # llama-bench's records, when it was run
    llama_batched_bench: list[dict] = field(default_factory=list)  # llama-batched-bench's, per batch size
    notes: list[str] = field(default_factory=list)
    interrupted: bool = False  # stopped (Ctrl-C) before every test had run: results holds those that had

    def llama_cpp_figures(self) -> dict[str, tuple[float, float]]:
        """test name ("pp512", "tg128", "b8x128") -> llama.cpp's (mean, sd) tokens/s, where it was run."""
        out = {llama_bench_test_name(r): (float(r["avg_ts"]), float(r.get("stddev_ts", 0.0)))
               for r in self.llama_bench if r.get("avg_ts")}
        out.update({r["test"]: (float(r["avg_ts"]), float(r.get("stddev_ts", 0.0)))
                    for r in self.llama_batched_bench if r.get("avg_ts")})
        return out

    def to_dict(self) -> dict:
        out = {k: v for k, v in asdict(self).items() if k != "results"}
        out["results"] = [r.to_dict() for r in self.results]
        return out

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)


# ---- facts about the run --------------------------------------------------------------------------


def source_commit() -> str:
    """$ROCMFORGE_COMMIT when set (for sources copied without a usable .git), else the git commit of
    this checkout (with '+dirty' for uncommitted changes), else 'unknown'."""
    named = os.environ.get("ROCMFORGE_COMMIT")
    if named:
        return named
    repo = Path(__file__).resolve().parents[1]
    git = shutil.which("git")
    if git is None or not (repo / ".git").exists():
        return "unknown"
    try:
        rev = subprocess.run([git, "-C", str(repo), "rev-parse", "--short=10", "HEAD"], capture_output=True, text=True,
                             timeout=10).stdout.strip()
        dirty = subprocess.run([git, "-C", str(repo), "diff", "--quiet", "HEAD", "--"], capture_output=True,
                               timeout=10).returncode
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return (rev or "unknown") + ("+dirty" if dirty == 1 else "")


def dominant_type(plan) -> str:
    """The tensor type holding most of the file's bytes ("Q4_1" for the demo model)."""
    by_type = plan.bytes_by_type()
    return max(by_type, key=lambda t: by_type[t][1]) if by_type else "?"


class _NoEndTokenizer:
    """The model's tokenizer with no end-of-generation ids: every run decodes exactly max_tokens."""

    eot_ids: frozenset = frozenset()

    def __init__(self, tokenizer):
        self._tokenizer = tokenizer

    def __getattr__(self, name):
        return getattr(self._tokenizer, name)


# ---- the workloads --------------------------------------------------------------------------------


@dataclass
class StepLog:
    """Wall time of each engine step, split by whether the step evaluated prompt tokens."""

    prompt_seconds: float = 0.0
    decode_seconds: float = 0.0
    decode_tokens: int = 0
    prompt_tokens: int = 0


def _run_requests(engine: Engine, prompts: list[list[int]], max_tokens: int) -> StepLog:
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens)
    for prompt in prompts:
        engine.submit(prompt, params)
    log = StepLog()
    stats = engine.stats
    while engine.has_work():
        prompt_before, generated_before = stats.prompt_tokens, stats.generated_tokens
        t0 = time.perf_counter()
        engine.step()
        elapsed = time.perf_counter() - t0
        if stats.prompt_tokens > prompt_before:
            log.prompt_seconds += elapsed
            log.prompt_tokens += stats.prompt_tokens - prompt_before
        else:
            log.decode_seconds += elapsed
            log.decode_tokens += stats.generated_tokens - generated_before
    return log


class Workloads:
    """The tests on one loaded model (its own Engine, sharing the model's runner and KV cache)."""

    def __init__(self, loaded: LoadedModel, cfg: BenchConfig):
        self.loaded = loaded
        self.vocab = loaded.config.vocab_size
        self.rng = np.random.default_rng(cfg.seed)
        self.engine = Engine(loaded.runner, _NoEndTokenizer(loaded.tokenizer), loaded.cache,
                             max_seqs=loaded.runner.max_seqs, max_step_tokens=loaded.runner.max_step_tokens,
                             max_context=min(cfg.context, loaded.memory_plan.ctx_size))

    def _prompt(self, n: int) -> list[int]:
        low = min(100, self.vocab // 4)  # clear of the special tokens at the start of most vocabularies
        return [int(t) for t in self.rng.integers(low, self.vocab, n)]

    def prompt(self, p: int) -> float:
        log = _run_requests(self.engine, [self._prompt(p)], max_tokens=1)
        return log.prompt_tokens / log.prompt_seconds

    def decode(self, batch: int, n: int, depth: int = 0) -> float:
        """Decode tokens/s of `batch` sequences generating n tokens each after a prompt of `depth` tokens (one
        when 0): the prompt's steps are not timed, so depth measures decode at that context length."""
        log = _run_requests(self.engine, [self._prompt(max(depth, 1)) for _ in range(batch)], max_tokens=n + 1)
        return log.decode_tokens / log.decode_seconds

    def close(self) -> None:
        self.engine.shutdown()
        self.loaded.cache.release_fenced()


# Warm-up runs last at least this long in all. One run loads the kernels and captures the bucket's
# graph, but a 512-token prompt takes ~8 ms on a fast GPU, and measured on an H100 the first run after
# a single warm-up run of it was 4x slower than the next four (most likely the GPU not yet at its
# clocks after the idle load).
WARMUP_SECONDS = 0.5
WARMUP_MAX_RUNS = 50


def _repeat(name: str, fn: Callable[[], float], reps: int, say: StatusFn) -> list[float]:
    start = time.perf_counter()
    fn()  # kernels load, the bucket's graph is captured
    for _ in range(WARMUP_MAX_RUNS - 1):
        if time.perf_counter() - start >= WARMUP_SECONDS:
            break
        fn()
    samples = []
    for i in range(reps):
        samples.append(fn())
        say(f"  {name}: run {i + 1}/{reps}: {samples[-1]:,.1f} tokens/s")
    return samples


def load_for_bench(cfg: BenchConfig, *, device=None, status: StatusFn | None = None, progress=None) -> LoadedModel:
    """Load the model sized for the tests of cfg (context, sequences, prompt length); `device` reuses an
    opened device (the caller closes it)."""
    options = LoadOptions(device=cfg.device, ctx_size=cfg.context, max_seqs=cfg.max_seqs,
                          max_step_tokens=max((512, *cfg.prompt_tokens)), kv_dtype=cfg.kv_dtype)
    loaded = load_model(cfg.model, options, status=status, progress=progress, device=device)
    if not cfg.use_graphs:
        loaded.runner.graphs.capture = False
    return loaded


def start_report(loaded: LoadedModel, cfg: BenchConfig) -> BenchReport:
    """The facts of the run, with no results yet."""
    gguf = loaded.gguf
    return BenchReport(
        model=Path(cfg.model).name, model_path=str(cfg.model), quant=dominant_type(gguf.plan),
        model_bytes=sum(t.nbytes for t in gguf.plan.tensors),
        params=sum(math.prod(t.shape) for t in gguf.plan.tensors), device=loaded.device.describe(),
        backend=loaded.device.backend, kv_dtype=loaded.cache.config.dtype, graphs=loaded.runner.graphs.capture,
        commit=source_commit(), date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    )


def tg_name(n_gen: int, depth: int) -> str:
    """llama-bench's name of a decode test: "tg128", or "tg128 @ d4096" after a 4096-token context."""
    return f"tg{n_gen}" if depth == 0 else f"tg{n_gen} @ d{depth}"


def run_bench(loaded: LoadedModel, cfg: BenchConfig, *, status: StatusFn | None = None,
              report: BenchReport | None = None, on_result: Callable[[TestResult], None] | None = None) -> BenchReport:
    """Run every test of `cfg` on the loaded model, appending each result to `report` (a new one if None)
    as soon as it is measured and handing it to `on_result`: an interrupted run keeps what it measured."""
    say = status or (lambda _m: None)
    report = report if report is not None else start_report(loaded, cfg)
    tests = [(f"pp{p}", p, 0, 1, lambda p=p: work.prompt(p)) for p in cfg.prompt_tokens]
    tests += [(tg_name(n, d), 0, n, 1, lambda n=n, d=d: work.decode(1, n, d)) for d in cfg.depths for n in cfg.gen_tokens]
    n = cfg.batch_gen_tokens
    tests += [(f"b{b}x{n}", 0, n, b, lambda b=b: work.decode(b, n)) for b in cfg.batches]
    work = Workloads(loaded, cfg)
    try:
        for k, (name, n_prompt, n_gen, batch, fn) in enumerate(tests):
            say(f"test {k + 1} of {len(tests)}: {name} ({len(tests) - k - 1} left after it)")
            result = TestResult(name, n_prompt, n_gen, batch, _repeat(name, fn, cfg.repetitions, say))
            report.results.append(result)
            if on_result is not None:
                on_result(result)
    finally:
        work.close()
        note_runtime_compiled(report, loaded.device.arch)
    return report


def note_runtime_compiled(report: BenchReport, arch: str) -> None:
    """Add a note naming the ops whose kernels were compiled at run time for `arch` (none: no note)."""
    compiled = runtime_compiled_ops(arch)
    if compiled:
        note = (f"kernels compiled at run time, with no prebuilt object of their sources for {arch} (they can run "
                f"slower than prebuilt ones; `rocmforge kernels build` makes them): {', '.join(compiled)}")
        if note not in report.notes:
            report.notes.append(note)
