"""`rocmforge profile-kv`: KV cache bytes per token, capacity per dtype and block size, --plan, and
--workloads (the MemoryProfile after real engine workloads)."""

from __future__ import annotations

import json
from typing import Annotated, Optional

import typer

from hipcore.gguf.demo_model import INSTALL_HINT, find_demo_model
from hipcore.errors import UsageError
from hipcore.kvcache import KV_DTYPES
from hipcore.model.memory_plan import parse_memory_size
from hipcore.runtime.selection import pick_device
from hipcore.runtime.ledger import format_bytes
from profiles import render
from profiles.kv_capacity import (
    DEFAULT_BLOCK_SIZES, DEFAULT_MAX_SEQS, DEFAULT_MAX_STEP_TOKENS, WEIGHT_TYPES, capacity_table, plan_kv,
)
from profiles.kv_workloads import WorkloadSpec, check_workloads, run_workloads
from profiles.memory_timeline import MemoryTimeline
from profiles.presets import PRESETS, preset_names, resolve_shape
from rocmforge_cli.common import handle_errors, stderr, stdout
from rocmforge_cli.picture_options import PlotFile, ReportFile, TraceFile, check_picture_paths, write_pictures, write_trace
from rocmforge_cli.options import (block_size_option, ctx_size_option, device_option, json_option, model_option,
                                    prefix_cache_option)

PRESET_LIST = ", ".join(preset_names())


def device_free_memory(device_spec: str) -> tuple[int, str]:
    """Free bytes of the device --device names, and a description of where the figure came from."""
    choice = pick_device(device_spec)
    try:
        info = choice.device.memory_info()
        where = f"free on {choice.device.backend}:{choice.device.index} {choice.device.name}"
    finally:
        choice.device.close()
    stderr.print(f"memory budget: {format_bytes(info.free)} {where} (pass --memory to choose another)", markup=False, soft_wrap=False)
    return info.free, where


def resolve_memory(memory: Optional[str], device_spec: str) -> tuple[int, str]:
    if memory is None:
        return device_free_memory(device_spec)
    if memory.strip().endswith("%"):
        free, where = device_free_memory(device_spec)
        return parse_memory_size(memory, free), f"{memory.strip()} of {format_bytes(free)} {where}"
    return parse_memory_size(memory, 0), f"--memory {memory.strip()}"


