"""`generate --json-schema FILE` and `--grammar FILE` (GBNF): constrained decoding on the tiny random model, whose
unconstrained text is neither JSON nor the grammar's; bad files are one line and exit 2 before the model loads."""

from __future__ import annotations

import json

import jsonschema
import pytest
from typer.testing import CliRunner

from support.engine_testing import tiny_model
from test_serve_tools_gpt_oss import write_gpt_oss
from rocmforge_cli.app import app
from hipcore.gguf.file import read_plan
from hipcore.tokenizer.harmony import FINAL_HEADER
from hipcore.tokenizer.tokenizer import Tokenizer

runner = CliRunner()
SCHEMA = {"type": "object", "properties": {"ok": {"type": "boolean"}, "n": {"type": "integer", "maximum": 99}},
          "required": ["ok", "n"], "additionalProperties": False}


def generate(*args: str):
    return runner.invoke(app, ["generate", *args], env={"COLUMNS": "200"})


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> str:
    return str(tiny_model(tmp_path_factory))


@pytest.mark.parametrize("seed", ["1", "2"])
def test_json_schema_file_constrains_the_output(tiny, tmp_path, seed):
    schema = tmp_path / "schema.json"
    schema.write_text(json.dumps(SCHEMA), encoding="utf-8")
    common = ["--model", tiny, "--device", "cpu", "-n", "40", "--temp", "1", "-s", seed, "--json", "hello"]
    result = generate(*common, "--json-schema", str(schema))
    assert result.exit_code == 0, result.stderr
    out = json.loads(result.stdout)
    assert out["ending"] == "eos", out["text"]
    jsonschema.validate(json.loads(out["text"]), SCHEMA)
    free = json.loads(generate(*common).stdout)["text"]  # the control: the same run without the schema
    with pytest.raises(ValueError):
        json.loads(free)


def test_gbnf_grammar_file_constrains_the_output(tiny, tmp_path):
    grammar = tmp_path / "g.gbnf"
    grammar.write_text('root ::= ("red" | "green") " " [0-9] [0-9]?\n', encoding="utf-8")
    result = generate("--model", tiny, "--device", "cpu", "-n", "20", "--temp", "1", "-s", "4", "--json",
                      "--grammar", str(grammar), "colour:")
    assert result.exit_code == 0, result.stderr
    text = json.loads(result.stdout)["text"]
    colour, _, number = text.partition(" ")
    assert colour in ("red", "green") and number.isdigit() and len(number) <= 2, text


@pytest.mark.parametrize("name, content, words", [
    ("bad.json", '{"type": "bogus"}', "--json-schema: the JSON Schema is not supported: Invalid type: bogus"),
    ("not.json", "{nope", "is not JSON"),
    ("bad.gbnf", "root ::= undefined_rule", "--grammar: the GBNF grammar is not valid"),
])
def test_bad_constraint_files_are_one_line_and_exit_2(tiny, tmp_path, name, content, words):
    path = tmp_path / name
    path.write_text(content, encoding="utf-8")
    option = "--grammar" if name.endswith(".gbnf") else "--json-schema"
    result = generate("--model", tiny, "--device", "cpu", option, str(path), "hello")
    assert result.exit_code == 2
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and words in lines[0], result.stderr


def test_json_schema_on_gpt_oss_is_the_final_message(tmp_path):
    """With --chat on a harmony template, the JSON is gpt-oss's final message: the generated tokens begin with
    <|channel|>final<|message|>'s tokens, and the answer (after harmony's split) is the JSON alone."""
    model = write_gpt_oss(tmp_path / "gpt-oss.gguf")
    schema = tmp_path / "schema.json"
    schema.write_text(json.dumps(SCHEMA), encoding="utf-8")
    result = generate("--model", str(model), "--device", "cpu", "-n", "40", "--temp", "1", "-s", "3", "--json",
                      "--chat", "--json-schema", str(schema), "hello")
    assert result.exit_code == 0, result.stderr
    out = json.loads(result.stdout)
    jsonschema.validate(json.loads(out["text"]), SCHEMA)
    header = Tokenizer.from_metadata(read_plan(model).metadata).encode(FINAL_HEADER, add_bos=False)
    assert out["tokens"][:len(header)] == header and out["reasoning"] == "", out
