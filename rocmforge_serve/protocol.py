"""Reading OpenAI request bodies: the body itself (size cap, UTF-8, JSON) and each field's type.

Everything a client sends is checked here before it reaches the engine, and each problem becomes a
400 naming the field (`param`), as OpenAI's API does. Ranges of the sampling values are checked by
SamplingParams itself (one rule set for the CLI and the server); its UsageError becomes a 400 as well.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

from hipcore.engine.sampler import MAX_LOGPROBS, MAX_STOP_STRINGS, SamplingParams
from hipcore.errors import UsageError
from hipcore.tokenizer.chat_template import checked_template_kwargs
from rocmforge_serve.api_errors import ApiError, bad_request
from rocmforge_serve.tool_calls import ToolRequest, parse_tools

MAX_BODY_BYTES = 4 << 20  # 4 MiB: far above any prompt the context can hold, far below a memory hazard
MAX_MESSAGES = 1024
MAX_PROMPT_IDS = 1 << 20
MAX_CHOICES = 16  # n: choices of one request (each a sequence of the engine's running batch)


@dataclass
class GenerationRequest:
    """One /v1/completions or /v1/chat/completions call, checked."""

    model: str | None
    prompt: str | list[int] | None  # completions: text or token ids
    messages: list[dict] | None  # chat: [{"role", "content"}] with content as plain text
    max_tokens: int | None  # None: up to the end of the context
    sampling: dict  # SamplingParams fields other than max_tokens
    stream: bool
    include_usage: bool
    ignore_eos: bool | None = None  # vLLM's extra; None: the server's default (serve --ignore-eos)
    # The constraint as compile_grammar's keyword arguments (compiled off the event loop), and the field it came from
    constraint: dict | None = None
    constraint_param: str | None = None
    tools: ToolRequest | None = None  # chat: the function tools and tool_choice
    template_kwargs: dict | None = None  # chat: chat_template_kwargs, more variables for the model's template


def parse_json_body(raw: bytes) -> dict:
    if not raw:
        raise bad_request("the request body is empty: send a JSON object", code="empty_body")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise bad_request(f"the request body is not valid UTF-8 (byte {exc.start})", code="invalid_utf8") from None
    try:
        body = json.loads(text, parse_constant=_reject_constant)
    except (ValueError, RecursionError) as exc:
        raise bad_request(f"the request body is not valid JSON: {exc}", code="invalid_json") from None
    if not isinstance(body, dict):
        raise bad_request(f"the request body must be a JSON object, got {_json_type(body)}", code="invalid_json")
    return body


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def parse_generation(body: dict, *, chat: bool) -> GenerationRequest:
    model = _optional(body, "model", str)
    if chat:
        prompt, messages = None, _messages(body)
    else:
        prompt, messages = _prompt(body), None
    max_tokens = _optional(body, "max_completion_tokens", int) if chat else None
    if max_tokens is None:
        max_tokens = _optional(body, "max_tokens", int)
    if max_tokens is not None and max_tokens < 1:
        raise bad_request(f"max_tokens must be at least 1, got {max_tokens}", param="max_tokens")
    n = _optional(body, "n", int) or 1
    if not 1 <= n <= MAX_CHOICES:
        raise bad_request(f"n must be between 1 and {MAX_CHOICES}, got {n}", param="n")
    for unsupported in ("echo", "functions", "logit_bias", "best_of", "suffix"):
        value = body.get(unsupported)
        if value not in (None, False, 0, [], {}) and not (unsupported == "best_of" and value == 1):
            raise bad_request(f"{unsupported} is not supported by this server", param=unsupported, code="unsupported")
    stream = _optional(body, "stream", bool) or False
    options = _optional(body, "stream_options", dict) or {}
    include_usage = options.get("include_usage", False)
    if not isinstance(include_usage, bool):
        raise bad_request("stream_options.include_usage must be a boolean", param="stream_options")
    sampling = {
        # OpenAI's defaults: plain temperature sampling, no top-k / min-p unless asked for (extras).
        "temperature": _number(body, "temperature", 1.0),
        "top_p": _number(body, "top_p", 1.0),
        "top_k": _optional(body, "top_k", int) or 0,
        "min_p": _number(body, "min_p", 0.0),
        "presence_penalty": _number(body, "presence_penalty", 0.0),
        "frequency_penalty": _number(body, "frequency_penalty", 0.0),
        "repeat_penalty": _number(body, "repetition_penalty", 1.0),
        "repeat_last_n": -1,  # OpenAI's penalties count every generated token so far
        "seed": _optional(body, "seed", int),
        "stop": _stop(body),
        "logprobs": _logprobs(body, chat),
        "n": n,  # parallel samples: they share the prompt's KV blocks (the engine forks the sequence)
    }
    if sampling["top_k"] < 0:  # vLLM's -1 means off, as our 0 does
        sampling["top_k"] = 0
    check_sampling(sampling, 1)  # max_tokens is judged against the context once the prompt is tokenized
    ignore_eos = _optional(body, "ignore_eos", bool)
    constraint, constraint_param = _constraint(body)
    tools = parse_tools(body) if chat else None
    if not chat and body.get("tools"):
        raise bad_request("tools are for /v1/chat/completions", param="tools", code="unsupported")
    if tools is not None and tools.active and n > 1:
        raise bad_request("n > 1 with tools is not supported: one choice per request with tools", param="n",
                          code="unsupported")
    if tools is not None and tools.forced and constraint is not None:
        raise bad_request(f"tool_choice {tools.choice!r} and {constraint_param.split('.')[0]} both constrain the "
                          "output; send one", param="tool_choice")
    return GenerationRequest(model, prompt, messages, max_tokens, sampling, stream, include_usage, ignore_eos,
                             constraint, constraint_param, tools, _template_kwargs(body, chat))


def _template_kwargs(body: dict, chat: bool) -> dict | None:
    """llama-server's and vLLM's chat_template_kwargs: an object of variables for the chat template (Qwen3's
    enable_thinking); none may replace what the request itself gives the template (messages, tools, ...)."""
    value = _optional(body, "chat_template_kwargs", dict)
    if not value:
        return None
    if not chat:
        raise bad_request("chat_template_kwargs is for /v1/chat/completions", param="chat_template_kwargs",
                          code="unsupported")
    try:
        return checked_template_kwargs(value)
    except UsageError as exc:
        raise bad_request(f"chat_template_kwargs: {exc}", param="chat_template_kwargs") from None


def _logprobs(body: dict, chat: bool) -> int | None:
    """SamplingParams.logprobs: chat's logprobs (a boolean) with top_logprobs (0-20), completions' logprobs (0-5)."""
    if chat:
        wanted = _optional(body, "logprobs", bool)
        top = _optional(body, "top_logprobs", int)
        if top is not None and not 0 <= top <= MAX_LOGPROBS:
            raise bad_request(f"top_logprobs must be between 0 and {MAX_LOGPROBS}, got {top}", param="top_logprobs")
        if top is not None and not wanted:
            raise bad_request("top_logprobs needs logprobs: true", param="top_logprobs")
        return (top or 0) if wanted else None
    value = body.get("logprobs")
    if value is None or value is False:
        return None
    value = _optional(body, "logprobs", int)
    if not 0 <= value <= 5:
        raise bad_request(f"logprobs must be between 0 and 5, got {value}", param="logprobs")
    return value


def _constraint(body: dict) -> tuple[dict | None, str | None]:
    """OpenAI's response_format, llama.cpp's json_schema and grammar (GBNF): at most one, as compile_grammar's
    arguments. A strict json_schema and a non-strict one are both enforced (llama.cpp's rule too)."""
    found = []
    response_format = _optional(body, "response_format", dict)
    if response_format is not None:
        kind = response_format.get("type")
        if kind == "json_object":
            schema = response_format.get("schema")  # llama.cpp's json_object with a schema
            found.append(({"json_schema": schema} if schema is not None else {"json_object": True}, "response_format"))
        elif kind == "json_schema":
            spec = response_format.get("json_schema")
            if not isinstance(spec, dict) or "schema" not in spec:
                raise bad_request("response_format.json_schema must be an object with a schema",
                                  param="response_format.json_schema", code="invalid_type")
            strict = spec.get("strict")
            if strict is not None and not isinstance(strict, bool):
                raise bad_request("response_format.json_schema.strict must be a boolean",
                                  param="response_format.json_schema.strict", code="invalid_type")
            found.append(({"json_schema": spec["schema"]}, "response_format.json_schema.schema"))
        elif kind != "text":
            raise bad_request(f"response_format.type {_quoted(kind)} is not supported (text, json_object, json_schema)",
                              param="response_format.type", code="unsupported")
    if body.get("json_schema") is not None:
        found.append(({"json_schema": body["json_schema"]}, "json_schema"))
    grammar = _optional(body, "grammar", str)
    if grammar:
        found.append(({"gbnf": grammar}, "grammar"))
    if len(found) > 1:
        names = " and ".join(param.split(".")[0] for _, param in found)
        raise bad_request(f"{names} both constrain the output; send one", param=found[1][1])
    return found[0] if found else (None, None)


def _quoted(value: Any) -> str:
    return json.dumps(value)[:80] if not isinstance(value, str) else repr(value[:80])


def check_sampling(sampling: dict, max_tokens: int) -> SamplingParams:
    try:
        return SamplingParams(max_tokens=max_tokens, **sampling)
    except UsageError as exc:
        message = str(exc)
        param = message.split(" ", 1)[0]
        raise bad_request(message, param=param if param in sampling or param == "max_tokens" else None) from None


def _json_type(value: Any) -> str:
    names = {dict: "an object", list: "an array", str: "a string", bool: "a boolean", int: "an integer",
             float: "a number", type(None): "null"}
    return names.get(type(value), type(value).__name__)


def _optional(body: dict, name: str, kind: type) -> Any:
    value = body.get(name)
    if value is None:
        return None
    if kind is int and isinstance(value, float) and value.is_integer() and abs(value) < 2**63:
        value = int(value)  # 16.0 is an integer in JSON's eyes
    ok = isinstance(value, kind) and not (kind is int and isinstance(value, bool))
    if not ok:
        wanted = {int: "an integer", bool: "a boolean", str: "a string", dict: "an object", list: "an array"}[kind]
        raise bad_request(f"{name} must be {wanted}, got {_json_type(value)}", param=name, code="invalid_type")
    return value


def _number(body: dict, name: str, default: float) -> float:
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise bad_request(f"{name} must be a finite number, got {_json_type(value)}", param=name, code="invalid_type")
    return float(value)


def _stop(body: dict) -> tuple[str, ...]:
    value = body.get("stop")
    if value is None:
        return ()
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list) or not all(isinstance(s, str) for s in items):
        raise bad_request("stop must be a string or an array of strings", param="stop", code="invalid_type")
    if len(items) > MAX_STOP_STRINGS:
        raise bad_request(f"stop has {len(items)} strings; at most {MAX_STOP_STRINGS}", param="stop")
    return tuple(items)


