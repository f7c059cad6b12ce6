"""Escapes in command-line text follow llama.cpp's string_process_escapes (common/common.cpp)."""

from __future__ import annotations

import pytest

from hipcore.errors import UsageError
from rocmforge_cli.escapes import process_escapes


@pytest.mark.parametrize("typed, meant", [
    (r"\n\n", "\n\n"),
    (r"a\tb\rc", "a\tb\rc"),
    (r"\'\"", "'\""),
    (r"\\n", "\\n"),            # an escaped backslash, then a plain n
    (r"\x41\x62", "Ab"),
    (r"\xc3\xa9", "é"),          # two bytes making one UTF-8 character
    (r"\q", r"\q"),              # unknown escapes stay as written
    (r"\x4", r"\x4"),            # \x needs two hex digits after it
    (r"\x4g", r"\x4g"),
    ("end\\", "end\\"),          # a lone backslash at the end stays
    ("no escapes", "no escapes"),
    ("é\\n", "é\n"),
])
def test_escapes_as_llamacpp_processes_them(typed, meant):
    assert process_escapes(typed) == meant


def test_bytes_that_are_not_utf8_are_a_usage_error():
    with pytest.raises(UsageError, match=r"--stop: .*not UTF-8.*--no-escape"):
        process_escapes(r"\xff", "--stop")
