"""`rocmforge generate -cnv`: the chat in the terminal (on the tiny model). Each turn renders the whole
conversation; /exit, /clear, end of input; Ctrl-C at the prompt (twice ends it) and during an answer (stops
it at a step's end, the request cancelled and its blocks back, the chat going on)."""

from __future__ import annotations

import io
import os
import pty
import select
import signal
import sys
import time

import pytest
from typer.testing import CliRunner

from support.engine_testing import greedy, load_tiny, tiny_model

from hipcore.tokenizer.chat_template import chat_prompt, chat_template_from_metadata
from rocmforge_cli.app import app
from rocmforge_cli.chat import Chat
from rocmforge_cli.stream_text import RESET_COLOR, USER_INPUT_COLOR

runner = CliRunner()


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return tiny_model(tmp_path_factory)


@pytest.fixture(scope="module")
def model(tiny):
    with load_tiny(tiny) as loaded:
        yield loaded


class Lines:
    """read_line for Chat: the given lines in turn; an exception instance is raised instead; then EOF."""

    def __init__(self, *items):
        self.items, self.markers = list(items), []

    def __call__(self, marker: str) -> str:
        self.markers.append(marker)
        if not self.items:
            raise EOFError
        item = self.items.pop(0)
        if isinstance(item, BaseException):
            raise item
        return item


class Spy:
    """The engine's generate(), recording each prompt; `on_event(n)` runs after the n-th event of a turn."""

    def __init__(self, engine, on_event=None):
        self.engine, self.prompts, self.on_event, self.real = engine, [], on_event, engine.generate

    def __call__(self, prompt_ids, params):
        self.prompts.append(list(prompt_ids))
        for n, event in enumerate(self.real(prompt_ids, params)):
            yield event
            if self.on_event:
                self.on_event(n)


def chat_with(model, monkeypatch, lines: Lines, params=None, on_event=None, **options):
    spy = Spy(model.engine, on_event)
    monkeypatch.setattr(model.engine, "generate", spy)
    template = chat_template_from_metadata(model.gguf.metadata)
    chat = Chat(model.engine, model.tokenizer, template, params or greedy(3), read_line=lines, quiet=True, **options)
    return chat, spy, template


def test_each_turn_renders_the_whole_conversation(model, monkeypatch, capsys):
    chat, spy, template = chat_with(model, monkeypatch, Lines("first question", "second question", "/exit"),
                                    system="Be brief.")
    chat.run()
    roles = [m["role"] for m in chat.messages]
    assert roles == ["system", "user", "assistant", "user", "assistant"]
    assert len(spy.prompts) == 2
    for turn, prompt in enumerate(spy.prompts):
        expected = chat_prompt(model.tokenizer, template, chat.messages[:2 + 2 * turn], context_tokens=model.engine.max_context)
        assert prompt == expected[1]
    assert len(spy.prompts[1]) > len(spy.prompts[0])  # the first answer is in the second prompt
    assert model.engine.active_count == 0


def test_a_first_message_clear_and_end_of_input(model, monkeypatch, capsys):
    lines = Lines("again", "/clear", "fresh")
    chat, spy, template = chat_with(model, monkeypatch, lines)
    chat.run(first="opening")
    assert len(spy.prompts) == 3 and len(lines.markers) == 4  # the last read met the end of input
    assert [m["content"] for m in chat.messages if m["role"] == "user"] == ["fresh"]  # /clear forgot the rest
    alone = chat_prompt(model.tokenizer, template, [{"role": "user", "content": "fresh"}],
                        context_tokens=model.engine.max_context)[1]
    assert spy.prompts[2] == alone


def test_ctrl_c_at_the_prompt_once_goes_on_twice_ends(model, monkeypatch, capsys):
    lines = Lines(KeyboardInterrupt(), "hello", KeyboardInterrupt(), KeyboardInterrupt(), "never read")
    chat, spy, _ = chat_with(model, monkeypatch, lines)
    chat.run()
    assert len(spy.prompts) == 1 and lines.items == ["never read"]


