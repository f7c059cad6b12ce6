"""Structured output on gpt-oss (harmony): a constrained chat answer is gpt-oss's final message, as the model was
trained to write it and as llama.cpp's gpt-oss handler constrains it: `<|channel|>final<|message|>` (its markers the
special tokens), then the JSON, which is the answer's content after harmony's split. Served on the cpu backend with
the tiny gpt-oss carrying llama.cpp's openai-gpt-oss-120b.jinja (tests/test_serve_tools_gpt_oss.py builds it), driven
by the official OpenAI client. A GBNF grammar constrains the raw output (llama.cpp's rule too): no header."""

from __future__ import annotations

import json

import jsonschema
import openai
import pytest

from support.serve_testing import MODEL_NAME, live_server
from test_serve_tools_gpt_oss import ASK, raw_answer, write_gpt_oss

import rocmforge_serve.generation as generation
import hipcore.engine.grammar as grammar
from hipcore.tokenizer.harmony import FINAL_HEADER, MARKERS

PET = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 8},
                                        "age": {"type": "integer", "minimum": 0, "maximum": 120},
                                        "kind": {"enum": ["cat", "dog"]}},
       "required": ["name", "age", "kind"], "additionalProperties": False}
STRICT = {"type": "json_schema", "json_schema": {"name": "pet", "schema": PET, "strict": True}}


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    path = write_gpt_oss(tmp_path_factory.mktemp("gpt_oss_json") / "gpt-oss.gguf")
    with live_server(path, max_seqs=2, kv_blocks=400, max_step_tokens=512) as server:
        yield server


@pytest.fixture(scope="module")
def client(live):
    return openai.OpenAI(base_url=live.url + "/v1", api_key="unused", max_retries=0, timeout=120)


def assert_final_message(live) -> str:
    """The last answer's generated tokens begin with the final-channel header's tokens, <|channel|> and <|message|>
    among them as the special tokens; returns the raw text after the header."""
    tokenizer = live.server.served.tokenizer
    header = tokenizer.encode(FINAL_HEADER, add_bos=False)
    for marker in ("<|channel|>", "<|message|>"):
        [marker_id] = tokenizer.encode(marker, add_bos=False)
        assert marker_id in header, (marker, header)
    [generated] = live.server.loaded.engine.finished_records()[-1].generated_tokens
    assert list(generated[:len(header)]) == header, (generated[:len(header) + 4], header)
    markers = {tokenizer.encode(marker, add_bos=False)[0] for marker in MARKERS}
    assert not markers & set(generated[len(header):]), generated  # harmony's split would cut the answer there
    raw = raw_answer(live)
    assert raw.startswith(FINAL_HEADER), raw
    return raw[len(FINAL_HEADER):]


@pytest.mark.parametrize("seed", [1, 2])
def test_strict_json_schema_is_the_final_message_and_validates(live, client, seed):
    reply = client.chat.completions.create(model=MODEL_NAME, messages=ASK, response_format=STRICT, max_tokens=80,
                                           temperature=1.0, seed=seed)
    choice = reply.choices[0]
    assert choice.finish_reason == "stop", choice.message.content
    body = assert_final_message(live)
    assert choice.message.content == body
    jsonschema.validate(json.loads(choice.message.content), PET)
    assert not getattr(choice.message, "reasoning_content", None)


def test_streamed_strict_json_schema_content_validates(live, client):
    chunks = [c for c in client.chat.completions.create(model=MODEL_NAME, messages=ASK, response_format=STRICT,
                                                         max_tokens=80, temperature=1.0, seed=3, stream=True)
              if c.choices]
    content = "".join(c.choices[0].delta.content or "" for c in chunks)
    assert chunks[-1].choices[0].finish_reason == "stop"
    assert content == assert_final_message(live)
    jsonschema.validate(json.loads(content), PET)
    assert "<|" not in content


@pytest.mark.parametrize("field", ["response_format", "json_schema"])
def test_json_object_and_llama_cpps_json_schema_field_are_the_final_message(live, client, field):
    extra = ({"response_format": {"type": "json_object"}} if field == "response_format"
             else {"extra_body": {"json_schema": PET}})
    reply = client.chat.completions.create(model=MODEL_NAME, messages=ASK, max_tokens=60, temperature=0.7, seed=9,
                                           **extra)
    choice = reply.choices[0]
    content = choice.message.content
    assert content == assert_final_message(live)
    if choice.finish_reason == "stop":  # json_object's free keys may run to max_tokens: then only the header counts
        value = json.loads(content)
        assert isinstance(value, dict)
        if field == "json_schema":
            jsonschema.validate(value, PET)
    else:
        assert field == "response_format" and content.startswith("{"), choice


def test_a_gbnf_grammar_constrains_the_raw_output(live, client):
    reply = client.chat.completions.create(model=MODEL_NAME, messages=ASK, max_tokens=8, seed=5,
                                           extra_body={"grammar": 'root ::= "yes" | "no"'})
    assert raw_answer(live) in ("yes", "no")
    assert reply.choices[0].message.content == raw_answer(live)


def test_completions_keep_the_raw_json(live, client):
    """A completion's prompt is the caller's own text, not the template's: its JSON is not wrapped."""
    reply = client.completions.create(model=MODEL_NAME, prompt="A pet:", max_tokens=80, seed=6,
                                      extra_body={"json_schema": PET})
    jsonschema.validate(json.loads(reply.choices[0].text), PET)


def test_a_bad_schema_is_a_400_as_on_other_templates(client):
    with pytest.raises(openai.BadRequestError, match="Invalid type"):
        client.chat.completions.create(model=MODEL_NAME, messages=ASK, max_tokens=8, response_format={
            "type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "strin"}}})


def test_planted_header_dropped_is_caught(live, client, monkeypatch):
    monkeypatch.setattr(generation, "FINAL_HEADER", "")
    reply = client.chat.completions.create(model=MODEL_NAME, messages=ASK, response_format=STRICT, max_tokens=80,
                                           temperature=1.0, seed=1)
    jsonschema.validate(json.loads(reply.choices[0].message.content), PET)  # the content alone does not show it
    with pytest.raises(AssertionError):
        assert_final_message(live)


def test_planted_marker_token_allowed_in_a_json_string_is_caught(live, client, monkeypatch):
    """<|end|> left an ordinary token to the grammar engine: the random model writes it inside a JSON string, where
    harmony's split cuts the answer."""
    monkeypatch.setattr(grammar, "MARKERS", tuple(marker for marker in MARKERS if marker != "<|end|>"))
    monkeypatch.setattr(grammar, "_vocabularies", {})
    client.chat.completions.create(model=MODEL_NAME, messages=ASK, max_tokens=60, temperature=0.7, seed=9,
                                   response_format={"type": "json_object"})
    with pytest.raises(AssertionError):
        assert_final_message(live)