def _prompt(body: dict) -> str | list[int]:
    value = body.get("prompt")
    if isinstance(value, list) and len(value) == 1 and isinstance(value[0], (str, list)):
        value = value[0]  # the client's batch form with one prompt
    if isinstance(value, str):
        if not value:
            raise bad_request("prompt is empty", param="prompt")
        return value
    if isinstance(value, list) and value and all(isinstance(t, int) and not isinstance(t, bool) for t in value):
        if len(value) > MAX_PROMPT_IDS:
            raise bad_request(f"prompt has {len(value)} token ids; at most {MAX_PROMPT_IDS}", param="prompt")
        return list(value)
    if value is None:
        raise bad_request("prompt is required", param="prompt", code="missing_field")
    raise bad_request("prompt must be a string, or an array of token ids (one prompt per request)", param="prompt",
                      code="invalid_type")


def _messages(body: dict) -> list[dict]:
    value = body.get("messages")
    if value is None:
        raise bad_request("messages is required", param="messages", code="missing_field")
    if not isinstance(value, list) or not value:
        raise bad_request("messages must be a non-empty array", param="messages", code="invalid_type")
    if len(value) > MAX_MESSAGES:
        raise bad_request(f"messages has {len(value)} entries; at most {MAX_MESSAGES}", param="messages")
    out = []
    for i, message in enumerate(value):
        where = f"messages[{i}]"
        if not isinstance(message, dict):
            raise bad_request(f"{where} must be an object", param=where, code="invalid_type")
        role = message.get("role")
        if role not in ("system", "developer", "user", "assistant", "tool"):
            raise bad_request(f"{where}.role must be system, developer, user, assistant or tool", param=f"{where}.role")
        checked = {"role": "system" if role == "developer" else role}
        calls = message.get("tool_calls") if role == "assistant" else None
        if calls:
            checked["tool_calls"] = _tool_calls(calls, where)
        content = message.get("content")
        checked["content"] = "" if content is None and calls else _content(content, where)
        if role == "assistant" and isinstance(message.get("reasoning_content"), str):
            checked["reasoning_content"] = message["reasoning_content"]  # the answer's reasoning, sent back
        if role == "tool" and message.get("tool_call_id") is not None:
            checked["tool_call_id"] = _checked_str(message["tool_call_id"], f"{where}.tool_call_id")
        out.append(checked)
    return out


