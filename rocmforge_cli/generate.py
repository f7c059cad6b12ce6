"""`rocmforge generate`: load a GGUF model and stream generated text, with llama.cpp-style timings."""

from __future__ import annotations

import json
import sys
import time
from typing import Annotated, Optional

import typer
from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn

from hipcore.tokenizer.chat_template import chat_prompt, chat_template_from_metadata
from hipcore.errors import RocmforgeError, UsageError
from hipcore.engine.loader import LoadedModel, LoadOptions, load_model
from hipcore.engine.request import Ending
from rocmforge_cli.common import handle_errors, stderr
from rocmforge_cli.escapes import process_escapes
from rocmforge_cli.stream_text import stream_text
from rocmforge_cli.generate_input import choose_seed, read_prompt, sampling_params
from rocmforge_cli.options import (
    CtxSize, Device, KvBlocks, KvDtype, KvMemory, Model, check_options, json_option, max_tokens_option, quiet_option,
    resolve_model, seed_option,
)

def load_with_progress(path: str, options: LoadOptions, quiet: bool) -> LoadedModel:
    if quiet:
        return load_model(path, options)
    with Progress(TextColumn("loading [bold]{task.description}"), BarColumn(), DownloadColumn(), TimeRemainingColumn(),
                  console=stderr, transient=True) as bar:
        task = bar.add_task("weights", total=None)

        def progress(done: int, total: int, name: str) -> None:
            bar.update(task, completed=done, total=total, description=name)

        loaded = load_model(path, options, status=lambda m: stderr.print(m, highlight=False), progress=progress)
    for reason in loaded.device_reasons:
        stderr.print(f"  {reason}", highlight=False)
    for name in loaded.weights.converted:  # (the tensors' names as the plan spells them; markup off all the same)
        stderr.print(f"  note: {name}, converted at load", highlight=False, markup=False)
    return loaded


def format_timings(t: dict) -> str:
    """llama.cpp's perf lines, so people comparing the two read the same figures."""
    def line(label: str, ms: float, n: int, unit: str) -> str:
        per = ms / n if n else 0.0
        rate = 1000.0 * n / ms if ms > 0 else 0.0
        return f"{label:>17} = {ms:10.2f} ms / {n:5d} {unit:<6} ({per:8.2f} ms per token, {rate:10.2f} tokens per second)"

    return "\n".join([
        f"{'load time':>17} = {t['load_ms']:10.2f} ms",
        line("prompt eval time", t["prompt_ms"], t["prompt_tokens"], "tokens"),
        line("eval time", t["eval_ms"], t["eval_runs"], "runs"),
        f"{'total time':>17} = {t['total_ms']:10.2f} ms / {t['prompt_tokens'] + t['generated_tokens']:5d} tokens",
    ])


