"""Tool calls through the official OpenAI client against a live server (cpu backend): tiny random qwen2 and qwen3
models carrying Qwen2.5's and Qwen3's real chat templates (tests/support/templates), which render the tools and
the tool results; calls forced by tool_choice come out valid even from random weights; a model whose template has
no tools (the demo model's) is a 400."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import openai
import pytest

from support.family_models import FAMILY_MODELS
from support.gguf_factory import write_tiny_llama
from support.serve_testing import MODEL_NAME, live_server, tool_round
from support.engine_testing import tiny_model

from hipcore.gguf.file import GGUFFile
from hipcore.tokenizer.chat_template import chat_template_from_metadata
from rocmforge_serve.tool_calls import HERMES, LLAMA3, parse_calls, tool_format

TEMPLATES = Path(__file__).parent / "support" / "templates"
WEATHER = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12},
                                            "unit": {"enum": ["C", "F"]}},
           "required": ["city", "unit"], "additionalProperties": False}
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city", "parameters": WEATHER}},
    {"type": "function", "function": {"name": "add", "description": "Add two integers", "parameters": {
        "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["a", "b"],
        "additionalProperties": False}}},
]
SCHEMAS = {tool["function"]["name"]: tool["function"]["parameters"] for tool in TOOLS}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module", params=[("qwen2-f32", "qwen2.5-instruct.jinja"), ("qwen3-f32", "qwen3.jinja")],
                ids=["qwen2", "qwen3"])
def client(request, tmp_path_factory):
    family, template = request.param
    path = tmp_path_factory.mktemp("tools") / f"{family}.gguf"
    # a context of 2,048: the templates' tool preamble alone is ~900 tokens of the tiny byte-level vocabulary
    write_tiny_llama(path, **{**FAMILY_MODELS[family], "context": 2048},
                     extra_metadata={"tokenizer.chat_template": (TEMPLATES / template).read_text(encoding="utf-8")})
    with live_server(path, max_seqs=4, kv_blocks=320, max_step_tokens=512) as server:
        yield openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=60)


def _valid_call(call) -> dict:
    arguments = json.loads(call.function.arguments)
    jsonschema.validate(arguments, SCHEMAS[call.function.name])
    assert call.type == "function" and call.id.startswith("call_")
    return arguments


@pytest.mark.parametrize("seed", [1, 2])
def test_named_tool_choice_gives_a_call_whose_arguments_validate(client, seed):
    reply = client.chat.completions.create(model=MODEL_NAME, messages=ASK, tools=TOOLS, max_tokens=160, seed=seed,
                                           tool_choice={"type": "function", "function": {"name": "get_weather"}})
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls", choice.message
    [call] = choice.message.tool_calls
    assert call.function.name == "get_weather"
    _valid_call(call)


def test_required_gives_a_call_of_one_of_the_tools(client):
    reply = client.chat.completions.create(model=MODEL_NAME, messages=ASK, tools=TOOLS, tool_choice="required",
                                           max_tokens=160, seed=3)
    [call] = reply.choices[0].message.tool_calls
    assert call.function.name in SCHEMAS
    _valid_call(call)


def test_tool_loop_call_then_result_then_answer(client):
    """call -> tool result (role "tool") -> an answer, the tool result rendered by the model's template."""
    first = client.chat.completions.create(model=MODEL_NAME, messages=ASK, tools=TOOLS, tool_choice="required",
                                           max_tokens=160, seed=5)
    call = first.choices[0].message.tool_calls[0]
    _valid_call(call)
    messages = ASK + tool_round(call, '{"temperature": 21, "sky": "clear"}')
    # auto, 8 tokens: too few for a whole <tool_call>...</tool_call>, so the answer is content
    second = client.chat.completions.create(model=MODEL_NAME, messages=messages, tools=TOOLS, max_tokens=8,
                                            temperature=0)
    answer = second.choices[0]
    assert answer.message.tool_calls is None and isinstance(answer.message.content, str)
    assert answer.finish_reason in ("stop", "length")
    # the call and the tool's result are in the prompt: it is longer than the question's by at least their text
    assert second.usage.prompt_tokens > first.usage.prompt_tokens + len('{"temperature": 21, "sky": "clear"}') // 4


