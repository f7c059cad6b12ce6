"""Tool calls through Meta's own Llama 3.1 Instruct chat template (tests/support/templates/llama3.1-instruct.jinja:
the "chat_template" of meta-llama/Llama-3.1-8B-Instruct's tokenizer_config.json, byte for byte), served on the cpu
backend and driven by the official OpenAI client. The model is a tiny random llama whose vocabulary carries Llama
3's special tokens (<|begin_of_text|> as BOS, which the tokenizer adds as Meta's GGUFs say, <|eot_id|> as EOS, the
header and <|python_tag|> tokens), so the prompt splits on them as a real Llama 3.1's does.

  - the prompt the server renders for a request with tools and a tool result is the template's own rendering in
    plain jinja2 (transformers' settings) of the same conversation: the tools in the first user message, the call
    as {"name": ..., "parameters": ...}, the result as an ipython turn; one BOS, not the template's and the
    tokenizer's;
  - tool_choice "required" and a named function give Llama 3.1's JSON call, whose arguments validate against the
    function's schema, as OpenAI tool_calls, whole and streamed;
  - a call -> tool result -> next request loop renders and is served.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import jinja2
import jsonschema
import openai
import pytest

from support.gguf_factory import write_tiny_llama
from support.gguf_vocab import TOKEN_CONTROL, gpt2_vocab
from support.serve_testing import MODEL_NAME, live_server, tool_round

import rocmforge_serve.generation as generation
from rocmforge_serve.tool_calls import HERMES, LLAMA3, tool_format

TEMPLATE = (Path(__file__).parent / "support" / "templates" / "llama3.1-instruct.jinja").read_text(encoding="utf-8")
TEMPLATE_SHA256 = "e10ca381b1ccc5cf9db52e371f3b6651576caee0a630b452e2816b2d404d4b65"
LLAMA3_SPECIALS = ("<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>",
                   "<|eom_id|>", "<|python_tag|>")
VOCAB = 384
BOS, EOT = "<|begin_of_text|>", "<|eot_id|>"
WEATHER = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12},
                                            "unit": {"enum": ["C", "F"]}},
           "required": ["city", "unit"], "additionalProperties": False}
# bounded: a random model's digits would otherwise run on to max_tokens
NUMBER = {"type": "integer", "minimum": -999, "maximum": 999}
ADD = {"type": "object", "properties": {"a": NUMBER, "b": NUMBER}, "required": ["a", "b"],
       "additionalProperties": False}
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
                                      "parameters": WEATHER}},
    {"type": "function", "function": {"name": "add", "description": "Add two integers", "parameters": ADD}},
]
SCHEMAS = {tool["function"]["name"]: tool["function"]["parameters"] for tool in TOOLS}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
RESULT = '{"temperature": 21, "sky": "clear"}'


def write_llama31(path: Path) -> Path:
    """A tiny llama with Llama 3.1's template and special tokens (the byte-level BPE of the other tiny models)."""
    tokens, types, merges = gpt2_vocab(VOCAB - len(LLAMA3_SPECIALS))
    tokens = [*tokens, *LLAMA3_SPECIALS]
    types = [*types, *[TOKEN_CONTROL] * len(LLAMA3_SPECIALS)]
    # a context of 4,096: the two tools and the template's preamble are ~1,600 tokens of the tiny vocabulary
    return write_tiny_llama(path, vocab=VOCAB, context=4096, tied=False, logit_scale=6.0, seed=41, extra_metadata={
        "tokenizer.ggml.pre": "llama-bpe", "tokenizer.ggml.tokens": tokens, "tokenizer.ggml.token_type": types,
        "tokenizer.ggml.merges": merges, "tokenizer.ggml.bos_token_id": tokens.index(BOS),
        "tokenizer.ggml.eos_token_id": tokens.index(EOT), "tokenizer.ggml.padding_token_id": None,
        "tokenizer.ggml.add_bos_token": True, "tokenizer.chat_template": TEMPLATE})


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    path = write_llama31(tmp_path_factory.mktemp("llama31") / "llama31.gguf")
    with live_server(path, max_seqs=2, kv_blocks=400, max_step_tokens=512) as server:
        yield server


@pytest.fixture(scope="module")
def client(live):
    return openai.OpenAI(base_url=live.url + "/v1", api_key="unused", max_retries=0, timeout=120)


@pytest.fixture
def rendered(monkeypatch):
    """(text, ids) of each prompt the server tokenizes: what its renderer gave, and the ids it computes."""
    prompts = []

    def recording(tokenizer, text):
        ids = encode_chat(tokenizer, text)
        prompts.append((text, ids))
        return ids

    encode_chat = generation.encode_chat
    monkeypatch.setattr(generation, "encode_chat", recording)
    return prompts


