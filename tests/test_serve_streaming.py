"""The streamed path's fast parts: preformatted SSE chunks, per-step delivery of events, catching up in one
write, and waking a waiting handler on a disconnect; then the same properties end to end on a live server."""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace

import httpx
import pytest

from support.engine_testing import greedy, load_tiny, prompt_of, tiny_model
from support.serve_testing import MODEL_NAME, SHAPES, live_server

from hipcore.engine.request import Ending, Event
from rocmforge_serve.engine_loop import AsyncSink, EngineLoop
from rocmforge_serve.generation import ClientGone, Generation
from rocmforge_serve.responses import ChunkEncoder, _envelope, stream_response


def fake_generation(sink, name=MODEL_NAME, request_id=7, prompt_tokens=5):
    cancelled = []
    served = SimpleNamespace(name=name, loop=SimpleNamespace(cancel=cancelled.append))
    loop = asyncio.get_running_loop()
    never = loop.create_future()  # the client never leaves unless the test says so
    gen = Generation(served, request_id, sink, asyncio.ensure_future(never), prompt_tokens=prompt_tokens)
    gen.disconnected.add_done_callback(lambda _t: sink.wake())
    return gen, never, cancelled


TEXTS = ["plain", "", " with space", 'quote " and \\ backslash', "line\nbreak\ttab\r", "\x00\x01\x1f control",
         "café naïve", "日本語", "emoji 🙂", "\u2028\u2029 separators", "</script>", "{\"json\": 1}"]


@pytest.mark.parametrize("chat", [False, True])
@pytest.mark.parametrize("name", [MODEL_NAME, 'odd "name" \\ é', "\x00rocmforge-text\x00"])
def test_chunk_encoder_writes_what_json_dumps_writes(chat, name):
    async def run():
        gen, _, _ = fake_generation(AsyncSink(asyncio.get_running_loop()), name=name)
        encoder = ChunkEncoder(gen, chat)
        for reason in (None, "stop", "length"):
            for text in TEXTS:
                if chat:
                    delta = {"content": text} if text else {}
                    choice = {"index": 0, "delta": delta, "finish_reason": reason, "logprobs": None}
                else:
                    choice = {"index": 0, "text": text, "finish_reason": reason, "logprobs": None}
                expected = {**_envelope(gen, chat, [choice], stream=True), "created": encoder.envelope["created"]}
                want = f"data: {json.dumps(expected, ensure_ascii=False)}\n\n".encode("utf-8")
                assert encoder.text(text, reason) == want, (text, reason)
    asyncio.run(run())


def parse_sse(raw: bytes) -> list:
    events = [e for e in raw.decode("utf-8").split("\n\n") if e]
    assert all(e.startswith("data: ") for e in events), events
    return [e[6:] if e[6:] == "[DONE]" else json.loads(e[6:]) for e in events]


@pytest.mark.parametrize("chat", [False, True])
def test_a_burst_of_events_goes_out_in_one_write_in_order(chat):
    """A handler that fell behind gets every queued event in one write, one SSE event per token, in order;
    usage counts the tokens; nothing queued after the final event is sent."""
    async def run():
        sink = AsyncSink(asyncio.get_running_loop())
        gen, _, cancelled = fake_generation(sink)
        writes = []
        stream = stream_response(gen, chat, include_usage=True)
        if chat:
            writes.append(await stream.__anext__())  # the role chunk goes out before any event
        pieces = ["a", "b", "", "c"]
        for i, text in enumerate(pieces):
            sink.put(Event(7, 0, (10 + i,), text))
        sink.put(Event(7, 0, (), "", finished=True, ending=Ending.LENGTH))
        sink.put(Event(7, 0, (99,), "after the end"))  # never sent: the request has ended
        async for chunk in stream:
            writes.append(chunk)
        return writes, gen, cancelled

    writes, gen, cancelled = asyncio.run(run())
    assert len(writes) == (2 if chat else 1)  # the burst: one write
    events = parse_sse(b"".join(writes))
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    usage = chunks.pop()
    assert usage["choices"] == [] and usage["usage"] == {"prompt_tokens": 5, "completion_tokens": 4, "total_tokens": 9,
                                                     "prompt_tokens_details": {"cached_tokens": 0}}
    if chat:
        assert chunks.pop(0)["choices"][0]["delta"] == {"role": "assistant", "content": ""}
        texts = [c["choices"][0]["delta"].get("content") for c in chunks]
        assert texts == ["a", "b", "c", None]
    else:
        texts = [c["choices"][0]["text"] for c in chunks]
        assert texts == ["a", "b", "c", ""]
    assert [c["choices"][0]["finish_reason"] for c in chunks] == [None, None, None, "length"]
    assert len({(c["id"], c["created"]) for c in chunks + [usage]}) == 1
    assert gen.completion_tokens == 4 and cancelled == []  # it ended: nothing to cancel


def test_an_error_ending_streams_the_error_then_usage_and_done():
    async def run():
        sink = AsyncSink(asyncio.get_running_loop())
        gen, _, _ = fake_generation(sink)
        sink.put(Event(7, 0, (11,), "x"))
        sink.put(Event(7, 0, (), "", finished=True, ending=Ending.FAILED, error="boom"))
        return b"".join([c async for c in stream_response(gen, False, include_usage=True)])

    events = parse_sse(asyncio.run(run()))
    assert events[0]["choices"][0]["text"] == "x"
    assert "boom" in events[1]["error"]["message"]
    assert events[2]["usage"]["completion_tokens"] == 1 and events[3] == "[DONE]"


