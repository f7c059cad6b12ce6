"""A command's output rendered at 80 and at 200 columns, and what must hold between the two (not a test module).

    assert_readable_at(narrow, wide)   # texts of the same output at 80 and 200 columns

- no line is longer than its width;
- every figure is whole: the numbers (with their unit, where they have one) are the same at both widths, compared
  by their form (digits as 9) so that two runs whose timings differ still compare, while a number cut across two
  lines ('1,097,' and '048', or '93.8' and 'MiB') changes the form and fails;
- names wrap between words: every word at 80 columns is a word at 200 (a word folded in two, 'activation' and
  's', is not), unless it was shortened on purpose (it ends in '…').
"""

from __future__ import annotations

import re
from collections import Counter

NARROW, WIDE = 80, 200
UNITS = r"B|KiB|MiB|GiB|TiB|ms|us|s|tokens|token|blocks|allocs|allocations|req|requests|handles|slots|runs|MB|GB|GB/s"
# A number not glued to a word ('Q4_1', 'f16', 'gfx942' and '135M' are names), with its unit after one space.
NUMBER = re.compile(rf"(?<![\w.…])\d+(?:,\d{{3}})*(?:\.\d+)?(?![\w…])(?:%| (?:{UNITS})(?![\w…]))?")
WORD = re.compile(r"[A-Za-z](?:[A-Za-z_']*[A-Za-z])?…?")


def number_forms(text: str) -> Counter:
    """'1,097,048' and '6,413.9' -> '9' and '9.9'; '93.8 MiB' -> '9.9 U' (a unit may differ between two runs)."""
    forms = Counter()
    for match in NUMBER.finditer(text):
        number, _, unit = match.group().partition(" ")
        form = re.sub(r"\d+(?:,\d{3})*", "9", number)
        forms[form + (" U" if unit else "")] += 1
    return forms


def words(text: str) -> set[str]:
    return {w for w in WORD.findall(text) if not w.endswith("…")}


def assert_readable_at(narrow: str, wide: str, narrow_width: int = NARROW, wide_width: int = WIDE) -> None:
    for text, width in ((narrow, narrow_width), (wide, wide_width)):
        longest = max(text.splitlines() or [""], key=len)
        assert len(longest) <= width, f"a line of {len(longest)} characters at {width} columns: {longest!r}"
    lost = number_forms(wide) - number_forms(narrow)
    gained = number_forms(narrow) - number_forms(wide)
    assert not lost and not gained, (f"numbers cut at {narrow_width} columns: {dict(lost)} at {wide_width} became "
                                     f"{dict(gained)}\n{narrow}")
    broken = words(narrow) - words(wide)
    assert not broken, f"words cut at {narrow_width} columns: {sorted(broken)}\n{narrow}"
