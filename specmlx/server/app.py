"""The HTTP side: an OpenAI-compatible FastAPI app over one `Engine`.

POST /v1/chat/completions (the target's chat template), POST /v1/completions, GET /v1/models,
GET /health. Handlers tokenize and check a request, submit it to the engine and relay its
messages: as one JSON body, or as server-sent events in OpenAI's chunk format ending with
`data: [DONE]`. A client that goes away cancels its job, so the worker is free for the next:
a stream's (Starlette cancels the body iterator on disconnect, and its `finally` tells the
engine) and a plain reply's (its handler listens for the disconnect while it waits). Every
error is OpenAI's body.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import replace
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from jinja2 import TemplateError
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Receive, Scope, Send

from specmlx.api.config import GenerationConfig
from specmlx.api.generate import encode_prompt
from specmlx.engine.sampling import SamplingConfig
from specmlx.errors import UsageError
from specmlx.server import protocol
from specmlx.server.engine import Done, Engine, Failed, Job, QueueFull, Record, Text
from specmlx.server.protocol import (
    APIError,
    ChatRequest,
    CompletionRequest,
    GenerationRequest,
    Kind,
    error_body,
)


def create_app(
    engine: Engine,
    model_id: str,
    *,
    aliases: tuple[str, ...] = (),
    api_key: str | None = None,
) -> FastAPI:
    """The app serving `engine`'s models as `model_id` (requests may also name an alias);
    the engine's worker runs for the app's lifetime."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        engine.start()
        try:
            yield
        finally:
            await asyncio.to_thread(engine.stop)

    app = FastAPI(title="specmlx", lifespan=lifespan)
    if api_key is not None:
        app.add_middleware(BearerAuth, api_key=api_key)
    _add_error_handlers(app)
    names = {model_id, *aliases}
    models = engine.models

    @app.get("/health")
    async def health() -> dict[str, Any]:
        return {"status": "ok", "model": model_id, "busy": engine.busy, "waiting": engine.waiting}

    def model_card() -> dict[str, Any]:
        return {"id": model_id, "object": "model", "created": 0, "owned_by": "specmlx"}

    @app.get("/v1/models")
    async def list_models() -> dict[str, Any]:
        return {"object": "list", "data": [model_card()]}

    @app.get("/v1/models/{name:path}")
    async def get_model(name: str) -> dict[str, Any]:
        _check_model(name, names, model_id)
        return model_card()

    @app.post("/v1/chat/completions")
    async def chat(body: ChatRequest, request: Request) -> Any:
        body.check()
        _check_model(body.model, names, model_id)
        messages = body.chat()
        prompt_ids = _encode(lambda: encode_prompt(models, messages, True), "messages")
        limit = body.max_completion_tokens or body.max_tokens
        return await _serve(engine, request, "chat", model_id, body, prompt_ids, limit)

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request) -> Any:
        body.check()
        _check_model(body.model, names, model_id)
        prompt = body.prompt_value()
        if isinstance(prompt, str):
            prompt_ids = _encode(lambda: encode_prompt(models, prompt, False), "prompt")
        else:
            prompt_ids = _check_ids(prompt, models.vocab_size, models.context_length)
        limit = body.max_tokens
        return await _serve(engine, request, "completion", model_id, body, prompt_ids, limit)

    return app


def _check_model(name: str | None, names: set[str], model_id: str) -> None:
    if name is not None and name not in names:
        raise APIError(
            404,
            f"The model '{name}' does not exist; this server serves '{model_id}'",
            param="model",
            code="model_not_found",
        )


def _encode(encode: Callable[[], list[int]], param: str) -> list[int]:
    try:
        return encode()
    except UsageError as exc:  # empty, or longer than the context (the message has the numbers)
        code = "context_length_exceeded" if "context" in str(exc) else None
        raise APIError(400, str(exc), param=param, code=code) from None
    except (TemplateError, ValueError) as exc:  # no chat template, or one these messages break
        raise APIError(400, f"the chat template failed: {exc}", param=param) from None


def _check_ids(ids: list[int], vocab_size: int, context: int | None) -> list[int]:
    bad = [i for i in ids if not 0 <= i < vocab_size]
    if bad:
        raise APIError(400, f"token id {bad[0]} is outside the vocabulary", param="prompt")
    if context is not None and len(ids) >= context:
        raise APIError(
            400,
            f"the prompt has {len(ids)} tokens; the target's context holds {context}",
            param="prompt",
            code="context_length_exceeded",
        )
    return ids


def _config(
    base: GenerationConfig,
    body: GenerationRequest,
    max_tokens: int | None,
    context: int | None,
    prompt_tokens: int,
) -> GenerationConfig:
    """The server's config with the request's sampling and length (the server's defaults
    where the request gives none); the length is capped to what the context has left."""
    defaults = base.sampling
    sampling = SamplingConfig(
        defaults.temperature if body.temperature is None else body.temperature,
        defaults.top_p if body.top_p is None else body.top_p,
        defaults.top_k if body.top_k is None else body.top_k,
    )
    length = max_tokens or base.max_tokens
    if context is not None:
        length = min(length, context - prompt_tokens)  # encode_prompt left at least one
    seed = base.seed if body.seed is None else body.seed
    return replace(base, max_tokens=length, sampling=sampling, seed=seed)


