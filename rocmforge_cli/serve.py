"""`rocmforge serve`: an OpenAI-compatible HTTP server on the engine (rocmforge_serve)."""

from __future__ import annotations

import logging
import math
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from hipcore.engine.loader import LoadOptions
from hipcore.errors import EXIT_FAILURE, UsageError
from profiles.engine_recording import record_engine
from profiles.memory_breakdown import breakdown_table, memory_breakdown
from profiles.memory_timeline import MemoryTimeline
from rocmforge_cli.picture_options import PlotFile, ReportFile, TraceFile, check_picture_paths, write_pictures, write_trace
from rocmforge_cli.common import handle_errors, stderr
from rocmforge_cli.generate import load_with_progress
from rocmforge_cli.threads import Threads, limit_threads, threads_note
from rocmforge_cli.options import (
    BlockSize, CtxSize, Device, KvBlocks, KvDtype, KvMemory, Model, Parallel, PlantBug, PrefixCache, Quiet,
    check_options, quiet_option, resolve_model,
)


@handle_errors
def serve_command(
    model: Model = None,
    host: Annotated[str, typer.Option("--host", help="Address to listen on. The default takes no connections from other machines; 0.0.0.0 takes them from anywhere (use --api-key).")] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", help="TCP port.")] = 8080,
    parallel: Parallel = 8,
    queue: Annotated[int, typer.Option("--queue", help="Requests that may wait beyond --parallel; past that a request gets 429 with Retry-After.")] = 64,
    ctx_size: CtxSize = None,
    kv_dtype: KvDtype = "f16",
    kv_blocks: KvBlocks = None,
    kv_memory: KvMemory = None,
    step_tokens: Annotated[int, typer.Option("--step-tokens", help="Prompt tokens evaluated per engine step, beside the running requests' decoding (longer prompts go in chunks). More takes a burst of prompts in fewer steps, at the cost of activation memory (the memory plan shows it) and of longer pauses for streams under way; llama-server's --batch-size default is the same.")] = 2048,
    block_size: BlockSize = 16,
    device: Device = "auto",
    api_key: Annotated[Optional[str], typer.Option("--api-key", envvar="ROCMFORGE_API_KEY", help="Require `Authorization: Bearer KEY` on every /v1 route.", show_default=False)] = None,
    model_name: Annotated[Optional[str], typer.Option("--model-name", help="The model's name in the API. Default: the file name without .gguf.", show_default=False)] = None,
    grace: Annotated[float, typer.Option("--shutdown-grace", help="Seconds in-flight requests may run on after SIGTERM / Ctrl-C before they are cancelled.")] = 10.0,
    ignore_eos: Annotated[bool, typer.Option("--ignore-eos", help="Generate through end-of-generation tokens up to max_tokens unless a request sends ignore_eos false (fixed output lengths for load generators, as llama-server's --ignore-eos).")] = False,
    warmup: Annotated[bool, typer.Option("--warmup/--no-warmup", help="On a GPU, before taking requests: run a decode step of every batch size class up to --parallel, a few prompts up to --step-tokens long and the padded prompt-step shapes, so that kernels load and step graphs are captured now, not in the first clients' latency (and device memory stays flat from the first request). A few seconds on an 8B model.")] = True,
    queue_timeout: Annotated[float, typer.Option("--queue-timeout", help="Seconds a request may wait in the queue without starting; past that it gets 503 with Retry-After.")] = 300.0,
    allowed_hosts: Annotated[Optional[list[str]], typer.Option("--allowed-hosts", help="Names the server may be reached by (the Host header), comma-separated or repeated; '*.example.com' for subdomains, '*' for any. On a loopback address localhost, 127.0.0.1 and ::1 are always allowed; elsewhere, without this option, any name is.", show_default=False)] = None,
    cors_origins: Annotated[Optional[list[str]], typer.Option("--cors-origins", help="Web origins (scheme://host[:port]) whose pages may call the API, comma-separated or repeated; '*' for any. Without it, requests that carry another Origin than the server's own get 403.", show_default=False)] = None,
    prefix_cache: PrefixCache = True,
    one_process: Annotated[bool, typer.Option("--one-process", help="Run the HTTP layer in the engine's process instead of a process of its own (one interpreter: less to start, slower on small models under many clients). Always so on Windows.")] = False,
    quiet: Annotated[bool, quiet_option("No progress or memory plan on stderr.")] = False,
    threads: Threads = None,
    report_file: ReportFile = None,
    plot_file: PlotFile = None,
    trace_file: TraceFile = None,
    plant_bug: PlantBug = None,
) -> None:
    """Serve the model over HTTP with OpenAI's API: /v1/models, /v1/completions, /v1/chat/completions (streaming too), /health (liveness), /load (readiness and load) and /metrics.

    Request bodies must be JSON (Content-Type: application/json); the Host and Origin headers must name this server (see --allowed-hosts, --cors-origins), so that web pages cannot drive it. On SIGTERM or Ctrl-C it answers new requests with 503, finishes in-flight ones (up to --shutdown-grace seconds), cancels the rest (each still gets its answer), checks that every KV block came back, and exits 0 (1 if one did not).

    Prefix caching is on (--no-prefix-cache turns it off): a prompt that starts as an earlier one did (a chat's history, a shared system prompt) takes that prompt's KV blocks instead of computing them; /metrics counts rocmforge_prefix_cache_queries and rocmforge_prefix_cache_hits (prompt tokens, vLLM's names), and each response's usage.prompt_tokens_details.cached_tokens says how many of its prompt were found.

    Examples:
      rocmforge serve --port 8080
      rocmforge serve -m model.gguf --parallel 32 --api-key secret
      rocmforge serve --host 0.0.0.0 --allowed-hosts gpu1.lan --cors-origins http://localhost:3000 --api-key secret
      rocmforge serve --no-prefix-cache          (compute every prompt from its first token)
      rocmforge serve --report serve.html --trace serve.json   (written at exit)
      curl localhost:8080/v1/chat/completions -H 'Content-Type: application/json' -d '{"messages":[{"role":"user","content":"Hi"}]}'
    """
    check_options(ctx_size, kv_dtype, kv_blocks, kv_memory)
    limit_threads(threads)
    check_ranges(port=port, parallel=parallel, queue=queue, step_tokens=step_tokens, grace=grace,
                 queue_timeout=queue_timeout)
    hosts, origins = split_list(allowed_hosts, "--allowed-hosts"), split_list(cors_origins, "--cors-origins")
    for origin in origins:
        check_origin(origin)
    if api_key is not None and not api_key.strip():
        raise UsageError("--api-key is empty")
    path = resolve_model(model)
    trace = check_picture_paths(report_file, plot_file, trace_file)
    from rocmforge_serve.server import Server, bound_socket  # the ASGI stack loads only for this command

    try:  # before the model loads: a port in use is said at once, not after a minute of loading
        listening = bound_socket(host, port)
    except OSError as exc:
        raise UsageError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    port = listening.getsockname()[1]  # --port 0: the free port it got
    # The HTTP process reads its pipe from the event loop (add_reader), which Windows' default loop lacks.
    two_processes = not one_process and sys.platform != "win32"
    options = LoadOptions(device=device, ctx_size=ctx_size, max_seqs=parallel, max_step_tokens=step_tokens,
                          kv_dtype=kv_dtype, block_size=block_size, kv_blocks=kv_blocks, kv_memory=kv_memory,
                          prefix_caching=prefix_cache)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        with load_with_progress(path, options, quiet) as loaded:
            if (note := threads_note(threads, loaded.device.backend)) and not quiet:
                stderr.print(note, highlight=False, markup=False)
            if plant_bug:  # proves serve-leak-check catches a leak (profiles/leak_bugs.py)
                from profiles import leak_bugs
                leak_bugs.plant(plant_bug, loaded)
            if warmup and loaded.device.arch != "cpu":  # the cpu backend loads nothing lazily and captures no graph
                warm_up_with_progress(loaded.engine, parallel, quiet)
            name = model_name or Path(path).name.removesuffix(".gguf")
            timeline = None
            if report_file or plot_file or trace:
                timeline = MemoryTimeline(f"serve {name}", total_blocks=loaded.cache.num_usable_blocks)
                record_engine(loaded.engine, loaded.cache, timeline, loaded.device.ledger, trace,
                              loaded.device.driver_free_bytes)
            server = Server(loaded, name=name, host=host, port=port, max_queue=queue, api_key=api_key, grace_s=grace,
                            log_level="warning" if quiet else "info", ignore_eos=ignore_eos, http_process=two_processes,
                            queue_timeout_s=queue_timeout, allowed_hosts=hosts, cors_origins=origins,
                            access_log=not quiet)
            where = "in a process of its own" if two_processes else "in the engine's process"
            stderr.print(f"serving {name!r} on http://{host}:{port}/v1 (context {server.context} tokens, "
                         f"{parallel} in parallel, queue {queue}; HTTP {server.http}, event loop {server.loop}, {where}); "
                         f"Ctrl-C stops", highlight=False, markup=False)
            report = server.run(sockets=[listening])  # its line is logged (stderr) by the shutdown check
            memory = memory_breakdown(loaded.device)  # what the model held, before it is closed
    finally:
        listening.close()
    if not quiet:
        stderr.print(breakdown_table(memory), soft_wrap=False)
    if timeline is not None:
        timeline.verdict = "clean" if report.clean else "leak"
        write_pictures(timeline, report_file, plot_file, summary=[report.line()])
    write_trace(trace, trace_file, {"command": "serve", "model": path})
    ledger_left = loaded.device.ledger.total_bytes
    if ledger_left:
        stderr.print(f"after close the ledger still holds {ledger_left} bytes", highlight=False)
    if not report.clean or ledger_left:
        raise typer.Exit(EXIT_FAILURE)


