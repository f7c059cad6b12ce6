"""Reading kernel sources as text in tests: the block a brace opens."""

from __future__ import annotations


def braced_block(text: str, open_at: int) -> str:
    """text[open_at:] up to and with the brace that closes the one at open_at (to the end if none does)."""
    assert text[open_at] == "{", f"no brace at {open_at}"
    depth, i = 0, open_at
    while i < len(text):
        depth += {"{": 1, "}": -1}.get(text[i], 0)
        i += 1
        if depth == 0:
            break
    return text[open_at:i]
