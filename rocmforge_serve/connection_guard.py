"""Limits on what one connection may hold of the server: the request head's size, the time to send it and its
body, and an idle connection's life (uvicorn's httptools protocol, with a guard around its parser).

uvicorn bounds none of these with httptools: heads of 64 MiB and 200,000 headers were taken (the HTTP process
grew from 113 to 389 MiB), connections sending a byte a second were kept for good, and a connection that never
sent anything was never closed (uvicorn's keep-alive timer starts only after a response). h11 has a head-size
limit but no read timeouts either, and costs more host time per streamed token (uvicorn_stack.py); hypercorn
has both limits but is a second server to measure and keep. So: uvicorn's own HttpToolsProtocol, with
- a head over `head_bytes` or with more than `max_headers` headers: 431 (JSON), connection closed;
- a head not complete `head_timeout_s` after its first byte: 408 (JSON), connection closed;
- a body not complete `body_timeout_s` after its head: connection closed (the handler sees a disconnect);
- a connection idle `idle_timeout_s` from its start or its last response: closed (uvicorn's keep-alive timer,
  armed at the start too);
- more than `max_connections` open: 503 (JSON) to the new one, closed.
The guard works on received bytes and parser callbacks only; nothing runs per streamed token.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass

from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol

from rocmforge_serve.api_errors import ApiError

log = logging.getLogger("rocmforge.serve")


@dataclass(frozen=True)
class ConnectionLimits:
    head_bytes: int = 32 << 10  # the request line and headers (nginx's default large buffers hold 4 x 8 KiB)
    max_headers: int = 100  # h11's and most servers' order of magnitude
    head_timeout_s: float = 10.0
    body_timeout_s: float = 60.0  # a 4 MiB body at 70 KB/s
    idle_timeout_s: float = 5.0  # uvicorn's keep-alive default
    max_connections: int = 512  # well below the default 1,024 open files


def _refusal_bytes(status: int, message: str, code: str) -> bytes:
    body = json.dumps(ApiError(status, message, code=code).body()).encode("utf-8")
    return b"".join([STATUS_LINE[status], b"content-type: application/json\r\n",
                     b"content-length: %d\r\n" % len(body), b"connection: close\r\n\r\n", body])


class GuardedHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol under ConnectionLimits (`limits`, set on a subclass by guarded_protocol)."""

    limits: ConnectionLimits = ConnectionLimits()

    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        self._head_bytes = 0
        self._header_count = 0
        self._in_head = False
        self._refused = False
        self._timer = None
        if len(self.connections) > self.limits.max_connections:
            self._refuse(503, f"the server has {self.limits.max_connections} connections open; retry shortly",
                         "too_many_connections")
            return
        # uvicorn arms its keep-alive timer only after a response: a connection that never sends would stay
        self.timeout_keep_alive_task = self.loop.call_later(self.timeout_keep_alive, self.timeout_keep_alive_handler)

    def connection_lost(self, exc) -> None:
        self._cancel_timer()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._refused:
            return
        super().data_received(data)
        if self._in_head and not self._refused:
            self._head_bytes += len(data)  # a head still incomplete: httptools buffers it whole
            self._check_head()

    # ---- parser callbacks ---------------------------------------------------------------------------

    def on_message_begin(self) -> None:
        if self._refused:
            return
        super().on_message_begin()
        self._head_bytes = 0
        self._header_count = 0
        self._in_head = True
        self._arm(self.limits.head_timeout_s, self._head_timed_out)

    def on_url(self, url: bytes) -> None:
        self._head_bytes += len(url)
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._head_bytes += len(name) + len(value) + 4
        self._header_count += 1
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        self._in_head = False
        if self._check_head():
            return
        self._arm(self.limits.body_timeout_s, self._body_timed_out)
        super().on_headers_complete()

    def on_body(self, body: bytes) -> None:
        if not self._refused:
            super().on_body(body)

    def on_message_complete(self) -> None:
        self._cancel_timer()
        if not self._refused:
            super().on_message_complete()

    # ---- the guard ------------------------------------------------------------------------------------

    def _check_head(self) -> bool:
        limits = self.limits
        if self._head_bytes > limits.head_bytes or self._header_count > limits.max_headers:
            what = (f"{self._header_count} headers (at most {limits.max_headers})" if self._header_count > limits.max_headers
                    else f"over {limits.head_bytes} bytes of request line and headers")
            self._refuse(431, f"the request head is too large: {what}", "headers_too_large")
            return True
        return False

    def _head_timed_out(self) -> None:
        self._refuse(408, f"the request head did not arrive within {self.limits.head_timeout_s:g} s", "request_timeout")

    def _body_timed_out(self) -> None:
        # the handler is reading the body: closing shows it a disconnect, and nothing is written under it
        log.debug("closing a connection whose request body did not arrive within %g s", self.limits.body_timeout_s)
        self._timer = None
        if not self.transport.is_closing():
            self.transport.close()

    def _refuse(self, status: int, message: str, code: str) -> None:
        log.debug("refused a connection's request: %d %s", status, message)
        self._refused = True
        self._in_head = False
        self._cancel_timer()
        if not self.transport.is_closing():
            if self.cycle is None or self.cycle.response_complete:  # never inside a response under way (pipelining)
                self.transport.write(_refusal_bytes(status, message, code))
            self.transport.close()

    def _arm(self, seconds: float, handler) -> None:
        self._cancel_timer()
        self._timer = self.loop.call_later(seconds, handler)

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None


def guarded_protocol(limits: ConnectionLimits) -> type[GuardedHttpToolsProtocol]:
    """The protocol class uvicorn instantiates per connection, with these limits."""
    return type("GuardedHttpTools", (GuardedHttpToolsProtocol,), {"limits": limits})