@pytest.fixture
def ctrl_c_as_in_a_terminal():
    """SIGINT as an interactive shell leaves it to Python (a run started in the background inherits it ignored)."""
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, before)


def test_ctrl_c_during_an_answer_stops_it_and_the_chat_goes_on(model, monkeypatch, capsys, ctrl_c_as_in_a_terminal):
    def interrupt_after_the_second(n: int) -> None:
        if n == 1:
            signal.raise_signal(signal.SIGINT)  # as Ctrl-C in a terminal: the handler, not an exception mid-step

    params = greedy(40, ignore_eos=True)
    chat, spy, _ = chat_with(model, monkeypatch, Lines("tell me a long story", "/exit"), params=params,
                             on_event=interrupt_after_the_second)
    chat.run()
    answer = chat.messages[-1]
    assert answer["role"] == "assistant"
    kept = model.tokenizer.encode(answer["content"])
    assert 0 < len(kept) < 40  # stopped after two events, kept what was said
    assert model.engine.active_count == 0
    model.cache.check_invariants(quiescent=True)  # every block of the cancelled request is back
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # the usual Ctrl-C again at the prompt


def test_a_conversation_past_the_context_is_said_and_dropped(model, monkeypatch, capsys):
    chat, spy, _ = chat_with(model, monkeypatch, Lines("word " * (model.engine.max_context + 8), "short", "/exit"))
    chat.quiet = False
    chat.run()
    assert [m["content"] for m in chat.messages if m["role"] == "user"] == ["short"]
    assert "not answered:" in capsys.readouterr().err


def test_the_command_chats_over_stdin(tiny):
    result = runner.invoke(app, ["generate", "-m", str(tiny), "-d", "cpu", "--temp", "0", "-n", "3", "-cnv"],
                           input="hello\nagain\n/exit\nnot read\n")
    assert result.exit_code == 0, result.stderr
    assert result.stdout.count("> ") == 3
    assert "/exit or Ctrl-D ends" in result.stderr
    ended = runner.invoke(app, ["generate", "-m", str(tiny), "-d", "cpu", "--temp", "0", "-n", "2", "-cnv", "-q"],
                          input="hello\n")  # Ctrl-D: the end of input
    assert ended.exit_code == 0 and ended.stdout.count("> ") == 2


