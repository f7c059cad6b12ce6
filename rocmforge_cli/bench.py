"""`rocmforge bench`: prompt and decode throughput like llama.cpp's llama-bench, and a decode-step profile."""

from __future__ import annotations

import json
import sys
from typing import Annotated, Optional

import typer

from hipcore.errors import UsageError
from hipcore.runtime.selection import pick_device
from hipcore.runtime.ledger import format_bytes
from profiles.bench import (
    CPU_DEFAULTS, GPU_DEFAULTS, BenchConfig, BenchReport, TestResult, load_for_bench, run_bench, start_report,
)
from profiles.llama_cpp_runs import batched_bench_beside, run_llama_bench, run_llama_batched_bench
from profiles.decode_profile import DecodeProfile, profile_decode
from rocmforge_cli.bench_prefix import prefix_reuse_command
from profiles.memory_breakdown import breakdown_table, memory_breakdown
from rocmforge_cli.common import handle_errors, stderr, stdout, terminal_width
from rocmforge_cli.markdown_out import print_markdown
from rocmforge_cli.options import Device, KvDtype, Model, Quiet, resolve_model
from rocmforge_cli.threads import Threads, limit_threads, threads_note


def parse_counts(text: Optional[str], name: str) -> Optional[tuple[int, ...]]:
    """'512' or '128,256' -> (128, 256); '0' -> () (skip the test); None -> None (the default)."""
    if text is None:
        return None
    try:
        values = tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise UsageError(f"{name} takes whole numbers separated by commas, got {text!r}") from None
    if any(v < 0 for v in values):
        raise UsageError(f"{name} values must not be negative, got {text!r}")
    return tuple(v for v in values if v > 0)


def parse_depths(text: Optional[str]) -> tuple[int, ...]:
    """'0,4096' -> (0, 4096); None -> (0,). Unlike the test lists, 0 is a depth (an empty context), not a skip."""
    if text is None:
        return (0,)
    try:
        values = tuple(dict.fromkeys(int(v) for v in text.split(",") if v.strip()))
    except ValueError:
        raise UsageError(f"--n-depth takes whole numbers separated by commas, got {text!r}") from None
    if not values or any(v < 0 for v in values):
        raise UsageError(f"--n-depth values must be 0 or more, got {text!r}")
    return values


def _number(n: float) -> str:
    return f"{n:,.2f}".replace(",", "")


def _params(n: int) -> str:
    return f"{n / 1e9:.2f} B" if n >= 1e9 else f"{n / 1e6:.2f} M"


def table_head(report: BenchReport, width: int | None = None) -> list[str]:
    """The header of llama-bench's table, with llama.cpp's columns when it was run (and the terminal has room for
    them: else they come in a table of their own below, llama_cpp_beside)."""
    head = ["model", "size", "params", "backend", "kv", "test", "t/s"]
    align = ["---", "---:", "---:", "---", "---", "---:", "---:"]
    if report.llama_cpp_figures() and not llama_cpp_apart(report, width):
        head += ["llama.cpp t/s", "ratio"]
        align += ["---:", "---:"]
    return ["| " + " | ".join(head) + " |", "| " + " | ".join(align) + " |"]


# The widest figures a row is sized for when deciding, before any test ran, whether llama.cpp's columns fit.
_WIDE_FIGURES = f"{_number(99999.99)} ± {_number(9999.99)}"


def llama_cpp_apart(report: BenchReport, width: int | None) -> bool:
    """Whether llama.cpp's columns go to a table of their own: on a terminal too narrow for a row that carries them
    with the model's name shortened as far as it goes."""
    if width is None or not report.llama_cpp_figures():
        return False
    cells = [report.model[:MODEL_SHORTEST], format_bytes(report.model_bytes), _params(report.params), report.backend,
             report.kv_dtype, "b32x128", _WIDE_FIGURES, _WIDE_FIGURES, "9.99"]
    return len("| " + " | ".join(cells) + " |") > width


def llama_cpp_beside(report: BenchReport) -> list[str]:
    """llama.cpp's figures and the ratio per test, a table of their own (a narrow terminal: llama_cpp_apart)."""
    theirs = report.llama_cpp_figures()
    lines = ["", "| test | llama.cpp t/s | ratio |", "| ---: | ---: | ---: |"]
    for r in report.results:
        other = theirs.get(r.test)
        lines.append(f"| {r.test} | {_number(other[0])} ± {_number(other[1])} | {r.mean / other[0]:.2f} |" if other
                     else f"| {r.test} | - | - |")
    return lines


MODEL_SHORTEST = 8  # a model name is cut to fit a narrow terminal, never below this