@handle_errors
def profile_kv_command(
    model: Annotated[Optional[str], model_option("A GGUF model file: its shape is read from the file's metadata (no weights are loaded).")] = None,
    preset: Annotated[Optional[str], typer.Option("--preset", help=f"A named model shape instead of a file, one of: {PRESET_LIST}.", show_default=False)] = None,
    list_presets: Annotated[bool, typer.Option("--list-presets", help="List the model presets with their shapes and exit.")] = False,
    memory: Annotated[Optional[str], typer.Option("--memory", help="Memory to plan for, e.g. 8GiB, 512MiB, 24G, or 70% (of the device's free memory). Default: the free memory of --device.", show_default=False)] = None,
    device: Annotated[str, device_option("Device whose free memory is the default --memory: auto, hip, cuda or cpu (add :N for the N-th GPU).")] = "auto",
    dtypes: Annotated[Optional[list[str]], typer.Option("--dtype", help=f"KV dtype to show; repeat for several. Default: all ({', '.join(KV_DTYPES)}).", show_default=False)] = None,
    block_sizes: Annotated[Optional[list[int]], block_size_option(f"Tokens per KV block; repeat for several. Default: {', '.join(map(str, DEFAULT_BLOCK_SIZES))} for the table, 16 for --plan.")] = None,
    context: Annotated[Optional[int], ctx_size_option("Context length to plan for (tokens). Default: the model's.", "--context")] = None,
    plan: Annotated[bool, typer.Option("--plan", help="Say how many tokens, and sequences of --seq-len tokens, fit in --memory beside the weights and the activations, for each KV dtype.")] = False,
    seq_len: Annotated[Optional[int], typer.Option("--seq-len", help="With --plan: the length of each sequence (prompt + output). Default: the context length.", show_default=False)] = None,
    weights_type: Annotated[Optional[str], typer.Option("--weights-type", help=f"With --plan: count the weights as every parameter in this type ({', '.join(t.lower() for t in WEIGHT_TYPES)}; the _S/_M/_L mixes at llama.cpp's bits per weight). Default: a file's real tensor bytes; q4_k_m (4.84 bits/weight) for a preset.", show_default=False)] = None,
    max_step_tokens: Annotated[int, typer.Option("--max-step-tokens", help="With --plan or --workloads: prompt tokens evaluated per step (longer prompts are evaluated in chunks; sizes the activation buffers).")] = DEFAULT_MAX_STEP_TOKENS,
    max_seqs: Annotated[int, typer.Option("--max-seqs", help="With --plan: sequences stepped together (sizes the activation buffers).")] = DEFAULT_MAX_SEQS,
    workloads: Annotated[bool, typer.Option("--workloads", help="Run engine workloads (single sequences of several lengths, many concurrent sequences, single-token appends vs one batched prompt, parallel samples sharing a prompt, a multi-turn chat and requests sharing a system prompt through the prefix cache) and print the KV cache's memory profile after each. On a model file (default: the demo model) the real model runs; on a preset the engine runs on the KV cache alone (no weights).")] = False,
    lengths: Annotated[Optional[list[int]], typer.Option("--length", help="With --workloads: a single-sequence length in tokens; repeat for several. Default: 1, 17, 100.", show_default=False)] = None,
    concurrent: Annotated[Optional[int], typer.Option("--concurrent", help="With --workloads: how many sequences run together. Default: 8.", show_default=False)] = None,
    samples: Annotated[Optional[int], typer.Option("--samples", help="With --workloads: parallel samples forked from one prompt. Default: 4.", show_default=False)] = None,
    report_file: ReportFile = None,
    plot_file: PlotFile = None,
    trace_file: TraceFile = None,
    prefix_cache: Annotated[bool, prefix_cache_option("With --workloads: prefix caching on (the chat and system-prompt workloads show its hits; the cache is emptied after each workload).")] = True,
    as_json: Annotated[bool, json_option("Print everything as JSON (exact integers) instead of tables.")] = False,
) -> None:
    """Show how much KV cache memory a model needs per token and how many tokens fit.

    For each KV dtype (f16, bf16, f32, q8_0) and block size, for a model file (--model) or a named preset (--preset). With --plan, subtract the weights and activations from a device memory size and say how many tokens and sequences fit. With --workloads, run request patterns through the engine and show the memory profile after each.

    Examples:
      rocmforge profile-kv --preset Llama-2-70B --plan --memory 80GiB
      rocmforge profile-kv --workloads                       (the demo model, on --device)
      rocmforge profile-kv --workloads --preset Llama-2-70B  (the KV cache alone)
      rocmforge profile-kv --workloads --no-prefix-cache     (every prompt computed whole)
      rocmforge profile-kv --workloads --report kv.html --plot kv.png --trace kv.json
    """
    if list_presets:
        shapes = list(PRESETS.values())
        if as_json:
            print(json.dumps({"presets": [s.to_dict() for s in shapes]}, indent=2))
        else:
            stdout.print(render.presets_table(shapes), soft_wrap=False)
        return
    if model is None and preset is None:
        model = default_model()
    if workloads:
        run_workloads_command(model, preset, device, dtypes, block_sizes, max_step_tokens, lengths, concurrent, samples,
                              as_json, prefix_cache, (report_file, plot_file, trace_file), memory=memory, context=context, plan=plan, seq_len=seq_len, weights_type=weights_type)
        return
    for name, value in (("--length", lengths), ("--concurrent", concurrent), ("--samples", samples),
                        ("--report", report_file), ("--plot", plot_file), ("--trace", trace_file),
                        ("--no-prefix-cache", None if prefix_cache else True)):
        if value is not None:
            raise UsageError(f"{name} only applies to --workloads")
    shape = resolve_shape(model, preset)
    dtypes = dtypes or list(KV_DTYPES)
    if not plan:
        for name, value in (("--seq-len", seq_len), ("--weights-type", weights_type)):
            if value is not None:
                raise UsageError(f"{name} only applies to --plan")
    budget, source = resolve_memory(memory, device)
    if plan:
        if block_sizes and len(block_sizes) > 1:
            raise UsageError("--plan takes one --block-size")
        result = plan_kv(shape, budget, context=context, seq_len=seq_len, block_size=(block_sizes or [16])[0],
                         weights_type=weights_type, max_step_tokens=max_step_tokens, max_seqs=max_seqs, dtypes=dtypes)
        if as_json:
            print(json.dumps({"model": shape.to_dict(), "plan": result.to_dict()}, indent=2))
            return
        stdout.print(render.model_table(shape), soft_wrap=False)
        for table in render.plan_tables(result):
            stdout.print(table, soft_wrap=False)
        return
    table = capacity_table(shape, budget, memory_source=source, context=context, dtypes=dtypes,
                           block_sizes=block_sizes or DEFAULT_BLOCK_SIZES)
    if as_json:
        print(json.dumps({"model": shape.to_dict(), "capacity": table.to_dict()}, indent=2))
        return
    stdout.print(render.model_table(shape), soft_wrap=False)
    stdout.print(render.capacity_table(table), soft_wrap=False)
    if shape.layer_windows:
        stdout.print(render.window_groups_table(shape, table.rows, table.context), soft_wrap=False)


