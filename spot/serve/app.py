"""The HTTP routes of `spot serve` (FastAPI): OpenAI's /v1/completions, /v1/chat/completions, /v1/models and
/v1/models/{id}, and /health, /ready and /metrics for operations.

A request's body is read on the event loop (413 past MAX_BODY_BYTES); parsing it, rendering the chat template,
encoding the prompt and checking the job run on a worker thread, so that /health and the other requests are answered
meanwhile (400 with the library's message when it is bad, before it takes a place in the queue). A prompt longer than
the model's context is refused before it is encoded, a chat template's rendering is bounded (spot.chat_template). The
job is then queued for the engine pool (429 when every engine is busy and the queue is full). A
streamed answer sends one server-sent event per finished block, its text through spot.tokenizer.TextStream (a
character split across blocks waits for its last byte). A client that goes away cancels its decode at the next
block, or takes it out of the queue.
"""
from __future__ import annotations

import asyncio
import hmac
import json
import time
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException

from spot.chat_template import RenderLimits
from spot.errors import SpotError
from spot.serve.jobs import DecodeFields, build_job, check_prompt_fits, finish_reason, room_left, usage
from spot.serve.metrics import CONTENT_TYPE, ServeMetrics
from spot.serve.model import ServedModel
from spot.serve.openai_api import (ChatRequest, CompletionRequest, chunk_body, created_now, error_body, model_object,
                                   new_id, parse_request, response_body, shown, usage_chunk_body)
from spot.serve.pool import EnginePool, PoolClosed, QueueFull
from spot.tokenizer import TextStream

COMPLETION_MAX_TOKENS = 16         # OpenAI's default of /v1/completions
DISCONNECT_POLL_S = 0.25           # how often a waiting (not streamed) request checks that its client is still there
CLIENT_GONE = 499                  # the status a request whose client went away is counted under (nginx's)
MAX_BODY_BYTES = 16 * 2**20        # far beyond any context's prompt; a larger body is refused before it fills memory


