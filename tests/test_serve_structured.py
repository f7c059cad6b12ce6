"""Structured output through the official OpenAI client against a live server (cpu backend, the tiny random model):
response_format json_object / json_schema (strict), llama.cpp's json_schema and grammar fields, and the 400s of
constraints that are not valid or not supported, each within a bounded time with the server still serving."""

from __future__ import annotations

import json
import time

import httpx
import jsonschema
import openai
import pytest

from support.engine_testing import tiny_model
from support.serve_testing import MODEL_NAME, live_server

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 8},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "kind": {"enum": ["cat", "dog"]},
        "tags": {"type": "array", "items": {"type": "boolean"}, "maxItems": 2},
    },
    "required": ["name", "age", "kind", "tags"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    with live_server(tiny_model(tmp_path_factory), max_seqs=8) as server:
        yield server


@pytest.fixture(scope="module")
def client(live):
    return openai.OpenAI(base_url=live.url + "/v1", api_key="unused", max_retries=0, timeout=60)


def _chat(client, **kwargs):
    return client.chat.completions.create(model=MODEL_NAME, messages=[{"role": "user", "content": "a pet"}], **kwargs)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_strict_json_schema_output_validates(client, seed):
    reply = _chat(client, max_tokens=80, temperature=1.0, seed=seed, response_format={
        "type": "json_schema", "json_schema": {"name": "pet", "schema": PERSON, "strict": True}})
    choice = reply.choices[0]
    assert choice.finish_reason == "stop", choice.message.content
    jsonschema.validate(json.loads(choice.message.content), PERSON)


def test_unconstrained_output_of_the_same_request_is_not_json(client):
    """The control: without response_format the random model's text does not parse, so the test above shows the
    constraint at work."""
    reply = _chat(client, max_tokens=30, temperature=1.0, seed=1)
    with pytest.raises(ValueError):
        json.loads(reply.choices[0].message.content)


def test_json_object_and_streamed_json_schema(client):
    reply = _chat(client, max_tokens=60, temperature=0.7, seed=4, response_format={"type": "json_object"})
    if reply.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(reply.choices[0].message.content), dict)
    else:  # cut by max_tokens: says so, and what came is the start of an object
        assert reply.choices[0].finish_reason == "length" and reply.choices[0].message.content.startswith("{")
    chunks = list(_chat(client, max_tokens=80, temperature=1.0, seed=5, stream=True, response_format={
        "type": "json_schema", "json_schema": {"name": "pet", "schema": PERSON, "strict": True}}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    jsonschema.validate(json.loads(text), PERSON)


def test_cut_by_max_tokens_says_length(client):
    reply = _chat(client, max_tokens=3, temperature=0, response_format={
        "type": "json_schema", "json_schema": {"name": "pet", "schema": PERSON}})
    assert reply.choices[0].finish_reason == "length"
    assert reply.choices[0].message.content.startswith('{"')


def test_llama_cpp_fields_json_schema_and_gbnf_grammar(live):
    body = {"model": MODEL_NAME, "prompt": "answer:", "max_tokens": 20, "temperature": 1.0, "seed": 9}
    out = httpx.post(live.url + "/v1/completions", json={**body, "json_schema": {"type": "array", "items": {
        "type": "integer"}, "minItems": 1, "maxItems": 3}}, timeout=60).json()
    values = json.loads(out["choices"][0]["text"])
    assert isinstance(values, list) and 1 <= len(values) <= 3 and all(isinstance(v, int) for v in values)
    out = httpx.post(live.url + "/v1/completions", json={**body, "grammar": 'root ::= ("yes" | "no") "!"'},
                     timeout=60).json()
    assert out["choices"][0]["text"] in ("yes!", "no!") and out["choices"][0]["finish_reason"] == "stop"


def test_recursive_schema_is_served(client):
    tree = {"type": "object", "properties": {"leaf": {"type": "boolean"}, "kids": {
        "type": "array", "items": {"$ref": "#"}, "maxItems": 2}}, "required": ["leaf", "kids"],
        "additionalProperties": False}
    reply = _chat(client, max_tokens=120, temperature=1.0, seed=3, response_format={
        "type": "json_schema", "json_schema": {"name": "tree", "schema": tree, "strict": True}})
    if reply.choices[0].finish_reason == "stop":
        jsonschema.validate(json.loads(reply.choices[0].message.content), tree)
    else:
        assert reply.choices[0].finish_reason == "length"


def test_a_schema_whose_recursion_never_ends_is_a_400_in_bounded_time(live):
    """A required property that refers to the whole schema has no finite instance: llguidance compiles it, then its
    parser's item limit stops it at the first token; that is the request's fault (400), and the server serves on."""
    endless = {"type": "object", "properties": {"a": {"$ref": "#"}}, "required": ["a"], "additionalProperties": False}
    started = time.perf_counter()
    reply = httpx.post(live.url + "/v1/chat/completions", json={
        "messages": [{"role": "user", "content": "x"}], "max_tokens": 24, "response_format": {
            "type": "json_schema", "json_schema": {"name": "endless", "schema": endless}}}, timeout=60)
    assert time.perf_counter() - started < 10
    assert reply.status_code == 400 and "the grammar failed" in reply.json()["error"]["message"], reply.text
    after = httpx.post(live.url + "/v1/completions", json={"prompt": "a", "max_tokens": 2}, timeout=60)
    assert after.status_code == 200


BIG_SCHEMA = {"type": "object", "properties": {f"p{i}": {"type": "string", "description": "x" * 100}
                                               for i in range(8000)}}


@pytest.mark.parametrize("extra, param, words", [
    ({"response_format": {"type": "bogus"}}, "response_format.type", "'bogus' is not supported"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}}, "response_format.json_schema",
     "must be an object with a schema"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": [1, 2]}}},
     "response_format.json_schema.schema", "must be an object"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "bogus"}}}},
     "response_format.json_schema.schema", "bogus"),
    ({"json_schema": {"type": "string", "format": "no-such-format"}}, "json_schema", "no-such-format"),
    ({"json_schema": {"type": "string", "pattern": "(?=a)b"}}, "json_schema", "look-around"),
    ({"json_schema": BIG_SCHEMA}, "json_schema", "at most 65,536"),
    ({"grammar": "root ::= missing"}, "grammar", "missing"),
    ({"grammar": 'root ::= "a" root'}, "grammar", "never accepts"),
    ({"grammar": 'root ::= item\nitem ::= "[" item "]"'}, "grammar", "never accepts"),
    ({"json_schema": False}, "json_schema", "no value matches it"),
    ({"json_schema": {"allOf": [{"type": "string"}, {"type": "integer"}]}}, "json_schema", "Unsatisfiable"),
    ({"grammar": 'root ::= "a"', "json_schema": {"type": "object"}}, "grammar", "send one"),
])
def test_bad_constraints_are_a_400_naming_them_and_the_server_serves_on(live, extra, param, words):
    started = time.perf_counter()
    reply = httpx.post(live.url + "/v1/chat/completions", json={
        "model": MODEL_NAME, "messages": [{"role": "user", "content": "x"}], "max_tokens": 4, **extra}, timeout=60)
    assert time.perf_counter() - started < 5
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert error["param"] == param and words in error["message"], error
    after = httpx.post(live.url + "/v1/completions", json={"model": MODEL_NAME, "prompt": "a", "max_tokens": 2},
                       timeout=60)
    assert after.status_code == 200


def test_constraint_and_logprobs_cross_the_http_process_pipe(tmp_path_factory):
    """With two processes (rocmforge serve's shape) the grammar compiles in the HTTP process and the engine's
    process builds its own vocabulary view; the answer still validates and its logprobs come back."""
    with live_server(tiny_model(tmp_path_factory), max_seqs=2, http_process=True) as server:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=60)
        reply = _chat(client, max_tokens=80, temperature=1.0, seed=2, logprobs=True, top_logprobs=2,
                      response_format={"type": "json_schema", "json_schema": {"name": "pet", "schema": PERSON}})
        jsonschema.validate(json.loads(reply.choices[0].message.content), PERSON)
        entries = reply.choices[0].logprobs.content
        assert len(entries) == reply.usage.completion_tokens  # (the end-of-generation token is not counted)
        assert entries[0].token == "{" and entries[0].logprob == 0.0  # the grammar allows '{' alone: probability 1
