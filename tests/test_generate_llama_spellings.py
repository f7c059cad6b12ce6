"""`rocmforge generate` under llama.cpp's spellings (on the tiny model): -p, -f, -sys/--system-prompt, -t,
--ignore-eos, --color, -no-cnv, -e, and the short flags with values attached (-n5) as before."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from support.engine_testing import tiny_model

from rocmforge_cli import generate as generate_module
from rocmforge_cli import threads as threads_module
from rocmforge_cli.app import app
from rocmforge_cli.stream_text import PROMPT_COLOR, RESET_COLOR

runner = CliRunner()


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> str:
    return str(tiny_model(tmp_path_factory))


def run_json(tiny: str, *args: str, input=None) -> dict:
    result = runner.invoke(app, ["generate", "-m", tiny, "-d", "cpu", "--json", "--temp", "0", *args], input=input)
    assert result.exit_code == 0, result.stderr
    return json.loads(result.stdout)


def test_dash_p_and_the_positional_prompt_are_the_same_prompt(tiny):
    by_flag = run_json(tiny, "-n", "3", "-p", "hello world")
    by_argument = run_json(tiny, "-n", "3", "hello world")
    assert by_flag["prompt"] == "hello world" and by_flag["tokens"] == by_argument["tokens"]


def test_a_prompt_file_is_read_literally(tiny, tmp_path):
    path = tmp_path / "prompt.txt"
    path.write_text("line one\\n\nline two", encoding="utf-8")
    result = run_json(tiny, "-n", "2", "-f", str(path))
    assert result["prompt"] == "line one\\n\nline two"  # the \n stays two characters, as on stdin


@pytest.mark.parametrize("args, words", [
    (["-p", "a", "b"], "not a prompt argument and -p/--prompt"),
    (["-f", "/nonexistent/prompt.txt"], "-f/--file: cannot read"),
    (["-t", "0", "hi"], "-t/--threads must be at least 1"),
    (["-cnv", "--json"], "it has no --json"),
])
def test_bad_prompt_sources_are_one_line_and_exit_2(tiny, args, words):
    result = runner.invoke(app, ["generate", "-m", tiny, "-d", "cpu", *args])
    assert result.exit_code == 2, result.stderr
    assert words in result.stderr


def test_a_prompt_file_that_is_not_utf8_is_refused(tiny, tmp_path):
    path = tmp_path / "latin1.txt"
    path.write_bytes(b"caf\xe9")
    result = runner.invoke(app, ["generate", "-m", tiny, "-d", "cpu", "-f", str(path)])
    assert result.exit_code == 2 and "is not UTF-8 text" in result.stderr


def test_the_system_prompt_spellings_are_one_option(tiny):
    prompts = {run_json(tiny, "-n", "1", flag, "Be brief.", "hi")["prompt"] for flag in ("--system", "--system-prompt", "-sys")}
    assert len(prompts) == 1
    (prompt,) = prompts
    assert "Be brief." in prompt and "hi" in prompt  # rendered in the chat template, as --system is


def test_short_flags_with_values_attached_still_parse(tiny):
    assert len(run_json(tiny, "-n2", "-c64", "-s7", "hi")["tokens"]) <= 2
    assert len(run_json(tiny, "-n", "2", "-c", "64", "--n-predict", "2", "hi")["tokens"]) <= 2


def test_no_conversation_and_escape_flags(tiny):
    assert run_json(tiny, "-no-cnv", "-n", "1", "a\\tb")["prompt"] == "a\tb"
    assert run_json(tiny, "-e", "-n", "1", "a\\tb")["prompt"] == "a\tb"
    assert run_json(tiny, "--no-escape", "-n", "1", "a\\tb")["prompt"] == "a\\tb"


def test_ignore_eos_generates_through_the_end_token(tiny, monkeypatch):
    seen = []
    real = generate_module.load_with_progress

    def spy(*args, **kwargs):
        loaded = real(*args, **kwargs)
        submit = loaded.engine.submit
        loaded.engine.submit = lambda prompt, params, **kw: (seen.append(params), submit(prompt, params, **kw))[1]
        return loaded

    monkeypatch.setattr(generate_module, "load_with_progress", spy)
    run_json(tiny, "-n", "2", "--ignore-eos", "hi")
    run_json(tiny, "-n", "2", "hi")
    assert [p.ignore_eos for p in seen] == [True, False]


def test_threads_set_blas_threads_on_the_cpu_backend(tiny, monkeypatch):
    import threadpoolctl

    asked = []
    monkeypatch.setattr(threadpoolctl, "threadpool_limits", lambda **kw: asked.append(kw))
    run_json(tiny, "-n", "1", "-t", "2", "hi")
    assert asked == [{"limits": 2, "user_api": "blas"}]


def test_threads_on_a_gpu_is_a_note(tiny):
    assert threads_module.threads_note(4, "hip") == ("note: -t 4: the model runs on hip; --threads sets the cpu "
                                                      "backend's BLAS threads only")
    assert threads_module.threads_note(4, "cpu") is None and threads_module.threads_note(None, "cuda") is None
    result = runner.invoke(app, ["generate", "-m", tiny, "-d", "cpu", "--temp", "0", "-n", "1", "-t", "1", "hi"])
    assert result.exit_code == 0 and "note: -t" not in result.stderr


def test_color_only_on_a_terminal(tiny, monkeypatch):
    args = ["generate", "-m", tiny, "-d", "cpu", "--temp", "0", "-n", "2", "-q", "--color", "hello"]
    piped = runner.invoke(app, args)
    assert piped.exit_code == 0 and "\x1b[" not in piped.stdout
    monkeypatch.setattr(generate_module, "stdout_is_terminal", lambda: True)
    shown = runner.invoke(app, args)
    assert shown.exit_code == 0, shown.stderr
    assert shown.stdout.startswith(f"{PROMPT_COLOR}hello{RESET_COLOR}")


@pytest.mark.parametrize("command", ["generate", "bench", "serve"])
def test_threads_below_one_is_refused_before_the_model_is_read(command):
    result = runner.invoke(app, [command, "-m", "/nonexistent/model.gguf", "-d", "cpu", "-t", "0", "hi"][:None if command == "generate" else -1])
    assert result.exit_code == 2 and result.stderr.strip() == "error: -t/--threads must be at least 1, got 0"


def test_bench_takes_threads_as_llama_bench_does(tiny, monkeypatch):
    import threadpoolctl

    asked = []
    monkeypatch.setattr(threadpoolctl, "threadpool_limits", lambda **kw: asked.append(kw))
    result = runner.invoke(app, ["bench", "-m", tiny, "-d", "cpu", "-p", "0", "-n", "1", "-b", "0", "-r", "1", "-o", "json",
                                 "-q", "-t", "3"])
    assert result.exit_code == 0, result.stderr
    assert asked == [{"limits": 3, "user_api": "blas"}]
