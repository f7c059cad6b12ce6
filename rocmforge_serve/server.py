"""Running the app under uvicorn, and the shutdown check: every block and every KV byte back.

Two shapes. One process (`http_process=False`, the tests' and embedders' default): uvicorn's event loop
and the engine's thread share the interpreter. Two processes (`http_process=True`, what `rocmforge serve`
runs): the engine and its thread stay here, uvicorn and the app run in a spawned process
(http_process.py), and engine_bridge.py joins the two, so the event loop never holds the engine's GIL.

SIGTERM or Ctrl-C: the server drains first (drain.py): new requests get a JSON 503, in-flight ones run up to
`grace_s`, the rest are cancelled through the engine and still get their answer (a final event and [DONE], or a
JSON 503); with two processes, this process relays the signal to the HTTP process as SIGTERM, which drains, and
every request the HTTP process leaves is cancelled when its pipe closes. The engine loop then stops, ending
anything still queued through the engine's release path, and the check reads the KV cache's quiescence
invariants and the ledger's kv bytes against the figure at start; with two processes, an HTTP process that did
not exit 0 fails the check too.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import logging
import multiprocessing
import signal
import socket
import threading
import time
from dataclasses import dataclass

from rocmforge_serve.app import attach, create_app, served_model
from rocmforge_serve.connection_guard import ConnectionLimits
from rocmforge_serve.engine_bridge import EngineBridge
from rocmforge_serve.engine_loop import EngineLoop
from rocmforge_serve.protocol import MAX_BODY_BYTES
from rocmforge_serve.request_guard import HostPolicy
from rocmforge_serve.uvicorn_stack import SignalledUvicorn, http_stack, uvicorn_config

log = logging.getLogger("rocmforge.serve")


@dataclass
class ShutdownReport:
    ended_at_shutdown: int  # requests the engine still held when the loop stopped
    kv_bytes_at_start: int
    kv_bytes_at_end: int
    invariant_error: str | None
    http_process_error: str | None = None  # two processes: how the HTTP process ended, if not with exit 0

    @property
    def clean(self) -> bool:
        return (self.invariant_error is None and self.kv_bytes_at_end == self.kv_bytes_at_start
                and self.http_process_error is None)

    def line(self) -> str:
        if self.clean:
            return (f"shutdown: every KV block returned (KV cache quiescent), ledger kv bytes unchanged "
                    f"({self.kv_bytes_at_end}); {self.ended_at_shutdown} requests ended at shutdown")
        leaks = [p for p in (self.invariant_error,) if p]
        if self.kv_bytes_at_end != self.kv_bytes_at_start:
            leaks.append(f"ledger kv bytes {self.kv_bytes_at_start} at start, {self.kv_bytes_at_end} at shutdown")
        if leaks:
            return "shutdown: LEAK: " + "; ".join(leaks + [p for p in (self.http_process_error,) if p])
        return (f"shutdown: FAILED: {self.http_process_error} (every KV block returned, ledger kv bytes unchanged; "
                f"{self.ended_at_shutdown} requests ended at shutdown)")


class Server:
    def __init__(self, loaded, *, name: str, host: str = "127.0.0.1", port: int = 8080, max_queue: int = 64,
                 api_key: str | None = None, grace_s: float = 10.0, max_body_bytes: int | None = None,
                 log_level: str = "warning", ignore_eos: bool = False, http_process: bool = False,
                 queue_timeout_s: float | None = 300.0, allowed_hosts: tuple[str, ...] = (),
                 cors_origins: tuple[str, ...] = (), limits: ConnectionLimits | None = None, access_log: bool = False):
        self.loaded = loaded
        self.grace_s = grace_s
        self.http_process = http_process
        self.engine_loop = EngineLoop(loaded.engine, device=loaded.device, queue_timeout_s=queue_timeout_s)
        served = served_model(loaded, name=name, max_queue=max_queue, ignore_eos=ignore_eos)
        self.context = served.context
        self.report: ShutdownReport | None = None
        self._kv_at_start = loaded.device.ledger.bytes_by_tag().get("kv", 0)
        self.http, self.loop = http_stack()
        uvicorn_settings = dict(host=host, port=port, log_level=log_level, limits=limits)
        policy = HostPolicy(host, tuple(allowed_hosts), tuple(cors_origins))
        if http_process:
            self.served = served  # pickled to the HTTP process, which attaches its EngineClient
            self._http_settings = {"api_key": api_key, "max_body_bytes": max_body_bytes or MAX_BODY_BYTES,
                                   "uvicorn": uvicorn_settings, "policy": policy, "grace_s": grace_s,
                                   "access_log": access_log}
            self.uvicorn = None
        else:
            self.served = attach(served, self.engine_loop)
            extra = {} if max_body_bytes is None else {"max_body_bytes": max_body_bytes}
            self.app = create_app(self.served, api_key=api_key, on_shutdown=self.shutdown_check, policy=policy,
                                  access_log=access_log, **extra)
            self.uvicorn = SignalledUvicorn(uvicorn_config(self.app, **uvicorn_settings), served=self.served, grace_s=grace_s)
        self.bridge: EngineBridge | None = None
        self.http_pid: int | None = None
        self.http_exit_code: int | None = None
        self._exit = threading.Event()  # two processes: a signal or request_exit() asked for the shutdown
        self._force = threading.Event()  # ... and a second signal: no grace

    @property
    def started(self) -> bool:
        """The server answers requests (with two processes: the HTTP process's app is up)."""
        if self.uvicorn is not None:
            return self.uvicorn.started
        return self.bridge is not None and self.bridge.started.is_set()

    def request_exit(self) -> None:
        """Start the shutdown as SIGTERM would (for a server in a thread, which receives no signal)."""
        if self.uvicorn is not None:
            self.uvicorn.should_exit = True
        self._exit.set()

    def shutdown_check(self) -> ShutdownReport:
        if self.report is not None:
            return self.report
        ended = self.engine_loop.stop(grace_s=0.0)
        if self.served.templates is not None:
            self.served.templates.close()
        error = None
        try:
            cache = self.loaded.cache
            cache.check_invariants(quiescent=True)  # the prefix cache's blocks and entries checked as they are
            cache.flush_prefix_cache()  # then evicted: every block must be free
            cache.check_invariants(quiescent=True)
            if cache.num_free_blocks != cache.num_usable_blocks:
                raise RuntimeError(f"{cache.num_free_blocks} of {cache.num_usable_blocks} KV blocks free")
        except Exception as exc:  # noqa: BLE001 - the invariant's message is the finding
            error = f"{type(exc).__name__}: {exc}"
        kv_now = self.loaded.device.ledger.bytes_by_tag().get("kv", 0)
        http_error = None
        if self.http_process and self.http_exit_code != 0:
            http_error = f"the HTTP process ended with exit code {self.http_exit_code}"
        self.report = ShutdownReport(sum(1 for e in ended if e.finished), self._kv_at_start, kv_now, error, http_error)
        (log.info if self.report.clean else log.error)(self.report.line())
        return self.report

    def run(self, sockets: list[socket.socket] | None = None) -> ShutdownReport:
        """Serve until SIGTERM / Ctrl-C (or request_exit); returns the shutdown check."""
        self.engine_loop.start()
        try:
            if self.http_process:
                self._run_http_process(sockets[0] if sockets else None)
            else:
                self.uvicorn.run(sockets=sockets)
        finally:
            report = self.shutdown_check()  # a no-op when the lifespan already ran it
        return report

    def _run_http_process(self, sock: socket.socket | None) -> None:
        from rocmforge_serve.http_process import serve_http

        spawn = multiprocessing.get_context("spawn")
        ours, theirs = spawn.Pipe()
        process = spawn.Process(target=serve_http, args=(self.served, theirs, sock, self._http_settings),
                                name="rocmforge-http")  # not a daemon: it starts chat-template workers
        with self._relay_signals():
            process.start()
            self.http_pid = process.pid
            # If this process ends without coming through here (an exception in a caller that runs the server
            # in a thread), multiprocessing's exit handler would wait forever for the HTTP process, which is
            # not a daemon; this handler, registered later, runs first and ends it.
            end_at_exit = functools.partial(_end_process, process, 5.0)
            atexit.register(end_at_exit)
            try:
                theirs.close()
                self.bridge = EngineBridge(self.engine_loop, ours)
                self.bridge.start()
                while not self._exit.wait(0.05):
                    if self.bridge.closed.is_set() or not process.is_alive():
                        # the HTTP process is ending by itself (a failed start, a crash): let it finish, so
                        # that its own exit code is the one reported, then shut down too
                        process.join(10.0)
                        break
            finally:
                # SIGTERM: uvicorn's graceful shutdown there, in-flight requests get grace_s; a second signal
                # here (self._force) or a stuck process: SIGKILL
                _end_process(process, self.grace_s + 30.0, self._force)
                atexit.unregister(end_at_exit)
        self.http_exit_code = process.exitcode
        if self.bridge is not None:
            self.bridge.join(timeout=10.0)  # its reader ends at the pipe's close, cancelling what was left
        ours.close()

    @contextlib.contextmanager
    def _relay_signals(self):
        """Two processes: SIGTERM / Ctrl-C here starts the shutdown; a second Ctrl-C skips the grace."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return

        def handle(signum, _frame):  # uvicorn's rule: only a second Ctrl-C skips the grace, not a repeated SIGTERM
            (self._force if self._exit.is_set() and signum == signal.SIGINT else self._exit).set()
        previous = {sig: signal.signal(sig, handle) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)


def _end_process(process, wait_s: float, force: threading.Event | None = None) -> None:
    """SIGTERM, up to wait_s (less if `force` is set) for it to exit, then SIGKILL."""
    if process.is_alive():
        process.terminate()
    deadline = time.monotonic() + wait_s
    while process.is_alive() and not (force is not None and force.is_set()) and time.monotonic() < deadline:
        process.join(0.05)
    if process.is_alive():
        process.kill()
    process.join()


def bound_socket(host: str = "127.0.0.1", port: int = 0) -> socket.socket:
    """A listening socket (port 0: a free port, no race between finding it and binding it). IPv4 or IPv6 as
    the host resolves; bound before anything is served, so a port in use is an error at once, and both of the
    server's shapes serve the same socket. OSError when the address cannot be had."""
    family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                                         flags=socket.AI_PASSIVE)[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(2048)  # uvicorn's own backlog
    except OSError:
        sock.close()
        raise
    return sock


class ServerThread:
    """A server on a free loopback port in a background thread (tests and the serve leak check)."""

    def __init__(self, server: Server):
        self.server = server
        self.socket = bound_socket()
        self.port = self.socket.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.thread = threading.Thread(target=server.run, kwargs={"sockets": [self.socket]}, daemon=True)

    def __enter__(self) -> "ServerThread":
        self.thread.start()
        import time
        deadline = time.monotonic() + 30
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the server did not start")
            time.sleep(0.02)
        return self

    def stop(self) -> ShutdownReport:
        self.server.request_exit()
        self.thread.join(timeout=60)
        self.socket.close()
        return self.server.shutdown_check()

    def __exit__(self, *exc) -> None:
        self.stop()
