"""`rocmforge serve`'s options: every numeric one bounded (a clear line, exit 2, before the model is read), the
host and origin lists checked; and an out-of-memory error's plan table printed as lines, not as a literal \\n."""

from __future__ import annotations

import pytest
import typer
from typer.testing import CliRunner

from hipcore.errors import DeviceOutOfMemory
from rocmforge_cli.app import app
from rocmforge_cli.common import handle_errors

runner = CliRunner()

BAD = [
    (["--shutdown-grace", "nan"], "--shutdown-grace must be a number from 0 to 3600, got nan"),
    (["--shutdown-grace", "inf"], "--shutdown-grace must be a number from 0 to 3600"),
    (["--shutdown-grace", "-1"], "--shutdown-grace must be a number from 0 to 3600"),
    (["--step-tokens", "1000000000"], "--step-tokens must be a number from 1 to 65536"),
    (["--step-tokens", "0"], "--step-tokens must be a number from 1 to 65536"),
    (["--parallel", "100000"], "--parallel must be a number from 1 to 1024"),
    (["--queue", "-1"], "--queue must be a number from 0 to 65536"),
    (["--queue-timeout", "0"], "--queue-timeout must be a number from 0.001 to 86400"),
    (["--queue-timeout", "nan"], "--queue-timeout must be a number"),
    (["--port", "70000"], "--port must be a number from 0 to 65535"),
    (["--kv-blocks", "10000000000"], "--kv-blocks must be at most"),
    (["--cors-origins", "evil.example"], "'evil.example' is not an origin"),
    (["--cors-origins", "http://a.example/path"], "is not an origin"),
    (["--allowed-hosts", "a.example,,b.example"], "'' is not a host name"),
]


@pytest.mark.parametrize("args,message", BAD, ids=[" ".join(a) for a, _ in BAD])
def test_a_bad_option_is_one_line_and_exit_2_before_the_model_is_read(args, message):
    result = runner.invoke(app, ["serve", "--model", "/nonexistent/model.gguf", "--device", "cpu", *args])
    assert result.exit_code == 2, result.output
    assert message in result.output and "Traceback" not in result.output
    assert "nonexistent" not in result.output  # refused before the model path was looked at


def test_an_out_of_memory_table_keeps_its_lines_and_escapes_each(capsys):
    @handle_errors
    def command():
        raise DeviceOutOfMemory("CPU backend out of memory on cpu: the model needs 9 GiB.\ncomponent  bytes\n"
                                "weights\x1b[31m  8 GiB")
    with pytest.raises(typer.Exit) as exit_info:
        command()
    assert exit_info.value.exit_code == 5
    err = capsys.readouterr().err
    assert "\\n" not in err and "component  bytes\n" in err
    assert "\x1b[31m" not in err and "\\x1b" in err  # a control character in a line is still escaped


@pytest.mark.parametrize("args,message", [(["--clients", "1000000"], "--clients must be a number from 1 to 1024"),
                                          (["--requests", "0"], "--requests must be a number from 1"),
                                          (["--time-limit", "nan"], "--time-limit must be a number")])
def test_serve_leak_check_bounds_its_options_too(args, message):
    result = runner.invoke(app, ["serve-leak-check", "--model", "/nonexistent/model.gguf", "--device", "cpu", *args])
    assert result.exit_code == 2 and message in result.output, result.output
