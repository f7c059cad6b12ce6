"""OpenAI response bodies for completions and chat completions, whole or as server-sent events.

The streamed form is a series of `data: {json}` events ending in `data: [DONE]`, as the official client
expects; model text only ever travels inside JSON strings (escaped), never raw.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import AsyncIterator

from hipcore.engine.request import Ending
from rocmforge_serve.generation import ClientGone, Generation, error_for_ending

FINISH_REASON = {Ending.EOS: "stop", Ending.STOP: "stop", Ending.LENGTH: "length"}


def _usage(gen: Generation) -> dict:
    return {"prompt_tokens": gen.prompt_tokens, "completion_tokens": gen.completion_tokens,
            "total_tokens": gen.prompt_tokens + gen.completion_tokens}


def _envelope(gen: Generation, chat: bool, choices: list, stream: bool) -> dict:
    prefix, obj = ("chatcmpl", "chat.completion") if chat else ("cmpl", "text_completion")
    return {"id": f"{prefix}-{gen.request_id}-{_run_id}", "object": obj + (".chunk" if stream and chat else ""),
            "created": int(time.time()), "model": gen.served.name, "choices": choices}


_run_id = uuid.uuid4().hex[:8]  # request ids restart with the process; this keeps response ids unique


async def whole_response(gen: Generation, chat: bool) -> dict:
    """Collect every event, then one JSON body (the caller maps an error ending to its status)."""
    pieces = []
    final = None
    async for event in gen.events():
        pieces.append(event.text)
        if event.finished:
            final = event
    error = error_for_ending(final)
    if error is not None:
        raise error
    text = "".join(pieces)
    reason = FINISH_REASON[final.ending]
    if chat:
        choice = {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": reason,
                  "logprobs": None}
    else:
        choice = {"index": 0, "text": text, "finish_reason": reason, "logprobs": None}
    body = _envelope(gen, chat, [choice], stream=False)
    body["usage"] = _usage(gen)
    return body


def _sse(payload: dict | str) -> bytes:
    data = payload if isinstance(payload, str) else json.dumps(payload, ensure_ascii=False)
    return f"data: {data}\n\n".encode("utf-8")


async def stream_response(gen: Generation, chat: bool, include_usage: bool) -> AsyncIterator[bytes]:
    """SSE chunks; an error after the stream began becomes an error event (the status line is already sent).
    If the client leaves, the ASGI server cancels this generator and the `finally` cancels the request."""
    try:
        if chat:
            yield _sse(_envelope(gen, chat, [{"index": 0, "delta": {"role": "assistant", "content": ""},
                                              "finish_reason": None, "logprobs": None}], stream=True))
        async for event in gen.events():
            reason = None
            if event.finished:
                error = error_for_ending(event)
                if error is not None:
                    yield _sse(error.body())
                    break
                reason = FINISH_REASON[event.ending]
            if not event.text and reason is None:
                continue
            if chat:
                delta = {"content": event.text} if event.text else {}
                choice = {"index": 0, "delta": delta, "finish_reason": reason, "logprobs": None}
            else:
                choice = {"index": 0, "text": event.text, "finish_reason": reason, "logprobs": None}
            yield _sse(_envelope(gen, chat, [choice], stream=True))
        if include_usage:
            chunk = _envelope(gen, chat, [], stream=True)
            chunk["usage"] = _usage(gen)
            yield _sse(chunk)
        yield _sse("[DONE]")
    except ClientGone:
        return
    finally:
        gen.close()
