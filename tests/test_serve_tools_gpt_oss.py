"""Tool calls through gpt-oss's own chat template (tests/support/templates/openai-gpt-oss-120b.jinja, as llama.cpp ships
it), served on the cpu backend and driven by the official OpenAI client. The model is the tiny random gpt-oss of
tests/support/moe_models.py with a vocabulary that carries harmony's special tokens (<|start|>, <|channel|>,
<|message|>, <|constrain|>, <|end|>, and <|return|> / <|call|>, which end generation), so the prompt splits on them as
a real gpt-oss's does.

  - the prompt the server renders for a request with tools and a tool result is the template's own rendering in plain
    jinja2 of the same conversation: the tools as a TypeScript namespace in the developer message, the call as a
    commentary message to functions.NAME, the result as a message from functions.NAME to the assistant;
  - with tool_choice "auto" a call in any of harmony's header forms is read (a planted answer: the random model does
    not write one), its analysis text as reasoning_content, whole and streamed;
  - tool_choice "required" and a named function give gpt-oss's call message, whose arguments validate against the
    function's schema, as OpenAI tool_calls, whole and streamed;
  - a call -> tool result -> next request loop renders and is served.
"""

from __future__ import annotations

import datetime
import hashlib
import json
from dataclasses import replace
from pathlib import Path

import jinja2
import jsonschema
import openai
import pytest

from support.gguf_factory import write_gguf
from support.gguf_vocab import TOKEN_CONTROL, gpt2_vocab
from support.moe_models import moe_spec
from support.serve_testing import MODEL_NAME, live_server, tool_round

import rocmforge_serve.generation as generation
from hipcore.engine.request import Ending, Event
from rocmforge_serve.harmony_calls import HarmonyCallWatcher, parse
from rocmforge_serve.tool_calls import HARMONY, LLAMA3, new_call, tool_format

TEMPLATE = (Path(__file__).parent / "support" / "templates" / "openai-gpt-oss-120b.jinja").read_text(encoding="utf-8")
TEMPLATE_SHA256 = "a4c9919cbbd4acdd51ccffe22da049264b1b73e59055fa58811a99efbd7c8146"
HARMONY_SPECIALS = ("<|startoftext|>", "<|return|>", "<|constrain|>", "<|channel|>", "<|start|>", "<|end|>",
                    "<|message|>", "<|call|>")
VOCAB = 384
WEATHER = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12},
                                            "unit": {"enum": ["C", "F"]}},
           "required": ["city", "unit"], "additionalProperties": False}
NUMBER = {"type": "integer", "minimum": -999, "maximum": 999}  # bounded: random digits would run to max_tokens
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
# gpt-oss's call as it writes one, and the header forms llama.cpp's parser also reads
PLANTED = {
    "channel_header": ('<|channel|>analysis<|message|>Need the weather.<|end|><|start|>assistant<|channel|>commentary '
                       'to=functions.get_weather <|constrain|>json<|message|>{"city": "Paris", "unit": "C"}'),
    "no_constrain": '<|channel|>commentary to=functions.get_weather<|message|>{"city": "Paris", "unit": "C"}',
    "role_header": ('<|channel|>analysis<|message|>Need the weather.<|end|><|start|>assistant to=functions.get_weather'
                    '<|channel|>commentary json<|message|>{"city": "Paris", "unit": "C"}'),
}


def write_gpt_oss(path: Path) -> Path:
    """The tiny gpt-oss with harmony's special tokens and the real template (a context of 4,096: the template's
    preamble and the two tools are ~500 tokens of the tiny vocabulary)."""
    tokens, types, merges = gpt2_vocab(VOCAB - len(HARMONY_SPECIALS))
    tokens = [*tokens, *HARMONY_SPECIALS]
    types = [*types, *[TOKEN_CONTROL] * len(HARMONY_SPECIALS)]
    return write_gguf(path, moe_spec("gpt-oss-f16", vocab=VOCAB, context=4096, extra_metadata={
        "tokenizer.ggml.tokens": tokens, "tokenizer.ggml.token_type": types, "tokenizer.ggml.merges": merges,
        "tokenizer.ggml.bos_token_id": tokens.index("<|startoftext|>"),
        "tokenizer.ggml.eos_token_id": tokens.index("<|return|>"), "tokenizer.ggml.padding_token_id": None,
        "tokenizer.ggml.add_bos_token": False, "tokenizer.chat_template": TEMPLATE}))


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    path = write_gpt_oss(tmp_path_factory.mktemp("gpt_oss") / "gpt-oss.gguf")
    with live_server(path, max_seqs=2, kv_blocks=400, max_step_tokens=512) as server:
        yield server


