"""`rocmforge serve-leak-check`: drive a real `rocmforge serve` with concurrent HTTP clients and prove nothing leaks."""

from __future__ import annotations

import json
import math
import shlex
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from hipcore.errors import UsageError
from profiles.leak_thresholds import Thresholds, parse_fail_on
from profiles.serve_leak_check import ServeLeakSettings, run_serve_leak_check
from profiles.serve_leak_render import render
from profiles.serve_leak_report import SERVE_FAIL_ON_KEYS
from rocmforge_cli.picture_options import PlotFile, ReportFile, TraceFile, check_picture_paths
from rocmforge_cli.common import handle_errors, stderr, stdout
from rocmforge_cli.leak_progress_display import progress_on_stderr
from rocmforge_cli.options import Device, Model, PlantBug, json_option, quiet_option, resolve_model, seed_option


DEFAULT_REQUESTS = 1500
FAIL_ON_HELP = ("Fail (exit 1) when a layer leaks more than LIMIT; repeatable. KEY=LIMIT with KEY one of: blocks (KV "
                "blocks, default 0), ledger (device bytes, default 0), driver (device memory outside the ledger beyond "
                "the driver's 2 MiB granule, over both halves of the requests; GPU only, default 0), host-growth (the "
                "server's RSS slope, e.g. 2MiB/1000req, default 1MiB/1000req). LIMIT 'off' makes the key a warning only "
                "(host-growth=off: a run too short to judge host memory is not a failure).")


@handle_errors
def serve_leak_check_command(
    model: Model = None,
    device: Device = "auto",
    requests: Annotated[Optional[int], typer.Option("--requests", help="Requests to send after the warm-up. Default: 1,500, enough to judge the server's host memory (from request 1,000 on, over at least 250); with --duration, no limit but the time.", show_default=False)] = None,
    duration: Annotated[Optional[str], typer.Option("--duration", help="A soak: send requests until this much time has passed (e.g. 90s, 10m, 1h); the server's host memory must then be judged flat (at most 1 MiB per 1,000 requests over the second half, which must span >= 250 requests).", show_default=False)] = None,
    clients: Annotated[int, typer.Option("--clients", help="Concurrent HTTP clients; the server decodes half as many at once, so the rest queue.")] = 8,
    max_tokens: Annotated[int, typer.Option("--max-tokens", help="Most new tokens per request (each draws its own).")] = 8,
    seed: Annotated[int, seed_option("Seed of the request mix: the same seed and settings send the same requests.")] = 0,
    serve_arg: Annotated[Optional[list[str]], typer.Option("--serve-arg", help="An extra argument for `rocmforge serve` (repeatable), e.g. --serve-arg=--kv-blocks=64.", show_default=False)] = None,
    time_limit: Annotated[Optional[float], typer.Option("--time-limit", help="Seconds the clients may run at most. Default: 600, or the duration plus 300.", show_default=False)] = None,
    fail_on: Annotated[Optional[list[str]], typer.Option("--fail-on", help=FAIL_ON_HELP, show_default=False)] = None,
    as_json: Annotated[bool, json_option("Print the report as one JSON object (leak-check's keys).")] = False,
    quiet: Annotated[bool, quiet_option("No progress on stderr (by default: a progress bar on a terminal, otherwise a line for each phase and every 10 s one with requests done and the server's KV blocks in use).")] = False,
    report_file: ReportFile = None,
    plot_file: PlotFile = None,
    trace_file: TraceFile = None,
    plant_bug: PlantBug = None,
) -> None:
    """Start `rocmforge serve` on a free loopback port, send it a seeded mix of requests from concurrent clients (some leave during the prompt or mid-stream), then check that every KV block and ledger byte came back, that the GPU driver's free memory did not keep dropping, that the server's host memory is flat, and that it exits 0 on SIGTERM; exit 0 when clean, 1 on a leak or when a layer could not be judged (verdict "not judged": e.g. host memory on a run of fewer than 1,500 requests; --fail-on host-growth=off makes that a warning), 2 on a usage error. A driver drop in one half of the requests only is a warning.

    Examples:
      rocmforge serve-leak-check --device cpu --requests 60 --max-tokens 4 --fail-on host-growth=off
      rocmforge serve-leak-check --requests 5000 --clients 64 --json > serve-leak.json
      rocmforge serve-leak-check --duration 30m --clients 64 --max-tokens 64 --json > soak.json
      rocmforge serve-leak-check --requests 1500 --report serve.html --trace serve.json   (the server's, at its exit)
    """
    duration_s = parse_duration(duration) if duration is not None else None
    if requests is None and duration_s is None:
        requests = DEFAULT_REQUESTS
    if time_limit is None:
        time_limit = 600.0 if duration_s is None else duration_s + 300.0
    for flag, value, least, most in (("--requests", requests, 1, 10**8), ("--clients", clients, 1, 1024),
                                     ("--max-tokens", max_tokens, 1, 65536), ("--time-limit", time_limit, 0.001, 7 * 86400)):
        if value is not None and not (math.isfinite(value) and least <= value <= most):  # a thread per client
            raise UsageError(f"{flag} must be a number from {least:g} to {most:g}, got {value}")
    thresholds = serve_fail_on(fail_on)
    check_picture_paths(report_file, plot_file, trace_file)
    # The server records its own run and writes the files as it exits (serve's options of the same names).
    pictures = [arg for flag, path in (("--report", report_file), ("--plot", plot_file), ("--trace", trace_file))
                if path is not None for arg in (flag, str(Path(path).resolve()))]
    settings = ServeLeakSettings(model=resolve_model(model), device=device, requests=requests, clients=clients,
                                 max_tokens=max_tokens, seed=seed, extra_args=(*(serve_arg or ()), *pictures),
                                 planted_bug=plant_bug,
                                 time_limit_s=time_limit, duration_s=duration_s, thresholds=thresholds)
    with progress_on_stderr(stderr, quiet, "serve-leak-check") as progress:
        report = run_serve_leak_check(settings, progress,
                                      command_line=" ".join(["rocmforge", *map(shlex.quote, sys.argv[1:])]))
    if as_json:
        print(json.dumps(report.to_dict(), indent=1))
    else:
        stdout.print(render(report), soft_wrap=False)
    if report.exit_code:
        raise typer.Exit(report.exit_code)


def serve_fail_on(specs: Optional[list[str]]) -> Thresholds:
    """leak-check's --fail-on, for the layers this check has."""
    for spec in specs or ():
        for part in filter(None, (p.strip() for p in spec.split(","))):
            key = part.partition("=")[0].strip().lower()
            if key not in SERVE_FAIL_ON_KEYS:
                raise UsageError(f"--fail-on {part!r}: serve-leak-check's keys are {', '.join(SERVE_FAIL_ON_KEYS)}")
    return parse_fail_on(specs)


_DURATION_UNITS = {"": 1.0, "s": 1.0, "m": 60.0, "h": 3600.0}


def parse_duration(text: str) -> float:
    """'90', '90s', '10m', '1.5h' -> seconds."""
    value = text.strip().lower()
    unit = value[-1:] if value[-1:] in ("s", "m", "h") else ""
    try:
        seconds = float(value[: len(value) - len(unit)]) * _DURATION_UNITS[unit]
    except ValueError:
        raise UsageError(f"--duration: cannot read {text!r}; use e.g. 90s, 10m or 1h") from None
    if not 0 < seconds < float("inf"):
        raise UsageError(f"--duration must be positive, got {text!r}")
    return seconds