def table_row(report: BenchReport, r: TestResult, theirs: dict[str, tuple[float, float]], width: int | None = None) -> str:
    """One markdown row; on a terminal narrower than the row, the model's name is shortened with '…' (the foot gives
    it whole), so that the terminal never cuts a figure across lines."""
    row = [report.model, format_bytes(report.model_bytes), _params(report.params), report.backend, report.kv_dtype,
           r.test, f"{_number(r.mean)} ± {_number(r.sd)}"]
    if theirs:
        other = theirs.get(r.test)
        row += [f"{_number(other[0])} ± {_number(other[1])}", f"{r.mean / other[0]:.2f}"] if other else ["-", "-"]
    text = "| " + " | ".join(row) + " |"
    if width is not None and len(text) > width and len(report.model) > MODEL_SHORTEST:
        keep = max(MODEL_SHORTEST, len(report.model) - (len(text) - width)) - 1
        text = text.replace(f"| {report.model} |", f"| {report.model[:keep]}… |", 1)
    return text


def table_foot(report: BenchReport, width: int | None = None) -> list[str]:
    apart = llama_cpp_apart(report, width)
    lines = llama_cpp_beside(report) + [""] if apart else [""]
    theirs = {} if apart else report.llama_cpp_figures()
    if width is not None and any(len(table_row(report, r, theirs)) > width for r in report.results):
        lines.append(f"model: {report.model}")  # shortened in the rows
    build = [f"quant: {report.quant}", f"graphs: {'on' if report.graphs else 'off'}", f"commit: {report.commit}",
             f"date: {report.date}"]
    if width is None or len("; ".join(build)) <= width:
        build = ["; ".join(build)]
    else:  # two lines on a narrow terminal, so that it cuts neither the commit nor the date
        build = ["; ".join(build[:2]), "; ".join(build[2:])]
    lines += [f"device: {report.device}", *build]
    return lines + [f"note: {n}" for n in report.notes]


def markdown(report: BenchReport) -> str:
    """llama-bench's table, plus llama.cpp's figures and the ratio where llama.cpp was run."""
    theirs = report.llama_cpp_figures()
    return "\n".join(table_head(report) + [table_row(report, r, theirs) for r in report.results] + table_foot(report))


