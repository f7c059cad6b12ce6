"""`rocmforge generate -cnv`: a chat in the terminal, as llama-cli's conversation mode.

Each line typed is a user message; the whole conversation is rendered with the model's chat template (the
sandboxed renderer) and answered through the engine's generate(), so every turn is an ordinary request
whose blocks come back when it ends. /exit, /quit or Ctrl-D end the chat; /clear forgets the conversation
(the system message stays). Ctrl-C while an answer streams stops it after the engine step under way (the
engine is never interrupted half-way through a step, so the chat goes on with it) and keeps what was said;
Ctrl-C at the prompt asks for a second one, which ends the chat.
"""

from __future__ import annotations

import signal
import sys
import threading
from typing import Callable, Optional, TextIO

from hipcore.engine.request import Ending
from hipcore.errors import RocmforgeError, UsageError
from hipcore.tokenizer.chat_template import chat_prompt
from rocmforge_cli.common import stderr
from rocmforge_cli.stream_text import RESET_COLOR, USER_INPUT_COLOR, stream_text

EXIT_COMMANDS = ("/exit", "/quit")
CLEAR_COMMAND = "/clear"


class StopOnInterrupt:
    """While an answer streams: Ctrl-C (SIGINT) sets `requested` instead of raising in the middle of a step.
    Only the main thread can take signals; elsewhere this does nothing."""

    def __init__(self) -> None:
        self.requested = False
        self._previous = None

    def __enter__(self) -> "StopOnInterrupt":
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGINT, self._on_interrupt)
        return self

    def _on_interrupt(self, _signum, _frame) -> None:
        self.requested = True

    def __exit__(self, *_exc) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)


def terminal_input(marker: str) -> str:
    """A line from stdin, with line editing and history when stdin is a terminal."""
    if sys.stdin.isatty():
        try:
            import readline  # noqa: F401 - importing it is what gives input() editing and history
        except ImportError:  # not on every platform
            pass
    return input(marker)


class Chat:
    """A conversation with the model: `messages` holds it (system, then user and assistant in turn)."""

    def __init__(self, engine, tokenizer, template: Optional[str], params, *, system: Optional[str] = None,
                 color: bool = False, quiet: bool = False, read_line: Callable[[str], str] = terminal_input,
                 out: Optional[TextIO] = None) -> None:
        self.engine, self.tokenizer, self.template, self.params = engine, tokenizer, template, params
        self.system = system
        self.messages: list[dict] = self._fresh()
        self.color, self.quiet, self.read_line = color, quiet, read_line
        self.out = out if out is not None else sys.stdout

    def run(self, first: Optional[str] = None) -> None:
        """Answer `first` (when given), then each line read, until /exit, end of input or a second Ctrl-C."""
        self._say(f"chat: type a message; {EXIT_COMMANDS[0]} or Ctrl-D ends, Ctrl-C stops an answer, "
                  f"{CLEAR_COMMAND} forgets the conversation")
        try:
            self._converse(first)
        except KeyboardInterrupt:  # a second Ctrl-C that came between two reads rather than in one
            self._write("\n")

    def _converse(self, pending: Optional[str]) -> None:
        interrupted = False
        while True:
            if pending is not None:
                line, pending = pending, None
            else:
                try:
                    line = self._read()
                except EOFError:
                    self._write("\n")
                    return
                except KeyboardInterrupt:
                    self._write("\n")
                    if interrupted:
                        return
                    interrupted = True
                    self._say(f"(Ctrl-C again, {EXIT_COMMANDS[0]} or Ctrl-D to leave)", always=True)
                    continue
            interrupted = False
            command = line.strip()
            if command in EXIT_COMMANDS:
                return
            if command == CLEAR_COMMAND:
                self.messages = self._fresh()
                self._say("(the conversation is forgotten)")
            elif command:
                self.turn(line)

    def turn(self, text: str) -> Optional[str]:
        """One user message answered: the answer (kept in the conversation, also when Ctrl-C stopped it), or
        None when the conversation no longer fits the context or Ctrl-C came before the first word (the
        message is dropped, and the chat says so)."""
        self.messages.append({"role": "user", "content": text})
        with StopOnInterrupt() as stop:  # from the template's rendering to the answer's last token
            try:
                _, prompt_ids = chat_prompt(self.tokenizer, self.template, self.messages,
                                            context_tokens=self.engine.max_context)
                answer, ending = self._stream(prompt_ids, stop) if not stop.requested else ("", None)
            except UsageError as exc:  # the conversation is longer than the context
                return self._not_answered(f"{exc}; {CLEAR_COMMAND} starts the conversation again")
        if ending is not None and ending.error:
            if ending.ending != Ending.REJECTED:
                raise RocmforgeError(f"generation {ending.ending.value if ending.ending else 'failed'}: {ending.error}")
            return self._not_answered(f"{ending.error}; {CLEAR_COMMAND} starts the conversation again")
        if stop.requested and not answer:
            return self._not_answered("stopped before the first word")
        if stop.requested:
            self._say("(stopped)", always=True)
        self.messages.append({"role": "assistant", "content": answer})
        return answer

    def _not_answered(self, why: str) -> None:
        self.messages.pop()
        self._say(f"not answered: {why}", always=True)

    def _stream(self, prompt_ids: list[int], stop: StopOnInterrupt):
        """Stream the answer to the prompt until it ends or Ctrl-C asks it to stop: (its text, its last event)."""
        pieces: list[str] = []
        ending = None
        stream = self.engine.generate(prompt_ids, self.params)
        try:
            for event in stream:
                if event.text:
                    pieces.append(event.text)
                    self._write(stream_text(event.text))
                if event.finished:
                    ending = event
                if stop.requested:
                    break
        finally:
            stream.close()  # a request still running is cancelled here, its blocks back in the pool
        if pieces:
            self._write("\n")
        return "".join(pieces), ending

    def _read(self) -> str:
        if not self.color:
            return self.read_line("> ")
        # with readline (stdin a terminal), \001 \002 tell it the colour codes take no room on the line
        color = f"\001{USER_INPUT_COLOR}\002" if sys.stdin.isatty() else USER_INPUT_COLOR
        try:
            return self.read_line(f"{color}> ")
        finally:
            self._write(RESET_COLOR)

    def _fresh(self) -> list[dict]:
        return [{"role": "system", "content": self.system}] if self.system is not None else []

    def _write(self, text: str) -> None:
        self.out.write(text)
        self.out.flush()

    def _say(self, message: str, always: bool = False) -> None:
        """A line on stderr; --quiet keeps only those that answer what the user did."""
        if always or not self.quiet:
            stderr.print(message, highlight=False, markup=False)
