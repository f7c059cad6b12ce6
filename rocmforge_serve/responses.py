"""OpenAI response bodies for completions and chat completions, whole or as server-sent events.

The streamed form is a series of `data: {json}` events ending in `data: [DONE]`, as the official client
expects; model text only ever travels inside JSON strings (escaped), never raw.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from typing import AsyncIterator

from hipcore.engine.request import Ending
from hipcore.tokenizer import harmony
from hipcore.tokenizer.harmony import is_harmony
from rocmforge_serve.generation import ClientGone, Generation, error_for_ending
from rocmforge_serve.logprobs_format import chat_logprobs, completion_logprobs, event_logprobs
from rocmforge_serve import harmony_calls
from rocmforge_serve.tool_calls import HARMONY, CallWatcher, new_call, parse_calls

log = logging.getLogger("rocmforge.serve")
FINISH_REASON = {Ending.EOS: "stop", Ending.STOP: "stop", Ending.LENGTH: "length"}


def _usage(gen: Generation) -> dict:
    return {"prompt_tokens": gen.prompt_tokens, "completion_tokens": gen.completion_tokens,
            "total_tokens": gen.prompt_tokens + gen.completion_tokens,
            # OpenAI's field: prompt tokens whose KV the server had already (the prefix cache)
            "prompt_tokens_details": {"cached_tokens": gen.cached_tokens}}


def _envelope(gen: Generation, chat: bool, choices: list, stream: bool) -> dict:
    prefix, obj = ("chatcmpl", "chat.completion") if chat else ("cmpl", "text_completion")
    return {"id": f"{prefix}-{gen.request_id}-{_run_id}", "object": obj + (".chunk" if stream and chat else ""),
            "created": int(time.time()), "model": gen.served.name, "choices": choices}


_run_id = uuid.uuid4().hex[:8]  # request ids restart with the process; this keeps response ids unique


def _choice_reason(gen: Generation, final_reason: str, tokens: int) -> str:
    """One of n choices' finish reason: the engine's final event tells the request's; a choice that generated
    max_tokens tokens was cut there (an end-of-generation token is never counted), any other one stopped."""
    if gen.choices == 1:
        return final_reason
    return "length" if tokens >= gen.max_tokens else "stop"


async def whole_response(gen: Generation, chat: bool) -> dict:
    """Collect every event, then one JSON body (the caller maps an error ending to its status)."""
    pieces = [[] for _ in range(gen.choices)]
    tokens = [0] * gen.choices
    logprobs = [[] for _ in range(gen.choices)]
    final = None
    async for event in gen.events():
        pieces[event.seq_index].append(event.text)
        tokens[event.seq_index] += len(event.token_ids)
        logprobs[event.seq_index] += event_logprobs(event)
        if event.finished:
            final = event
    error = error_for_ending(final)
    if error is not None:
        raise error
    final_reason = FINISH_REASON[final.ending]
    choices = [_whole_choice(gen, chat, i, "".join(pieces[i]), _choice_reason(gen, final_reason, tokens[i]))
               for i in range(gen.choices)]
    if gen.logprobs is not None:
        tokenizer = gen.served.tokenizer
        for choice, taken in zip(choices, logprobs):
            choice["logprobs"] = chat_logprobs(tokenizer, taken) if chat else completion_logprobs(tokenizer, taken)
    body = _envelope(gen, chat, choices, stream=False)
    body["usage"] = _usage(gen)
    return body


def _whole_choice(gen: Generation, chat: bool, index: int, text: str, reason: str) -> dict:
    if chat:
        message = {"role": "assistant", "content": text}
        if gen.tools is not None and gen.tool_format == HARMONY:  # gpt-oss's calls, read from its markup
            reasoning, content, calls = harmony_calls.parse(text, gen.tools.tools, new_call)
            message = {"role": "assistant", "content": content or (None if calls else ""),
                       **({"reasoning_content": reasoning} if reasoning else {})}
            if calls:
                message, reason = {**message, "tool_calls": calls}, "tool_calls"
            return {"index": index, "message": message, "finish_reason": reason, "logprobs": None}
        if _harmony(gen):  # gpt-oss: its analysis channel as reasoning_content
            reasoning, text = harmony.split(text)
            message = {"role": "assistant", "content": text, **({"reasoning_content": reasoning} if reasoning else {})}
        if gen.tools is not None:
            content, calls = parse_calls(gen.tool_format, text, gen.tools.tools)
            if calls:
                message, reason = {"role": "assistant", "content": content, "tool_calls": calls}, "tool_calls"
        return {"index": index, "message": message, "finish_reason": reason, "logprobs": None}
    return {"index": index, "text": text, "finish_reason": reason, "logprobs": None}


def _harmony(gen: Generation) -> bool:
    """Whether the served model answers in harmony channels (gpt-oss's template)."""
    return is_harmony(getattr(gen.served, "chat_template", None))


def _sse(payload: dict | str) -> bytes:
    data = payload if isinstance(payload, str) else json.dumps(payload, ensure_ascii=False)
    return f"data: {data}\n\n".encode("utf-8")


class ChunkEncoder:
    """The SSE events of one stream, as json.dumps of the full chunk would write them, byte for byte, at the
    cost of escaping the text alone: the envelope (id, object, created, model) is the same for every chunk
    of a stream (OpenAI's streams share one `created` too), so it is formatted once, around a marker."""

    _MARK = "\x00rocmforge-text\x00"  # cannot occur in the JSON of the envelope: json.dumps escapes \x00

    def __init__(self, gen: Generation, chat: bool):
        self.envelope = _envelope(gen, chat, [], stream=True)
        self._by_reason: dict[str | None, tuple[bytes, bytes] | None] = {}
        self.chat = chat

    def _choice(self, text, reason: str | None) -> dict:
        if self.chat:
            delta = {"content": text} if text != "" else {}
            return {"index": 0, "delta": delta, "finish_reason": reason, "logprobs": None}
        return {"index": 0, "text": text, "finish_reason": reason, "logprobs": None}

    def _frame(self, reason: str | None) -> tuple[bytes, bytes] | None:
        if reason not in self._by_reason:
            whole = _sse({**self.envelope, "choices": [self._choice(self._MARK, reason)]}).decode("utf-8")
            marker = json.dumps(self._MARK, ensure_ascii=False)
            if whole.count(marker) == 1:
                before, _, after = whole.partition(marker)
                self._by_reason[reason] = (before.encode("utf-8"), after.encode("utf-8"))
            else:  # a model named like the marker: every chunk through json.dumps, never a wrong cut
                self._by_reason[reason] = None
        return self._by_reason[reason]

    def text(self, text: str, reason: str | None = None) -> bytes:
        """One chunk carrying `text` (and the finish reason on the last one)."""
        frame = self._frame(reason) if text != "" or not self.chat else None
        if frame is None:  # (an empty delta is {} in chat chunks, not {"content": ""})
            return _sse({**self.envelope, "choices": [self._choice(text, reason)]})
        before, after = frame
        return before + _encode_string(text).encode("utf-8") + after

    def reasoning(self, text: str) -> bytes:
        """One chat chunk carrying reasoning text (gpt-oss's analysis channel) as `reasoning_content`."""
        return _sse({**self.envelope, "choices": [{"index": 0, "delta": {"reasoning_content": text},
                                                   "finish_reason": None, "logprobs": None}]})

    def delta(self, delta: dict, logprobs: dict | None) -> bytes:
        """One chat chunk with this delta (content or tool_calls) and these chat logprobs (or none)."""
        return _sse({**self.envelope, "choices": [{"index": 0, "delta": delta, "finish_reason": None,
                                                   "logprobs": logprobs}]})

    def usage(self, gen: Generation) -> bytes:
        return _sse({**self.envelope, "choices": [], "usage": _usage(gen)})


async def _choices_stream(gen: Generation, encoder: ChunkEncoder, include_usage: bool) -> AsyncIterator[bytes]:
    """n > 1 or logprobs: each event's chunk names its choice (index) and carries its tokens' log-probabilities;
    the finish reasons of every choice come at the end. Harmony answers (gpt-oss) are split per choice, as whole."""
    tokens = [0] * gen.choices
    offsets = [0] * gen.choices
    chat = encoder.chat
    tokenizer = gen.served.tokenizer
    splitters = [harmony.HarmonySplitter() for _ in range(gen.choices)] if chat and _harmony(gen) else None
    async for batch in gen.event_batches():
        out = []
        for event in batch:
            tokens[event.seq_index] += len(event.token_ids)
            if event.finished:
                error = error_for_ending(event)
                if error is not None:
                    out.append(_sse(error.body()))
                else:
                    final_reason = FINISH_REASON[event.ending]
                    for index, splitter in enumerate(splitters or []):  # what each held back (a marker's start)
                        out += _harmony_chunks(encoder, index, splitter.finish(), None)
                    for index in range(gen.choices):
                        out.append(_sse({**encoder.envelope, "choices": [_stream_choice(
                            chat, index, "", _choice_reason(gen, final_reason, tokens[index]))]}))
                if include_usage and error is None:
                    out.append(encoder.usage(gen))
                out.append(_sse("[DONE]"))
                break
            taken = event_logprobs(event) if gen.logprobs is not None else []
            if splitters is not None:
                out += _harmony_chunks(encoder, event.seq_index, splitters[event.seq_index].feed(event.text),
                                       chat_logprobs(tokenizer, taken) if taken else None)
            elif event.text or taken:
                choice = _stream_choice(chat, event.seq_index, event.text)
                if taken:
                    choice["logprobs"] = chat_logprobs(tokenizer, taken) if chat else completion_logprobs(
                        tokenizer, taken, offsets[event.seq_index])
                offsets[event.seq_index] += len(event.text)
                out.append(_sse({**encoder.envelope, "choices": [choice]}))
        if out:
            yield b"".join(out)


def _harmony_chunks(encoder: ChunkEncoder, index: int, parts: list[tuple[str, str]], logprobs: dict | None) -> list:
    """One choice's split harmony text as chunks (reasoning_content or content); the token's logprobs with the first,
    or alone in an empty delta when its text was markup or is held back."""
    deltas = [{"reasoning_content": text} if kind == "reasoning" else {"content": text} for kind, text in parts]
    if logprobs is not None and not deltas:
        deltas = [{}]
    return [_sse({**encoder.envelope, "choices": [{"index": index, "delta": delta, "finish_reason": None,
                                                   "logprobs": logprobs if k == 0 else None}]})
            for k, delta in enumerate(deltas)]


def _stream_choice(chat: bool, index: int, text: str, reason: str | None = None) -> dict:
    if chat:
        return {"index": index, "delta": {"content": text} if text else {}, "finish_reason": reason, "logprobs": None}
    return {"index": index, "text": text, "finish_reason": reason, "logprobs": None}


async def _tool_call_stream(gen: Generation, encoder: ChunkEncoder, include_usage: bool) -> AsyncIterator[bytes]:
    """A chat answer that may hold tool calls: text that cannot begin a call streams as content as it comes
    (tool_calls.CallWatcher); the rest waits until the answer ends (a call is only known as one when it is whole),
    then goes as content and/or one tool_calls delta per call, as OpenAI streams them. With logprobs, a content
    chunk carries those of the tokens whose text it releases; the held tokens' (the calls' among them) come with
    the first tool_calls delta, else with what follows the held text (every token's, once, in order)."""
    watcher = CallWatcher(gen.tool_format, gen.tools.forced)
    held = _HeldLogprobs() if gen.logprobs is not None else None
    final = None
    async for batch in gen.event_batches():
        out = []
        for event in batch:
            released = watcher.feed(event.text)
            if held is not None:
                held.add(event)
            if released:
                out.append(encoder.text(released) if held is None else
                           encoder.delta({"content": released}, held.take(gen, watcher.sent)))
            if event.finished:
                final = event
        if out:
            yield b"".join(out)
    error = error_for_ending(final)
    if error is not None:
        yield _sse(error.body()) + _sse("[DONE]")
        return
    reason = FINISH_REASON[final.ending]
    content, calls = parse_calls(gen.tool_format, watcher.rest(), gen.tools.tools)
    rest = held.take(gen, None) if held is not None else None
    out = []
    if content:
        out.append(encoder.delta({"content": content}, None if calls else rest))
    for index, call in enumerate(calls):
        out.append(encoder.delta({"tool_calls": [{"index": index, **call}]}, rest if index == 0 else None))
    if rest and not content and not calls:  # held tokens of no text (a character's first bytes at the end)
        out.append(encoder.delta({}, rest))
    out.append(encoder.text("", "tool_calls" if calls else reason))
    if include_usage:
        out.append(encoder.usage(gen))
    out.append(_sse("[DONE]"))
    yield b"".join(out)


async def _harmony_tool_call_stream(gen: Generation, encoder: ChunkEncoder, include_usage: bool) -> AsyncIterator[bytes]:
    """gpt-oss's answer that may hold tool calls: reasoning and content stream as they come, a message at a time once
    its header is read (harmony_calls.HarmonyCallWatcher); from a call's header on, the rest waits for the end, then
    goes as reasoning, content and one tool_calls delta per call. Each token's logprobs come with its own chunk."""
    watcher = harmony_calls.HarmonyCallWatcher(gen.tools.forced)
    tokenizer = gen.served.tokenizer
    final = None
    async for batch in gen.event_batches():
        out = []
        for event in batch:
            taken = event_logprobs(event) if gen.logprobs is not None else []
            out += _harmony_chunks(encoder, 0, watcher.feed(event.text), chat_logprobs(tokenizer, taken) if taken else None)
            if event.finished:
                final = event
        if out:
            yield b"".join(out)
    error = error_for_ending(final)
    if error is not None:
        yield _sse(error.body()) + _sse("[DONE]")
        return
    parts, rest = watcher.finish()
    out = _harmony_chunks(encoder, 0, parts, None)
    reasoning, content, calls = harmony_calls.parse(rest, gen.tools.tools, new_call) if rest else ("", "", [])
    out += _harmony_chunks(encoder, 0, [(kind, text) for kind, text in (("reasoning", reasoning), ("content", content))
                                        if text], None)
    for index, call in enumerate(calls):
        out.append(encoder.delta({"tool_calls": [{"index": index, **call}]}, None))
    out.append(encoder.text("", "tool_calls" if calls else FINISH_REASON[final.ending]))
    if include_usage:
        out.append(encoder.usage(gen))
    out.append(_sse("[DONE]"))
    yield b"".join(out)


class _HeldLogprobs:
    """The log-probabilities of a streamed tool-call answer's tokens not yet sent, each with the end of its text in
    the answer (characters): a content chunk takes those whose text it released whole."""

    def __init__(self):
        self.entries: list[tuple[int, list]] = []
        self.chars = 0

    def add(self, event) -> None:
        self.chars += len(event.text)
        taken = event_logprobs(event)
        if taken:
            self.entries.append((self.chars, taken))

    def take(self, gen: Generation, released: int | None) -> dict | None:
        """Chat logprobs of the tokens whose text ends within the first `released` characters (None: all)."""
        count = len(self.entries) if released is None else \
            next((i for i, (end, _) in enumerate(self.entries) if end > released), len(self.entries))
        taken, self.entries = self.entries[:count], self.entries[count:]
        return chat_logprobs(gen.served.tokenizer, [pair for _, pairs in taken for pair in pairs]) if taken else None


_encode_string = json.encoder.encode_basestring  # json.dumps(text, ensure_ascii=False) for one str, in C


async def stream_response(gen: Generation, chat: bool, include_usage: bool) -> AsyncIterator[bytes]:
    """SSE chunks; an error after the stream began becomes an error event (the status line is already sent).
    If the client leaves, the ASGI server cancels this generator and the `finally` cancels the request.

    Each yield is one write: every token event that arrived since the last one (one SSE event each, in order),
    so a handler that fell behind the engine catches up with one write, not one per token."""
    encoder = ChunkEncoder(gen, chat)
    try:
        if chat:
            yield b"".join(_sse({**encoder.envelope, "choices": [{
                "index": index, "delta": {"role": "assistant", "content": ""}, "finish_reason": None,
                "logprobs": None}]}) for index in range(gen.choices))
        if gen.tools is not None:
            stream = _harmony_tool_call_stream if gen.tool_format == HARMONY else _tool_call_stream
            async for chunk in stream(gen, encoder, include_usage):
                yield chunk
            return
        if gen.choices > 1 or gen.logprobs is not None:
            async for chunk in _choices_stream(gen, encoder, include_usage):
                yield chunk
            return
        splitter = harmony.HarmonySplitter() if chat and _harmony(gen) else None
        async for batch in gen.event_batches():
            out = []
            ended = False
            for event in batch:
                reason = None
                if event.finished:
                    ended = True
                    error = error_for_ending(event)
                    if error is not None:
                        out.append(_sse(error.body()))
                        break
                    reason = FINISH_REASON[event.ending]
                if splitter is not None:  # gpt-oss: reasoning and answer apart, no channel markup
                    parts = splitter.feed(event.text) + (splitter.finish() if reason is not None else [])
                    out += [encoder.reasoning(t) if kind == "reasoning" else encoder.text(t) for kind, t in parts]
                    if reason is not None:
                        out.append(encoder.text("", reason))
                    continue
                if not event.text and reason is None:
                    continue
                out.append(encoder.text(event.text, reason))
            if ended:  # the final event is the last of its batch (Generation.event_batches)
                if include_usage:
                    out.append(encoder.usage(gen))
                out.append(_sse("[DONE]"))
            if out:
                yield b"".join(out)
    except ClientGone as exc:
        log.debug("request %d: the client left mid-stream (%s); cancelled", gen.request_id, exc.args[0])
    finally:
        if gen.close():  # cancelled from outside (the ASGI server saw the client leave first)
            log.debug("request %d: the client left mid-stream (after %d tokens); cancelled", gen.request_id,
                      gen.completion_tokens)
