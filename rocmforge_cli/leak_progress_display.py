"""leak-check's and serve-leak-check's progress on stderr: requests done of the total, KV blocks in use, and the
phase.

On a terminal: a rich progress line, redrawn in place. Otherwise (CI logs, a pipe): each status
line as it comes and a plain summary line every PLAIN_EVERY_SECONDS, so a long run is never silent
and a log shows how far it got. `--quiet` uses neither.
"""

from __future__ import annotations

import sys
import time
from contextlib import contextmanager
from typing import Iterator

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from profiles.breakable_text import BreakableText

PLAIN_EVERY_SECONDS = 10.0


class RichProgress:
    """The progress bar: the phase as its description, requests done/total, KV blocks in use."""

    def __init__(self, bar: Progress):
        self.bar = bar
        self.task = None
        self._blocks = "-"

    @staticmethod
    def bar_for(console) -> Progress:
        return Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                        TextColumn("KV blocks {task.fields[blocks]}"), TimeElapsedColumn(), TimeRemainingColumn(),
                        console=console, transient=True)

    def status(self, text: str) -> None:
        if self.task is None:  # a line of its own, wrapped between words (the warm-up's is 180 columns)
            self.bar.console.print(BreakableText(text), soft_wrap=False)
        else:
            self.bar.update(self.task, description=text)

    def start(self, total: int | None, description: str) -> None:
        """A count from 0 of `total` (the warm-up's requests, then the measured ones: the same bar again; None: a
        count with no end, as a soak's)."""
        if self.task is None:
            self.task = self.bar.add_task(description, total=total, blocks=self._blocks)
        else:
            self.bar.reset(self.task, total=total, description=description, blocks=self._blocks)

    def advance(self, n: int) -> None:
        if self.task is not None:
            self.bar.advance(self.task, n)

    def blocks(self, used: int, usable: int) -> None:
        self._blocks = f"{used}/{usable}"
        if self.task is not None:
            self.bar.update(self.task, blocks=self._blocks)


class PlainProgress:
    """Lines on stderr: status lines as they come, and every `every` seconds
    '<command>: <phase>: D/T requests done, KV blocks in use U/N, S s'."""

    def __init__(self, every: float | None = None, command: str = "leak-check"):
        self.command = command
        self.every = PLAIN_EVERY_SECONDS if every is None else every
        self.started = time.monotonic()
        self.last = self.started
        self.phase = "loading"
        self.done = 0
        self.total: int | None = None
        self.counting = False
        self.used: int | None = None
        self.usable: int | None = None

    def _print(self, text: str) -> None:
        print(f"{self.command}: {text}", file=sys.stderr, flush=True)  # sys.stderr looked up now: it may be redirected

    def status(self, text: str) -> None:
        self.phase = text
        self._print(text)

    def start(self, total: int | None, description: str) -> None:
        self.total, self.done, self.counting = total, 0, True

    def advance(self, n: int) -> None:
        self.done += n
        self._maybe_line()

    def blocks(self, used: int, usable: int) -> None:
        self.used, self.usable = used, usable
        self._maybe_line()

    def _maybe_line(self) -> None:
        now = time.monotonic()
        if now - self.last < self.every:
            return
        self.last = now
        total = f"/{self.total:,}" if self.total is not None else ""
        done = f"{self.done:,}{total} requests done" if self.counting else "loading"
        blocks = f", KV blocks in use {self.used:,}/{self.usable:,}" if self.used is not None else ""
        self._print(f"{self.phase}: {done}{blocks}, {now - self.started:.0f} s")


@contextmanager
def progress_on_stderr(console, quiet: bool, command: str) -> Iterator[RichProgress | PlainProgress | None]:
    """The progress a command shows: none with --quiet, the bar on a terminal, plain lines in a log."""
    if quiet:
        yield None
    elif console.is_terminal:
        with RichProgress.bar_for(console) as bar:
            yield RichProgress(bar)
    else:  # a log: plain lines every few seconds instead of a bar that only a terminal can redraw
        yield PlainProgress(command=command)