@pytest.fixture(scope="module")
def client(live):
    return openai.OpenAI(base_url=live.url + "/v1", api_key="unused", max_retries=0, timeout=120)


@pytest.fixture
def rendered(monkeypatch):
    """(text, ids) of each prompt the server tokenizes."""
    prompts = []

    def recording(tokenizer, text):
        ids = encode_chat(tokenizer, text)
        prompts.append((text, ids))
        return ids

    encode_chat = generation.encode_chat
    monkeypatch.setattr(generation, "encode_chat", recording)
    return prompts


def plant(monkeypatch, answer: str) -> None:
    """The server's next answers are `answer` (in pieces of 3 characters, as a stream brings them) in place of the
    random model's: the request runs, its text is replaced."""
    real = generation.Generation.event_batches

    async def planted(self):
        final = None
        async for batch in real(self):
            final = next((event for event in batch if event.finished), final)
        pieces = [answer[i:i + 3] for i in range(0, len(answer), 3)]
        yield [Event(final.request_id, 0, text=piece) for piece in pieces] + [
            Event(final.request_id, 0, finished=True, ending=Ending.EOS)]

    monkeypatch.setattr(generation.Generation, "event_batches", planted)


def reference_render(messages: list[dict], tools: list[dict] | None) -> str:
    """The template by itself: plain jinja2 with transformers' chat-template settings and strftime_now."""
    def raise_exception(message):
        raise jinja2.TemplateError(message)

    def tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    env = jinja2.Environment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = tojson
    context = {"messages": messages, "add_generation_prompt": True,
               "strftime_now": lambda fmt: datetime.datetime.now().strftime(fmt)}
    if tools is not None:
        context["tools"] = tools
    return env.from_string(TEMPLATE).render(raise_exception=raise_exception, **context)


def hf_messages(messages: list[dict]) -> list[dict]:
    """The conversation as transformers' apply_chat_template takes it: a call's arguments as an object, and the
    call's message with content "" (OpenAI's null content; the template tests `in message.content`); an assistant's
    reasoning_content as the template's "thinking", without content beside a call (llama.cpp's gpt-oss handler)."""
    out = []
    for message in messages:
        if message.get("tool_calls"):
            calls = [{**c, "function": {**c["function"], "arguments": json.loads(c["function"]["arguments"])}}
                     for c in message["tool_calls"]]
            message = {**message, "content": message.get("content") or "", "tool_calls": calls}
        if "reasoning_content" in message:
            message = {**message, "thinking": message["reasoning_content"]}
            del message["reasoning_content"]
            if message.get("tool_calls"):
                del message["content"]
        out.append(message)
    return out


def assert_rendered_as_template(live, served: tuple[str, list[int]], messages: list[dict],
                                tools: list[dict] | None) -> str:
    text, ids = served
    expected = reference_render(hf_messages(messages), tools)
    assert text == expected, (text, expected)
    tokenizer = live.server.served.tokenizer
    assert ids == tokenizer.encode(expected, add_bos=False)
    marker = tokenizer.encode("<|message|>", add_bos=False)
    assert len(marker) == 1 and marker[0] in ids  # the markers as the model's special tokens
    return expected


def raw_answer(live) -> str:
    return live.server.loaded.engine.finished_records()[-1].texts[0]


def assert_harmony_call(raw: str, name: str | None = None) -> dict:
    """gpt-oss's call message: the header to functions.NAME on the commentary channel, then JSON arguments that
    validate against NAME's schema, and nothing else."""
    head, _, body = raw.partition("<|message|>")
    prefix = "<|channel|>commentary to=functions."
    assert head.startswith(prefix) and head.endswith(" <|constrain|>json"), raw
    called = head[len(prefix):-len(" <|constrain|>json")]
    assert called in SCHEMAS and (name is None or called == name), raw
    arguments = json.loads(body)
    jsonschema.validate(arguments, SCHEMAS[called])
    return {"name": called, "arguments": arguments}


