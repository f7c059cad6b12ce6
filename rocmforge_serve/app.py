"""The ASGI app: routes, the body size cap, the API key, and every error in OpenAI's shape.

Handlers never block the event loop: prompts render and tokenize in worker threads, the engine steps in
its own thread (engine_loop) or its own process (http_process: the app then runs in a process of its own
and talks to the engine over a pipe), and events come back a step at a time into each request's sink.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hmac
import logging
import time

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from rocmforge_serve import metrics
from rocmforge_serve.access_log import AccessLog
from rocmforge_serve.tokenize_routes import detokenize_body, model_card, tokenize_body
from rocmforge_serve.api_errors import ApiError, server_error, unavailable
from rocmforge_serve.engine_loop import EngineStopped
from rocmforge_serve.generation import ClientGone, ServedModel, start_generation
from rocmforge_serve.protocol import MAX_BODY_BYTES, parse_generation, parse_json_body
from rocmforge_serve.request_guard import HostPolicy, RequestGuard
from rocmforge_serve.responses import stream_response, whole_response

log = logging.getLogger("rocmforge.serve")
TEMPLATE_WORKERS = 4  # chat renders at once; a warm worker renders in about a millisecond
STATE_WAIT_S = 0.9  # /metrics: the engine's process answers from its published reading; past this it is 503


async def read_body(request: Request, cap: int) -> bytes:
    """The body, refused with 413 as soon as it passes the cap (never buffered beyond it); ClientGone if the
    client leaves before it is all in."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > cap:
        raise ApiError(413, f"the request body is {int(declared)} bytes; at most {cap}", code="body_too_large")
    chunks, size = [], 0
    try:
        async for chunk in request.stream():
            size += len(chunk)
            if size > cap:
                raise ApiError(413, f"the request body is over {cap} bytes", code="body_too_large")
            chunks.append(chunk)
    except ClientDisconnect:
        raise ClientGone("during its request body") from None
    return b"".join(chunks)


def client_left(request: Request, exc: ClientGone) -> Response:
    """A client that left: a normal event, one debug line; the response goes nowhere (499, as nginx logs it)."""
    log.debug("%s %s: the client left %s; its request was cancelled", request.method, request.url.path,
              exc.args[0] if exc.args else "")
    return Response(status_code=499)


