"""The command line as a whole: every command's --help has examples; each short flag means one thing in every
command (the app walked, and the walker shown to catch a planted clash); llama.cpp's flags with no meaning
here are one line and exit 2, never read as another option; --version."""

from __future__ import annotations

from importlib.metadata import version
from typing import Annotated, Optional

import pytest
import typer
from typer.testing import CliRunner

from rocmforge_cli.app import app
from rocmforge_cli.llama_flags import NO_MEANING, RETIRED, FlagCheckedCommand
from rocmforge_cli.options import BENCH_SHORT_FLAGS, SHORT_FLAGS, Model, seed_option

runner = CliRunner()


def commands(group, path=()):
    """(path, command) for every command under the Click group, subcommands included."""
    for name, command in group.commands.items():
        if hasattr(command, "commands"):
            yield from commands(command, (*path, name))
        else:
            yield (*path, name), command


def short_flags(command) -> dict[str, str]:
    """Each single-dash spelling of the command's options and the long name it stands for."""
    found = {}
    for param in command.params:
        if param.param_type_name != "option":
            continue
        for names in (param.opts, param.secondary_opts):
            long = next((n for n in names if n.startswith("--")), None)
            found.update({n: long for n in names if not n.startswith("--")})
    return found


def clashes(group) -> list[str]:
    """Short flags whose meaning in some command is not the table's (bench: llama-bench's)."""
    wrong = []
    for path, command in commands(group):
        expected = {**SHORT_FLAGS, **BENCH_SHORT_FLAGS} if path == ("bench",) else SHORT_FLAGS
        for flag, long in short_flags(command).items():
            if expected.get(flag) != long:
                wrong.append(f"{' '.join(path)}: {flag} is {long}, the table says {expected.get(flag)}")
    return wrong


ROOT = typer.main.get_command(app)
ALL = list(commands(ROOT))


def test_the_walk_sees_every_command():
    names = {" ".join(path) for path, _ in ALL}
    assert {"generate", "bench", "serve", "serve-leak-check", "leak-check", "profile-kv", "inspect", "devices",
            "kernels build", "kernels list"} <= names