def profile_markdown(p: DecodeProfile) -> str:
    lines = [f"### One decode step: batch {p.batch}, context {p.context} ({p.launches} launches)", "",
             "| where | us per step |", "| --- | ---: |",
             f"| engine step (wall, real requests) | {p.engine_step_us:,.1f} |",
             f"| runner execute_sampled (wall) | {p.runner_us:,.1f} |"]
    lines += [f"| - runner {k} | {v:,.1f} |" for k, v in p.runner_split_us.items()]
    lines += [f"| graph replay (device) | {p.graph_us:,.1f} |",
              f"| eager launches (wall, no graph) | {p.eager_us:,.1f} |",
              f"| kernels, kind by kind (device, in graphs) | {p.kernels_us:,.1f} |",
              f"| floor: active weights at copy bandwidth | {p.floor_us:,.1f} |", "",
              "| kernel | launches | us per step | us per launch | share | weights read | GB/s |",
              "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    total = p.kernels_us or 1.0
    for k in sorted(p.kernels, key=lambda k: -k.us_per_step):
        read = "-" if k.bytes_read is None else format_bytes(k.bytes_read)
        rate = "-" if k.gb_per_s is None else f"{k.gb_per_s:,.0f}" if k.gb_per_s >= 10 else f"{k.gb_per_s:.2f}"
        lines.append(f"| {k.name} | {k.launches} | {k.us_per_step:,.1f} | {k.us_per_launch:,.2f} | "
                     f"{100 * k.us_per_step / total:.0f}% | {read} | {rate} |")
    lines += ["", f"floor: {p.weights_line()}; device-to-device copy {p.copy_bandwidth / 1e9:,.0f} GB/s "
              "(read + write); weights read: what each kind's launches read in the step, - where they read no weight"]
    lines += [f"- {line}" for line in p.advice()]
    return "\n".join(lines)


@handle_errors
def bench_command(
    model: Model = None,
    prompt: Annotated[Optional[str], typer.Option("-p", "--n-prompt", help="Prompt lengths to test (pp), comma-separated; 0 skips. Default: 512 on a GPU, 32 on the CPU.", show_default=False)] = None,
    gen: Annotated[Optional[str], typer.Option("-n", "--n-gen", help="Tokens to generate one by one (tg), comma-separated; 0 skips. Default: 128 on a GPU, 8 on the CPU.", show_default=False)] = None,
    batch: Annotated[Optional[str], typer.Option("-b", "--batch", help="Parallel sequences for batched decode, comma-separated; 0 skips. Default: 8,32,64,128 on a GPU, 4 on the CPU.", show_default=False)] = None,
    batch_gen: Annotated[Optional[int], typer.Option("--batch-gen", help="Tokens each sequence generates in the batched tests. Default: 128 on a GPU, 4 on the CPU.", show_default=False)] = None,
    depth: Annotated[Optional[str], typer.Option("--n-depth", help="Tokens already in the context before each tg test, comma-separated (llama-bench's -d): decode speed at long contexts, e.g. 0,4096. Default: 0.", show_default=False)] = None,
    repetitions: Annotated[Optional[int], typer.Option("-r", "--repetitions", help="Measured runs of each test (after one warm-up run). Default: 5 on a GPU, 2 on the CPU.", show_default=False)] = None,
    output: Annotated[str, typer.Option("-o", "--output", help="md (a table like llama-bench's) or json.")] = "md",
    device: Device = "auto",
    kv_dtype: KvDtype = "f16",
    llama_bench: Annotated[Optional[str], typer.Option("--llama-bench", help="Path of llama.cpp's llama-bench: run it on the same model and show its figures and the ratio beside ours.", show_default=False)] = None,
    llama_batched_bench: Annotated[Optional[str], typer.Option("--llama-batched-bench", help="Path of llama.cpp's llama-batched-bench for the b rows (-npp 1 -ntg N -npl B -fa on). Default: the one beside --llama-bench.", show_default=False)] = None,
    profile: Annotated[bool, typer.Option("--profile", help="Also report where one decode step's time goes: each kind of kernel with the weights it reads and their GB/s, launches, host work, and how far the step is from the floor of reading the active weights once (a mixture of experts: only the experts its tokens select).")] = False,
    profile_batch: Annotated[int, typer.Option("--profile-batch", help="Sequences in the profiled decode step.")] = 1,
    profile_depth: Annotated[int, typer.Option("--profile-depth", help="Tokens already in each profiled sequence's context (attention's share grows with it), e.g. 4096.")] = 128,
    no_graphs: Annotated[bool, typer.Option("--no-graphs", help="Launch decode steps one kernel at a time instead of replaying captured graphs (to measure what graphs save).")] = False,
    prefix_reuse: Annotated[bool, typer.Option("--prefix-reuse", help="Instead of pp/tg/b: a multi-turn chat load (each turn's prompt the whole conversation so far) with the prefix cache and without; time to first token by turn and throughput, in a table of its own.")] = False,
    conversations: Annotated[Optional[int], typer.Option("--conversations", help="With --prefix-reuse: conversations run together. Default: 32 on a GPU, 4 on the CPU.", show_default=False)] = None,
    turns: Annotated[Optional[int], typer.Option("--turns", help="With --prefix-reuse: turns of each conversation. Default: 8 on a GPU, 3 on the CPU.", show_default=False)] = None,
    turn_tokens: Annotated[Optional[int], typer.Option("--turn-tokens", help="With --prefix-reuse: user tokens each turn adds. Default: 200 on a GPU, 24 on the CPU.", show_default=False)] = None,
    reply_tokens: Annotated[Optional[int], typer.Option("--reply-tokens", help="With --prefix-reuse: tokens of each reply. Default: 32 on a GPU, 4 on the CPU.", show_default=False)] = None,
    threads: Threads = None,
    quiet: Quiet = False,
) -> None:
    """Measure prompt (pp) and decode (tg) speed, and decode with many sequences at once (b), like llama.cpp's llama-bench; print a table (or JSON) with the device, model, quant, KV dtype and commit.

    Examples:
      rocmforge bench                   # the demo model, this device's defaults
      rocmforge bench -p 512 -n 128 -b 64 -r 3 -o json
      rocmforge bench -n 128 --n-depth 0,4096   # decode after a 4k context too
      rocmforge bench --profile         # and where a decode step's time goes
      rocmforge bench -p 0 -n 0 -b 0 --profile --profile-depth 4096   # a decode step after a 4k context
      rocmforge bench --prefix-reuse --conversations 32 --turns 8   # a chat's history, cached and not
    """
    if output not in ("md", "json"):
        raise UsageError(f"-o takes md or json, got {output!r}")
    if profile and no_graphs:
        raise UsageError("--profile measures graph replay; leave out --no-graphs")
    if profile_batch < 1:
        raise UsageError(f"--profile-batch must be at least 1, got {profile_batch}")
    limit_threads(threads)
    path = resolve_model(model)
    chat = {"--conversations": conversations, "--turns": turns, "--turn-tokens": turn_tokens, "--reply-tokens": reply_tokens}
    if not prefix_reuse and any(v is not None for v in chat.values()):
        raise UsageError(f"{next(k for k, v in chat.items() if v is not None)} only applies to --prefix-reuse")
    choice = pick_device(device)
    dev = choice.device
    if (note := threads_note(threads, dev.backend)) and not quiet:
        stderr.print(note, highlight=False, markup=False)
    if prefix_reuse:
        try:
            say = (lambda m: None) if quiet else (lambda m: stderr.print(m, highlight=False, markup=False))
            prefix_reuse_command(path, dev, kv_dtype=kv_dtype, output=output, quiet=quiet, conversations=conversations,
                                 turns=turns, turn_tokens=turn_tokens, reply_tokens=reply_tokens, say=say)
        finally:
            dev.close()
        return
    try:
        defaults = CPU_DEFAULTS if dev.backend == "cpu" else GPU_DEFAULTS
        pick = lambda given, key: defaults[key] if given is None else given  # noqa: E731
        cfg = BenchConfig(
            model=path, device=device, kv_dtype=kv_dtype,
            prompt_tokens=pick(parse_counts(prompt, "-p"), "prompt_tokens"),
            gen_tokens=pick(parse_counts(gen, "-n"), "gen_tokens"),
            batches=pick(parse_counts(batch, "-b"), "batches"),
            batch_gen_tokens=pick(batch_gen, "batch_gen_tokens"), depths=parse_depths(depth), repetitions=pick(repetitions, "repetitions"),
            use_graphs=not no_graphs, profile_batch=profile_batch if profile else 0, profile_depth=profile_depth,
        )
        cfg.validate()
        say = (lambda m: None) if quiet else (lambda m: stderr.print(m, highlight=False, markup=False))
        # llama.cpp first, while our model is not loaded: its figures are then known when each of our rows
        # is printed, and the two never share the GPU's memory
        theirs = _run_llama_cpp(cfg, llama_bench, llama_batched_bench, gpu=dev.backend != "cpu", say=say)
        loaded = load_for_bench(cfg, device=dev, status=say)
        try:
            report = start_report(loaded, cfg)
            report.llama_bench, report.llama_batched_bench, notes = theirs
            report.notes += notes
            prof = None
            try:
                _run_tests(report, loaded, cfg, output, say)
                if profile:
                    say(f"profiling a decode step of batch {profile_batch} after {profile_depth} tokens")
                    prof = profile_decode(loaded, batch=profile_batch, context=min(profile_depth, cfg.context - 1),
                                          copy_bytes=(256 << 20) if dev.backend != "cpu" else (16 << 20),
                                          reps=50 if dev.backend != "cpu" else 3, engine_steps=64 if dev.backend != "cpu" else 4)
            except KeyboardInterrupt:
                report.interrupted = True
                report.notes.append(f"interrupted after {len(report.results)} of {cfg.test_count} tests: "
                                    "the rows above are all that was measured")
            memory = memory_breakdown(dev)  # while the model is loaded: what it holds
        finally:
            loaded.close()
    finally:
        dev.close()
    if output == "json":
        out = report.to_dict()
        if prof is not None:
            out["profile"] = prof.to_dict()
        out["memory"] = memory
        print(json.dumps(out, indent=2))
    else:
        print("\n".join(table_foot(report, terminal_width(stdout))))
        if prof is not None:
            print()
            print_markdown(profile_markdown(prof))
    sys.stdout.flush()
    if output != "json" and not quiet:
        stderr.print(breakdown_table(memory), soft_wrap=False)
    if report.interrupted:
        stderr.print("interrupted")
        raise typer.Exit(130)


def _run_llama_cpp(cfg: BenchConfig, llama_bench: Optional[str], batched: Optional[str], *, gpu: bool,
                   say) -> tuple[list[dict], list[dict], list[str]]:
    """llama-bench's records (pp, tg), llama-batched-bench's (b), and notes on what was not run."""
    notes: list[str] = []
    single: list[dict] = []
    if llama_bench and (cfg.prompt_tokens or cfg.gen_tokens):
        say(f"running {llama_bench}")
        single = run_llama_bench(llama_bench, cfg, gpu=gpu)
    if batched is None and llama_bench:
        batched = batched_bench_beside(llama_bench)
        if batched is None and cfg.batches:
            notes.append("no llama-batched-bench beside llama-bench (give --llama-batched-bench): "
                         "the b rows have no llama.cpp figures")
    multi: list[dict] = []
    if batched and cfg.batches:
        say(f"running {batched}")
        multi = run_llama_batched_bench(batched, cfg, gpu=gpu)
    return single, multi, notes


def _run_tests(report: BenchReport, loaded, cfg: BenchConfig, output: str, say) -> None:
    """Run the tests; in md each row is printed as soon as its test is measured (header first)."""
    if output != "md":
        run_bench(loaded, cfg, status=say, report=report)
        return
    width = terminal_width(stdout)
    theirs = {} if llama_cpp_apart(report, width) else report.llama_cpp_figures()
    print("\n".join(table_head(report, width)), flush=True)
    run_bench(loaded, cfg, status=say, report=report,
              on_result=lambda r: print(table_row(report, r, theirs, width), flush=True))