def valid_tool_call(call, raw_call: dict | None = None) -> dict:
    assert call.type == "function" and call.id.startswith("call_")
    arguments = json.loads(call.function.arguments)
    jsonschema.validate(arguments, SCHEMAS[call.function.name])
    if raw_call is not None:
        assert (call.function.name, arguments) == (raw_call["name"], raw_call["arguments"])
    return arguments


def test_the_template_is_llama_cpps_and_read_as_harmonys_call_format():
    assert hashlib.sha256(TEMPLATE.encode()).hexdigest() == TEMPLATE_SHA256  # unedited (templates/README.md)
    assert tool_format(TEMPLATE) == HARMONY


def test_tools_and_a_tool_result_render_as_the_template_renders_them(live, client, rendered):
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
    developer = expected.split("<|start|>developer<|message|>", 1)[1].split("<|end|>", 1)[0]
    assert developer.startswith("# Tools\n\n## functions\n\nnamespace functions {")
    assert "// Weather in a city\ntype get_weather = (_: {\ncity: string,\n" in developer
    assert "type add = (_: {\na: number,\nb: number,\n}) => any;" in developer
    assert ('<|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>'
            '{"city": "Paris", "unit": "C"}<|call|>') in expected
    assert ("<|start|>functions.get_weather to=assistant<|channel|>commentary<|message|>" + json.dumps(RESULT)
            + "<|end|><|start|>assistant") in expected
    assert reply.usage.prompt_tokens == len(served[1])


def test_without_tools_the_template_renders_no_tool_namespace(live, client, rendered):
    client.chat.completions.create(model=MODEL_NAME, messages=ASK, max_tokens=2, temperature=0)
    [served] = rendered
    assert_rendered_as_template(live, served, ASK, None)
    assert "namespace functions" not in served[0] and "<|start|>developer" not in served[0]


@pytest.mark.parametrize("form", sorted(PLANTED))
def test_auto_reads_a_call_in_each_header_form(client, monkeypatch, form):
    plant(monkeypatch, PLANTED[form])
    reply = client.chat.completions.create(model=MODEL_NAME, messages=ASK, tools=TOOLS, max_tokens=8)
    answer = reply.choices[0]
    assert answer.finish_reason == "tool_calls"
    [call] = answer.message.tool_calls
    assert valid_tool_call(call) == {"city": "Paris", "unit": "C"} and call.function.name == "get_weather"
    assert answer.message.content is None
    reasoning = getattr(answer.message, "reasoning_content", None)
    assert reasoning == ("Need the weather." if "analysis" in PLANTED[form] else None)


@pytest.mark.parametrize("form", sorted(PLANTED))
def test_auto_call_streams_reasoning_then_tool_calls_deltas(client, monkeypatch, form):
    plant(monkeypatch, PLANTED[form])
    stream = client.chat.completions.create(model=MODEL_NAME, messages=ASK, tools=TOOLS, max_tokens=8, stream=True)
    chunks = [c for c in stream if c.choices]
    deltas = [c.choices[0].delta for c in chunks]
    calls = [d.tool_calls for d in deltas if d.tool_calls]
    assert len(calls) == 1 and len(calls[0]) == 1 and calls[0][0].index == 0, calls
    assert valid_tool_call(calls[0][0]) == {"city": "Paris", "unit": "C"}
    assert "".join(getattr(d, "reasoning_content", None) or "" for d in deltas) == (
        "Need the weather." if "analysis" in PLANTED[form] else "")
    assert not any(d.content for d in deltas)
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