def reference_render(messages: list[dict], tools: list[dict] | None) -> str:
    """The template by itself: plain jinja2 with transformers' chat-template settings (trim_blocks, lstrip_blocks,
    loop controls, raise_exception, a tojson that keeps key order and non-ASCII text), as apply_chat_template
    renders it with add_generation_prompt."""
    def raise_exception(message):
        raise jinja2.TemplateError(message)

    def tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    env = jinja2.Environment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = tojson
    context = {"messages": messages, "bos_token": BOS, "eos_token": EOT, "add_generation_prompt": True}
    if tools is not None:
        context["tools"] = tools
    return env.from_string(TEMPLATE).render(raise_exception=raise_exception, **context)


def hf_messages(messages: list[dict]) -> list[dict]:
    """The conversation as transformers' apply_chat_template takes it: a call's arguments as an object."""
    out = []
    for message in messages:
        if message.get("tool_calls"):
            calls = [{**c, "function": {**c["function"], "arguments": json.loads(c["function"]["arguments"])}}
                     for c in message["tool_calls"]]
            message = {"role": message["role"], "tool_calls": calls}
        out.append(message)
    return out


def assert_rendered_as_template(live, served: tuple[str, list[int]], messages: list[dict],
                                tools: list[dict] | None) -> str:
    """The server's prompt is the template's own rendering, and its ids are that rendering's with one BOS (the
    template's and the tokenizer's are one) and the markers as the model's special tokens."""
    text, ids = served
    expected = reference_render(hf_messages(messages), tools)
    assert expected.startswith(BOS)
    assert text == expected, (text, expected)
    tokenizer = live.server.served.tokenizer
    assert ids == tokenizer.encode(expected, add_bos=False)  # the template's BOS, parsed as the special token
    assert ids.count(tokenizer.bos_id) == 1
    return expected


def raw_answer(live) -> str:
    """The model's own text of the request that ended last, as the engine recorded it, before the server turned
    it into tool_calls."""
    return live.server.loaded.engine.finished_records()[-1].texts[0]


def assert_llama31_call(raw: str, name: str | None = None) -> dict:
    """Llama 3.1's JSON call: the whole answer is {"name": ..., "parameters": {...}}, its arguments valid."""
    call = json.loads(raw)
    assert set(call) == {"name", "parameters"}, raw
    assert call["name"] in SCHEMAS and (name is None or call["name"] == name), raw
    jsonschema.validate(call["parameters"], SCHEMAS[call["name"]])
    return call


def valid_tool_call(call, raw_call: dict | None = None) -> dict:
    assert call.type == "function" and call.id.startswith("call_")
    arguments = json.loads(call.function.arguments)
    jsonschema.validate(arguments, SCHEMAS[call.function.name])
    if raw_call is not None:
        assert (call.function.name, arguments) == (raw_call["name"], raw_call["parameters"])
    return arguments


def test_the_template_is_metas_and_read_as_llama31s_call_format():
    assert hashlib.sha256(TEMPLATE.encode()).hexdigest() == TEMPLATE_SHA256  # unedited (templates/README.md)
    assert tool_format(TEMPLATE) == LLAMA3


def test_tools_and_a_tool_result_render_as_the_template_renders_them(live, client, rendered):
    """The whole conversation of a tool loop (question, call, result) with two tools: the server's prompt is the
    template's, the tools as JSON in the first user message, the call as Llama 3.1's JSON, the result as ipython."""
    arguments = '{"city": "Paris", "unit": "C"}'
    messages = ASK + [
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": arguments}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": RESULT},
    ]
    reply = client.chat.completions.create(model=MODEL_NAME, messages=messages, tools=TOOLS, max_tokens=4,
                                           temperature=0)
    [served] = rendered
    expected = assert_rendered_as_template(live, served, messages, TOOLS)
    user_turn = expected.split("<|start_header_id|>user<|end_header_id|>\n\n", 1)[1].split(EOT, 1)[0]
    for tool in TOOLS:
        assert json.dumps(tool, indent=4) in user_turn
    assert user_turn.endswith(ASK[0]["content"])
    assert ('<|start_header_id|>assistant<|end_header_id|>\n\n{"name": "get_weather", "parameters": '
            '{"city": "Paris", "unit": "C"}}<|eot_id|>') in expected
    assert "<|start_header_id|>ipython<|end_header_id|>\n\n" + json.dumps(RESULT) + EOT in expected
    assert reply.usage.prompt_tokens == len(served[1])


def test_without_tools_the_template_renders_no_tool_preamble(live, client, rendered):
    client.chat.completions.create(model=MODEL_NAME, messages=ASK, max_tokens=2, temperature=0)
    [served] = rendered
    assert_rendered_as_template(live, served, ASK, None)
    assert "Environment: ipython" not in served[0] and "Given the following functions" not in served[0]


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "add"}}],
                         ids=["required", "named"])
