"""One log line per request when its response has ended: time, method, path, status, the prompt and completion
tokens of a generation, and the duration (a stream's whole length). Off with `serve -q`.

A pure ASGI middleware: it sees the status as the response starts and the end as the last body part goes (or the
client leaves); a generation handler puts its Generation in the request's state, whose token counts are read then.
"""

from __future__ import annotations

import json
import logging
import time

log = logging.getLogger("rocmforge.serve.access")


def access_line(method: str, path: str, status: int, prompt_tokens: int | None, completion_tokens: int | None,
                seconds: float) -> str:
    when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    path = json.dumps(path[:200], ensure_ascii=True)[1:-1]  # the client's text, escaped: one line, no control bytes
    tokens = "" if prompt_tokens is None else f" prompt_tokens={prompt_tokens} completion_tokens={completion_tokens}"
    return f"{when} {method} {path} {status}{tokens} {seconds * 1000:.1f}ms"


class AccessLog:
    def __init__(self, app, enabled: bool = True):
        self.app = app
        self.enabled = enabled

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or not self.enabled:
            return await self.app(scope, receive, send)
        started = time.perf_counter()
        state = scope.setdefault("state", {})
        status = [499]  # no response started: the client left first (nginx's code)
        logged = [False]

        def write() -> None:
            if logged[0]:
                return
            logged[0] = True
            gen = state.get("generation")
            log.info(access_line(scope.get("method", "?"), scope.get("path", "?"), status[0],
                                 None if gen is None else gen.prompt_tokens,
                                 None if gen is None else gen.completion_tokens, time.perf_counter() - started))

        async def logged_send(message):
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)
            if message["type"] == "http.response.body" and not message.get("more_body", False):
                write()

        try:
            await self.app(scope, receive, logged_send)
        finally:
            write()
