"""Tool calls: OpenAI's `tools` and `tool_choice`, each model family's call format, and the grammar that forces a call.

The tools go to the model's own chat template (it receives `tools`, as transformers' apply_chat_template gives
them), so the model sees them as it was trained to. Which format its calls come in is read from the template:
  - "hermes": Qwen2.5 / Qwen3 (and the Hermes models): <tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>
  - "llama3": Llama 3.1+: a JSON object {"name": ..., "parameters": {...}} as the whole answer (after an optional
    <|python_tag|>).
  - "harmony": gpt-oss: a commentary message to functions.NAME whose text is the arguments (harmony_calls.py).
A template with neither has no tool support: a request with tools is a 400 saying so. With tool_choice "required"
or a named function the answer is constrained by a grammar (hipcore/engine/grammar.py) to one call whose
arguments validate against the function's parameters, so even a small model emits a valid call; with "auto" the
answer is parsed after the fact and what is not a well-formed call stays content.
"""

from __future__ import annotations

import json
import re
import secrets
from dataclasses import dataclass

from hipcore.tokenizer.harmony import is_harmony
from rocmforge_serve import harmony_calls
from rocmforge_serve.api_errors import bad_request

HERMES, LLAMA3, HARMONY = "hermes", "llama3", "harmony"
MAX_TOOLS = 128
_HERMES_CALL = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)


@dataclass(frozen=True)
class ToolRequest:
    tools: list[dict]  # OpenAI's [{"type": "function", "function": {name, description, parameters}}]
    choice: str  # "auto", "none", "required", or "function" (a named one)
    name: str | None = None  # the function tool_choice names

    @property
    def active(self) -> bool:
        return self.choice != "none"

    @property
    def forced(self) -> bool:
        return self.choice in ("required", "function")


def parse_tools(body: dict) -> ToolRequest | None:
    """`tools` and `tool_choice` checked (400 naming the field), or None when the request has no tools."""
    tools = body.get("tools")
    choice = body.get("tool_choice")
    if tools in (None, []):
        if choice not in (None, "none", "auto"):
            raise bad_request("tool_choice needs tools", param="tool_choice")
        return None
    if not isinstance(tools, list) or len(tools) > MAX_TOOLS:
        raise bad_request(f"tools must be an array of at most {MAX_TOOLS} function tools", param="tools",
                          code="invalid_type")
    names = []
    for i, tool in enumerate(tools):
        where = f"tools[{i}]"
        if not isinstance(tool, dict) or tool.get("type") != "function" or not isinstance(tool.get("function"), dict):
            raise bad_request(f'{where} must be {{"type": "function", "function": {{...}}}}', param=where)
        function = tool["function"]
        name = function.get("name")
        if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9_.-]{1,64}", name):
            raise bad_request(f"{where}.function.name must be 1-64 letters, digits, _ . or -", param=f"{where}.function.name")
        parameters = function.get("parameters", {"type": "object"})
        if not isinstance(parameters, dict):
            raise bad_request(f"{where}.function.parameters must be a JSON Schema object", param=f"{where}.function.parameters")
        names.append(name)
    if len(set(names)) != len(names):
        raise bad_request("tools has two functions of the same name", param="tools")
    if choice is None:
        return ToolRequest(tools, "auto")
    if choice in ("auto", "none", "required"):
        return ToolRequest(tools, choice)
    if isinstance(choice, dict) and choice.get("type") == "function" and isinstance(choice.get("function"), dict):
        name = choice["function"].get("name")
        if name not in names:
            raise bad_request(f"tool_choice names the function {str(name)[:64]!r}, which is not in tools",
                              param="tool_choice")
        return ToolRequest(tools, "function", name)
    raise bad_request('tool_choice must be "auto", "none", "required" or {"type": "function", "function": {"name"}}',
                      param="tool_choice")


def tool_format(template: str | None) -> str | None:
    """The family's call format as the template writes it, or None when it has no tool support."""
    if not template or "tools" not in template:
        return None
    if "<tool_call>" in template:
        return HERMES
    if is_harmony(template) and "functions." in template:
        return HARMONY
    if "<|python_tag|>" in template or "ipython" in template:
        return LLAMA3
    return None


def _call_schema(fmt: str, tools: list[dict], name: str | None) -> dict:
    key = "arguments" if fmt == HERMES else "parameters"
    options = []
    for tool in tools:
        function = tool["function"]
        if name is not None and function["name"] != name:
            continue
        options.append({"type": "object", "properties": {
            "name": {"const": function["name"]}, key: function.get("parameters", {"type": "object"})},
            "required": ["name", key], "additionalProperties": False})
    return options[0] if len(options) == 1 else {"anyOf": options}


