"""`rocmforge generate`: load a GGUF model and stream generated text, with llama.cpp-style timings."""

from __future__ import annotations

import json
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn

from hipcore.tokenizer.chat_template import chat_prompt, chat_template_from_metadata
from hipcore.tokenizer.harmony import FINAL_HEADER, HarmonySplitter, as_lark, is_harmony
from hipcore.errors import RocmforgeError, UsageError
from hipcore.engine.loader import LoadedModel, LoadOptions, load_model
from hipcore.engine.request import Ending
from profiles.memory_breakdown import breakdown_table, memory_breakdown
from rocmforge_cli.common import handle_errors, stderr, terminal_width
from rocmforge_cli.stream_text import PROMPT_COLOR, RESET_COLOR
from rocmforge_cli.threads import Threads, limit_threads, threads_note
from rocmforge_cli.escapes import process_escapes
from rocmforge_cli.stream_text import stream_text
from rocmforge_cli.generate_input import choose_seed, constraint_grammar, prompt_source, read_prompt, sampling_params
from rocmforge_cli.options import (
    CtxSize, Device, KvBlocks, KvDtype, KvMemory, Model, check_options, json_option, max_tokens_option,
    prefix_cache_option, quiet_option, resolve_model, seed_option,
)

def load_with_progress(path: str, options: LoadOptions, quiet: bool) -> LoadedModel:
    if quiet:
        return load_model(path, options)
    with Progress(TextColumn("loading [bold]{task.description}"), BarColumn(), DownloadColumn(binary_units=True), TimeRemainingColumn(),
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


def stdout_is_terminal() -> bool:
    """Whether --color may colour: only text for a person, never codes in a file or a pipe."""
    return sys.stdout.isatty()


def format_timings(t: dict, width: int | None = None) -> str:
    """llama.cpp's perf lines, so people comparing the two read the same figures; a line wider than `width` goes on
    after 'per token,' under its '(' (a terminal would cut it anywhere, a figure too)."""
    def line(label: str, ms: float, n: int, unit: str) -> str:
        per = ms / n if n else 0.0
        rate = 1000.0 * n / ms if ms > 0 else 0.0
        head = f"{label:>17} = {ms:10.2f} ms / {n:5d} {unit:<6} ({per:8.2f} ms per token,"
        tail = f"{rate:10.2f} tokens per second)"
        if width is None or len(head) + 1 + len(tail) <= width:
            return f"{head} {tail}"
        return f"{head}\n{' ' * head.index('(')}{tail}"

    return "\n".join([
        f"{'load time':>17} = {t['load_ms']:10.2f} ms",
        line("prompt eval time", t["prompt_ms"], t["prompt_tokens"], "tokens"),
        line("eval time", t["eval_ms"], t["eval_runs"], "runs"),
        f"{'total time':>17} = {t['total_ms']:10.2f} ms / {t['prompt_tokens'] + t['generated_tokens']:5d} tokens",
    ])


@handle_errors
def generate(
    prompt: Annotated[Optional[str], typer.Argument(help="The prompt text; '-' or nothing reads it from stdin.", show_default=False)] = None,
    prompt_flag: Annotated[Optional[str], typer.Option("--prompt", "-p", help="The prompt text, as llama.cpp's -p (instead of the argument).", show_default=False)] = None,
    file: Annotated[Optional[Path], typer.Option("--file", "-f", help="Read the prompt from this file (UTF-8, taken literally, as stdin is).", show_default=False)] = None,
    model: Model = None,
    max_tokens: Annotated[int, max_tokens_option("Most tokens to generate (in a conversation: in each answer).")] = 256,
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
    ignore_eos: Annotated[bool, typer.Option("--ignore-eos", help="Generate through end-of-generation tokens up to --max-tokens (--stop still ends it), as llama.cpp's --ignore-eos.")] = False,
    no_escape: Annotated[bool, typer.Option("--no-escape", help="Take the prompt, --system and --stop literally: no \\n \\t \\' \\\" \\\\ \\xHH escapes (processed by default, as llama.cpp does; stdin and -f are always literal).")] = False,
    escape_flag: Annotated[bool, typer.Option("--escape", "-e", hidden=True, help="llama-cli's -e: escapes are processed by default here; --no-escape wins.")] = False,
    chat: Annotated[bool, typer.Option("--chat", help="Wrap the prompt in the model's chat template, as a user message.")] = False,
    system: Annotated[Optional[str], typer.Option("--system", "--system-prompt", "-sys", help="System message (implies --chat).", show_default=False)] = None,
    conversation: Annotated[bool, typer.Option("--conversation", "-cnv", help="Chat in the terminal: each line you type is a user message, answered with the whole conversation in the chat template. /exit or Ctrl-D ends it, Ctrl-C stops an answer (at the prompt, twice: exits), /clear forgets the conversation. A prompt given is the first message.")] = False,
    no_conversation: Annotated[bool, typer.Option("--no-conversation", "-no-cnv", hidden=True, help="llama-cli's -no-cnv: the chat is off unless -cnv is given; -no-cnv wins.")] = False,
    color: Annotated[bool, typer.Option("--color", "-co", help="On a terminal, show the prompt (in a conversation: your input) in colour, the output in the terminal's own, as llama-cli does.")] = False,
    json_schema: Annotated[Optional[Path], typer.Option("--json-schema", help="Constrain the output to JSON that validates against the JSON Schema in this file (constrained decoding); with --chat on gpt-oss, its final message is that JSON.", show_default=False)] = None,
    grammar: Annotated[Optional[Path], typer.Option("--grammar", help="Constrain the output to this GBNF grammar file (llama.cpp's grammar format).", show_default=False)] = None,
    threads: Threads = None,
    device: Device = "auto",
    ctx_size: CtxSize = None,
    kv_dtype: KvDtype = "f16",
    kv_blocks: KvBlocks = None,
    kv_memory: KvMemory = None,
    reasoning: Annotated[bool, typer.Option("--reasoning", help="With --chat on a model that answers in channels (gpt-oss's harmony): also show its reasoning (the analysis channel), on stderr; the answer alone goes to stdout either way.")] = False,
    as_json: Annotated[bool, json_option("Print one JSON object with the text, tokens and timings instead of streaming.")] = False,
    prefix_cache: Annotated[bool, prefix_cache_option("With -cnv: each turn takes the KV blocks of the conversation so far from the turn before, computing only what is new.")] = True,
    quiet: Annotated[bool, quiet_option()] = False,
) -> None:
    """Generate text from a prompt, streaming it to stdout; timings go to stderr. With -cnv, chat in the terminal.

    llama.cpp's spellings work: -m, -p, -f, -n, -c, -s, -t, -sys, -cnv, --temp, --ignore-eos, --color; its flags
    with no meaning here (-ngl, -fa, --mlock, ...) are refused with one line saying so.

    Examples:
      rocmforge generate "The capital of France is"
      rocmforge generate -m model.gguf -p "Write a haiku about GPUs." --chat --temp 0 -n 64
      rocmforge generate -f prompt.txt -n 128 -s 42
      rocmforge generate -cnv -sys "You are a terse assistant."
      echo "Tell me a joke" | rocmforge generate --chat --json
      rocmforge generate -p "A user record:" --json-schema user.schema.json -n 128
      rocmforge generate -p "Is water wet?" --chat --grammar yes_no.gbnf
    """
    escape, conversation = not no_escape, conversation and not no_conversation
    seed, drawn_seed = choose_seed(seed)
    params = sampling_params(
        temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p, repeat_penalty=repeat_penalty,
        repeat_last_n=repeat_last_n, presence_penalty=presence_penalty, frequency_penalty=frequency_penalty,
        seed=seed, max_tokens=max_tokens, stop=tuple(stop or ()), escape=escape, ignore_eos=ignore_eos,
        grammar=constraint_grammar(json_schema, grammar),
    )
    check_options(ctx_size, kv_dtype, kv_blocks, kv_memory)
    limit_threads(threads)
    if conversation and as_json:
        raise UsageError("-cnv/--conversation is a chat in the terminal; it has no --json (use serve for a program)")
    given, file_text = prompt_source(prompt, prompt_flag, file)
    if system is not None and escape:
        system = process_escapes(system, "--system")
    if conversation:  # stdin is the conversation: a prompt is the first message only when given
        text_in = file_text if file_text is not None else (
            None if given is None else process_escapes(given, "the prompt") if escape else given)
    else:
        text_in = file_text if file_text is not None else read_prompt(given, escape)
        if not text_in and not (chat or system is not None):
            raise UsageError("the prompt is empty: give some text (or use --chat, whose template adds its own)")
    colored = color and stdout_is_terminal()
    path = resolve_model(model)
    options = LoadOptions(device=device, ctx_size=ctx_size, kv_dtype=kv_dtype, kv_blocks=kv_blocks, kv_memory=kv_memory,
                          prefix_caching=prefix_cache)
    with load_with_progress(path, options, quiet or as_json) as loaded:
        note = threads_note(threads, loaded.device.backend)
        if note and not quiet:
            stderr.print(note, highlight=False, markup=False)
        if drawn_seed and not (quiet or as_json):  # --json carries it in the object, stderr stays empty
            stderr.print(f"seed: {seed} (none was given; pass --seed {seed} to repeat this run)", highlight=False)
        template = chat_template_from_metadata(loaded.gguf.metadata)
        if json_schema is not None and (chat or system is not None or conversation) and is_harmony(template):
            # gpt-oss: the JSON is its final message, after the header it was trained to write (as serve does)
            params = replace(params, grammar=constraint_grammar(json_schema, None, as_lark(FINAL_HEADER)))
        if conversation:
            from rocmforge_cli.chat import Chat

            Chat(loaded.engine, loaded.tokenizer, template, params, system=system, color=colored, quiet=quiet).run(
                first=text_in)
            return
        tokenizer = loaded.tokenizer
        if chat or system is not None:
            messages = ([{"role": "system", "content": system}] if system is not None else []) + [{"role": "user", "content": text_in}]
            prompt_text, prompt_ids = chat_prompt(tokenizer, template, messages, context_tokens=loaded.engine.max_context)
        else:
            prompt_text, prompt_ids = text_in, tokenizer.encode(text_in)
        if colored:  # the user's words in llama-cli's prompt colour, then the output in the terminal's own
            sys.stdout.write(f"{PROMPT_COLOR}{stream_text(text_in)}{RESET_COLOR}" + ("\n" if chat or system is not None else ""))
        text_in = prompt_text
        pieces: list[str] = []
        # gpt-oss: the analysis channel is reasoning (stderr with --reasoning), the final channel the answer
        splitter = HarmonySplitter() if (chat or system is not None) and is_harmony(template) else None
        thoughts: list[str] = []
        tokens: list[int] = []
        ending = None
        started, first_at = time.perf_counter(), None
        try:
            for event in loaded.engine.generate(prompt_ids, params):
                tokens.extend(event.token_ids)
                if first_at is None and event.token_ids:
                    first_at = time.perf_counter()
                if event.text or (splitter is not None and event.finished):
                    parts = [("content", event.text)] if splitter is None else (
                        splitter.feed(event.text) + (splitter.finish() if event.finished else []))
                    for kind, text in parts:
                        (thoughts if kind == "reasoning" else pieces).append(text)
                        if as_json or (kind == "reasoning" and not reasoning):
                            continue
                        out = sys.stderr if kind == "reasoning" else sys.stdout
                        out.write(stream_text(text))
                        out.flush()
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
        memory = memory_breakdown(loaded.device)
        if ending is not None and ending.error:
            if ending.ending == Ending.REJECTED:
                raise UsageError(ending.error)
            raise RocmforgeError(f"generation {ending.ending.value if ending.ending else 'failed'}: {ending.error}")
        if as_json:
            print(json.dumps({
                "model": path, "device": loaded.device.describe(), "prompt": text_in, "prompt_tokens": len(prompt_ids),
                "text": "".join(pieces), **({"reasoning": "".join(thoughts)} if splitter is not None else {}),
                "tokens": tokens, "ending": ending.ending.value if ending and ending.ending else None,
                "seed": params.seed, "seed_drawn": drawn_seed, "timings": timings, "memory": memory,
            }, ensure_ascii=False))
        elif not quiet:
            stderr.print(format_timings(timings, terminal_width(stderr)), highlight=False)
            stderr.print(breakdown_table(memory), soft_wrap=False)


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
    stderr.print(format_timings(timings, terminal_width(stderr)), highlight=False)


def _timings(loaded: LoadedModel, record, prompt_tokens: int, generated: int) -> dict:
    ttft = (record.time_to_first_token or 0.0) if record else 0.0
    total = record.seconds if record else 0.0
    return {
        "load_ms": loaded.load_seconds * 1e3, "prompt_ms": ttft * 1e3, "prompt_tokens": prompt_tokens,
        "eval_ms": max(0.0, total - ttft) * 1e3, "eval_runs": max(0, generated - 1), "generated_tokens": generated,
        "total_ms": total * 1e3,
    }
