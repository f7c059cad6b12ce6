"""`rocmforge leak-check`: run a seeded mix of requests through the engine and prove nothing leaks."""

from __future__ import annotations

import json
from typing import Annotated, Optional

import typer

from hipcore.errors import UsageError
from profiles.leak_check import run_leak_check
from profiles.leak_render import render
from profiles.leak_settings import LeakCheckSettings
from profiles.leak_thresholds import parse_fail_on
from rocmforge_cli.common import handle_errors, stderr, stdout
from rocmforge_cli.options import (
    Device, KvDtype, Model, PlantBug, block_size_option, json_option, kv_blocks_option, parallel_option,
    prefix_cache_option, quiet_option, resolve_model, seed_option,
)
from rocmforge_cli.leak_progress_display import progress_on_stderr
from rocmforge_cli.picture_options import PlotFile, ReportFile, TraceFile, check_picture_paths, write_pictures, write_trace

FAIL_ON_HELP = (
    "Fail (exit 1) when a layer leaks more than LIMIT; repeatable. KEY=LIMIT with KEY one of: blocks (KV blocks, "
    "default 0), ledger (device bytes, default 0), driver (device memory outside the ledger: the driver's loss minus the ledger's growth, beyond one 2 MiB "
    "granule after two consecutive phases; GPU only, default 0), handles (streams, events, graphs, modules, open file "
    "descriptors more than at the baseline, default 0), "
    "host-growth (RSS slope on runs of 500+ requests, e.g. 2MiB/1000req, default 1MiB/1000req), host-traced (host "
    "memory tracemalloc finds kept since the baseline, on every run length, default 128KiB/1000req plus 256 KiB for "
    "bounded caches), unexpected (requests that ended other than planned, default off). LIMIT 'off' makes the key a "
    "warning only."
)


def parse_range(text: str) -> tuple[int, int]:
    low, sep, high = text.partition("-")
    try:
        lo = int(low)
        hi = int(high) if sep else lo
    except ValueError:
        raise UsageError(f"--prompt-tokens {text!r}: use MIN-MAX, e.g. 4-32, or one number") from None
    return lo, hi