def test_a_disconnect_wakes_a_waiting_handler_and_cancels_the_request():
    async def run():
        sink = AsyncSink(asyncio.get_running_loop())
        gen, client_left, cancelled = fake_generation(sink)
        waiting = asyncio.ensure_future(gen.next_batch())
        await asyncio.sleep(0)
        assert not waiting.done()
        client_left.set_result(None)  # the disconnect watcher returns
        with pytest.raises(ClientGone):
            await asyncio.wait_for(waiting, timeout=5)
        return cancelled

    assert asyncio.run(run()) == [7]


def test_events_already_here_are_returned_before_a_disconnect_is_noticed():
    async def run():
        sink = AsyncSink(asyncio.get_running_loop())
        gen, client_left, _ = fake_generation(sink)
        sink.put(Event(7, 0, (1,), "kept"))
        client_left.set_result(None)
        await asyncio.sleep(0)
        first = await gen.next_batch()
        with pytest.raises(ClientGone):
            await gen.next_batch()
        return first

    assert [e.text for e in asyncio.run(run())] == ["kept"]


def test_engine_loop_hands_over_a_step_in_one_call_and_keeps_each_request_in_order(tmp_path_factory):
    """Four requests decode together: every request's events arrive complete and in order, in far fewer
    loop wake-ups than events (one per step, not one per token)."""
    loaded = load_tiny(tiny_model(tmp_path_factory))
    engine_loop = EngineLoop(loaded.engine)
    engine_loop.start()

    async def run():
        loop = asyncio.get_running_loop()
        calls = []
        real = loop.call_soon_threadsafe

        def counting(callback, *args, **kw):
            calls.append(callback)
            return real(callback, *args, **kw)
        loop.call_soon_threadsafe = counting
        sinks = [AsyncSink(loop) for _ in range(4)]
        rids = [engine_loop.submit(prompt_of(6, salt=i), greedy(12), sink) for i, sink in enumerate(sinks)]
        received = {rid: [] for rid in rids}
        for rid, sink in zip(rids, sinks):
            while not (received[rid] and received[rid][-1].finished):
                await sink.wait()
                received[rid] += sink.take_all()
        return rids, received, calls

    steps_before = loaded.engine.stats.steps
    try:
        rids, received, calls = asyncio.run(run())
        steps = loaded.engine.stats.steps - steps_before
    finally:
        engine_loop.stop()
        loaded.close()
    for rid in rids:
        events = received[rid]
        assert all(e.request_id == rid for e in events)
        assert [e.finished for e in events] == [False] * 12 + [True] and events[-1].ending == Ending.LENGTH
        assert len([t for e in events for t in e.token_ids]) == 12
    # at most one wake-up per step (the requests may join a few steps apart), never one per event
    assert len(calls) <= steps < sum(len(v) for v in received.values())


# ---- end to end ----------------------------------------------------------------------------------------

@pytest.fixture(scope="module", params=SHAPES)
def http_process(request) -> bool:
    """Each live server of this module runs in both of Server's shapes."""
    return request.param == "http process"


@pytest.fixture(scope="module")
def live(tmp_path_factory, http_process):
    with live_server(tiny_model(tmp_path_factory), max_seqs=8, http_process=http_process) as server:
        yield server


def stream_events(url: str, route: str, body: dict) -> list:
    with httpx.stream("POST", url + route, json={**body, "stream": True}, timeout=60) as response:
        assert response.status_code == 200
        return parse_sse(response.read())


def test_streamed_stop_string_split_across_tokens_equals_the_whole_reply(live):
    body = {"model": MODEL_NAME, "prompt": "x y z", "max_tokens": 16, "temperature": 0}
    full = httpx.post(live.url + "/v1/completions", json=body, timeout=60).json()["choices"][0]["text"]
    # a stop string that starts inside one token's text and ends in a later one's
    pieces = [c["choices"][0]["text"] for c in stream_events(live.url, "/v1/completions", body)[:-1]]
    ends = [sum(len(p) for p in pieces[:k]) for k in range(1, len(pieces))]
    boundary = next(b for b in ends if 0 < b < len(full) and full.index(full[b - 1:b + 1]) == b - 1)
    stop = full[boundary - 1:boundary + 1]
    whole = httpx.post(live.url + "/v1/completions", json={**body, "stop": [stop]}, timeout=60).json()["choices"][0]
    events = stream_events(live.url, "/v1/completions", {**body, "stop": [stop],
                                                          "stream_options": {"include_usage": True}})
    assert events[-1] == "[DONE]"
    chunks = [e for e in events[:-1] if e["choices"]]
    assert "".join(c["choices"][0]["text"] for c in chunks) == whole["text"] == full[:boundary - 1]
    assert [c["choices"][0]["finish_reason"] for c in chunks][-1] == "stop" == whole["finish_reason"]
    assert all(c["choices"][0]["finish_reason"] is None for c in chunks[:-1])
    assert events[-2]["usage"]["completion_tokens"] >= 2


def test_concurrent_streams_each_get_their_own_tokens_in_order(live):
    """Eight streams decode in the same steps; each one's text equals its own non-streamed reply."""
    import concurrent.futures

    prompts = [f"word{i} " * (1 + i % 3) for i in range(8)]

    def one(prompt):
        body = {"model": MODEL_NAME, "prompt": prompt, "max_tokens": 10, "temperature": 0}
        events = stream_events(live.url, "/v1/completions", {**body, "stream_options": {"include_usage": True}})
        whole = httpx.post(live.url + "/v1/completions", json=body, timeout=60).json()
        return events, whole

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        results = list(pool.map(one, prompts))
    for events, whole in results:
        chunks = [e for e in events[:-1] if e["choices"]]
        assert "".join(c["choices"][0]["text"] for c in chunks) == whole["choices"][0]["text"]
        assert events[-2]["usage"] == whole["usage"]
        assert len({c["id"] for c in chunks}) == 1
