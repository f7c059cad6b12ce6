"""Nothing from a model file reaches the terminal raw: control characters come out escaped
(hipcore.errors.printable, the one rule) and rich markup in model text is shown, not obeyed.

Each case plants hostile text in one place a model file feeds the terminal from: the pre-tokenizer
name, a chat template's raise_exception message, the model's name, a tensor name, and any error
message at all (the CLI's last line of defence).
"""

from __future__ import annotations

import pytest
import typer
from typer.testing import CliRunner

from support.gguf_factory import raw_tiny_llama, write_tiny_llama
from hipcore.errors import InvalidModelError, printable
from rocmforge_cli.app import app
from rocmforge_cli.common import handle_errors

HOSTILE = "a\nb\x1b[31mc\u202ed [bold]e[/]"
SHOWN = "a\\nb\\x1b[31mc\\u202ed [bold]e[/]"  # how HOSTILE must appear: escaped, the markup as text

runner = CliRunner()


def invoke(*args: str):
    return runner.invoke(app, list(args), env={"COLUMNS": "400"})


def error_line(result) -> str:
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert "\x1b" not in result.stderr and "\u202e" not in result.stderr
    return lines[0]


def test_printable_escapes_what_a_terminal_would_obey_and_keeps_the_rest():
    assert printable(HOSTILE) == SHOWN
    assert printable("日本語 ok") == "日本語 ok"
    assert printable("x" * 10, 4) == "xxxx..."
    assert printable("\x00\t\r\x7f\u2028") == "\\x00\\t\\r\\x7f\\u2028"


def test_a_pre_tokenizer_name_in_an_error_is_one_escaped_line(tmp_path):
    path = write_tiny_llama(tmp_path / "m.gguf", extra_metadata={"tokenizer.ggml.pre": HOSTILE})
    result = invoke("generate", "-m", str(path), "--device", "cpu", "-n", "1", "-q", "hi")
    assert result.exit_code == 4
    assert f"pre-tokenizer '{SHOWN}' (tokenizer.ggml.pre) is not supported" in error_line(result)


def test_a_template_exception_message_is_one_escaped_line(tmp_path):
    template = "{{ raise_exception('" + HOSTILE.replace("\n", "\\n").replace("\x1b", "\\x1b") + "') }}"
    path = write_tiny_llama(tmp_path / "m.gguf", extra_metadata={"tokenizer.chat_template": template})
    result = invoke("generate", "-m", str(path), "--device", "cpu", "--chat", "-n", "1", "-q", "hi")
    assert result.exit_code == 2
    line = error_line(result)
    # the template's newline became a space (one line), the rest is escaped
    assert "rejected the conversation: a b\\x1b[31mc\\u202ed [bold]e[/]" in line


def test_inspect_shows_the_model_name_escaped_and_its_markup_as_text(tmp_path):
    path = write_tiny_llama(tmp_path / "m.gguf", extra_metadata={"general.name": HOSTILE})
    result = invoke("inspect", str(path))
    assert result.exit_code == 0, result.output
    assert f"llama - {SHOWN}" in result.stdout
    assert "\x1b" not in result.stdout and "\u202e" not in result.stdout


def test_inspect_shows_an_unsupported_pre_tokenizer_escaped(tmp_path):
    path = write_tiny_llama(tmp_path / "m.gguf", extra_metadata={"tokenizer.ggml.pre": HOSTILE})
    result = invoke("inspect", str(path))
    assert result.exit_code == 0, result.output
    assert f"gpt2 (pre: {SHOWN})" in result.stdout and "NOT SUPPORTED" in result.stdout
    assert "\x1b" not in result.stdout


def test_an_unknown_tensor_name_is_escaped(tmp_path):
    raw = raw_tiny_llama(n_layers=1)
    raw.tensors[-1].name = "blk.0.\x1b[2Jx[bold]"
    path = tmp_path / "m.gguf"
    path.write_bytes(raw.to_bytes())
    result = invoke("inspect", str(path))
    assert result.exit_code == 4
    assert "'blk.0.\\x1b[2Jx[bold]'" in error_line(result)


def test_the_cli_escapes_any_error_message_whatever_raised_it():
    # The last line of defence, shown on a planted error that no site escaped.
    @handle_errors
    def command() -> None:
        raise InvalidModelError(HOSTILE)

    with pytest.raises(typer.Exit) as caught:
        command()
    assert caught.value.exit_code == 3
    broken = typer.Typer()
    broken.command()(command)
    result = runner.invoke(broken, [])
    assert error_line(result) == f"error: {SHOWN}"