class HTTPError(Exception):
    def __init__(self, status: int, message: str, kind: str = "invalid_request_error", param: str | None = None,
                 code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.kind, self.param, self.code = status, message, kind, param, code

    def response(self) -> JSONResponse:
        return JSONResponse(error_body(self.message, self.kind, self.param, self.code), status_code=self.status)


def spot_error(e: SpotError) -> HTTPError:
    """A user's error (the library's message and hint) as a 400."""
    return HTTPError(400, e.message + (f" (hint: {e.hint})" if e.hint else ""))


def unknown_model(name, served: str) -> HTTPError:
    return HTTPError(404, f"the model {shown(name)} is not served here; this server serves {served!r} "
                          "(GET /v1/models)", param="model", code="model_not_found")


def create_app(model: ServedModel, pool: EnginePool, api_key: str | None = None,
               chat_max_tokens: int = 256) -> FastAPI:
    """The app serving `model` on `pool` (started and closed by the app's lifespan). api_key: required as
    `Authorization: Bearer KEY` on /v1/ (not on /health, /ready, /metrics). chat_max_tokens: what a chat request
    that names no max_tokens gets."""
    engine, drafter = pool.slots[0]          # any slot: only the model's shape is read outside the engine's thread
    context = engine.max_context
    # a chat prompt's rendering stops where it could no longer fit in the context (and the vocabulary is read now)
    chat_limits = RenderLimits(max_chars=model.tokenizer.max_text_chars(context)) if model.tokenizer else None
    metrics = ServeMetrics(pool, engine.block_size)
    pool.on_done = metrics.decoded
    created = created_now()

    @asynccontextmanager
    async def lifespan(app):
        pool.start()
        try:
            yield
        finally:        # uvicorn has let the running requests finish; the pool finishes what is left, then closes
            await asyncio.to_thread(pool.close)

    app = FastAPI(title="spot serve", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)

    def authorized(request: Request) -> None:
        if api_key is None:
            return
        given = request.headers.get("authorization", "")
        if not hmac.compare_digest(given.encode(), f"Bearer {api_key}".encode()):
            raise HTTPError(401, "missing or wrong API key", "authentication_error", code="invalid_api_key")

    @app.get("/health")
    async def health():
        return {"status": "ok"}

    @app.get("/ready")
    async def ready():
        """200 while a request sent now would be taken (an engine free or room in the queue), 503 otherwise: what
        a load balancer or a Kubernetes readiness probe routes by."""
        body = {"ready": pool.accepting, "model": model.name, "engines": pool.engines,
                "free_engines": pool.free_engines, "queue_depth": pool.queue_depth, "queue_size": pool.queue_size,
                "manifest_sha256": model.manifest_sha256, "backend": model.backend, "device": model.device}
        return JSONResponse(body, status_code=200 if body["ready"] else 503)

    @app.get("/metrics")
    async def prometheus():
        return Response(metrics.render(), media_type=CONTENT_TYPE)

    @app.get("/v1/models")
    async def models(request: Request):
        authorized(request)         # (an HTTPError becomes its response: the handler below)
        return {"object": "list", "data": [model_object(model.name, created, model.manifest_sha256)]}

    @app.get("/v1/models/{model_id:path}")
    async def model_by_id(model_id: str, request: Request):
        authorized(request)
        if model_id != model.name:
            raise unknown_model(model_id, model.name)
        return model_object(model.name, created, model.manifest_sha256)

    @app.post("/v1/completions")
    async def completions(request: Request):
        return await answer(request, chat=False)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        return await answer(request, chat=True)

    def prompt_ids(parsed) -> list:
        """The prompt's token ids: a chat's messages through the chat template, a completion's text or ids."""
        tokenizer = model.tokenizer
        if isinstance(parsed, ChatRequest):
            if tokenizer is None or not tokenizer.chat_template:
                raise SpotError(f"the model {model.name} has no chat template",
                                "start spot serve with --chat-template FILE (a Jinja chat template), or send the "
                                "prompt text to /v1/completions")
            messages = [m.as_template_message() for m in parsed.messages]
            return tokenizer.encode(tokenizer.apply_chat_template(messages, limits=chat_limits))
        prompt = parsed.prompt_text_or_ids()
        if isinstance(prompt, str) and tokenizer is None:
            raise SpotError(f"the model {model.name} has no tokenizer, so a text prompt cannot be encoded",
                            "send the prompt as a list of token ids")
        check_prompt_fits(prompt, tokenizer, context)
        return tokenizer.encode(prompt) if isinstance(prompt, str) else prompt

    def job_for(chat: bool, body: bytes):
        """The request `body` asks for, and its checked job (CPU work: run on a worker thread)."""
        parsed = parse_request(ChatRequest if chat else CompletionRequest, body)
        if parsed.model != model.name:
            raise unknown_model(parsed.model, model.name)
        max_tokens = parsed.max_tokens
        if isinstance(parsed, ChatRequest):
            max_tokens = parsed.max_completion_tokens if max_tokens is None else max_tokens
        if max_tokens is None:
            max_tokens = chat_max_tokens if isinstance(parsed, ChatRequest) else COMPLETION_MAX_TOKENS
        fields = DecodeFields(max_tokens, parsed.temperature, parsed.top_p, parsed.top_k, parsed.seed,
                              parsed.decoder, parsed.budget, parsed.depth, parsed.mode, parsed.tau)
        return parsed, build_job(model, engine, drafter, prompt_ids(parsed), fields)

    async def answer(request: Request, chat: bool):
        arrived = time.perf_counter()
        endpoint = "chat" if chat else "completions"
        try:
            authorized(request)
            parsed, job = await asyncio.to_thread(job_for, chat, await body_of(request))
            ticket = pool.submit(job, asyncio.get_running_loop())
        except SpotError as e:
            return counted(endpoint, arrived, spot_error(e).response())
        except HTTPError as e:
            return counted(endpoint, arrived, e.response())
        except QueueFull:
            return counted(endpoint, arrived, HTTPError(
                429, f"all {pool.engines} engines are busy and {pool.queue_size} requests wait: try again later",
                "rate_limit_error", code="queue_full").response())
        except PoolClosed:
            return counted(endpoint, arrived, HTTPError(503, "the server is shutting down", "server_error")
                           .response())
        try:
            first = await next_event(ticket, request)
            while first is not None and first[0] == "started":
                first = await next_event(ticket, request)
            if first is None:               # the client went away while its request waited or began
                pool.cancel(ticket)
                metrics.requests.labels(endpoint, str(CLIENT_GONE)).inc()
                return Response(status_code=CLIENT_GONE)
            if first[0] == "error":
                return counted(endpoint, arrived, failure(first[1]).response())
            if first[0] == "block":
                metrics.first_block.observe(time.perf_counter() - arrived)
            if parsed.stream:
                include_usage = parsed.stream_options is not None and parsed.stream_options.include_usage
                return StreamingResponse(stream(ticket, first, chat, include_usage, arrived, endpoint),
                                         media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
            return await whole(ticket, first, request, chat, arrived, endpoint)
        except BaseException:
            pool.cancel(ticket)
            raise

    async def body_of(request: Request) -> bytes:
        """The request's body, read up to MAX_BODY_BYTES (413 beyond)."""
        chunks, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > MAX_BODY_BYTES:
                raise HTTPError(413, f"the request body is larger than {MAX_BODY_BYTES // 2**20} MiB",
                                code="body_too_large")
            chunks.append(chunk)
        return b"".join(chunks)

    async def next_event(ticket, request: Request):
        """The ticket's next event, or None when the client went away meanwhile."""
        while True:
            try:
                return await asyncio.wait_for(ticket.events.get(), DISCONNECT_POLL_S)
            except asyncio.TimeoutError:        # (TimeoutError itself from Python 3.11)
                if await request.is_disconnected():
                    return None

    def failure(error) -> HTTPError:
        if isinstance(error, SpotError):
            return spot_error(error)
        return HTTPError(500, f"decoding failed: {type(error).__name__}: {error}", "server_error")

    def counted(endpoint: str, arrived: float, response: Response) -> Response:
        metrics.requests.labels(endpoint, str(response.status_code)).inc()
        metrics.latency.labels(endpoint).observe(time.perf_counter() - arrived)
        return response

    def text_of(ids: list[int]) -> str:
        return model.tokenizer.decode(ids) if model.tokenizer is not None else ""

    async def whole(ticket, event, request: Request, chat: bool, arrived: float, endpoint: str):
        job, ids = ticket.job, []
        while event[0] == "block":
            ids += room_left(event[1], len(ids), job.max_tokens)
            event = await next_event(ticket, request)
            if event is None:
                pool.cancel(ticket)
                metrics.requests.labels(endpoint, str(CLIENT_GONE)).inc()
                return Response(status_code=CLIENT_GONE)
        if event[0] == "error":
            return counted(endpoint, arrived, failure(event[1]).response())
        gen = event[1]
        metrics.completion_tokens.inc(len(ids))
        body = response_body(chat, new_id(chat), created_now(), model.name, text_of(ids), ids,
                             finish_reason(gen, job.max_tokens), usage(job, gen, len(ids), engine.block_size),
                             job.seed)
        return counted(endpoint, arrived, JSONResponse(body))

    async def stream(ticket, event, chat: bool, include_usage: bool, arrived: float, endpoint: str):
        job, rid, created_at = ticket.job, new_id(chat), created_now()
        pieces = TextStream(model.tokenizer) if model.tokenizer is not None else None
        sent, status = 0, CLIENT_GONE
        try:
            if chat:        # OpenAI's first chat chunk: the role
                yield sse(chunk_body(chat, rid, created_at, model.name, "", [], role=True, seed=job.seed))
            while event[0] == "block":
                ids = room_left(event[1], sent, job.max_tokens)
                sent += len(ids)
                if ids:
                    piece = pieces.feed(ids) if pieces is not None else ""
                    yield sse(chunk_body(chat, rid, created_at, model.name, piece, ids, seed=job.seed))
                event = await ticket.events.get()
            if event[0] == "error":
                status = failure(event[1]).status
                yield sse(error_body(failure(event[1]).message, "server_error"))
            else:
                gen = event[1]
                rest = pieces.end() if pieces is not None else ""
                yield sse(chunk_body(chat, rid, created_at, model.name, rest, [],
                                     finish_reason(gen, job.max_tokens), seed=job.seed))
                if include_usage:
                    yield sse(usage_chunk_body(chat, rid, created_at, model.name,
                                               usage(job, gen, sent, engine.block_size)))
                metrics.completion_tokens.inc(sent)
                status = 200
            yield "data: [DONE]\n\n"
        finally:        # (a client that went away: the response task is cancelled here)
            if status != 200:
                pool.cancel(ticket)
            metrics.requests.labels(endpoint, str(status)).inc()
            metrics.latency.labels(endpoint).observe(time.perf_counter() - arrived)

    @app.exception_handler(HTTPError)
    async def http_error(_request, e: HTTPError):
        return e.response()

    @app.exception_handler(HTTPException)
    async def starlette_error(_request, e: HTTPException):
        """An unknown path (404), a wrong method (405): OpenAI's error shape too."""
        return JSONResponse(error_body(str(e.detail), code="_".join(str(e.detail).lower().split())),
                            status_code=e.status_code, headers=e.headers)

    return app


def sse(body: dict) -> str:
    """One server-sent event."""
    return f"data: {json.dumps(body, ensure_ascii=False)}\n\n"
