"""gpt-oss's harmony output split as llama.cpp's server splits it (hipcore/tokenizer/harmony.py): the analysis channel as
reasoning_content, the final channel as content, no channel markup, whole and streamed in any chunking; chat answers
of a harmony template through serve's response builders (a model with another template is untouched) and generate."""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace

import pytest
from typer.testing import CliRunner

from hipcore.engine.engine import Engine
from hipcore.engine.request import Ending, Event
from rocmforge_cli.app import app
from rocmforge_serve import responses
from support.gguf_factory import write_tiny_llama
from hipcore.tokenizer.harmony import HarmonySplitter, is_harmony, split

ANSWER = ("<|channel|>analysis<|message|>The user asks for 2+2; <|it is> 4.<|start|>assistant<|channel|>final"
          "<|message|>2 + 2 = 4 <")
HARMONY_TEMPLATE = "{{ '<|start|>assistant<|channel|>final<|message|>' }}"


def test_whole_answer():
    assert split(ANSWER) == ("The user asks for 2+2; <|it is> 4.", "2 + 2 = 4 <")
    assert split("no channels at all") == ("", "no channels at all")
    assert split("<|channel|>final<|message|>just the answer") == ("", "just the answer")
    assert split("<|channel|>commentary to=functions.f <|constrain|>json<|message|>{}") == ("", "{}")


@pytest.mark.parametrize("size", [1, 2, 3, 5, 11])
def test_streamed_in_any_chunking_as_whole(size):
    splitter, parts = HarmonySplitter(), []
    for i in range(0, len(ANSWER), size):
        parts += splitter.feed(ANSWER[i:i + size])
    parts += splitter.finish()
    assert ("".join(t for k, t in parts if k == "reasoning"), "".join(t for k, t in parts if k == "content")) == split(ANSWER)
    assert not any("<|channel|>" in t or "<|message|>" in t for _, t in parts)


def test_is_harmony():
    assert is_harmony(HARMONY_TEMPLATE) and not is_harmony("{{ '<|im_start|>assistant' }}") and not is_harmony(None)


class FakeGeneration:
    def __init__(self, pieces, template):
        self.served = SimpleNamespace(name="m", chat_template=template)
        self.request_id, self.prompt_tokens, self.completion_tokens, self.cached_tokens = 1, 3, len(pieces), 0
        self.tools, self.choices, self.logprobs = None, 1, None
        self._events = [Event(1, 0, text=p) for p in pieces[:-1]] + [
            Event(1, 0, text=pieces[-1], finished=True, ending=Ending.EOS)]

    async def events(self):
        for event in self._events:
            yield event

    async def event_batches(self):
        yield self._events

    def close(self):
        return False


def _pieces(text, size=4):
    return [text[i:i + size] for i in range(0, len(text), size)]


def test_chat_answers_of_a_harmony_template():
    body = asyncio.run(responses.whole_response(FakeGeneration(_pieces(ANSWER), HARMONY_TEMPLATE), chat=True))
    message = body["choices"][0]["message"]
    assert message == {"role": "assistant", "content": "2 + 2 = 4 <", "reasoning_content": "The user asks for 2+2; <|it is> 4."}

    async def collect():
        return [c async for c in responses.stream_response(FakeGeneration(_pieces(ANSWER), HARMONY_TEMPLATE), True, False)]
    deltas = [json.loads(line[6:])["choices"][0]["delta"] for chunk in asyncio.run(collect())
              for line in chunk.decode().split("\n\n") if line.startswith("data: {")]
    assert "".join(d.get("reasoning_content", "") for d in deltas) == message["reasoning_content"]
    assert "".join(d.get("content", "") for d in deltas) == message["content"]


class FakeChoices(FakeGeneration):
    """n choices of one harmony answer, each piece a token with its logprobs (the engine's events with logprobs)."""

    def __init__(self, pieces, choices, logprobs):
        super().__init__(pieces, HARMONY_TEMPLATE)
        self.served.tokenizer = SimpleNamespace(token_piece=lambda token_id: pieces[token_id].encode("utf-8"))
        self.choices, self.logprobs, self.max_tokens = choices, logprobs, 99
        self._events = [Event(1, seq, token_ids=(k,), text=piece, logprobs=(-0.25, []))
                        for k, piece in enumerate(pieces) for seq in range(choices)]
        self._events.append(Event(1, 0, finished=True, ending=Ending.EOS))


@pytest.mark.parametrize("choices, logprobs", [(1, 0), (2, None), (2, 1)])
def test_streamed_choices_and_logprobs_split_as_whole(choices, logprobs):
    """Streams with logprobs or n > 1 go their own way (each chunk names its choice): the channels are split there
    too, never the markup as content, and each token's logprobs come once, in order."""
    pieces = _pieces(ANSWER)

    async def collect():
        return [c async for c in responses.stream_response(FakeChoices(pieces, choices, logprobs), True, False)]
    found = [json.loads(line[6:])["choices"][0] for chunk in asyncio.run(collect())
             for line in chunk.decode().split("\n\n") if line.startswith("data: {")]
    for index in range(choices):
        mine = [c for c in found if c["index"] == index]
        assert "".join(c["delta"].get("reasoning_content", "") for c in mine) == "The user asks for 2+2; <|it is> 4."
        assert "".join(c["delta"].get("content", "") for c in mine) == "2 + 2 = 4 <"
        tokens = [e["token"] for c in mine if c["logprobs"] for e in c["logprobs"]["content"]]
        assert tokens == (pieces if logprobs is not None else [])


def test_other_templates_are_untouched():
    body = asyncio.run(responses.whole_response(FakeGeneration(_pieces(ANSWER), "{{ '<|im_start|>' }}"), chat=True))
    assert body["choices"][0]["message"] == {"role": "assistant", "content": ANSWER}


def test_generate_shows_the_answer_and_the_reasoning_only_when_asked(tmp_path, monkeypatch):
    """`generate --chat` on a harmony template: the final channel on stdout, the analysis on stderr with --reasoning,
    both apart in --json; the engine's events stand in for a gpt-oss answer."""
    path = write_tiny_llama(tmp_path / "m.gguf", extra_metadata={"tokenizer.chat_template": HARMONY_TEMPLATE})
    pieces = _pieces(ANSWER, 5)

    def generate(self, prompt_ids, params):
        for i, text in enumerate(pieces):
            last = i == len(pieces) - 1
            yield Event(1, 0, token_ids=(5,), text=text, finished=last, ending=Ending.EOS if last else None)

    monkeypatch.setattr(Engine, "generate", generate)
    monkeypatch.setattr(Engine, "finished_record", lambda self, request_id: None)
    run = lambda *args: CliRunner().invoke(app, ["generate", "-m", str(path), "--device", "cpu", "--chat", "-q", *args,  # noqa: E731
                                                 "hi"], env={"COLUMNS": "200"})
    plain = run()
    assert plain.exit_code == 0, plain.stderr
    assert plain.stdout.strip() == "2 + 2 = 4 <" and "analysis" not in plain.stderr and "2+2" not in plain.stderr
    shown = run("--reasoning")
    assert shown.stdout.strip() == "2 + 2 = 4 <" and "The user asks for 2+2; <|it is> 4." in shown.stderr
    body = json.loads(run("--json").stdout)
    assert (body["text"], body["reasoning"]) == ("2 + 2 = 4 <", "The user asks for 2+2; <|it is> 4.")