async def _serve(
    engine: Engine,
    request: Request,
    kind: Kind,
    model_id: str,
    body: GenerationRequest,
    prompt_ids: list[int],
    max_tokens: int | None,
) -> Any:
    context = engine.models.context_length
    config = _config(engine.config, body, max_tokens, context, len(prompt_ids))
    request_id = protocol.new_id(kind)
    try:
        job = engine.submit(request_id, prompt_ids, config, body.stops())
    except QueueFull:
        raise APIError(
            429,
            f"the server is busy: {engine.max_queue} requests are waiting already; retry later",
            type="rate_limit_error",
            code="queue_full",
            headers={"Retry-After": "1"},
        ) from None
    if body.stream:
        events = _stream(engine, job, kind, model_id, body.include_usage)
        headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
        return StreamingResponse(events, media_type="text/event-stream", headers=headers)
    reply = asyncio.create_task(_reply(engine, job, kind, model_id))
    gone = asyncio.create_task(_disconnected(request))
    try:
        await asyncio.wait((reply, gone), return_when=asyncio.FIRST_COMPLETED)
        if reply.done():
            return reply.result()  # the response, or the APIError of a failed job
        gone.result()
        # The client went away while its reply was generated: nobody reads this one.
        return Response(status_code=CLIENT_CLOSED_REQUEST)
    finally:
        reply.cancel()
        gone.cancel()
        engine.cancel(job)  # a no-op once the job is done


# nginx's status for a request its client closed before the response: only logs see it.
CLIENT_CLOSED_REQUEST = 499


async def _reply(engine: Engine, job: Job, kind: Kind, model_id: str) -> dict[str, Any]:
    """The whole response of a job, once it is done."""
    parts: list[str] = []
    async for message in job.messages():
        if isinstance(message, Text):
            parts.append(message.text)
    # The messages end on one Done or Failed.
    if isinstance(message, Failed):
        raise APIError(message.status, message.message, type="server_error")
    usage = protocol.usage(message.stats, engine.method, engine.k)
    text = "".join(parts)
    return protocol.response(kind, job.request_id, model_id, text, message.finish, usage)


async def _disconnected(request: Request) -> None:
    """Returns when the client has gone. The body is read already: what the server sends
    next is `http.disconnect` (as Starlette's StreamingResponse listens for it); a
    `request.is_disconnected()` poll would only notice it later."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def _stream(
    engine: Engine, job: Job, kind: Kind, model_id: str, include_usage: bool
) -> AsyncIterator[str]:
    def chunk(text: str | None = None, finish: str | None = None, **extra: Any) -> str:
        return protocol.chunk(
            kind, job.request_id, model_id, text, finish, include_usage=include_usage, **extra
        )

    try:
        if kind == "chat":
            yield chunk(role=True)
        async for message in job.messages():
            if isinstance(message, Text):
                yield chunk(message.text)
            elif isinstance(message, Failed):
                yield protocol.event(error_body(message.message, "server_error"))
            elif isinstance(message, Done):
                yield chunk(finish=message.finish)
                if include_usage:
                    yield chunk(usage=protocol.usage(message.stats, engine.method, engine.k))
        yield protocol.DONE
    finally:
        engine.cancel(job)  # the client went away (or the stream ended): free the slot


class BearerAuth:
    """Every /v1 request must carry `Authorization: Bearer KEY`; others get a 401."""

    def __init__(self, app: ASGIApp, api_key: str):
        self.app = app
        self.expected = f"Bearer {api_key}".encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"].startswith("/v1"):
            given = dict(scope["headers"]).get(b"authorization", b"")
            if not secrets.compare_digest(given, self.expected):
                body = error_body(
                    "Incorrect or missing API key: send Authorization: Bearer KEY",
                    "invalid_request_error",
                    code="invalid_api_key",
                )
                response = JSONResponse(body, 401, headers={"WWW-Authenticate": "Bearer"})
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)


def _add_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(APIError)
    async def api_error(request: Request, exc: APIError) -> JSONResponse:
        return JSONResponse(exc.body(), exc.status, headers=exc.headers)

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0]
        where = [str(part) for part in first.get("loc", ()) if part != "body"]
        if first.get("type") == "json_invalid":
            message, param = f"the body is not valid JSON: {first.get('msg')}", None
        else:
            param = ".".join(where) or None
            message = f"{param}: {first.get('msg')}" if param else str(first.get("msg"))
        return JSONResponse(error_body(message, "invalid_request_error", param), 400)

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException) -> JSONResponse:
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code)
        body = error_body(str(exc.detail), "invalid_request_error", code=code)
        return JSONResponse(body, exc.status_code, headers=getattr(exc, "headers", None))

    @app.exception_handler(UsageError)
    async def usage_error(request: Request, exc: UsageError) -> JSONResponse:
        return JSONResponse(error_body(str(exc), "invalid_request_error"), 400)

    @app.exception_handler(Exception)
    async def internal(request: Request, exc: Exception) -> JSONResponse:
        body = error_body(f"internal error: {type(exc).__name__}: {exc}", "server_error")
        return JSONResponse(body, 500)


def request_logger(console: Any) -> Callable[[Record], None]:
    """One line per request on a Rich console (plain text when it is not a terminal)."""

    def log(record: Record) -> None:
        acceptance = "-" if record.acceptance_rate is None else f"{record.acceptance_rate:.0%}"
        console.print(
            f"[dim]{time.strftime('%H:%M:%S')}[/dim] {record.request_id} "
            f"prompt={record.prompt_tokens} completion={record.completion_tokens} "
            f"{record.tokens_per_sec:.1f} tok/s acceptance={acceptance} "
            f"{record.finish} {record.seconds:.2f}s",
            highlight=False,
            soft_wrap=True,  # one line, however narrow the terminal or pipe
        )

    return log
