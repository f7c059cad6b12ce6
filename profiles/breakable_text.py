"""Text for a table cell that wraps only where it is told: a path after a '/', a figure pair after ' / ', a name
between words. Rich wraps a cell at spaces only and folds a longer word anywhere ('llm_' / 'smollm2', '528' /
'tokens'); a narrow column then takes a piece a line instead, and a piece wider than the column still folds.
"""

from __future__ import annotations

import re

from rich.cells import cell_len
from rich.measure import Measurement
from rich.segment import Segment
from rich.text import Text

BETWEEN_WORDS = r"(?<= )(?<!\d )"  # never between a number and its unit ('23.5 GiB', '528 tokens')
PATH = r"(?<=/)|" + BETWEEN_WORDS  # a folder's name may hold spaces too
OPTION_START = r"(?<= )(?=-)"  # a command line: before each option
FIGURE_PAIR = r"(?<= / )|(?= \()"  # '264.0 KiB / 528 tokens', '93.8% (15 slots)'


class BreakableText:
    """`text` wrapped after the places `breaks` matches (a zero-width pattern) and at its own newlines."""

    def __init__(self, text: str, breaks: str = BETWEEN_WORDS, style: str | None = None):
        self.text, self.style = text, style
        self.paragraphs = [[p for p in re.split(breaks, line) if p] for line in text.split("\n")]

    def __str__(self) -> str:
        return self.text

    def lines(self, width: int) -> list[str]:
        lines = []
        for pieces in self.paragraphs:
            line = ""
            for piece in pieces:
                if line and cell_len((line + piece).rstrip()) > width:
                    lines.append(line.rstrip())
                    line = piece.lstrip()
                else:
                    line += piece
            lines.append(line.rstrip())
        return lines

    def widest_piece(self) -> int:
        return max((cell_len(p.strip()) for pieces in self.paragraphs for p in pieces), default=0)

    def __rich_measure__(self, console, options) -> Measurement:
        return Measurement(self.widest_piece(), max(cell_len(line) for line in self.text.split("\n")))

    def __rich_console__(self, console, options):
        yield Text("\n".join(self.lines(options.max_width)), justify=options.justify, overflow="fold", style=self.style or "")


class TableNote(BreakableText):
    """A table's title or caption, as wide as the terminal rather than its table (rich would wrap it at the table's
    width, so a long title over a narrow table took many short lines at any width)."""

    def __init__(self, text: str, style: str = "table.title"):
        super().__init__(text, BETWEEN_WORDS, style)

    def __rich_console__(self, console, options):
        style = console.get_style(self.style or "")
        for line in self.lines(console.width):
            yield Segment(line, style)
            yield Segment.line()


class ShellCommandText(BreakableText):
    """A command line that a shell still takes as printed: wrapped before an option (an option and its value stay
    together), each line but the last ending in ' \\', the next indented."""

    def __init__(self, label: str, command: str, style: str | None = None):
        super().__init__(label + command, OPTION_START, style)

    def lines(self, width: int) -> list[str]:
        lines = super().lines(width - 2)
        return [line + " \\" for line in lines[:-1]] + lines[-1:] if len(lines) > 1 else lines

    def __rich_console__(self, console, options):
        lines = self.lines(options.max_width)
        text = "\n".join([lines[0], *("  " + line for line in lines[1:])])
        yield Text(text, overflow="fold", style=self.style or "")