def _checked_str(value: Any, where: str) -> str:
    if not isinstance(value, str):
        raise bad_request(f"{where} must be a string", param=where, code="invalid_type")
    return value


def _tool_calls(calls: Any, where: str) -> list[dict]:
    """An assistant message's earlier calls, as the client echoes them back: [{id, type, function: {name,
    arguments (a JSON string)}}]."""
    if not isinstance(calls, list):
        raise bad_request(f"{where}.tool_calls must be an array", param=f"{where}.tool_calls", code="invalid_type")
    out = []
    for k, call in enumerate(calls):
        at = f"{where}.tool_calls[{k}]"
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict):
            raise bad_request(f"{at} must have a function", param=at)
        arguments = function.get("arguments", "{}")
        if not isinstance(arguments, (str, dict)):
            raise bad_request(f"{at}.function.arguments must be a JSON string", param=f"{at}.function.arguments")
        out.append({"id": str(call.get("id", "")), "type": "function", "function": {
            "name": _checked_str(function.get("name"), f"{at}.function.name"), "arguments": arguments}})
    return out


def _content(value: Any, where: str) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, list):  # content parts: only text ones can go to a text model
        texts = []
        for part in value:
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise bad_request(f"{where}.content: only text parts are supported", param=f"{where}.content")
            texts.append(part["text"])
        return "".join(texts)
    raise bad_request(f"{where}.content must be a string or an array of text parts", param=f"{where}.content",
                      code="invalid_type")


def context_error(prompt_tokens: int, max_tokens: int | None, context: int) -> ApiError:
    """vLLM's and OpenAI's wording, so clients that parse it keep working."""
    if max_tokens is None:
        detail = f"your prompt has {prompt_tokens} tokens, which leaves no room for a completion"
    else:
        detail = (f"you requested {prompt_tokens + max_tokens} tokens ({prompt_tokens} in the prompt, "
                  f"{max_tokens} for the completion)")
    return ApiError(400, f"This model's maximum context length is {context} tokens. However, {detail}. "
                         "Please reduce the length of the prompt or max_tokens.", param="max_tokens",
                    code="context_length_exceeded")