# Each numeric option's range, checked before anything is read or planned (a value past it is a usage error, exit 2).
RANGES = {  # option: (least, most)
    "--port": (0, 65535), "--parallel": (1, 1024), "--queue": (0, 65536), "--step-tokens": (1, 65536),
    "--shutdown-grace": (0.0, 3600.0), "--queue-timeout": (0.001, 86400.0),
}


def check_ranges(**values) -> None:
    for key, value in values.items():
        flag = "--" + {"grace": "shutdown-grace"}.get(key, key.replace("_", "-"))
        least, most = RANGES[flag]
        if not math.isfinite(value) or not least <= value <= most:
            raise UsageError(f"{flag} must be a number from {least:g} to {most:g}, got {value}")


def split_list(values: Optional[list[str]], flag: str) -> tuple[str, ...]:
    """Repeated and comma-separated values as one tuple; an empty item, or one with a space, is a usage error."""
    items = tuple(item.strip() for value in values or () for item in value.split(","))
    bad = next((item for item in items if not item or any(c.isspace() for c in item)
                or (flag == "--allowed-hosts" and "/" in item)), None)
    if bad is not None:
        raise UsageError(f"{flag}: {bad!r} is not a {'host name' if flag == '--allowed-hosts' else 'web origin'}")
    return items