def test_streamed_call_comes_as_tool_calls_deltas(client):
    stream = client.chat.completions.create(model=MODEL_NAME, messages=ASK, tools=TOOLS, max_tokens=160, seed=7,
                                            stream=True, tool_choice={"type": "function", "function": {"name": "add"}})
    chunks = [c for c in stream if c.choices]
    deltas = [c.choices[0].delta.tool_calls for c in chunks if c.choices[0].delta.tool_calls]
    assert len(deltas) == 1 and deltas[0][0].index == 0 and deltas[0][0].function.name == "add"
    _valid_call(deltas[0][0])
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


def test_auto_leaves_a_non_call_answer_as_content(client):
    reply = client.chat.completions.create(model=MODEL_NAME, messages=ASK, tools=TOOLS, max_tokens=12, temperature=0)
    message = reply.choices[0].message
    if message.tool_calls:  # a random model may; then it is a valid call
        _valid_call(message.tool_calls[0])
    else:
        assert isinstance(message.content, str) and reply.choices[0].finish_reason in ("stop", "length")


def test_bad_tool_requests_are_400s(client):
    for kwargs, param in [
        ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
        ({"tools": [{"type": "retrieval"}]}, "tools[0]"),
        ({"tools": TOOLS, "tool_choice": "required", "response_format": {"type": "json_object"}}, "tool_choice"),
    ]:
        with pytest.raises(openai.BadRequestError) as caught:
            client.chat.completions.create(model=MODEL_NAME, messages=ASK, max_tokens=4, **kwargs)
        assert caught.value.body["param"] == param, caught.value.body


def test_a_template_without_tools_is_a_clear_400(tmp_path_factory):
    with live_server(tiny_model(tmp_path_factory), max_seqs=2) as server:  # plain ChatML: no tools in it
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=60)
        with pytest.raises(openai.BadRequestError) as caught:
            client.chat.completions.create(model=MODEL_NAME, messages=ASK, tools=TOOLS, max_tokens=4)
        assert "no tool support" in caught.value.body["message"] and caught.value.body["param"] == "tools"
        # tool_choice "none" needs no tool format: the request is served
        reply = client.chat.completions.create(model=MODEL_NAME, messages=ASK, tools=TOOLS, tool_choice="none",
                                               max_tokens=3)
        assert reply.choices[0].finish_reason == "length"


def test_the_demo_models_template_has_no_tool_format(demo_model_path):
    with GGUFFile.open(str(demo_model_path)) as gguf:
        assert tool_format(chat_template_from_metadata(gguf.metadata)) is None
    assert tool_format((TEMPLATES / "qwen3.jinja").read_text(encoding="utf-8")) == HERMES


def test_calls_parsed_in_each_familys_format():
    content, calls = parse_calls(HERMES, 'Sure.\n<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n'
                                         '</tool_call>', TOOLS)
    assert content == "Sure." and json.loads(calls[0]["function"]["arguments"]) == {"a": 1, "b": 2}
    content, calls = parse_calls(LLAMA3, '<|python_tag|>{"name": "add", "parameters": {"a": 3, "b": 4}}', TOOLS)
    assert content is None and calls[0]["function"]["name"] == "add"
    for fmt, text in [(HERMES, '<tool_call>{"name": "unknown", "arguments": {}}</tool_call>'),
                      (HERMES, "<tool_call>not json</tool_call>"), (LLAMA3, "The answer is 7.")]:
        assert parse_calls(fmt, text, TOOLS) == (text, [])


def test_auto_streams_text_that_is_no_call_as_it_comes(client):
    """With tools and tool_choice auto, content that cannot begin a call is not held to the end: several content
    deltas, which rebuild the whole answer."""
    kwargs = dict(model=MODEL_NAME, messages=ASK, tools=TOOLS, max_tokens=24, temperature=0)
    whole = client.chat.completions.create(**kwargs).choices[0].message
    assert not whole.tool_calls
    parts = [c.choices[0].delta.content for c in client.chat.completions.create(stream=True, **kwargs)
             if c.choices and c.choices[0].delta.content]
    assert "".join(parts) == whole.content and len(parts) > 3, parts