@handle_errors
def leak_check_command(
    model: Model = None,
    device: Device = "auto",
    requests: Annotated[int, typer.Option("--requests", help="Requests to run after the warm-up.")] = 1000,
    parallel: Annotated[int, parallel_option("Sequences in flight at once (a request with n samples takes n); also the engine's sequence limit.")] = 8,
    seed: Annotated[int, seed_option("Seed of the workload: the same seed and settings give the same requests.")] = 0,
    kv_blocks: Annotated[Optional[int], kv_blocks_option("KV pool size in blocks. Default: deliberately small (about 60% of what --parallel requests hold at once), so requests get preempted.")] = None,
    max_tokens: Annotated[int, typer.Option("--max-tokens", help="Most new tokens per request (each request draws its own limit up to this).")] = 12,
    prompt_tokens: Annotated[str, typer.Option("--prompt-tokens", help="Length range of the random prompts, MIN-MAX tokens.")] = "4-32",
    step_tokens: Annotated[int, typer.Option("--step-tokens", help="Tokens computed per engine step; longer prompts are evaluated in chunks over several steps.")] = 32,
    phases: Annotated[int, typer.Option("--phases", help="Phases the requests are split into; every check runs after each.")] = 4,
    warmup: Annotated[Optional[int], typer.Option("--warmup", help="Warm-up requests before the baseline (default: --parallel).", show_default=False)] = None,
    finished_bound: Annotated[int, typer.Option("--finished-bound", help="Finished-request records the engine may keep; the check fails if it keeps more.")] = 100,
    kv_dtype: KvDtype = "f16",
    block_size: Annotated[int, block_size_option("Tokens per KV block; small blocks make short requests cross blocks (and get preempted) more often.")] = 16,
    fail_on: Annotated[Optional[list[str]], typer.Option("--fail-on", help=FAIL_ON_HELP, show_default=False)] = None,
    deadline: Annotated[Optional[float], typer.Option("--deadline", help="End the run as failed (exit 1) after this many seconds from the warm-up on. Default: 300 s + 5 s per request.", show_default=False)] = None,
    no_tracemalloc: Annotated[bool, typer.Option("--no-tracemalloc", help="Measure host memory by RSS only (tracemalloc slows Python code by about a third).")] = False,
    prefix_cache: Annotated[bool, prefix_cache_option("Prefix caching, as serve runs it: half the random prompts start alike; cached blocks are counted, checked and evicted after each phase, then every block must be free.")] = True,
    as_json: Annotated[bool, json_option("Print the report as one JSON object instead of tables.")] = False,
    quiet: Annotated[bool, quiet_option("No progress on stderr (by default: a progress line on a terminal, otherwise a plain line every 10 s with requests done, KV blocks in use and the phase).")] = False,
    report_file: ReportFile = None,
    plot_file: PlotFile = None,
    trace_file: TraceFile = None,
    plant_bug: PlantBug = None,
) -> None:
    """Run a seeded mix of requests through the engine and check that every KV block and every device byte comes back; exit 0 when clean, 1 on a leak or when a layer could not be judged (verdict "not judged"), 2 on a usage error.

    The mix covers every way a request ends (with prefix caching on, as serve runs, and prompts that share prefixes): max tokens, end token, stop string, cancelled while waiting / during its prompt / mid-decode / in its final step, failed by an injected sampler or forward-pass fault, parallel samples sharing their prompt's blocks, rejection, preemption under a small KV pool, and a shutdown with requests in flight. After the warm-up a baseline is taken; after each phase the engine must be empty, every KV block free, the device ledger equal to the baseline byte for byte, the driver's free memory unchanged beyond the ledger's own growth (GPU; on the cpu backend this layer is reported as not applicable), the device's streams, events, graphs and modules (beyond the kernel cache's one an op) and the process's open file descriptors as many as at the baseline, and host memory flat per request (tracemalloc on every run length; the RSS slope on runs of 500 requests or more); after the model is closed the ledger must be empty. A request preempted 50 times in a row without keeping a new token, or a run past --deadline, ends the run with exit 1 naming the KV blocks that never came back.

    Cost: on the cpu backend the demo model computes roughly 20-40 tokens per second on two cores, so the defaults (1,000 requests, prompts of 4-32 tokens, up to 12 new tokens) take about 15-25 minutes there; on a GPU they take a minute or two. For a quick check use e.g. --requests 200 --prompt-tokens 2-10 --max-tokens 4.

    Examples:
      rocmforge leak-check --device cpu --requests 200 --prompt-tokens 2-10 --max-tokens 4
      rocmforge leak-check --requests 10000 --json > leak.json
      rocmforge leak-check --fail-on host-growth=2MiB/1000req --fail-on driver=4MiB
      rocmforge leak-check --device cpu --requests 200 --no-prefix-cache
      rocmforge leak-check --requests 2000 --report leak.html --plot leak.png --trace leak.json
    """
    settings = LeakCheckSettings(
        model=resolve_model(model), device=device, requests=requests, parallel=parallel, seed=seed, kv_blocks=kv_blocks,
        max_tokens=max_tokens, prompt_tokens=parse_range(prompt_tokens), step_tokens=step_tokens, phases=phases,
        warmup=warmup, finished_bound=finished_bound, kv_dtype=kv_dtype, block_size=block_size, tracemalloc=not no_tracemalloc,
        thresholds=parse_fail_on(fail_on), planted_bug=plant_bug, deadline=deadline, prefix_caching=prefix_cache,
    )
    settings.validate()
    trace = check_picture_paths(report_file, plot_file, trace_file)
    with progress_on_stderr(stderr, quiet, "leak-check") as progress:
        report = run_leak_check(settings, progress, trace)
    write_pictures(report.timeline, report_file, plot_file, report.findings,
                   [f"command: {report.command}", f"device: {report.device}", f"model: {report.model}"])
    write_trace(trace, trace_file, {"command": report.command, "device": report.device, "verdict": report.verdict})
    if as_json:
        print(json.dumps(report.to_dict(), indent=1))
    else:
        stdout.print(render(report), soft_wrap=False)
    if report.exit_code:
        raise typer.Exit(report.exit_code)