def check_origin(origin: str) -> None:
    from urllib.parse import urlsplit

    parts = urlsplit(origin)
    if origin != "*" and (parts.scheme not in ("http", "https") or not parts.hostname or parts.path not in ("", "/")
                          or parts.query or parts.fragment):
        raise UsageError(f"--cors-origins: {origin!r} is not an origin; use scheme://host[:port], e.g. http://localhost:3000")


def warm_up_with_progress(engine, parallel: int, quiet: bool) -> None:
    """hipcore/engine/warmup.py's warm_up, said on stderr before and after (unless quiet)."""
    from hipcore.engine.warmup import batch_ladder, prompt_ladder, warm_up

    sizes = ", ".join(map(str, batch_ladder(min(parallel, engine.scheduler.max_seqs))))
    lengths = ", ".join(map(str, prompt_ladder(engine.scheduler.max_step_tokens, engine.max_context)))
    if not quiet:
        stderr.print(f"warming up: decode batches of {sizes}; prompts of {lengths} tokens; the prompt-step shapes",
                     highlight=False, markup=False)
    done = warm_up(engine, parallel)
    if not quiet:
        stderr.print(f"warmed up in {done.seconds:.1f} s ({len(done.batch_sizes)} batch sizes, "
                     f"{len(done.prompt_lengths)} prompts, {done.prompt_shapes} prompt-step shapes)",
                     highlight=False, markup=False)
