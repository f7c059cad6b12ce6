"""One generation from a handler's point of view: prompt -> engine -> events, and cancel when the client goes.

`start_generation` renders and tokenizes the prompt off the event loop, checks it against the context
(400 naming the limit), submits it, and waits for the first event while watching the connection: a
client that leaves during its prompt is cancelled at once. `Generation.events()` then yields the rest;
whoever consumes it must call `close()` (a `finally`), which cancels the request if it has not ended.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

from hipcore.engine.latency import LatencyHistogram
from hipcore.engine.request import Ending, Event
from hipcore.engine.grammar import GRAMMAR_FAILURE, compile_grammar, grammar_vocabulary
from hipcore.errors import InvalidModelError, UsageError
from hipcore.tokenizer.chat_template import encode_chat, render_chat
from hipcore.tokenizer.harmony import FINAL_HEADER, as_lark, is_harmony
from rocmforge_serve.api_errors import ApiError, bad_request, server_error, unavailable
from rocmforge_serve.engine_loop import AsyncSink, EngineStopped
from rocmforge_serve.protocol import GenerationRequest, check_sampling, context_error
from rocmforge_serve.tool_calls import ToolRequest, call_grammar, template_messages, tool_format


class ClientGone(Exception):
    """The client closed the connection; its request has been cancelled."""


@dataclass
class ServeLatency:
    """The HTTP layer's share of a first token, per generation request whose body parsed (/metrics): preparing
    the prompt (chat template and tokenizer) and the wait from the body to the first event in the handler's
    hands (the engine's queue and prompt step, and with two processes the pipe both ways, inside it)."""

    prepare_time: LatencyHistogram = field(default_factory=LatencyHistogram)
    first_token_time: LatencyHistogram = field(default_factory=LatencyHistogram)


@dataclass
class ServedModel:
    """What the handlers need of the loaded model. `loop` is the engine's EngineLoop when the HTTP layer
    shares its process, or an EngineClient (http_process.py) on the pipe to it; both take submit, cancel
    and state() alike."""

    name: str
    loop: object
    tokenizer: object
    chat_template: str | None
    context: int  # tokens of prompt + completion
    max_queue: int  # requests waiting beyond the engine's running batch
    max_seqs: int  # the engine's running batch
    vocab_size: int
    created: int = 0
    ignore_eos: bool = False  # the default of requests that do not say (serve --ignore-eos, for benchmarks)
    templates: object = None  # a TemplatePool (long-lived renderers); None: render_chat's process per render
    latency: ServeLatency = field(default_factory=ServeLatency)


@dataclass
class Generation:
    served: ServedModel
    request_id: int
    sink: AsyncSink
    disconnected: asyncio.Task
    prompt_tokens: int
    completion_tokens: int = 0
    cached_tokens: int = 0  # of the prompt, found in the prefix cache (the final event says)
    ending: Ending | None = None
    first: Event | None = None
    choices: int = 1  # n: parallel samples, events told apart by seq_index
    logprobs: int | None = None  # SamplingParams.logprobs: the events carry them
    max_tokens: int = 0
    tools: ToolRequest | None = None  # the request's tools when calls are parsed from its answer
    tool_format: str | None = None
    _done: bool = field(default=False)

    async def next_batch(self) -> list[Event]:
        """Every event that has arrived (at least one), waiting for the next if none has; ClientGone (the
        request cancelled) if the client leaves first. Events already here are returned even then."""
        if self.first is not None:
            first, self.first = self.first, None
            return [first, *self.sink.take_all()]
        sink = self.sink
        while not sink.events:
            if self.disconnected.done():
                self.close()
                raise ClientGone(self._where())
            await sink.wait()  # put() or, on a disconnect, the watcher's done callback wakes it
        return sink.take_all()

    async def next_event(self) -> Event:
        if self.first is not None:
            event, self.first = self.first, None
            return event
        sink = self.sink
        while not sink.events:
            if self.disconnected.done():
                self.close()
                raise ClientGone(self._where())
            await sink.wait()
        return sink.events.popleft()

    def _where(self) -> str:
        return "before its first token" if self.completion_tokens == 0 and self.first is None else \
            f"after {self.completion_tokens} tokens"

    async def event_batches(self):
        """The request's events up to and including the final one, in lists of those that arrived together
        (a consumer that fell behind catches up in one go: one write for several tokens)."""
        while not self._done:
            batch = await self.next_batch()
            for i, event in enumerate(batch):
                self.completion_tokens += len(event.token_ids)
                if event.finished:
                    self.ending, self.cached_tokens = event.ending, event.cached_tokens
                    self._done = True
                    del batch[i + 1:]  # nothing follows a request's final event; never yield past it
                    break
            yield batch

    async def events(self):
        """The request's events up to and including the final one."""
        async for batch in self.event_batches():
            for event in batch:
                yield event

    def close(self) -> bool:
        """Cancel the request unless it ended (safe to call twice; the engine's cancel is a no-op then). True
        when this call cancelled it."""
        self.disconnected.cancel()
        if not self._done:
            self._done = True
            self.served.loop.cancel(self.request_id)
            return True
        return False


async def watch_disconnect(receive) -> None:
    """Returns when the ASGI server reports that the client went away."""
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return


def error_for_ending(event: Event) -> ApiError | None:
    """The HTTP error for a request that ended without a normal finish (None: it finished normally)."""
    if event.ending in (Ending.EOS, Ending.STOP, Ending.LENGTH):
        return None
    if event.ending == Ending.REJECTED:
        return bad_request(event.error or "the request can never fit the KV cache", param="max_tokens",
                           code="context_length_exceeded")
    if event.ending == Ending.FAILED and GRAMMAR_FAILURE in (event.error or ""):
        # the request's own constraint gave out (llguidance's parser limits: a schema whose recursion never ends)
        return bad_request(f"the output's constraint failed: {event.error}", code="grammar_failed")
    if event.ending == Ending.CANCELLED:
        return unavailable(event.error or "the request was cancelled (the server is shutting down)")
    return server_error(f"generation failed: {event.error or event.ending}")


def request_tool_format(served: ServedModel, request: GenerationRequest) -> str | None:
    """The call format of the model's template for a request with tools (a 400 when it has none); None without
    tools or with tool_choice "none"."""
    if request.tools is None or not request.tools.active:
        return None
    fmt = tool_format(served.chat_template)
    if fmt is None:
        raise bad_request("this model's chat template has no tool support (it does not render tools or has no "
                          "tool-call format this server reads: Qwen2.5/Qwen3's <tool_call>, Llama 3.1's JSON, gpt-oss's harmony); send "
                          "the request without tools", param="tools", code="unsupported")
    return fmt


def compiled_constraint(served: ServedModel, request: GenerationRequest, fmt: str | None = None) -> str | None:
    """The request's grammar for SamplingParams.grammar (None: unconstrained); runs in a worker thread. A
    constraint that is not valid or not supported is a 400 naming the field it came in. fmt: the tool-call
    format, whose call a forced tool_choice constrains."""
    if fmt is not None and request.tools.forced:
        request.constraint, request.constraint_param = call_grammar(fmt, request.tools), "tools"
    if request.constraint is None:
        return None
    constraint = request.constraint
    if request.messages is not None and is_harmony(served.chat_template) and request.constraint_param != "tools" \
            and "gbnf" not in constraint:
        # gpt-oss answers in harmony messages: the JSON is its final message's text, after the header it was trained
        # to write (llama.cpp's gpt-oss handler does the same); a GBNF grammar constrains the raw output, as there
        constraint = {**constraint, "lark_prefix": as_lark(FINAL_HEADER)}
    try:
        grammar = compile_grammar(**constraint)
    except UsageError as exc:
        raise bad_request(f"{request.constraint_param}: {exc}", param=request.constraint_param,
                          code="unsupported_schema") from None
    grammar_vocabulary(served.tokenizer)  # built once, here rather than on the engine's thread
    return grammar


def prompt_ids(served: ServedModel, request: GenerationRequest) -> list[int]:
    """Render (chat) and tokenize; runs in a worker thread (the template renders in a sandboxed child)."""
    tok = served.tokenizer
    if request.messages is not None:
        bos = tok.token_text(tok.bos_id) if tok.bos_id is not None else ""
        eos = tok.token_text(tok.eos_id) if tok.eos_id is not None else ""
        messages = template_messages(request.messages, harmony=is_harmony(served.chat_template))
        tools = request.tools.tools if request.tools is not None and request.tools.active else None
        try:
            if served.templates is not None:
                text = served.templates.render(served.chat_template, messages, bos_token=bos, eos_token=eos,
                                               tools=tools, template_kwargs=request.template_kwargs)
            else:
                text = render_chat(served.chat_template, messages, bos_token=bos, eos_token=eos, tools=tools,
                                   template_kwargs=request.template_kwargs)
        except UsageError as exc:
            raise bad_request(str(exc), param="messages") from None
        except InvalidModelError as exc:
            raise server_error(f"the model's chat template failed: {exc}") from None
        return encode_chat(tok, text)
    if isinstance(request.prompt, str):
        return tok.encode(request.prompt)
    vocab = served.vocab_size
    if any(t < 0 or t >= vocab for t in request.prompt):
        raise bad_request(f"prompt token ids must be in [0, {vocab})", param="prompt")
    return list(request.prompt)


def check_capacity(served: ServedModel) -> None:
    """429 with Retry-After when the queue is full, 503 when the engine is not serving: never a hang."""
    loop = served.loop
    if not loop.accepting:
        raise unavailable(loop.fault or "the server is shutting down")
    limit = served.max_seqs + served.max_queue
    if loop.in_flight >= limit:
        raise ApiError(429, f"the server is full: {loop.in_flight} requests in flight (at most {limit}); retry shortly",
                       type="rate_limit_error", code="queue_full", headers={"Retry-After": "1"})


async def start_generation(served: ServedModel, request: GenerationRequest, receive) -> Generation:
    check_capacity(served)
    started = time.perf_counter()
    fmt = request_tool_format(served, request)
    grammar = await asyncio.to_thread(compiled_constraint, served, request, fmt)
    ids = await asyncio.to_thread(prompt_ids, served, request)
    served.latency.prepare_time.observe(time.perf_counter() - started)
    if not ids:
        raise bad_request("the prompt is empty after tokenization", param="prompt")
    if len(ids) >= served.context or (request.max_tokens is not None and len(ids) + request.max_tokens > served.context):
        raise context_error(len(ids), request.max_tokens, served.context)
    max_tokens = request.max_tokens if request.max_tokens is not None else served.context - len(ids)
    ignore_eos = served.ignore_eos if request.ignore_eos is None else request.ignore_eos
    params = check_sampling({**request.sampling, "ignore_eos": ignore_eos, "grammar": grammar}, max_tokens)
    if params.n > served.max_seqs:
        raise bad_request(f"n is {params.n}, more than the {served.max_seqs} sequences the server runs at once "
                          "(serve --parallel)", param="n")
    sink = AsyncSink(asyncio.get_running_loop())
    disconnected = asyncio.ensure_future(watch_disconnect(receive))
    disconnected.add_done_callback(lambda _task: sink.wake())  # a handler waiting for events learns at once
    try:
        check_capacity(served)  # again: the prompt took time and others may have come in meanwhile
        rid = served.loop.submit(ids, params, sink)
    except EngineStopped as exc:
        disconnected.cancel()
        raise unavailable(str(exc)) from None
    except (UsageError, ApiError) as exc:
        disconnected.cancel()
        raise exc if isinstance(exc, ApiError) else bad_request(str(exc)) from None
    generation = Generation(served, rid, sink, disconnected, prompt_tokens=len(ids),
                            choices=params.n, max_tokens=params.max_tokens, logprobs=params.logprobs,
                            tools=request.tools if fmt is not None else None, tool_format=fmt)
    try:
        # Wait for the first event before answering, so a rejection or a fault gets its own status code.
        first = await generation.next_event()
    except BaseException:
        generation.close()
        raise
    if first.finished:
        error = error_for_ending(first)
        if error is not None:
            generation.close()
            raise error
    if first.token_ids:
        served.latency.first_token_time.observe(time.perf_counter() - started)
    generation.first = first
    return generation
