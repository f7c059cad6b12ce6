"""gpt-oss's tool calls (OpenAI's harmony format): reading them from an answer, streaming what is not a call, and the
grammar that forces one.

After the prompt's `<|start|>assistant`, gpt-oss writes messages; a call is a message to a function recipient:
    <|channel|>commentary to=functions.NAME <|constrain|>json<|message|>{"city": "Paris"}<|call|>
The recipient may also stand in the role header (` to=functions.NAME<|channel|>commentary json<|message|>...`, as the
chat template writes earlier calls back), the constraint may be `<|constrain|>json`, ` json` or absent, and the
channel commentary or analysis: the variants llama.cpp's gpt-oss parser accepts. <|call|> ends generation and is not
in the text. An analysis message is reasoning, a final (or recipient-less commentary) message is content; a message
to a function that is unknown, or whose body is not a JSON object, stays content.
"""

from __future__ import annotations

import json
import re

from hipcore.tokenizer import harmony

_MESSAGE, _START = "<|message|>", "<|start|>"
_ENDS = ("<|end|>", "<|call|>", "<|return|>")
_RECIPIENT = re.compile(r"to=([^\s<]+)")
_CHANNEL = re.compile(r"<\|channel\|>\s*([A-Za-z]+)")


def parse(text: str, tools: list[dict], new_call) -> tuple[str, str, list[dict]]:
    """(reasoning, content, OpenAI tool_calls) of a whole harmony answer. new_call(name, arguments) -> a tool_call.
    Without a call, reasoning and content are harmony.split's."""
    known = {tool["function"]["name"] for tool in tools}
    reasoning, content, calls = [], [], []
    for index, segment in enumerate(text.split(_START)):
        if _MESSAGE not in segment:
            if index == 0:  # text before any message: a model that writes no channel
                content.append(harmony.split(segment)[1])
            continue
        header, body = segment.split(_MESSAGE, 1)
        cut = min((body.find(end) for end in _ENDS if end in body), default=len(body))
        body, after = body[:cut], body[cut:]
        recipient = _RECIPIENT.search(header)
        channel = _CHANNEL.search(header)
        call = _call(recipient.group(1), body, known, new_call) if recipient else None
        if call is not None:
            calls.append(call)
        elif channel is not None and channel.group(1) in harmony.REASONING_CHANNELS:
            reasoning.append(body)
        else:
            content.append(body)
        for end in _ENDS:  # text after a message's end and before the next <|start|>: answer text
            after = after.replace(end, "")
        content.append(after)
    if not calls:
        return (*harmony.split(text), [])
    return "".join(reasoning), "".join(content).strip(), calls


def _call(recipient: str, body: str, known: set[str], new_call) -> dict | None:
    name = recipient.removeprefix("functions.")
    if not recipient.startswith("functions.") or name not in known:
        return None
    try:
        arguments = json.loads(body)
    except ValueError:
        return None
    return new_call(name, arguments) if isinstance(arguments, dict) else None


class HarmonyCallWatcher:
    """Which parts of a streamed harmony answer can go out at once (reasoning, content), and which must wait until
    the answer is whole: a message's header is read whole before its text goes out; from the first header with a
    recipient (a call) on, everything waits. A forced call waits whole."""

    def __init__(self, forced: bool):
        self.text = ""
        self.sent = 0  # characters of text given to the splitter
        self.holding = forced
        self.splitter = harmony.HarmonySplitter()
        self._header_at: int | None = 0  # where the open message's header begins (None: in its text)
        self._body_at = 0

    def feed(self, piece: str) -> list[tuple[str, str]]:
        """[("reasoning" | "content", text)] released by this piece."""
        self.text += piece
        if self.holding:
            return []
        safe = self._safe_end()
        parts = self.splitter.feed(self.text[self.sent:safe]) if safe > self.sent else []
        self.sent = max(self.sent, safe)
        return parts

    def _safe_end(self) -> int:
        while True:
            if self._header_at is not None:
                end = self.text.find(_MESSAGE, self._header_at)
                if end < 0:
                    return self._header_at
                if _RECIPIENT.search(self.text[self._header_at:end]):
                    self.holding = True
                    return self._header_at
                self._header_at, self._body_at = None, end + len(_MESSAGE)
            else:
                start = self.text.find(_START, self._body_at)
                if start < 0:
                    return len(self.text)
                self._header_at = start + len(_START)

    def finish(self) -> tuple[list[tuple[str, str]], str]:
        """(the parts the splitter still held, the text not released: where calls are looked for)."""
        if self.holding:
            return self.splitter.finish(), self.text[self.sent:]
        return self.splitter.feed(self.text[self.sent:]) + self.splitter.finish(), ""


def call_grammar(tools: list[dict], name: str | None, compact: dict) -> dict:
    """compile_grammar's arguments for a forced call: gpt-oss's call message of the named function (or of any), its
    arguments valid against the function's parameters; the markers are their tokens."""
    options = []
    for tool in tools:
        function = tool["function"]
        if name is not None and function["name"] != name:
            continue
        head = f"<|channel|>commentary to=functions.{function['name']} <|constrain|>json<|message|>"
        options.append(f"{harmony.as_lark(head)} %json " + json.dumps({**function.get("parameters", {"type": "object"}),
                                                                   **compact}))
    rules = [f"call{i}: {option}" for i, option in enumerate(options)]
    return {"lark": "start: " + " | ".join(f"call{i}" for i in range(len(options))) + "\n" + "\n".join(rules)}