@pytest.mark.parametrize("path", [(), ("kernels",)] + [path for path, _ in ALL], ids=lambda p: " ".join(p) or "root")
def test_every_help_has_examples(path):
    result = runner.invoke(app, [*path, "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert "Examples:" in result.output
    assert "rocmforge " + " ".join(path) in result.output  # an example of this very command


def test_each_short_flag_means_one_thing_in_every_command():
    assert clashes(ROOT) == []


def test_every_flag_of_the_table_is_taken_somewhere():
    taken = {flag for _, command in ALL for flag in short_flags(command)} | {"-h", "-V"}
    assert set(SHORT_FLAGS) <= taken, set(SHORT_FLAGS) - taken


def test_a_planted_clash_is_caught():
    planted = typer.Typer()

    @planted.command("one")
    def one(model: Model = None, seed: Annotated[Optional[int], seed_option("a seed")] = None) -> None: ...

    @planted.command("two")
    def two(requests: int = typer.Option(1, "--requests", "-n")) -> None: ...

    found = clashes(typer.main.get_command(planted))
    assert found == ["two: -n is --requests, the table says --max-tokens"]


def test_the_short_flag_table_is_in_the_main_help():
    result = runner.invoke(app, ["--help"], env={"COLUMNS": "200"})
    for flag, long in {**SHORT_FLAGS, **BENCH_SHORT_FLAGS}.items():
        if flag not in ("-h", "-V"):
            assert f"{flag} {long}" in result.output


@pytest.mark.parametrize("flag", ["-V", "--version"])
def test_version(flag):
    result = runner.invoke(app, [flag])
    assert result.exit_code == 0
    assert result.stdout.startswith(f"rocmforge {version('rocmforge')}")


def one_error_line(result) -> str:
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    return lines[0]


@pytest.mark.parametrize("command", ["generate", "serve", "bench", "leak-check", "serve-leak-check", "profile-kv"])
@pytest.mark.parametrize("args", [["-ngl", "99"], ["--n-gpu-layers", "99"], ["-fa", "on"], ["--mlock"], ["--no-mmap"],
                                  ["-ub", "512"], ["--numa", "distribute"], ["-ctk", "q8_0"]])
def test_a_llama_cpp_flag_with_no_meaning_is_one_line_and_exit_2(command, args):
    result = runner.invoke(app, [command, *args, "-m", "missing.gguf"])
    assert result.exit_code == 2
    assert one_error_line(result) == f"error: {args[0]}: {NO_MEANING[args[0]]}"


def test_the_ngl_line_says_what_to_do():
    result = runner.invoke(app, ["generate", "-ngl", "99", "hello"])
    assert one_error_line(result) == "error: -ngl: every layer runs on the GPU here; drop the flag"


@pytest.mark.parametrize("flag", ["-cram", "--cache-ram", "--cache-reuse"])
def test_the_prompt_cache_flags_point_at_prefix_caching(flag):
    """serve caches prompts' prefixes (on by default): the line says so rather than that there is no cache."""
    result = runner.invoke(app, ["serve", flag, "8192", "-m", "missing.gguf"])
    assert result.exit_code == 2
    line = one_error_line(result)
    assert "--no-prefix-cache" in line and "no prompt cache" not in line


@pytest.mark.parametrize("args, words", [
    (["generate", "-nx", "3"], "-nx: no such option for generate (not -n with the value 'x'"),
    (["serve", "-cgarbage"], "-cgarbage: no such option for serve (not -c with the value 'garbage'"),
    (["leak-check", "-n", "5"], "--requests N"),
    (["leak-check", "-p", "4"], "-np/--parallel"),
    (["serve-leak-check", "-n", "5"], "--requests N"),
    (["profile-kv", "-p", "Llama-2-70B"], "--preset NAME"),
])
def test_letters_after_one_dash_and_retired_flags_are_never_misread(args, words):
    result = runner.invoke(app, args)
    assert result.exit_code == 2
    assert words in one_error_line(result)


def test_a_value_that_looks_like_a_flag_is_left_to_its_option():
    # --stop takes "-ngl" as its text: the check skips an option's value (here --help then ends the parse)
    result = runner.invoke(app, ["generate", "--stop", "-ngl", "--help"])
    assert result.exit_code == 0, result.stderr


def test_every_command_checks_its_flags():
    assert all(isinstance(command, FlagCheckedCommand) for _, command in ALL)
    assert set(RETIRED) <= {" ".join(path) for path, _ in ALL}


@pytest.mark.parametrize("args, words", [
    (["generate", "-n", "x", "hi"], "Invalid value for '--max-tokens'"),
    (["bench", "--no-such-option"], "No such option: --no-such-option"),
    (["generate", "--stop"], "Option '--stop' requires an argument"),
    (["kernels", "build", "-j", "0"], "--jobs"),
    (["inspect", "--no-such[bold]x"], "--no-such[bold]x"),  # the user's words as typed, not as markup
])
def test_clicks_own_usage_errors_are_one_line_and_exit_2(args, words):
    result = runner.invoke(app, args)
    assert result.exit_code == 2
    line = one_error_line(result)
    assert words in line and line.endswith(f"(see rocmforge {' '.join(args[:2] if args[0] == 'kernels' else args[:1])} -h)")


@pytest.mark.parametrize("args, words", [
    (["-ngl", "99", "generate"], "error: -ngl: every layer runs on the GPU here; drop the flag"),
    (["no-such-command"], "error: No such command 'no-such-command'. (see rocmforge -h)"),
    (["kernels", "no-such"], "error: No such command 'no-such'. (see rocmforge kernels -h)"),
    (["--bogus", "generate"], "error: No such option: --bogus (see rocmforge -h)"),
])
def test_the_groups_errors_are_one_line_too(args, words):
    result = runner.invoke(app, args)
    assert result.exit_code == 2 and one_error_line(result) == words


def test_a_group_without_a_command_shows_its_help():
    result = runner.invoke(app, ["kernels"])
    assert "build" in result.output and "list" in result.output and "error:" not in result.output
