r"""Backslash escapes in command-line text (prompt, --system, --stop), as llama.cpp processes them by default.

`--stop "\n\n"` in a shell passes a backslash and an n, not a newline; llama.cpp turns \n \r \t \' \" \\
and \xHH (two hex digits: one byte) into the characters, keeps any other backslash pair as it is, and keeps
a lone backslash at the end. This follows that behaviour (it is not llama.cpp's code). --no-escape turns
it off, as llama.cpp's flag of that name does.
"""

from __future__ import annotations

from hipcore.errors import UsageError

_SIMPLE = {"n": b"\n", "r": b"\r", "t": b"\t", "'": b"'", '"': b'"', "\\": b"\\"}
_HEX_DIGITS = frozenset("0123456789abcdefABCDEF")


def process_escapes(text: str, option: str = "the prompt") -> str:
    """`text` with its escapes replaced. \\xHH makes one byte, so the result is checked to be UTF-8."""
    if "\\" not in text:
        return text
    out = bytearray()
    i, n = 0, len(text)
    while i < n:
        ch = text[i]
        if ch != "\\" or i + 1 == n:
            out += ch.encode("utf-8", "surrogatepass")
            i += 1
            continue
        nxt = text[i + 1]
        if nxt in _SIMPLE:
            out += _SIMPLE[nxt]
            i += 2
        elif nxt == "x" and i + 3 < n and text[i + 2] in _HEX_DIGITS and text[i + 3] in _HEX_DIGITS:
            out.append(int(text[i + 2:i + 4], 16))
            i += 4
        else:  # an unknown escape stays as written, backslash included
            out += ("\\" + nxt).encode("utf-8", "surrogatepass")
            i += 2
    try:
        return out.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UsageError(f"{option}: its \\x escapes make bytes that are not UTF-8 (at byte {exc.start}); "
                         "write a whole UTF-8 sequence (e.g. \\xc3\\xa9 for é) or pass --no-escape") from None
