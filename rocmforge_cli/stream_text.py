"""Generated text as `generate` streams it to stdout: the model's words, never its control codes.

A model's vocabulary comes from its file, and a token may decode to ESC, a carriage return or a
bidirectional override: written as they are, they would recolour the terminal, retitle it, or overwrite the
line the user is reading (a file can also be built so that an innocent-looking prompt generates them).
Newlines and tabs pass (they are how text is laid out); every other character that is not printable is
written escaped as Python spells it (\\x1b, \\r, \\u202e). `generate --json` carries the exact text.
"""

from __future__ import annotations

_LAYOUT = frozenset("\n\t")


def stream_text(text: str) -> str:
    """`text` with every non-printable character but newline and tab escaped."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() or c in _LAYOUT else repr(c)[1:-1] for c in text)


# llama-cli's colours with --color (on a terminal only): the prompt yellow, the user's input bold green, the
# generated text in the terminal's own colour.
PROMPT_COLOR = "\x1b[33m"
USER_INPUT_COLOR = "\x1b[1;32m"
RESET_COLOR = "\x1b[0m"