def test_auto_answer_without_a_call_stays_reasoning_and_content(client, monkeypatch):
    plant(monkeypatch, "<|channel|>analysis<|message|>Easy.<|end|><|start|>assistant<|channel|>final<|message|>"
                       "It is sunny.")
    reply = client.chat.completions.create(model=MODEL_NAME, messages=ASK, tools=TOOLS, max_tokens=8)
    answer = reply.choices[0]
    assert answer.finish_reason == "stop" and not answer.message.tool_calls
    assert (answer.message.content, answer.message.reasoning_content) == ("It is sunny.", "Easy.")
    stream = client.chat.completions.create(model=MODEL_NAME, messages=ASK, tools=TOOLS, max_tokens=8, stream=True)
    deltas = [c.choices[0].delta for c in stream if c.choices]
    assert "".join(d.content or "" for d in deltas) == "It is sunny."
    assert "".join(getattr(d, "reasoning_content", None) or "" for d in deltas) == "Easy."
    assert not any(d.tool_calls for d in deltas)


def test_parse_leaves_unknown_functions_and_bad_arguments_as_content():
    for answer in ('<|channel|>commentary to=functions.nope <|constrain|>json<|message|>{"a": 1}',
                   '<|channel|>commentary to=functions.add <|constrain|>json<|message|>{"a": 1',
                   '<|channel|>commentary to=functions.add <|constrain|>json<|message|>[1, 2]'):
        reasoning, content, calls = parse(answer, TOOLS, new_call)
        assert calls == [] and content == answer.split("<|message|>")[1], answer
    reasoning, content, calls = parse(PLANTED["channel_header"] + "<|call|>", TOOLS, new_call)
    assert (reasoning, content, [c["function"]["name"] for c in calls]) == ("Need the weather.", "", ["get_weather"])


def test_the_watcher_holds_a_call_and_releases_the_rest_in_any_chunking():
    answer = PLANTED["channel_header"]
    for size in (1, 2, 5, 13):
        watcher, parts = HarmonyCallWatcher(forced=False), []
        for i in range(0, len(answer), size):
            parts += watcher.feed(answer[i:i + size])
        held, rest = watcher.finish()
        parts += held
        assert "".join(t for kind, t in parts if kind == "reasoning") == "Need the weather."
        assert not any(kind == "content" for kind, _ in parts)
        assert parse(rest, TOOLS, new_call)[2][0]["function"]["arguments"] == '{"city": "Paris", "unit": "C"}'


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "add"}}],
                         ids=["required", "named"])
def test_forced_call_is_harmonys_call_whose_arguments_validate(live, client, rendered, choice):
    reply = client.chat.completions.create(model=MODEL_NAME, messages=ASK, tools=TOOLS, tool_choice=choice,
                                           max_tokens=120, seed=11)
    answer = reply.choices[0]
    assert answer.finish_reason == "tool_calls", answer
    raw_call = assert_harmony_call(raw_answer(live), None if choice == "required" else "add")
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
    raw_call = assert_harmony_call(raw_answer(live), None if choice == "required" else "get_weather")
    valid_tool_call(deltas[0][0], raw_call)
    assert not any(c.choices[0].delta.content for c in chunks)
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


def test_a_forced_calls_markers_are_the_special_tokens_and_its_logprobs_every_token(live, client):
    """The grammar names the markers as tokens; the model emits them as its special tokens, as gpt-oss writes
    them. With logprobs, every token's entry comes once, whole and streamed."""
    kwargs = dict(model=MODEL_NAME, messages=ASK, tools=TOOLS, max_tokens=120, seed=5, logprobs=True, top_logprobs=2,
                  tool_choice={"type": "function", "function": {"name": "add"}})
    whole = client.chat.completions.create(**kwargs)
    record = live.server.loaded.engine.finished_records()[-1]
    tokenizer = live.server.served.tokenizer
    [generated] = record.generated_tokens
    for marker in ("<|channel|>", "<|constrain|>", "<|message|>"):
        [marker_id] = tokenizer.encode(marker, add_bos=False)
        assert generated.count(marker_id) == 1, (marker, generated)
    assert_harmony_call(raw_answer(live), "add")
    entries = whole.choices[0].logprobs.content
    assert whole.choices[0].finish_reason == "tool_calls" and len(entries) == whole.usage.completion_tokens
    chunks = [c for c in client.chat.completions.create(stream=True, **kwargs) if c.choices]
    streamed = [e for c in chunks if c.choices[0].logprobs for e in c.choices[0].logprobs.content]
    assert [(e.token, e.logprob) for e in streamed] == [(e.token, e.logprob) for e in entries]
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


