"""`rocmforge generate` through typer's CliRunner.

On the real demo model: the greedy text streamed for a prompt read from stdin is the engine's text
for the same tokens, and its tokens follow llama.cpp's greedy continuation (tests/golden) up to the
first near-tie; --chat --json renders exactly the chat prompt llama.cpp was given and prints one JSON
object with every field. On a tiny model (fast): a KV pool too small is a clear rejection; bad
options, a missing and a corrupt model file are one line on stderr with the documented exit code.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from support.engine_testing import greedy, tiny_model

from hipcore.engine.loader import LoadOptions, load_model
from rocmforge_cli.app import app

GOLDEN = json.loads((Path(__file__).parent / "golden" / "smollm2_135m_q4_1_llamacpp.json").read_text(encoding="utf-8"))
CODE, CHAT = GOLDEN["prompts"]["code"], GOLDEN["prompts"]["chat"]
TIE_MARGIN = 0.5  # tests/test_golden_llamacpp.py explains it: below this, llama.cpp disagrees with itself
CHAT_USER_MESSAGE = "Why is the sky blue? Explain it to a child."

runner = CliRunner()


def invoke(*args: str, input: str | None = None):
    return runner.invoke(app, ["generate", *args], input=input, env={"COLUMNS": "200"})


def one_error_line(result) -> str:
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    return lines[0]


def follows_llamacpp(tokens: list[int], record: dict) -> int:
    """How many leading tokens equal llama.cpp's greedy ones; at the first near-tie ours must be one
    of llama.cpp's near-tied candidates, and the comparison stops there. Returns the count checked."""
    for step, (ours, step_top) in enumerate(zip(tokens, record["greedy_step_top"])):
        ids, logits = step_top["ids"], step_top["logits"]
        if logits[0] - logits[1] < TIE_MARGIN:
            assert ours in {t for t, v in zip(ids, logits) if v > logits[0] - TIE_MARGIN}
            return step
        assert ours == record["greedy_ids"][step], f"step {step}: ours {ours}, llama.cpp {record['greedy_ids'][step]}"
    return len(tokens)


@pytest.fixture(scope="module")
def engine_code_run(demo_model_path):
    """The engine's own greedy run of the code prompt, loaded as `generate` loads by default."""
    with load_model(str(demo_model_path), LoadOptions(device="cpu")) as model:
        ids = model.tokenizer.encode(CODE["text"])
        assert ids == CODE["prompt_ids"]  # our tokenizer gives llama.cpp's prompt
        events = list(model.engine.generate(ids, greedy(4)))
    return [t for e in events for t in e.token_ids], "".join(e.text for e in events)


def test_greedy_text_from_stdin_is_the_engines_and_follows_llamacpp(engine_code_run):
    tokens, text = engine_code_run
    assert follows_llamacpp(tokens, CODE) >= 3  # the code prompt's first near-tie is at step 3
    result = invoke("--device", "cpu", "--temp", "0", "-n", "4", "-q", input=CODE["text"])
    assert result.exit_code == 0, result.stderr
    assert result.stdout == text + "\n"
    assert result.stderr == ""  # -q: no progress, no timings


def test_chat_json_has_every_field_and_llamacpps_prompt():
    result = invoke("--device", "cpu", "--chat", "--temp", "0", "-n", "1", "--json", CHAT_USER_MESSAGE)
    assert result.exit_code == 0, result.stderr
    assert result.stderr == ""  # --json: the result alone, nothing on stderr
    (line,) = result.stdout.splitlines()
    out = json.loads(line)
    assert set(out) == {"model", "device", "prompt", "prompt_tokens", "text", "tokens", "ending", "seed", "seed_drawn",
                        "timings", "memory"}
    assert out["prompt"] == CHAT["text"] and out["prompt_tokens"] == len(CHAT["prompt_ids"])  # the default system prompt
    assert out["tokens"] == CHAT["greedy_ids"][:1] and out["text"] == "The"  # llama.cpp's first token, margin 0.6
    assert out["ending"] == "length" and isinstance(out["seed"], int) and out["seed_drawn"] is True  # repeatable
    assert Path(out["model"]).name == "SmolLM2-135M-Instruct.Q4_1.gguf" and out["device"].startswith("cpu")
    timings = out["timings"]
    assert timings["prompt_tokens"] == 42 and timings["generated_tokens"] == 1
    assert all(timings[k] >= 0 for k in ("load_ms", "prompt_ms", "eval_ms", "total_ms"))


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> str:
    return str(tiny_model(tmp_path_factory))


def test_a_kv_pool_too_small_is_a_clear_rejection(tiny):
    result = invoke("--model", tiny, "--device", "cpu", "--kv-blocks", "1", "-n", "40", "--temp", "0", "-q", "hello")
    assert result.exit_code == 2
    line = one_error_line(result)
    assert "needs 3 KV blocks" in line and "only 1" in line and "--kv-blocks" in line


def test_tiny_model_json_run(tiny):
    result = invoke("--model", tiny, "--device", "cpu", "--temp", "0", "-n", "5", "--json", "--seed", "3", "hello")
    assert result.exit_code == 0, result.stderr
    out = json.loads(result.stdout)
    assert len(out["tokens"]) == 5 and out["ending"] == "length" and out["seed"] == 3 and out["model"] == tiny


@pytest.mark.parametrize("args, words", [
    (["--temp", "-1"], "--temp"),
    (["-n", "0"], "--max-tokens/-n"),
    (["--top-p", "2"], "--top-p"),
    (["--repeat-last-n", "-2"], "--repeat-last-n"),
    (["--kv-dtype", "q9"], "KV dtype"),
    (["--ctx-size", "0"], "--ctx-size"),
    (["--ctx-size", "100000"], "--ctx-size"),
    (["--kv-blocks", "0"], "--kv-blocks"),
    (["--kv-blocks", "134217727"], "--kv-blocks must be at most 134,217,726"),  # block 0 comes on top
    (["--kv-blocks", "3", "--kv-memory", "1G"], "either --kv-blocks or --kv-memory"),
    (["--kv-memory", "lots"], "memory size"),
    (["--device", "tpu"], "unknown device"),
])
def test_bad_options_are_one_line_and_exit_2(tiny, args, words):
    result = invoke("--model", tiny, "-q", *args, "hello")
    assert result.exit_code == 2
    assert words in one_error_line(result)


def test_an_unknown_option_exits_2_and_names_it(tiny):
    result = invoke("--model", tiny, "--bogus", "hello")
    assert result.exit_code == 2 and "--bogus" in result.output


def test_an_empty_prompt_on_stdin_is_refused(tiny):
    result = invoke("--model", tiny, "-q", input="")
    assert result.exit_code == 2 and "prompt is empty" in one_error_line(result)


def test_a_missing_model_file(tmp_path):
    missing = tmp_path / "nope.gguf"
    result = invoke("--model", str(missing), "hello")
    assert result.exit_code in (2, 3)
    line = one_error_line(result)
    assert str(missing) in line and "No such file" in line


@pytest.mark.parametrize("content", [b"\x90\x22OW not a model" * 20, b"GGUF\x03\x00\x00\x00"])
def test_a_corrupt_model_file_exits_3(tmp_path, content):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(content)
    result = invoke("--model", str(bad), "hello")
    assert result.exit_code == 3
    assert "invalid model file" in one_error_line(result)
