"""Markdown on stdout that a narrow terminal can read: as written for a file or a pipe (to paste into a page), and on a
terminal narrower than its lines, each table too wide for it drawn by rich (headers wrapped between words, figures
whole) and each line of text too long wrapped between words. Used by bench's --profile and --prefix-reuse tables."""

from __future__ import annotations

from rich import box
from rich.table import Table

from profiles.breakable_text import BETWEEN_WORDS, FIGURE_PAIR, BreakableText
from profiles.leak_render import FiguresFirst
from rocmforge_cli.common import stdout, terminal_width


def print_markdown(text: str) -> None:
    width = terminal_width(stdout)
    lines = text.split("\n")
    if width is None or all(len(line) <= width for line in lines):
        print(text, flush=True)
        return
    table: list[str] = []
    for line in [*lines, None]:
        if line is not None and line.startswith("|"):
            table.append(line)
            continue
        if table and all(len(row) <= width for row in table):
            stdout.print("\n".join(table), markup=False, highlight=False)
        elif table:
            stdout.print(FiguresFirst(_rich_table(table)), soft_wrap=False)
        table = []
        if line is not None:
            stdout.print(BreakableText(line), soft_wrap=False)
    stdout.file.flush()


def _cells(line: str) -> list[str]:
    return [cell.strip() for cell in line.strip().strip("|").split("|")]


def _rich_table(lines: list[str]) -> Table:
    """A markdown table (header, alignment row, rows) as a rich table; right-aligned columns are figures."""
    header, aligns, *rows = lines
    right = [a.endswith(":") for a in _cells(aligns)]
    t = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, padding=(0, 0, 0, 1))
    for name, is_figure in zip(_cells(header), right):
        t.add_column(name, justify="right" if is_figure else "left", min_width=max(map(len, name.split())))
    for row in rows:
        cells = _cells(row)
        t.add_row(*(BreakableText(c, FIGURE_PAIR if is_figure else BETWEEN_WORDS) for c, is_figure in zip(cells, right)))
    for column, is_figure in zip(t.columns, right):
        if is_figure:  # a figure column is as wide as its widest figure: the text columns wrap instead
            column.min_width = max([column.min_width or 0, *(len(str(c)) for c in column._cells)])
    return t