def test_tool_loop_call_then_result_then_next_request(live, client, rendered):
    first = client.chat.completions.create(model=MODEL_NAME, messages=ASK, tools=TOOLS, tool_choice="required",
                                           max_tokens=120, seed=17)
    call = first.choices[0].message.tool_calls[0]
    valid_tool_call(call)
    messages = ASK + tool_round(call, RESULT)
    second = client.chat.completions.create(model=MODEL_NAME, messages=messages, tools=TOOLS, max_tokens=6,
                                            temperature=0)
    assert second.choices[0].finish_reason in ("stop", "length", "tool_calls")
    expected = assert_rendered_as_template(live, rendered[1], messages, TOOLS)
    arguments = json.loads(call.function.arguments)
    assert (f"<|start|>assistant to=functions.{call.function.name}<|channel|>commentary json<|message|>"
            f"{json.dumps(arguments)}<|call|><|start|>functions.{call.function.name} to=assistant<|channel|>"
            f"commentary<|message|>{json.dumps(RESULT)}<|end|>") in expected
    assert second.usage.prompt_tokens > first.usage.prompt_tokens
    messages += [{"role": "assistant", "content": "It is 21 C and clear."},
                 {"role": "user", "content": "And in F?"}]
    third = client.chat.completions.create(model=MODEL_NAME, messages=messages, tools=TOOLS, max_tokens=2,
                                           temperature=0)
    assert third.choices[0].finish_reason in ("stop", "length", "tool_calls")
    expected = assert_rendered_as_template(live, rendered[2], messages, TOOLS)
    assert "<|start|>assistant<|channel|>final<|message|>It is 21 C and clear.<|end|>" in expected


def test_a_calls_reasoning_sent_back_renders_as_its_analysis_message(live, client, rendered, monkeypatch):
    """The client sends the call's message back with its reasoning_content: the template writes it as the analysis
    message before the call, until a later final answer (then the template drops it)."""
    plant(monkeypatch, PLANTED["channel_header"])
    first = client.chat.completions.create(model=MODEL_NAME, messages=ASK, tools=TOOLS, max_tokens=8)
    message = first.choices[0].message
    assert message.reasoning_content == "Need the weather."
    call = message.tool_calls[0]
    messages = ASK + tool_round(call, RESULT)
    messages[1]["reasoning_content"] = message.reasoning_content
    client.chat.completions.create(model=MODEL_NAME, messages=messages, tools=TOOLS, max_tokens=2)
    expected = assert_rendered_as_template(live, rendered[1], messages, TOOLS)
    assert ("<|start|>assistant<|channel|>analysis<|message|>Need the weather.<|end|><|start|>assistant "
            "to=functions.get_weather<|channel|>commentary json<|message|>") in expected
    messages += [{"role": "assistant", "content": "It is 21 C."}, {"role": "user", "content": "And in F?"}]
    client.chat.completions.create(model=MODEL_NAME, messages=messages, tools=TOOLS, max_tokens=2)
    expected = assert_rendered_as_template(live, rendered[2], messages, TOOLS)
    assert "Need the weather." not in expected


def test_planted_tools_left_out_of_the_template_are_caught(live, client, rendered, monkeypatch):
    templates = live.server.served.templates
    real_render = templates.render

    def render_without_tools(*args, tools=None, **kwargs):
        return real_render(*args, **kwargs)

    monkeypatch.setattr(templates, "render", render_without_tools)
    client.chat.completions.create(model=MODEL_NAME, messages=ASK, tools=TOOLS, max_tokens=2, temperature=0)
    with pytest.raises(AssertionError):
        assert_rendered_as_template(live, rendered[0], ASK, TOOLS)


def test_planted_wrong_family_is_caught(live, client, monkeypatch):
    """The gpt-oss template read as Llama 3.1's JSON calls gives an answer that is not gpt-oss's call message."""
    monkeypatch.setattr(generation, "tool_format", lambda template: LLAMA3)
    client.chat.completions.create(model=MODEL_NAME, messages=ASK, tools=TOOLS, tool_choice="required",
                                   max_tokens=120, seed=11)
    with pytest.raises((AssertionError, ValueError)):
        assert_harmony_call(raw_answer(live))
