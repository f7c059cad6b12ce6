"""gpt-oss's chat output (OpenAI's harmony format) split as llama.cpp's server splits it: the analysis channel is the
reasoning (`reasoning_content`), the final channel (and commentary) the answer (`content`), the markup itself never
shown.

A harmony answer reads, as the tokenizer renders it (hipcore/tokenizer/vocab.py renders <|channel|>, <|message|>,
<|start|> and <|constrain|>; <|end|> and <|return|> end a message or the turn and are not rendered):
    <|channel|>analysis<|message|>THINKING<|start|>assistant<|channel|>final<|message|>ANSWER
Text before any marker (a model that writes no channel) is the answer. The splitter takes the text as it streams,
holding back only a tail that may be the start of a marker, so a marker split across two pieces is still found.
"""

from __future__ import annotations

import json
import re

MARKERS = ("<|channel|>", "<|message|>", "<|start|>", "<|end|>", "<|return|>", "<|constrain|>", "<|call|>")
REASONING_CHANNELS = ("analysis",)
FINAL_HEADER = "<|channel|>final<|message|>"  # what a constrained answer begins with: the JSON is the final message


def as_lark(text: str) -> str:
    """Harmony text as a Lark sequence for llguidance: each marker as its token (<|channel|>: llguidance's
    special-token syntax; hipcore/engine/grammar.py makes the markers special tokens), the rest as quoted literals."""
    parts = re.split("(" + "|".join(re.escape(marker) for marker in MARKERS) + ")", text)
    return " ".join(part if part in MARKERS else json.dumps(part) for part in parts if part)


def is_harmony(template: str | None) -> bool:
    """Whether a chat template writes harmony turns (gpt-oss's)."""
    return template is not None and "<|channel|>" in template and "<|message|>" in template


class HarmonySplitter:
    """feed(text) -> [("reasoning" | "content", text)], in order; finish() flushes what was held back."""

    def __init__(self) -> None:
        self._held = ""
        self._state = "body"  # "body": message text; "header": a channel name; "role": after <|start|>
        self._kind = "content"  # where body text goes
        self._header = ""

    def feed(self, text: str) -> list[tuple[str, str]]:
        out: list[tuple[str, str]] = []
        text = self._held + text
        self._held = ""
        while text:
            at = text.find("<|")
            if at < 0:
                tail = 1 if text.endswith("<") else 0  # a marker's first character: wait for the next
                self._take(text[:len(text) - tail], out)
                self._held = text[len(text) - tail:]
                break
            self._take(text[:at], out)
            text = text[at:]
            marker = next((m for m in MARKERS if text.startswith(m)), None)
            if marker is None:
                if any(m.startswith(text) for m in MARKERS):  # a marker's beginning: wait for the rest
                    self._held = text
                    break
                self._take("<|", out)  # not a marker: text
                text = text[2:]
                continue
            self._mark(marker)
            text = text[len(marker):]
        return _merged(out)

    def finish(self) -> list[tuple[str, str]]:
        out: list[tuple[str, str]] = []
        self._take(self._held, out)
        self._held = ""
        return _merged(out)

    def _take(self, text: str, out: list[tuple[str, str]]) -> None:
        if not text:
            return
        if self._state == "body":
            out.append((self._kind, text))
        elif self._state == "header":
            self._header += text

    def _mark(self, marker: str) -> None:
        if marker == "<|channel|>":
            self._state, self._header = "header", ""
        elif marker == "<|message|>":
            channel = self._header.strip().split(" ")[0] if self._header.strip() else ""
            self._state, self._kind = "body", "reasoning" if channel in REASONING_CHANNELS else "content"
        elif marker == "<|start|>":
            self._state = "role"
        elif marker == "<|constrain|>":
            pass  # inside a header ("<|constrain|>json"): part of it
        else:  # <|end|>, <|return|>, <|call|>: the message ends; what follows before a channel is answer text
            self._state, self._kind = "body", "content"


def split(text: str) -> tuple[str, str]:
    """(reasoning, content) of a whole harmony answer."""
    splitter = HarmonySplitter()
    parts = splitter.feed(text) + splitter.finish()
    return ("".join(t for kind, t in parts if kind == "reasoning"),
            "".join(t for kind, t in parts if kind == "content"))


def _merged(parts: list[tuple[str, str]]) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    for kind, text in parts:
        if out and out[-1][0] == kind:
            out[-1] = (kind, out[-1][1] + text)
        elif text:
            out.append((kind, text))
    return out
