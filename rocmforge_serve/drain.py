"""The graceful shutdown, before uvicorn's own: every request in flight gets its answer.

uvicorn's shutdown stops listening at once (new clients got a refused connection), waits up to its timeout for
the handlers and then cancels their tasks: a stream then ended in a bare EOF (no final event, no [DONE]), a
queued request's handler died with a 500 in plain text, and each cancelled task logged a traceback. So on
SIGTERM (or Ctrl-C) the server first drains, still listening:
1. new requests get a JSON 503 (the engine loop stops taking requests; /health stays 200, /load says draining);
2. the requests in flight run on for up to the grace (`--shutdown-grace`);
3. those still running then are cancelled through the engine, with a reason: each stream ends with an error
   event and [DONE], each whole response is a JSON 503, as any cancelled request's;
4. a handler that still has no engine request (a body still arriving) sees its connection closed: a disconnect.
Only then does uvicorn's shutdown run, with nothing left to cancel. One line at INFO says what happened.
"""

from __future__ import annotations

import asyncio
import logging
import time

log = logging.getLogger("rocmforge.serve")
POLL_S = 0.05
ANSWER_WAIT_S = 5.0  # after the cancels: the final events reach their clients (a step, the pipe, a write)
CUT_WAIT_S = 1.0  # after closing the connections of handlers with no request yet
TAIL_S = 2.0  # uvicorn's own graceful timeout, after the drain (its tasks are done by then)


async def _wait_for(tasks: set, server, seconds: float) -> None:
    end = time.monotonic() + seconds
    while tasks and not server.force_exit and time.monotonic() < end:
        await asyncio.sleep(POLL_S)


async def drain(served, server, grace_s: float) -> str:
    """Drain `server` (a uvicorn.Server) serving `served` (a ServedModel); returns the line it logged."""
    loop = served.loop
    loop.stop_intake()
    tasks = server.server_state.tasks
    in_flight = loop.in_flight
    await _wait_for(tasks, server, grace_s)
    cancelled = cut = 0
    if tasks and not server.force_exit:
        cancelled = loop.cancel_all(f"the server is shutting down: the request was cancelled after the "
                                    f"{grace_s:g} s shutdown grace; retry on another server or later")
        await _wait_for(tasks, server, ANSWER_WAIT_S)
    if tasks and not server.force_exit:
        for connection in list(server.server_state.connections):
            cycle = getattr(connection, "cycle", None)
            if cycle is not None and not cycle.response_complete and not connection.transport.is_closing():
                connection.transport.close()
                cut += 1
        await _wait_for(tasks, server, CUT_WAIT_S)
    line = (f"draining: {in_flight} requests in flight at the signal, {in_flight - cancelled} ended within the "
            f"{grace_s:g} s grace, {cancelled} cancelled at its end")
    if cut:
        line += f"; {cut} connections closed before their request was in"
    if server.force_exit:
        line += "; cut short by a second signal"
    log.info(line)
    return line
