"""llama.cpp's habits, read right: its flags that mean nothing here get one line and exit 2, and a word of
letters after one dash is never split into a short flag and its value.

Click reads `-ngl 99` as `-n gl` and then `99` as a stray argument, and `-no-cnv` as `-n o-cnv`: an error
about another option, or worse, a value taken silently. Every command is a `FlagCheckedCommand`, whose
argument list is checked before Click parses it; `-n 5`, `-n5` and `-c 2048` parse as before.
"""

from __future__ import annotations

import re

from typing import Any

import typer
from rich.markup import escape
from typer.core import TyperCommand, TyperGroup

from hipcore.errors import EXIT_USAGE, printable
from rocmforge_cli.common import fail

# llama.cpp's flags with no meaning here: refused (exit 2) with what to do instead. Never accepted silently:
# a script moved from llama.cpp learns at once that the flag does nothing here.
_NO_MEANING: dict[tuple[str, ...], str] = {
    ("-ngl", "--n-gpu-layers", "--gpu-layers", "-ngld", "--n-gpu-layers-draft"):
        "every layer runs on the GPU here; drop the flag",
    ("-fa", "--flash-attn"): "attention always runs in fused paged-attention kernels here; drop the flag",
    ("--mlock",): "the weights are uploaded to the device once at load and never paged out; drop the flag",
    ("--no-mmap", "--mmap"): "the model file is mapped only while its weights are read; drop the flag",
    ("-ub", "--ubatch-size"): "a prompt is evaluated in chunks of one engine step (serve's --step-tokens); drop the flag",
    ("--numa",): "there is no NUMA placement here; drop the flag",
    ("-sm", "--split-mode", "-ts", "--tensor-split", "-mg", "--main-gpu"):
        "one GPU runs the whole model here; choose it with --device hip:N or --device cuda:N",
    ("-ctk", "--cache-type-k", "-ctv", "--cache-type-v"):
        "K and V share one type here: use --kv-dtype (f16, bf16, f32 or q8_0)",
    ("-nkvo", "--no-kv-offload", "-kvo", "--kv-offload"): "the KV cache always lives on the device; drop the flag",
    ("-cb", "--cont-batching", "-nocb", "--no-cont-batching"): "serve always batches continuously; drop the flag",
    ("-tb", "--threads-batch"): "there is one thread count here: -t/--threads (generate, cpu backend)",
    ("-i", "--interactive", "-if", "--interactive-first", "-ins", "--instruct"):
        "the interactive mode here is the chat: rocmforge generate -cnv",
    ("-r", "--reverse-prompt"): "use --stop TEXT (generation ends where TEXT appears)",
    ("--jinja",): "chat templates always render with Jinja here (sandboxed); drop the flag",
    ("-hf", "--hf-repo", "-hff", "--hf-file", "-mu", "--model-url"):
        "rocmforge downloads nothing: fetch the GGUF file first and pass -m PATH",
    ("-a", "--alias"): "the model's name in the API is serve's --model-name",
    ("-cram", "--cache-ram", "--cache-reuse"):
        "serve reuses cached prompt prefixes from the KV cache's own blocks (on by default, --no-prefix-cache turns "
        "it off), with no cache in host RAM to size; drop the flag",
}
NO_MEANING: dict[str, str] = {flag: note for flags, note in _NO_MEANING.items() for flag in flags}

# Short flags a command gave up so that each short flag means one thing everywhere: what to write instead.
RETIRED: dict[str, dict[str, str]] = {
    "leak-check": {"-n": "leak-check's request count is --requests N (-n is --max-tokens in generate)",
                   "-p": "leak-check's sequences in flight are -np/--parallel N (-p is the prompt in generate)"},
    "serve-leak-check": {"-n": "serve-leak-check's request count is --requests N (-n is --max-tokens in generate)"},
    "profile-kv": {"-p": "profile-kv's model shape is --preset NAME (-p is the prompt in generate)"},
}

_LETTERS_AFTER_ONE_DASH = re.compile(r"-[A-Za-z][A-Za-z-]+")


def check_flags(command: TyperCommand, ctx: Any, args: list[str]) -> None:
    """Refuse, with one line and exit 2, a llama.cpp flag that means nothing here, a short flag this command
    gave up, and a word of letters after one dash that Click would split into a short flag and its value."""
    name = ctx.info_name or command.name or ""
    options = {opt: p for p in command.get_params(ctx) if p.param_type_name == "option"  # (Typer carries its own Click)
               for opt in (*p.opts, *p.secondary_opts)}
    retired = RETIRED.get(name, {})
    i = 0
    while i < len(args):
        arg = args[i]
        if arg == "--":
            return
        flag, equals, _ = arg.partition("=")
        option = options.get(flag)
        if option is not None:
            takes_value = not option.is_flag and not option.count
            i += 2 if takes_value and not equals else 1
            continue
        if flag in NO_MEANING:
            raise refuse(f"{flag}: {NO_MEANING[flag]}")
        if flag in retired:
            raise refuse(f"{flag}: {retired[flag]}")
        if _LETTERS_AFTER_ONE_DASH.fullmatch(flag):
            short = options.get(flag[:2])
            if short is not None and not short.is_flag:
                raise refuse(f"{flag}: no such option for {name} (not {flag[:2]} with the value {flag[2:]!r}: to mean "
                           f"that, write {flag[:2]} {flag[2:]})")
        i += 1


# Click's usage error (an unknown option, a value of the wrong type), found by name: Typer carries its own Click.
_CLICK_USAGE_ERROR = next(c for c in typer.BadParameter.__mro__ if c.__name__ == "UsageError")


def refuse(message: str) -> Exception:
    """The usage error to raise: one line, exit 2; the user's words shown as typed, never as markup or control codes."""
    return fail(escape(printable(message)), EXIT_USAGE)


def usage_line(exc: Exception, ctx: Any) -> Exception:
    """Click's usage error as one line; its no-arguments help (a usage error with no message) as Click shows it."""
    message = exc.format_message()  # type: ignore[attr-defined]
    return refuse(f"{message} (see {ctx.command_path} -h)") if message.strip() else exc


class FlagCheckedCommand(TyperCommand):
    """A Typer command whose arguments pass check_flags before Click parses them, and whose usage errors are
    one line, as every other error of rocmforge is (Click's own are a usage line, a hint and a framed box)."""

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        check_flags(self, ctx, args)
        try:
            return super().parse_args(ctx, args)
        except _CLICK_USAGE_ERROR as exc:
            raise usage_line(exc, ctx) from None


class FlagCheckedGroup(TyperGroup):
    """The same for a group of commands (rocmforge itself, kernels): its own options checked, an unknown
    command or option one line."""

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        own = args[:next((i for i, a in enumerate(args) if not a.startswith("-")), len(args))]
        check_flags(self, ctx, own)
        try:
            return super().parse_args(ctx, args)
        except _CLICK_USAGE_ERROR as exc:
            raise usage_line(exc, ctx) from None

    def resolve_command(self, ctx: Any, args: list[str]):
        try:
            return super().resolve_command(ctx, args)
        except _CLICK_USAGE_ERROR as exc:
            raise usage_line(exc, ctx) from None
