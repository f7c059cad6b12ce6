"""`rocmforge generate` as a Unix tool: escapes in --stop and the prompt, a closed pipe, Ctrl-C, the seed
reported, stdin that is not UTF-8, and option errors in the words of the options (on the tiny model)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from support.engine_testing import tiny_model

from hipcore.engine.engine import Engine
from rocmforge_cli.app import app
from rocmforge_cli.stream_text import stream_text

runner = CliRunner()


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> str:
    return str(tiny_model(tmp_path_factory))


def invoke(*args: str, input=None):
    return runner.invoke(app, ["generate", *args], input=input, env={"COLUMNS": "200"})


def run_json(tiny: str, *args: str) -> dict:
    result = invoke("--model", tiny, "--device", "cpu", "--json", *args)
    assert result.exit_code == 0, result.stderr
    return json.loads(result.stdout)


def test_a_stop_string_written_with_escapes_matches_the_text_it_stands_for(tiny):
    sampled = ("--temp", "1", "--seed", "5", "-n", "40")
    full = run_json(tiny, *sampled, "hello")["text"]
    # a two-character piece whose first appearance is not at the start
    target = next(full[i:i + 2] for i in range(1, len(full) - 1) if full.index(full[i:i + 2]) == i)
    as_hex = "".join(f"\\x{b:02x}" for b in target.encode("utf-8"))
    stopped = run_json(tiny, *sampled, "--stop", as_hex, "hello")
    assert stopped["ending"] == "stop" and stopped["text"] == full[:full.index(target)]
    literal = run_json(tiny, *sampled, "--stop", as_hex, "--no-escape", "hello")
    assert literal["ending"] == "length" and literal["text"] == full


def test_the_readmes_blank_line_stop_reaches_the_engine_as_two_newlines(tiny, monkeypatch):
    seen = []
    original = Engine.generate

    def recording(self, prompt, params, **kwargs):
        seen.append((params.stop, self.tokenizer.decode(list(prompt))))
        return original(self, prompt, params, **kwargs)

    monkeypatch.setattr(Engine, "generate", recording)
    run_json(tiny, "--temp", "0", "-n", "2", "--stop", r"\n\n", r"a\tb")
    run_json(tiny, "--temp", "0", "-n", "2", "--stop", r"\n\n", "--no-escape", r"a\tb")
    assert seen[0][0] == ("\n\n",) and "a\tb" in seen[0][1]
    assert seen[1][0] == ("\\n\\n",) and "a\\tb" in seen[1][1]


def _sigint_as_in_a_terminal() -> None:
    # A child of a background job (`pytest &` in a script) starts with SIGINT ignored, and Python then
    # installs no KeyboardInterrupt handler: give it the disposition a terminal's foreground process has.
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _spawn(model: str, *args: str, stdout=subprocess.PIPE) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "rocmforge_cli.app", "generate", "--model", model, "--device", "cpu",
                             "--temp", "1", "-n", "250", *args],
                            stdout=stdout, stderr=subprocess.PIPE, env={**os.environ, "COLUMNS": "200"},
                            preexec_fn=_sigint_as_in_a_terminal)


def test_a_closed_pipe_ends_quietly_with_the_sigpipe_status(tiny):
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader is gone before the first token (as `| head -c 0`; no race with the writer)
    proc = _spawn(tiny, "-q", "hello", stdout=write_end)
    os.close(write_end)
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 141, err
    assert err == "", err  # no "internal error: BrokenPipeError", no "Exception ignored"


def test_ctrl_c_prints_the_timings_so_far_on_lines_of_their_own(demo_model_path):
    # the demo model: slow enough on the CPU that the signal always lands mid-generation
    proc = _spawn(str(demo_model_path), "--stop", "never-seen", "1, 2, 3, 4, 5,")
    assert proc.stdout.read(5)  # generation is under way
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err.decode()
    err = err.decode()
    lines = err.splitlines()
    interrupted = next(i for i, line in enumerate(lines) if line.startswith("interrupted after "))
    timing_lines = lines[interrupted + 1:]
    assert [line.split("=")[0].strip() for line in timing_lines] == ["load time", "prompt eval time", "eval time",
                                                                     "total time"], err
    assert "Traceback" not in err and "internal error" not in err
    assert out.endswith(b"\n")  # the streamed text's line was ended before the timings


def test_a_drawn_seed_is_reported_and_repeats_the_run(tiny):
    shown = invoke("--model", tiny, "--device", "cpu", "--temp", "1", "-n", "12", "hello")
    assert shown.exit_code == 0, shown.stderr
    line = next(line for line in shown.stderr.splitlines() if line.startswith("seed: "))
    seed = int(line.split()[1])
    assert f"--seed {seed} " in line
    first = run_json(tiny, "--temp", "1", "-n", "12", "--seed", str(seed), "hello")
    # the stream shows control characters escaped; the JSON carries the exact text
    assert stream_text(first["text"]) + "\n" == shown.stdout and first["seed"] == seed and first["seed_drawn"] is False

    drawn = run_json(tiny, "--temp", "1", "-n", "12", "hello")  # in the JSON object when --json
    assert isinstance(drawn["seed"], int) and drawn["seed_drawn"] is True
    again = run_json(tiny, "--temp", "1", "-n", "12", "--seed", str(drawn["seed"]), "hello")
    assert again["tokens"] == drawn["tokens"]


def test_stdin_that_is_not_utf8_is_refused_clearly(tiny):
    result = invoke("--model", tiny, "--device", "cpu", "-q", input=b"caf\xe9 au lait")
    assert result.exit_code == 2
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "not UTF-8" in lines[0] and "byte 3" in lines[0], result.stderr


def test_stdin_is_taken_literally(tiny, monkeypatch):
    seen = []
    original = Engine.generate
    monkeypatch.setattr(Engine, "generate",
                        lambda self, prompt, params, **kw: seen.append(self.tokenizer.decode(list(prompt)))
                        or original(self, prompt, params, **kw))
    result = invoke("--model", tiny, "--device", "cpu", "-q", "--temp", "0", "-n", "1", input="a\\tb")
    assert result.exit_code == 0, result.stderr
    assert "a\\tb" in seen[0]


@pytest.mark.parametrize("args, option", [
    (["-n", "0"], "--max-tokens/-n"),
    (["--max-tokens", "-5"], "--max-tokens/-n"),
    (["--temp", "-1"], "--temp"),
    (["--top-k", "-1"], "--top-k"),
    (["--top-p", "0"], "--top-p"),
    (["--min-p", "2"], "--min-p"),
    (["--repeat-penalty", "0"], "--repeat-penalty"),
    (["--presence-penalty", "3"], "--presence-penalty"),
    (["--frequency-penalty", "3"], "--frequency-penalty"),
    (["--seed", "-1"], "--seed/-s"),
    (["--stop", ""], "--stop"),
])
def test_option_errors_name_the_option_as_typed(tiny, args, option):
    result = invoke("--model", tiny, "-q", *args, "hello")
    assert result.exit_code == 2
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith((f"error: {option} ", f"error: {option}: ")), result.stderr
    assert "_" not in lines[0].split(" must")[0]  # no internal field name such as max_tokens


@pytest.mark.parametrize("name, kind, good", [("ROCMFORGE_MMA_FIRST_MIN_COLS", "a whole number", "2880"),
                                              ("ROCMFORGE_MOE_MMA_MIN_PAIRS", "a number", "2.5"),
                                              ("ROCMFORGE_MOE_GROUPED_MIN_PAIRS", "a number", "1"),
                                              ("ROCMFORGE_MOE_MMA_WIDE_PAIRS", "a number", "64")])
def test_a_bad_numeric_setting_is_one_line_and_exit_2(tiny, name, kind, good, monkeypatch):
    """A measurement setting (the README's settings table) that is no number is refused when the model loads, in one
    line naming it, exit 2, as a bad option is: not a traceback, not a failed forward pass, and on a dense model too;
    a good value of the same setting runs."""
    monkeypatch.setenv(name, "lots")
    result = invoke("--model", tiny, "--device", "cpu", "-p", "Hi", "-n", "2")
    assert result.exit_code == 2, result.output
    assert f"error: {name} must be {kind} of 0 or more, got 'lots'" in result.stderr
    assert "Traceback" not in result.output and "forward pass" not in result.output
    monkeypatch.setenv(name, good)
    assert invoke("--model", tiny, "--device", "cpu", "-p", "Hi", "-n", "2").exit_code == 0
