"""-t/--threads (llama.cpp's): the cpu backend's matrix products (numpy's BLAS) on N threads. On a GPU it
changes nothing, and a note says so rather than ignoring it."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from hipcore.errors import UsageError

Threads = Annotated[Optional[int], typer.Option(
    "--threads", "-t", show_default=False,
    help="Threads of the cpu backend's matrix products (BLAS). On a GPU it changes nothing (a note says so). "
         "Default: BLAS's own.")]


def limit_threads(threads: Optional[int]) -> None:
    """BLAS on `threads` threads for the rest of the process (None: as it is). An environment variable would
    have to be set before numpy loads; threadpoolctl changes it at run time."""
    if threads is None:
        return
    if threads < 1:
        raise UsageError(f"-t/--threads must be at least 1, got {threads}")
    from threadpoolctl import threadpool_limits

    threadpool_limits(limits=threads, user_api="blas")


def threads_note(threads: Optional[int], backend: str) -> Optional[str]:
    """-t on a GPU changes nothing: said once rather than ignored."""
    if threads is None or backend == "cpu":
        return None
    return f"note: -t {threads}: the model runs on {backend}; --threads sets the cpu backend's BLAS threads only"
