"""What `generate` takes from the user before a model is read: the prompt (argument or stdin, checked to
be UTF-8), escapes, the sampling options checked in the words of the options, and the seed."""

from __future__ import annotations

import json
import secrets
import sys
from pathlib import Path
from typing import Optional

from hipcore.errors import UsageError
from hipcore.engine.sampler import SamplingParams
from rocmforge_cli.escapes import process_escapes

# SamplingParams' field names as the user typed them, for its error messages.
OPTION_OF_FIELD = {
    "temperature": "--temp", "top_k": "--top-k", "top_p": "--top-p", "min_p": "--min-p",
    "repeat_penalty": "--repeat-penalty", "repeat_last_n": "--repeat-last-n",
    "presence_penalty": "--presence-penalty", "frequency_penalty": "--frequency-penalty",
    "seed": "--seed/-s", "max_tokens": "--max-tokens/-n",
}
# A seed the user can type back: llama.cpp's seeds are 32-bit too.
SEED_RANGE = 1 << 32


def read_prompt(prompt: Optional[str], escape: bool) -> str:
    """The prompt argument (escapes processed unless --no-escape), or stdin taken as it is (real newlines
    need no escapes there) and refused unless it is UTF-8."""
    if prompt is not None and prompt != "-":
        return process_escapes(prompt, "the prompt") if escape else prompt
    if sys.stdin.isatty() and prompt is None:
        raise UsageError('give a prompt: rocmforge generate "Once upon a time" (or -p TEXT, -f FILE, or pipe it on stdin)')
    raw = sys.stdin.buffer.read() if hasattr(sys.stdin, "buffer") else sys.stdin.read().encode("utf-8", "surrogateescape")
    return _utf8(raw, "the prompt on stdin")


def prompt_source(positional: Optional[str], flag: Optional[str], file: Optional[Path]) -> tuple[Optional[str], Optional[str]]:
    """(the prompt given as text, or None; the text of -f FILE, or None): at most one of the three ways."""
    given = [name for name, value in (("a prompt argument", positional), ("-p/--prompt", flag), ("-f/--file", file))
             if value is not None]
    if len(given) > 1:
        raise UsageError(f"give the prompt one way, not {' and '.join(given)}")
    if file is None:
        return (flag if flag is not None else positional), None
    try:
        raw = file.read_bytes()
    except OSError as exc:
        raise UsageError(f"-f/--file: cannot read {str(file)!r}: {exc.strerror or exc}") from None
    return None, _utf8(raw, f"-f/--file {str(file)!r}")


def _utf8(raw: bytes, what: str) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UsageError(f"{what} is not UTF-8 text (byte {exc.start} is {raw[exc.start]:#04x}); "
                         "convert it first, e.g. with iconv -f latin1 -t utf-8") from None


def choose_seed(seed: Optional[int]) -> tuple[int, bool]:
    """(the seed to use, whether it was drawn here): a drawn seed is reported so the run can be repeated."""
    if seed is not None:
        return seed, False
    return secrets.randbelow(SEED_RANGE), True


def sampling_params(*, stop: tuple[str, ...], escape: bool, **fields) -> SamplingParams:
    """SamplingParams from the options, validated now (before the model loads), errors naming the options."""
    stops = tuple(process_escapes(s, "--stop") if escape else s for s in stop)
    try:
        return SamplingParams(stop=stops, **fields)  # validates as it is made
    except UsageError as exc:
        raise UsageError(_in_option_words(str(exc))) from None


def _in_option_words(message: str) -> str:
    field, _, rest = message.partition(" ")
    if field in OPTION_OF_FIELD:
        return f"{OPTION_OF_FIELD[field]} {rest}"
    if "stop string" in message:
        return f"--stop: {message}"
    return message


def constraint_grammar(json_schema_file: Optional[Path], grammar_file: Optional[Path],
                       lark_prefix: str = "") -> Optional[str]:
    """The grammar of --json-schema FILE or --grammar FILE (GBNF), compiled and checked before the model loads.
    lark_prefix: what the output begins with before the JSON (gpt-oss's final-channel header)."""
    from hipcore.engine.grammar import compile_grammar

    if json_schema_file is not None and grammar_file is not None:
        raise UsageError("--json-schema and --grammar both constrain the output; give one")
    option, path = ("--json-schema", json_schema_file) if json_schema_file is not None else ("--grammar", grammar_file)
    if path is None:
        return None
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"{option}: cannot read {path}: {getattr(exc, 'strerror', None) or exc}") from None
    try:
        if option == "--grammar":
            return compile_grammar(gbnf=text)
        try:
            schema = json.loads(text)
        except ValueError as exc:
            raise UsageError(f"{path} is not JSON: {exc}") from None
        return compile_grammar(json_schema=schema, lark_prefix=lark_prefix)
    except UsageError as exc:
        raise UsageError(f"{option}: {exc}") from None