def _read_until(fd: int, wanted: bytes, seen: bytearray, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while wanted not in seen:
        left = deadline - time.monotonic()
        assert left > 0, f"no {wanted!r} in {bytes(seen)!r}"
        if select.select([fd], [], [], left)[0]:
            try:
                seen += os.read(fd, 4096)
            except OSError:  # the child closed the terminal
                break
    assert wanted in seen, bytes(seen)


def _read_until_any(fd: int, seen: bytearray, timeout: float = 30.0) -> None:
    """At least one more byte from the child, within `timeout` seconds."""
    ready = select.select([fd], [], [], timeout)[0]
    assert ready, f"nothing more from the chat: {bytes(seen)!r}"
    seen += os.read(fd, 4096)


def _exit_status(pid: int, fd: int, seen: bytearray, timeout: float = 30.0) -> int:
    """The child's exit status, reading what it still writes meanwhile (a child blocked writing to a full
    terminal would never exit); an assertion, not a hang, when it does not end in `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        left = deadline - time.monotonic()
        assert left > 0, f"the chat did not end: {bytes(seen)!r}"
        if select.select([fd], [], [], min(left, 0.1))[0]:
            try:
                seen += os.read(fd, 4096)
            except OSError:
                pass


def _at_the_prompt(fd: int, seen: bytearray) -> None:
    """Wait for the prompt, then a moment: CPython's readline misses a SIGINT that lands between drawing
    the prompt and waiting for a key (it checks for signals only when its wait is interrupted), as a person
    typing Ctrl-C twice within microseconds would; a person's second Ctrl-C comes later than that."""
    _read_until(fd, b"> ", seen)
    time.sleep(0.3)


@pytest.mark.skipif(not hasattr(os, "fork") or sys.platform == "darwin", reason="a pseudo-terminal with fork (Linux)")
def test_ctrl_c_typed_at_a_terminal(tiny):
    """Under a pseudo-terminal, as a person types: a line answered, Ctrl-C at the prompt says how to leave,
    a second Ctrl-C ends the chat with status 0."""
    pid, fd = pty.fork()
    if pid == 0:  # the child: the chat, its terminal the pseudo-terminal
        os.environ["OPENBLAS_NUM_THREADS"] = "1"
        signal.signal(signal.SIGINT, signal.SIG_DFL)  # as a terminal's shell starts it, even under a background run
        os.execv(sys.executable, [sys.executable, "-m", "rocmforge_cli.app", "generate", "-m", str(tiny), "-d", "cpu",
                                  "--temp", "0", "-n", "3", "-cnv", "-q"])
    seen = bytearray()
    try:
        _read_until(fd, b"> ", seen)
        os.write(fd, b"hello\r")
        _read_until(fd, b"hello", seen)
        del seen[:]
        _at_the_prompt(fd, seen)  # answered, back at the prompt
        os.write(fd, b"\x03")
        _read_until(fd, b"Ctrl-C again", seen)
        _at_the_prompt(fd, seen)
        os.write(fd, b"\x03")
        status = _exit_status(pid, fd, seen)
        pid = 0
        assert status == 0
    finally:
        if pid:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        os.close(fd)


@pytest.mark.skipif(not hasattr(os, "fork") or sys.platform == "darwin", reason="a pseudo-terminal with fork (Linux)")
def test_ctrl_c_typed_during_an_answer_stops_it(tiny):
    """Under a pseudo-terminal: Ctrl-C while an answer streams stops it, and the chat asks for the next line."""
    pid, fd = pty.fork()
    if pid == 0:
        os.environ["OPENBLAS_NUM_THREADS"] = "1"
        signal.signal(signal.SIGINT, signal.SIG_DFL)  # as a terminal's shell starts it, even under a background run
        os.execv(sys.executable, [sys.executable, "-m", "rocmforge_cli.app", "generate", "-m", str(tiny), "-d", "cpu",
                                  "--temp", "0", "-n", "200", "--ignore-eos", "-cnv", "-q"])
    seen = bytearray()
    try:
        _read_until(fd, b"> ", seen)
        os.write(fd, b"hello\r")
        _read_until(fd, b"hello\r\n", seen)
        del seen[:]
        _read_until_any(fd, seen)  # the answer has begun
        os.write(fd, b"\x03")
        _read_until(fd, b"(stopped)", seen)
        _at_the_prompt(fd, seen)
        os.write(fd, b"/exit\r")
        status = _exit_status(pid, fd, seen)
        pid = 0
        assert status == 0
    finally:
        if pid:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        os.close(fd)


def test_each_turn_takes_the_conversation_so_far_from_the_prefix_cache(tiny, monkeypatch):
    with load_tiny(tiny, prefix_caching=True, block_size=4) as cached:
        chat, spy, _ = chat_with(cached, monkeypatch, Lines("first question", "second question", "/exit"),
                                 system="Be brief and kind to everyone who asks anything at all.")
        chat.run()
        profile = cached.cache.memory_profile()
        first, second = spy.prompts
        # the second turn found every full block of the first turn's prompt (its answer's blocks too, but one)
        assert profile.prefix_hit_tokens >= len(first) // 4 * 4 > 0
        assert profile.prefix_query_tokens == len(first) + len(second)


def test_color_marks_the_input_and_resets_after_it(model, monkeypatch):
    out = io.StringIO()
    lines = Lines("hi", "/exit")
    chat, _, _ = chat_with(model, monkeypatch, lines, color=True, out=out)
    chat.run()
    assert lines.markers == [f"{USER_INPUT_COLOR}> "] * 2  # stdin is no terminal here: no readline markers
    assert out.getvalue().startswith(RESET_COLOR) and "\x1b[" not in out.getvalue().replace(RESET_COLOR, "")