def test_call_watcher_holds_what_may_be_a_call():
    from rocmforge_serve.tool_calls import CallWatcher

    hermes = CallWatcher(HERMES, forced=False)
    assert [hermes.feed(p) for p in ["Let me", " check <tool", "_call>\\n{", "}"]] == ["Let me", " check ", "", ""]
    assert hermes.rest() == "<tool_call>\\n{}"
    llama = CallWatcher(LLAMA3, forced=False)
    assert [llama.feed(p) for p in ["  ", '{"name"', ": 1}"]] == ["", "", ""] and llama.rest() == '  {"name": 1}'
    prose = CallWatcher(LLAMA3, forced=False)
    assert [prose.feed(p) for p in [" It", " is"]] == [" It", " is"] and prose.rest() == ""
    assert CallWatcher(HERMES, forced=True).feed("text") == ""


def _tokens(entries) -> list[tuple]:
    return [(e.token, e.logprob, tuple((t.token, t.logprob) for t in e.top_logprobs)) for e in entries]


def _text(entries) -> str:
    return bytes(b for e in entries for b in e.bytes).decode("utf-8", "replace")


def test_a_calls_logprobs_cover_every_token_whole_and_streamed(client):
    """logprobs with a tool call: the tokens of the call itself are in choices[].logprobs.content (as llama-server and
    vLLM report them), and the stream carries the same entries, the call's with its tool_calls delta."""
    kwargs = dict(model=MODEL_NAME, messages=ASK, tools=TOOLS, max_tokens=160, seed=4, logprobs=True, top_logprobs=3,
                  tool_choice={"type": "function", "function": {"name": "get_weather"}})
    whole = client.chat.completions.create(**kwargs)
    choice = whole.choices[0]
    [call] = choice.message.tool_calls
    entries = choice.logprobs.content
    assert choice.finish_reason == "tool_calls" and len(entries) == whole.usage.completion_tokens
    _, [parsed] = parse_calls(HERMES, _text(entries), TOOLS)  # the generated text, call and all
    assert parsed["function"]["name"] == call.function.name == "get_weather"
    assert json.loads(parsed["function"]["arguments"]) == _valid_call(call)
    for entry in entries:
        tops = [t.logprob for t in entry.top_logprobs]
        assert 1 <= len(tops) <= 3 and tops == sorted(tops, reverse=True) and entry.logprob <= 0
    chunks = [c for c in client.chat.completions.create(stream=True, **kwargs) if c.choices]
    streamed = [e for c in chunks if c.choices[0].logprobs for e in c.choices[0].logprobs.content]
    assert _tokens(streamed) == _tokens(entries)
    [call_chunk] = [c for c in chunks if c.choices[0].delta.tool_calls]
    assert "get_weather" in _text(call_chunk.choices[0].logprobs.content)


def test_streamed_content_beside_tools_carries_its_tokens_logprobs(client):
    """tool_choice auto, an answer that is no call: each content chunk carries the logprobs of the tokens whose text
    it releases; together they are the whole answer's, in order."""
    kwargs = dict(model=MODEL_NAME, messages=ASK, tools=TOOLS, max_tokens=24, temperature=0, logprobs=True,
                  top_logprobs=2)
    whole = client.chat.completions.create(**kwargs).choices[0]
    assert not whole.message.tool_calls and len(whole.logprobs.content) == 24
    chunks = [c.choices[0] for c in client.chat.completions.create(stream=True, **kwargs) if c.choices]
    with_text = [c for c in chunks if c.delta.content]
    assert len(with_text) > 3 and all(c.logprobs and c.logprobs.content for c in with_text)
    streamed = [e for c in chunks if c.logprobs for e in c.logprobs.content]
    assert _tokens(streamed) == _tokens(whole.logprobs.content)
    assert "".join(c.delta.content for c in with_text) == whole.message.content