@handle_errors
def generate(
    prompt: Annotated[Optional[str], typer.Argument(help="The prompt text; '-' or nothing reads it from stdin.", show_default=False)] = None,
    model: Model = None,
    max_tokens: Annotated[int, max_tokens_option("Most tokens to generate (llama.cpp's -n/--n-predict).")] = 256,
    temperature: Annotated[float, typer.Option("--temp", help="Sampling temperature; 0 = greedy (always the most likely token).")] = 0.8,
    top_k: Annotated[int, typer.Option("--top-k", help="Keep only the k most likely tokens (0 = off).")] = 40,
    top_p: Annotated[float, typer.Option("--top-p", help="Keep the smallest set of tokens whose probability reaches p (1 = off).")] = 0.95,
    min_p: Annotated[float, typer.Option("--min-p", help="Drop tokens less likely than min_p x the top token's probability (0 = off).")] = 0.05,
    repeat_penalty: Annotated[float, typer.Option("--repeat-penalty", help="Penalize tokens seen in the last --repeat-last-n tokens (1 = off).")] = 1.0,
    repeat_last_n: Annotated[int, typer.Option("--repeat-last-n", help="Window of the repeat penalty in tokens (0 = off, -1 = all).")] = 64,
    presence_penalty: Annotated[float, typer.Option("--presence-penalty", help="Subtract this from tokens already present (0 = off).")] = 0.0,
    frequency_penalty: Annotated[float, typer.Option("--frequency-penalty", help="Subtract this x count from repeated tokens (0 = off).")] = 0.0,
    seed: Annotated[Optional[int], seed_option("Random seed, for reproducible sampling. Default: random (and printed).")] = None,
    stop: Annotated[Optional[list[str]], typer.Option("--stop", help="Stop when this text appears (repeatable); it is not printed. Escapes such as \\n work as in the prompt.", show_default=False)] = None,
    no_escape: Annotated[bool, typer.Option("--no-escape", help="Take the prompt, --system and --stop literally: no \\n \\t \\' \\\" \\\\ \\xHH escapes (processed by default, as llama.cpp does; stdin is always literal).")] = False,
    chat: Annotated[bool, typer.Option("--chat", help="Wrap the prompt in the model's chat template, as a user message.")] = False,
    system: Annotated[Optional[str], typer.Option("--system", help="System message (implies --chat).", show_default=False)] = None,
    device: Device = "auto",
    ctx_size: CtxSize = None,
    kv_dtype: KvDtype = "f16",
    kv_blocks: KvBlocks = None,
    kv_memory: KvMemory = None,
    as_json: Annotated[bool, json_option("Print one JSON object with the text, tokens and timings instead of streaming.")] = False,
    quiet: Annotated[bool, quiet_option()] = False,
) -> None:
    """Generate text from a prompt, streaming it to stdout; timings go to stderr.

    Examples:
      rocmforge generate "The capital of France is"
      rocmforge generate --chat --temp 0 "Write a haiku about GPUs."
      echo "Tell me a joke" | rocmforge generate --chat --json
    """
    escape = not no_escape
    seed, drawn_seed = choose_seed(seed)
    params = sampling_params(
        temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p, repeat_penalty=repeat_penalty,
        repeat_last_n=repeat_last_n, presence_penalty=presence_penalty, frequency_penalty=frequency_penalty,
        seed=seed, max_tokens=max_tokens, stop=tuple(stop or ()), escape=escape,
    )
    check_options(ctx_size, kv_dtype, kv_blocks, kv_memory)
    text_in = read_prompt(prompt, escape)
    if system is not None and escape:
        system = process_escapes(system, "--system")
    if not text_in and not (chat or system is not None):
        raise UsageError("the prompt is empty: give some text (or use --chat, whose template adds its own)")
    path = resolve_model(model)
    options = LoadOptions(device=device, ctx_size=ctx_size, kv_dtype=kv_dtype, kv_blocks=kv_blocks, kv_memory=kv_memory)
    with load_with_progress(path, options, quiet or as_json) as loaded:
        tokenizer = loaded.tokenizer
        if chat or system is not None:
            messages = ([{"role": "system", "content": system}] if system is not None else []) + [{"role": "user", "content": text_in}]
            template = chat_template_from_metadata(loaded.gguf.metadata)
            text_in, prompt_ids = chat_prompt(tokenizer, template, messages, context_tokens=loaded.engine.max_context)
        else:
            prompt_ids = tokenizer.encode(text_in)
        if drawn_seed and not (quiet or as_json):  # --json carries it in the object, stderr stays empty
            stderr.print(f"seed: {seed} (none was given; pass --seed {seed} to repeat this run)", highlight=False)
        pieces: list[str] = []
        tokens: list[int] = []
        ending = None
        started, first_at = time.perf_counter(), None
        try:
            for event in loaded.engine.generate(prompt_ids, params):
                tokens.extend(event.token_ids)
                if first_at is None and event.token_ids:
                    first_at = time.perf_counter()
                if event.text:
                    pieces.append(event.text)
                    if not as_json:
                        sys.stdout.write(stream_text(event.text))
                        sys.stdout.flush()
                if event.finished:
                    ending = event
        except KeyboardInterrupt:
            # The stream was closed on the way out, so the request is already cancelled and its blocks freed.
            report_interrupt(loaded, started, first_at, len(prompt_ids), len(tokens), streamed=bool(pieces) and not as_json,
                             quiet=quiet)
            raise typer.Exit(130) from None
        if not as_json:
            sys.stdout.write("\n")
        record = loaded.engine.finished_record(ending.request_id) if ending else None
        timings = _timings(loaded, record, len(prompt_ids), len(tokens))
        if ending is not None and ending.error:
            if ending.ending == Ending.REJECTED:
                raise UsageError(ending.error)
            raise RocmforgeError(f"generation {ending.ending.value if ending.ending else 'failed'}: {ending.error}")
        if as_json:
            print(json.dumps({
                "model": path, "device": loaded.device.describe(), "prompt": text_in, "prompt_tokens": len(prompt_ids),
                "text": "".join(pieces), "tokens": tokens, "ending": ending.ending.value if ending and ending.ending else None,
                "seed": params.seed, "seed_drawn": drawn_seed, "timings": timings,
            }, ensure_ascii=False))
        elif not quiet:
            stderr.print(format_timings(timings), highlight=False)


def report_interrupt(loaded: LoadedModel, started: float, first_at: Optional[float], prompt_tokens: int, generated: int,
                     *, streamed: bool, quiet: bool) -> None:
    """Ctrl-C during generation: end the streamed text's line, then the timings so far on lines of their own."""
    if streamed:
        try:
            sys.stdout.write("\n")
            sys.stdout.flush()
        except (BrokenPipeError, ValueError):
            pass
    stderr.print(f"interrupted after {generated} generated tokens", highlight=False)
    if quiet:
        return
    now = time.perf_counter()
    prompt_s = (first_at if first_at is not None else now) - started
    timings = {
        "load_ms": loaded.load_seconds * 1e3, "prompt_ms": prompt_s * 1e3, "prompt_tokens": prompt_tokens,
        "eval_ms": (now - first_at) * 1e3 if first_at is not None else 0.0, "eval_runs": max(0, generated - 1),
        "generated_tokens": generated, "total_ms": (now - started) * 1e3,
    }
    stderr.print(format_timings(timings), highlight=False)


def _timings(loaded: LoadedModel, record, prompt_tokens: int, generated: int) -> dict:
    ttft = (record.time_to_first_token or 0.0) if record else 0.0
    total = record.seconds if record else 0.0
    return {
        "load_ms": loaded.load_seconds * 1e3, "prompt_ms": ttft * 1e3, "prompt_tokens": prompt_tokens,
        "eval_ms": max(0.0, total - ttft) * 1e3, "eval_runs": max(0, generated - 1), "generated_tokens": generated,
        "total_ms": total * 1e3,
    }
