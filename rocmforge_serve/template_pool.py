"""Chat prompts for the server, rendered in long-lived sandboxed child processes (template_worker).

render_chat (hipcore.tokenizer.chat_template) starts a fresh interpreter per render: ~0.1 s of CPU and of
time to first token per chat request, measured on the demo model. The pool keeps a few workers alive
with the same limits (see template_worker) and the same failures: a late reply kills the worker ("took
longer than"), a worker that dies ends the render as "ended abnormally"; either way the next render gets
a fresh worker. The prompt is the text render_chat gives for the same conversation (a test holds them
equal); the messages come checked by rocmforge_serve.protocol.
"""

from __future__ import annotations

import json
import queue
import select
import subprocess
import sys
import threading
import time
from pathlib import Path

from hipcore.errors import InvalidModelError, RocmforgeError, UsageError, printable
from hipcore.tokenizer.chat_template import (
    CHATML_TEMPLATE, CHILD_STARTUP_S, checked_messages, checked_template_kwargs, conversation_size, template_allowance,
    template_context,
)
from hipcore.tokenizer.chat_template_sandbox import DEFAULT_TIMEOUT_S, USAGE

_PROJECT_ROOT = str(Path(__file__).resolve().parents[1])
_BOOT = "import sys; sys.path.insert(0, sys.argv[1]); from rocmforge_serve.template_worker import main; main()"
RENDERS_PER_WORKER = 1000  # then a fresh process: whatever a long run of renders left behind goes with it


class _Worker:
    def __init__(self):
        self.process = subprocess.Popen([sys.executable, "-I", "-c", _BOOT, _PROJECT_ROOT], stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        self.renders = 0
        self.started = False  # the first reply also waits for the interpreter to start and import jinja2

    def render(self, request: bytes, timeout_s: float) -> dict | None:
        """The reply, or None when the worker died or missed the deadline (it is then killed)."""
        deadline = time.monotonic() + timeout_s + (0.5 if self.started else CHILD_STARTUP_S)
        try:
            self.process.stdin.write(request)
            self.process.stdin.flush()
        except (BrokenPipeError, OSError):
            self.kill()
            return None
        out = self.process.stdout
        line = b""
        while not line.endswith(b"\n"):
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([out], [], [], left)[0]:
                self.kill()
                raise TimeoutError
            piece = out.readline()
            if not piece:  # end of file: the process is gone
                self.kill()
                return None
            line += piece
        self.started = True
        self.renders += 1
        try:
            reply = json.loads(line)
        except ValueError:
            self.kill()
            return None
        return reply if isinstance(reply, dict) else None

    @property
    def alive(self) -> bool:
        return self.process.poll() is None

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()
        for stream in (self.process.stdin, self.process.stdout):
            try:
                stream.close()
            except OSError:
                pass


class TemplatePool:
    """Up to `size` renders at once (each in its own worker); more wait for a free worker."""

    def __init__(self, size: int = 4):
        self._idle: queue.LifoQueue[_Worker | None] = queue.LifoQueue()
        for _ in range(size):
            self._idle.put(None)  # a slot; its worker starts on first use
        self._lock = threading.Lock()
        self._all: set[_Worker] = set()
        self._closed = False

    def render(self, template: str | None, messages: list[dict], *, bos_token: str, eos_token: str,
               timeout_s: float = DEFAULT_TIMEOUT_S, tools: list[dict] | None = None,
               template_kwargs: dict | None = None) -> str:
        """The prompt text of a conversation (add_generation_prompt), as render_chat gives it (tools and
        template_kwargs likewise)."""
        source = template if template is not None else CHATML_TEMPLATE
        conversation = checked_messages(messages)
        template_kwargs = checked_template_kwargs(template_kwargs)
        chars = conversation_size(conversation, tools, template_kwargs)
        context = template_context(conversation, bos_token=bos_token, eos_token=eos_token, add_generation_prompt=True,
                                   tools=tools, template_kwargs=template_kwargs)
        request = json.dumps({"template": source, "context": context, "timeout_s": timeout_s,
                              "max_chars": template_allowance(source, len(conversation), chars, bos_token, eos_token)},
                             ensure_ascii=True).encode("ascii") + b"\n"
        worker = self._take()
        try:
            try:
                reply = worker.render(request, timeout_s)
            except TimeoutError:
                raise InvalidModelError(
                    f"the model's chat template was stopped: rendering took longer than {timeout_s:g} s") from None
        finally:
            self._give_back(worker)
        if reply is None:
            raise InvalidModelError("the model's chat template was stopped: its renderer process ended abnormally, "
                                    "most likely at its memory or CPU-time limit")
        if "text" in reply:
            return str(reply["text"])
        message = printable(str(reply.get("message", "the model's chat template failed")))
        raise (UsageError if reply.get("kind") == USAGE else InvalidModelError)(message)

    def _take(self) -> _Worker:
        worker = self._idle.get()
        if worker is not None and worker.alive and worker.renders < RENDERS_PER_WORKER:
            return worker
        if worker is not None:
            worker.kill()
            with self._lock:
                self._all.discard(worker)
        try:
            with self._lock:
                if self._closed:
                    raise RocmforgeError("the chat-template renderers are shut down")
                worker = _Worker()
                self._all.add(worker)
        except BaseException:
            self._idle.put(None)
            raise
        return worker

    def _give_back(self, worker: _Worker) -> None:
        with self._lock:
            if self._closed or not worker.alive:
                worker.kill()
                self._all.discard(worker)
                self._idle.put(None)
                return
        self._idle.put(worker)

    def close(self) -> None:
        """Kill every worker (idempotent); renders after this fail with a clear error."""
        with self._lock:
            self._closed = True
            workers, self._all = list(self._all), set()
        for worker in workers:
            worker.kill()
