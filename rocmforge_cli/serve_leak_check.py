"""`rocmforge serve-leak-check`: drive a real `rocmforge serve` with concurrent HTTP clients and prove nothing leaks."""

from __future__ import annotations

import json
from typing import Annotated, Optional

import typer

from hipcore.errors import UsageError
from profiles.serve_leak_check import ServeLeakSettings, run_serve_leak_check
from rocmforge_cli.common import handle_errors, stderr, stdout
from rocmforge_cli.generate import DEVICE_HELP, resolve_model


@handle_errors
def serve_leak_check_command(
    model: Annotated[Optional[str], typer.Option("--model", "-m", help="Path of a GGUF model file. Default: the demo model if installed.", show_default=False)] = None,
    device: Annotated[str, typer.Option("--device", "-d", help=DEVICE_HELP)] = "auto",
    requests: Annotated[int, typer.Option("--requests", "-n", help="Requests to send after the warm-up.")] = 200,
    clients: Annotated[int, typer.Option("--clients", help="Concurrent HTTP clients; the server decodes half as many at once, so the rest queue.")] = 8,
    max_tokens: Annotated[int, typer.Option("--max-tokens", help="Most new tokens per request (each draws its own).")] = 8,
    seed: Annotated[int, typer.Option("--seed", "-s", help="Seed of the request mix.")] = 0,
    serve_arg: Annotated[Optional[list[str]], typer.Option("--serve-arg", help="An extra argument for `rocmforge serve` (repeatable), e.g. --serve-arg=--kv-blocks=64.", show_default=False)] = None,
    time_limit: Annotated[float, typer.Option("--time-limit", help="Seconds the clients may run at most.")] = 600.0,
    as_json: Annotated[bool, typer.Option("--json", help="Print the report as one JSON object.")] = False,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No progress on stderr.")] = False,
    plant_bug: Annotated[Optional[str], typer.Option("--plant-bug", hidden=True, help="Tests only (needs ROCMFORGE_TESTING=1).")] = None,
) -> None:
    """Start `rocmforge serve` on a free loopback port, send it a seeded mix of requests from concurrent clients (some leave during the prompt or mid-stream), then check that every KV block and ledger byte came back and that it exits 0 on SIGTERM; exit 1 on a leak.

    Examples:
      rocmforge serve-leak-check --device cpu --requests 60 --max-tokens 4
      rocmforge serve-leak-check --requests 5000 --clients 64 --json > serve-leak.json
    """
    if requests < 1 or clients < 1 or max_tokens < 1 or time_limit <= 0:
        raise UsageError("--requests, --clients and --max-tokens must be at least 1, --time-limit positive")
    settings = ServeLeakSettings(model=resolve_model(model), device=device, requests=requests, clients=clients,
                                 max_tokens=max_tokens, seed=seed, extra_args=tuple(serve_arg or ()), planted_bug=plant_bug,
                                 time_limit_s=time_limit)
    say = (lambda _m: None) if quiet else (lambda m: stderr.print(m, highlight=False, markup=False))
    report = run_serve_leak_check(settings, say)
    if as_json:
        print(json.dumps(report.to_dict(), indent=1))
    else:
        stdout.print(f"{report.requests} requests in {report.seconds:.1f} s; plans {dict(report.plans)}; "
                     f"answers {dict(report.statuses)}", markup=False)
        stdout.print(f"baseline {report.baseline}", markup=False)
        stdout.print(f"final    {report.final}", markup=False)
        stdout.print(f"server exit code after SIGTERM: {report.server_exit}", markup=False)
        for finding in report.findings:
            stdout.print(f"LEAK: {finding}", markup=False)
        if not report.findings:
            stdout.print("clean: every KV block and every ledger byte came back", markup=False)
    if report.exit_code:
        raise typer.Exit(report.exit_code)