def create_app(served: ServedModel, *, api_key: str | None = None, max_body_bytes: int = MAX_BODY_BYTES,
               on_startup=None, on_shutdown=None, policy: HostPolicy | None = None, access_log: bool = False) -> Starlette:
    """policy: the Host / Origin rules (request_guard.py); None: a server on loopback with no extra names.
    access_log: one line per request (access_log.py)."""
    key = api_key.encode("utf-8") if api_key else None

    def authorize(request: Request) -> None:
        if key is None:
            return
        given = request.headers.get("authorization", "")
        scheme, _, token = given.partition(" ")
        # compare_digest on bytes: the time taken does not depend on where the first difference is
        if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode("utf-8", "replace"), key):
            raise ApiError(401, "invalid or missing API key: send Authorization: Bearer KEY", code="invalid_api_key",
                           headers={"WWW-Authenticate": "Bearer"})

    def check_model(name: str | None) -> None:
        if name is not None and name != served.name:
            raise ApiError(404, f"the model {name!r} does not exist; this server serves {served.name!r}",
                           param="model", code="model_not_found")

    async def generate(request: Request, chat: bool) -> Response:
        authorize(request)
        try:
            body = parse_json_body(await read_body(request, max_body_bytes))
            call = parse_generation(body, chat=chat)
            check_model(call.model)
            gen = await start_generation(served, call, request.receive)
        except ClientGone as exc:
            return client_left(request, exc)
        request.state.generation = gen  # its token counts for the access log
        if call.stream:
            return StreamingResponse(stream_response(gen, chat, call.include_usage), media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        try:
            return JSONResponse(await whole_response(gen, chat))
        except ClientGone as exc:
            return client_left(request, exc)
        finally:
            gen.close()

    async def completions(request: Request) -> Response:
        return await generate(request, chat=False)

    async def chat_completions(request: Request) -> Response:
        return await generate(request, chat=True)

    async def models(request: Request) -> Response:
        authorize(request)
        return JSONResponse({"object": "list", "data": [model_card(served)]})

    async def model(request: Request) -> Response:
        authorize(request)
        name = request.path_params["name"]
        if name != served.name:
            raise ApiError(404, f"the model {name[:200]!r} does not exist; this server serves {served.name!r}",
                           param="model", code="model_not_found")
        return JSONResponse(model_card(served))

    async def tokenize(request: Request) -> Response:
        """llama-server's /tokenize: {"content", "add_special", "with_pieces"} -> {"tokens"}."""
        authorize(request)
        body = parse_json_body(await read_body(request, max_body_bytes))
        return JSONResponse(await asyncio.to_thread(tokenize_body, served, body))

    async def detokenize(request: Request) -> Response:
        """llama-server's /detokenize: {"tokens"} -> {"content"}."""
        authorize(request)
        body = parse_json_body(await read_body(request, max_body_bytes))
        return JSONResponse(detokenize_body(served, body))

    async def health(request: Request) -> Response:
        """Liveness (vLLM's /health): 200 while the server runs, busy, full or draining; 503 once its engine has
        stopped (a fault), so that a probe restarts only a server that cannot recover. Never waits for the engine."""
        loop = served.loop
        if loop.fault or not loop.running:
            return JSONResponse({"status": "unavailable", "reason": loop.fault or "the engine is not running"},
                                status_code=503)
        return JSONResponse({"status": "ok"})

    async def load(request: Request) -> Response:
        """Readiness and load (vLLM's /load, with its `server_load`: requests in flight): 200 when a new request
        would be taken now, 503 with the reason when not (full, draining, stopped). Never waits for the engine."""
        reason = not_ready_reason(served)
        loop = served.loop
        body = {"server_load": loop.in_flight, "ready": reason is None, "limit": served.max_seqs + served.max_queue,
                "parallel": served.max_seqs}
        if reason is not None:
            body["reason"] = reason
        return JSONResponse(body, status_code=200 if reason is None else 503)

    async def metrics_route(request: Request) -> Response:
        try:
            state = await asyncio.wait_for(served.loop.state(), STATE_WAIT_S)
        except EngineStopped as exc:
            raise unavailable(str(exc)) from None
        except asyncio.TimeoutError:
            raise unavailable(f"the engine's process did not answer within {STATE_WAIT_S:g} s") from None
        return Response(metrics.render(state, served.loop.in_flight, served.latency), media_type="text/plain; version=0.0.4; charset=utf-8")

    async def api_error(request: Request, exc: ApiError) -> Response:
        return exc.response()

    async def http_error(request: Request, exc: HTTPException) -> Response:
        kind = "not_found" if exc.status_code == 404 else "invalid_request_error"
        message = f"{request.method} {request.url.path}: {exc.detail}"
        return ApiError(exc.status_code, message, type=kind, headers=dict(exc.headers or {})).response()

    async def unexpected(request: Request, exc: Exception) -> Response:
        log.exception("internal error on %s %s", request.method, request.url.path)
        return server_error(f"internal error: {type(exc).__name__}").response()

    routes = [
        Route("/v1/models", models, methods=["GET"]),
        Route("/v1/models/{name:path}", model, methods=["GET"]),
        Route("/tokenize", tokenize, methods=["POST"]),
        Route("/detokenize", detokenize, methods=["POST"]),
        Route("/v1/completions", completions, methods=["POST"]),
        Route("/v1/chat/completions", chat_completions, methods=["POST"]),
        Route("/health", health, methods=["GET"]),
        Route("/load", load, methods=["GET"]),
        Route("/metrics", metrics_route, methods=["GET"]),
    ]
    @contextlib.asynccontextmanager
    async def lifespan(app):
        if on_startup is not None:
            on_startup()  # on the event loop, before the first request
        yield
        # uvicorn gets here after its graceful shutdown: connections closed, handlers done or cancelled.
        if on_shutdown is not None:
            on_shutdown()

    policy = policy or HostPolicy("127.0.0.1")
    middleware = [Middleware(AccessLog, enabled=access_log), Middleware(RequestGuard, policy=policy)]
    if policy.cors_origins:  # preflights and the response headers of the origins allowed (the guard refused the rest)
        middleware.append(Middleware(CORSMiddleware, allow_origins=["*"] if "*" in policy.cors_origins else
                                     list(policy.cors_origins), allow_methods=["GET", "POST"],
                                     allow_headers=["Authorization", "Content-Type"], max_age=600))
    app = Starlette(routes=routes, exception_handlers={ApiError: api_error, HTTPException: http_error, Exception: unexpected},
                    lifespan=lifespan, middleware=middleware)
    app.router.redirect_slashes = False  # its redirect names the Host the request gave: /v1/models/ is a 404
    app.state.served = served
    return app


def not_ready_reason(served: ServedModel) -> str | None:
    """Why the server would not take a new request now (None: it would); from the HTTP side's own state."""
    loop = served.loop
    if loop.fault:
        return loop.fault
    if not loop.running:
        return "the engine is not running"
    if not loop.accepting:
        return "the server is shutting down"
    limit = served.max_seqs + served.max_queue
    if loop.in_flight >= limit:
        return f"the queue is full ({loop.in_flight} requests in flight, at most {limit})"
    return None


def served_model(loaded, *, name: str, max_queue: int, ignore_eos: bool = False) -> ServedModel:
    """What the HTTP layer needs of a LoadedModel (hipcore.engine.loader), with no engine attached yet: it
    pickles, so an HTTP process of its own can take it. `attach` gives it the engine where it will serve."""
    from hipcore.tokenizer.chat_template import chat_template_from_metadata

    engine = loaded.engine
    return ServedModel(name=name, loop=None, tokenizer=loaded.tokenizer,
                       chat_template=chat_template_from_metadata(loaded.gguf.metadata), context=engine.max_context,
                       max_queue=max_queue, max_seqs=engine.scheduler.max_seqs,
                       vocab_size=engine.runner.config.vocab_size, created=int(time.time()), ignore_eos=ignore_eos)


def attach(served: ServedModel, loop) -> ServedModel:
    """The served model on `loop` (an EngineLoop, or an EngineClient in the HTTP process), with its own
    long-lived chat-template renderers."""
    from rocmforge_serve.template_pool import TemplatePool

    return dataclasses.replace(served, loop=loop, templates=TemplatePool(size=TEMPLATE_WORKERS))