def default_model() -> str:
    """The demo model's path when neither --model nor --preset is given, as the other commands do."""
    demo = find_demo_model()
    if demo is None:
        raise UsageError(f"give --model PATH or --preset NAME (presets: {', '.join(PRESETS)}); "
                         f"the demo model is not installed: {INSTALL_HINT}")
    return str(demo)


def run_workloads_command(model, preset, device, dtypes, block_sizes, max_step_tokens, lengths, concurrent, samples,
                          as_json, prefix_cache, pictures=(None, None, None), **not_for_workloads) -> None:
    for name, value in not_for_workloads.items():
        if value not in (None, False):
            flag = "--" + name.replace("_", "-")
            raise UsageError(f"{flag} does not apply to --workloads")
    shape = resolve_shape(model, preset)
    if dtypes and len(dtypes) > 1 or block_sizes and len(block_sizes) > 1:
        raise UsageError("--workloads takes one --dtype and one --block-size")
    defaults = WorkloadSpec()
    spec = WorkloadSpec(lengths=tuple(lengths) if lengths else defaults.lengths,
                        concurrent=defaults.concurrent if concurrent is None else concurrent,
                        samples=defaults.samples if samples is None else samples)
    dtype, block_size = (dtypes or ["f16"])[0], (block_sizes or [16])[0]
    check_workloads(shape, dtype, block_size, spec, max_step_tokens)
    report_file, plot_file, trace_file = pictures
    trace = check_picture_paths(report_file, plot_file, trace_file)
    timeline = MemoryTimeline(f"profile-kv --workloads {shape.name}") if report_file or plot_file or trace else None
    if not as_json:
        where = "the KV cache alone (a preset has no weights)" if model is None else f"{shape.name} on --device {device}"
        stderr.print(f"running KV workloads: {where} ...", markup=False)
    report = run_workloads(shape, model_path=model, device=device, dtype=dtype, block_size=block_size, spec=spec,
                           max_step_tokens=max_step_tokens, prefix_caching=prefix_cache, timeline=timeline, trace=trace,
                           status=lambda text: stderr.print(f"profile-kv: {text}", markup=False, highlight=False))
    if timeline is not None:
        timeline.verdict = "quiescent" if all(r.quiescent_after for r in report.results) else "NOT quiescent"
        write_pictures(timeline, report_file, plot_file, summary=[f"device: {report.device}"])
        write_trace(trace, trace_file, {"command": "profile-kv --workloads", "model": shape.name})
    if as_json:
        print(json.dumps(report.to_dict(), indent=2))
        return
    stdout.print(render.model_table(shape), soft_wrap=False)
    stdout.print(render.workloads_header(report), soft_wrap=False)
    for result in report.results:
        stdout.print(render.workload_table(result), soft_wrap=False)