def call_grammar(fmt: str, request: ToolRequest) -> dict:
    """compile_grammar's arguments for a forced call: one call of the named function (or of any, "required")."""
    # compact JSON: with free whitespace a random model fills its tokens with spaces and newlines
    compact = {"x-guidance": {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}}
    if fmt == HARMONY:
        return harmony_calls.call_grammar(request.tools, request.name, compact)
    schema = {**_call_schema(fmt, request.tools, request.name), **compact}
    if fmt == HERMES:
        return {"lark": 'start: "<tool_call>\\n" call "\\n</tool_call>"\ncall: %json ' + json.dumps(schema)}
    return {"json_schema": schema}


def parse_calls(fmt: str, text: str, tools: list[dict]) -> tuple[str | None, list[dict]]:
    """(content, OpenAI tool_calls) of an answer; text that is not a call of a known function stays content."""
    known = {tool["function"]["name"] for tool in tools}
    calls = []
    if fmt == HERMES:
        content_parts, cursor = [], 0
        for match in _HERMES_CALL.finditer(text):
            call = _call(match.group(1), "arguments", known)
            if call is None:
                continue
            content_parts.append(text[cursor:match.start()])
            cursor = match.end()
            calls.append(call)
        content_parts.append(text[cursor:])
        content = "".join(content_parts).strip() if calls else text
    else:
        body = text.strip().removeprefix("<|python_tag|>").strip()
        call = _call(body, "parameters", known)
        if call is not None:
            calls.append(call)
        content = "" if calls else text
    return (content or None) if calls else content, calls


def _call(payload: str, key: str, known: set[str]) -> dict | None:
    try:
        value = json.loads(payload)
    except ValueError:
        return None
    if not isinstance(value, dict) or value.get("name") not in known:
        return None
    arguments = value.get(key, value.get("arguments", value.get("parameters", {})))
    if not isinstance(arguments, dict):
        return None
    return new_call(value["name"], arguments)


def new_call(name: str, arguments: dict) -> dict:
    """One OpenAI tool_call: a fresh id, the arguments as a JSON string."""
    return {"id": "call_" + secrets.token_hex(12), "type": "function",
            "function": {"name": name, "arguments": json.dumps(arguments, ensure_ascii=False)}}


class CallWatcher:
    """Which text of a streamed answer can go out as content at once, and which must wait until the answer is whole
    (it may be a call). Hermes: everything before a <tool_call> (and before a tail that could begin one); Llama 3.1:
    the whole answer waits if it begins with "{" or "<" (a JSON call, or <|python_tag|>), else it all streams. A
    forced call waits whole."""

    def __init__(self, fmt: str, forced: bool):
        self.fmt, self.forced = fmt, forced
        self.text = ""
        self.sent = 0  # characters of text already released as content
        self.holding = forced

    def feed(self, piece: str) -> str:
        self.text += piece
        if self.holding:
            return ""
        if self.fmt == HERMES:
            start = self.text.find("<tool_call>", self.sent)
            if start >= 0:
                self.holding = True
                end = start
            else:
                end = len(self.text) - _partial_tail(self.text, "<tool_call>")
        else:
            stripped = self.text.lstrip()
            if not stripped:
                return ""
            if stripped[0] in "{<":
                self.holding = True
                return ""
            end = len(self.text)
        out, self.sent = self.text[self.sent:end], max(self.sent, end)
        return out

    def rest(self) -> str:
        """What was not released: the text in which calls are looked for once the answer ends."""
        return self.text[self.sent:]


def _partial_tail(text: str, marker: str) -> int:
    """The length of the longest end of `text` that begins `marker` (it may become the marker)."""
    for length in range(min(len(marker) - 1, len(text)), 0, -1):
        if text.endswith(marker[:length]):
            return length
    return 0


def template_messages(messages: list[dict], harmony: bool = False) -> list[dict]:
    """The messages as chat templates read them: a call's arguments as an object (OpenAI sends a JSON string;
    Qwen's template writes them with tojson, as vLLM and llama.cpp pass them). An assistant's reasoning_content goes
    to gpt-oss's template as "thinking" (the analysis message it writes before a call), without the content beside
    a call, as llama.cpp passes it; other templates get none."""
    out = []
    for message in messages:
        reasoning = message.get("reasoning_content")
        if reasoning is not None:
            message = {k: v for k, v in message.items() if k != "reasoning_content"}
            if harmony:
                message["thinking"] = reasoning
                if message.get("tool_calls"):
                    message.pop("content", None)
        calls = message.get("tool_calls")
        if calls:
            converted = []
            for call in calls:
                function = dict(call["function"])
                if isinstance(function.get("arguments"), str):
                    try:
                        function["arguments"] = json.loads(function["arguments"])
                    except ValueError:
                        pass
                converted.append({**call, "function": function})
            message = {**message, "tool_calls": converted}
        out.append(message)
    return out