def test_forced_call_is_llama31_json_whose_arguments_validate(live, client, rendered, choice):
    reply = client.chat.completions.create(model=MODEL_NAME, messages=ASK, tools=TOOLS, tool_choice=choice,
                                           max_tokens=120, seed=11)
    answer = reply.choices[0]
    assert answer.finish_reason == "tool_calls", answer
    raw_call = assert_llama31_call(raw_answer(live), None if choice == "required" else "add")
    [call] = answer.message.tool_calls
    valid_tool_call(call, raw_call)
    assert answer.message.content is None
    assert_rendered_as_template(live, rendered[0], ASK, TOOLS)


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "get_weather"}}],
                         ids=["required", "named"])
def test_streamed_forced_call_comes_as_tool_calls_deltas(live, client, choice):
    stream = client.chat.completions.create(model=MODEL_NAME, messages=ASK, tools=TOOLS, tool_choice=choice,
                                            max_tokens=120, seed=13, stream=True)
    chunks = [c for c in stream if c.choices]
    deltas = [c.choices[0].delta.tool_calls for c in chunks if c.choices[0].delta.tool_calls]
    assert len(deltas) == 1 and len(deltas[0]) == 1 and deltas[0][0].index == 0, deltas
    raw_call = assert_llama31_call(raw_answer(live), None if choice == "required" else "get_weather")
    valid_tool_call(deltas[0][0], raw_call)
    assert not any(c.choices[0].delta.content for c in chunks)
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


def test_tool_loop_call_then_result_then_next_request(live, client, rendered):
    """call (forced) -> the client runs it and sends the result as role "tool" -> the next request renders the call
    and the result (an ipython turn) as the template does, and is served; then a follow-up question after the
    answer renders too."""
    first = client.chat.completions.create(model=MODEL_NAME, messages=ASK, tools=TOOLS, tool_choice="required",
                                           max_tokens=120, seed=17)
    call = first.choices[0].message.tool_calls[0]
    valid_tool_call(call)
    messages = ASK + tool_round(call, RESULT)
    second = client.chat.completions.create(model=MODEL_NAME, messages=messages, tools=TOOLS, max_tokens=6,
                                            temperature=0)
    answer = second.choices[0]
    assert answer.finish_reason in ("stop", "length", "tool_calls")
    expected = assert_rendered_as_template(live, rendered[1], messages, TOOLS)
    arguments = json.loads(call.function.arguments)
    assert (f'{{"name": "{call.function.name}", "parameters": {json.dumps(arguments)}}}{EOT}'
            "<|start_header_id|>ipython<|end_header_id|>\n\n" + json.dumps(RESULT) + EOT) in expected
    assert second.usage.prompt_tokens > first.usage.prompt_tokens
    # the answer, then a follow-up question: the whole history renders as the template renders it
    messages += [{"role": "assistant", "content": "It is 21 C and clear."},
                 {"role": "user", "content": "And in F?"}]
    third = client.chat.completions.create(model=MODEL_NAME, messages=messages, tools=TOOLS, max_tokens=2,
                                           temperature=0)
    assert third.choices[0].finish_reason in ("stop", "length", "tool_calls")
    assert_rendered_as_template(live, rendered[2], messages, TOOLS)


def test_two_calls_in_one_message_are_the_templates_400(client):
    """Llama 3.1's template raises on an assistant message with two calls: a 400 that says so, not a 500."""
    calls = [{"id": f"call_{i}", "type": "function", "function": {"name": "add", "arguments": '{"a": 1, "b": 2}'}}
             for i in range(2)]
    messages = ASK + [{"role": "assistant", "content": None, "tool_calls": calls},
                      {"role": "tool", "tool_call_id": "call_0", "content": "3"}]
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model=MODEL_NAME, messages=messages, tools=TOOLS, max_tokens=2)
    assert "only supports single tool-calls" in caught.value.body["message"], caught.value.body


def test_planted_tools_left_out_of_the_template_are_caught(live, client, rendered, monkeypatch):
    """The detector: a server that renders the conversation without its tools gives a prompt the comparison
    rejects."""
    templates = live.server.served.templates
    real_render = templates.render

    def render_without_tools(*args, tools=None, **kwargs):
        return real_render(*args, **kwargs)

    monkeypatch.setattr(templates, "render", render_without_tools)
    client.chat.completions.create(model=MODEL_NAME, messages=ASK, tools=TOOLS, max_tokens=2, temperature=0)
    with pytest.raises(AssertionError):
        assert_rendered_as_template(live, rendered[0], ASK, TOOLS)


def test_planted_wrong_family_is_caught(live, client, monkeypatch):
    """The detector: the Llama 3.1 template read as Hermes (Qwen's <tool_call>) gives an answer that is not Llama
    3.1's JSON call."""
    monkeypatch.setattr(generation, "tool_format", lambda template: HERMES)
    reply = client.chat.completions.create(model=MODEL_NAME, messages=ASK, tools=TOOLS, tool_choice="required",
                                           max_tokens=120, seed=11)
    assert reply.choices[0].finish_reason == "tool_calls"  # Hermes's call, parsed as Hermes's
    with pytest.raises((AssertionError, ValueError)):
        assert_llama31_call(raw_answer(live))
