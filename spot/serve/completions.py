"""Answering /v1/completions and /v1/chat/completions: read the body, turn it into a checked job, queue it on the
engine pool, then answer with the whole completion or stream it as server-sent events, one per finished block.

A request's body is read on the event loop (413 past MAX_BODY_BYTES); parsing it, rendering the chat template,
encoding the prompt and checking the job run on a worker thread, so that /health and the other requests are answered
meanwhile (400 with the library's message when it is bad, before it takes a place in the queue). A prompt longer than
the model's context is refused before it is encoded, a chat template's rendering is bounded (spot.chat_template). The
job is then queued for the engine pool (429 when every engine is busy and the queue is full). A streamed answer's text
goes through spot.tokenizer.TextStream (a character split across blocks waits for its last byte). A client that goes
away cancels its decode at the next block, or takes it out of the queue.
"""
from __future__ import annotations

import asyncio
import hmac
import json
import time

from fastapi import Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from spot.errors import SpotError
from spot.serve.http_errors import HTTPError, failure, spot_error, unknown_model
from spot.serve.jobs import DecodeFields, Job, build_job, check_prompt_fits, finish_reason, room_left, usage
from spot.serve.openai_api import (ChatRequest, CompletionRequest, DecodingRequest, chunk_body, created_now,
                                   error_body, new_id, parse_request, response_body, usage_chunk_body)
from spot.serve.pool import PoolClosed, QueueFull, Ticket
from spot.serve.state import ServerState
from spot.tokenizer import TextStream

COMPLETION_MAX_TOKENS = 16         # OpenAI's default of /v1/completions
DISCONNECT_POLL_S = 0.25           # how often a waiting (not streamed) request checks that its client is still there
CLIENT_GONE = 499                  # the status a request whose client went away is counted under (nginx's)
MAX_BODY_BYTES = 16 * 2**20        # far beyond any context's prompt; a larger body is refused before it fills memory


def check_api_key(state: ServerState, request: Request) -> None:
    """HTTPError 401 unless the request carries the server's API key (when it has one)."""
    if state.api_key is None:
        return
    given = request.headers.get("authorization", "")
    if not hmac.compare_digest(given.encode(), f"Bearer {state.api_key}".encode()):
        raise HTTPError(401, "missing or wrong API key", "authentication_error", code="invalid_api_key")


async def answer(state: ServerState, request: Request, chat: bool) -> Response:
    """The response to a completion (chat: a chat completion) request: whole or streamed, or its error."""
    arrived = time.perf_counter()
    endpoint = "chat" if chat else "completions"
    pool = state.pool
    try:
        check_api_key(state, request)
        parsed, job = await asyncio.to_thread(job_for, state, chat, await body_of(request))
        ticket = pool.submit(job, asyncio.get_running_loop())
    except SpotError as e:
        return counted(state, endpoint, arrived, spot_error(e).response())
    except HTTPError as e:
        return counted(state, endpoint, arrived, e.response())
    except QueueFull:
        return counted(state, endpoint, arrived, HTTPError(
            429, f"all {pool.engines} engines are busy and {pool.queue_size} requests wait: try again later",
            "rate_limit_error", code="queue_full").response())
    except PoolClosed:
        return counted(state, endpoint, arrived, HTTPError(503, "the server is shutting down", "server_error")
                       .response())
    try:
        first = await next_event(ticket, request)
        while first is not None and first[0] == "started":
            first = await next_event(ticket, request)
        if first is None:               # the client went away while its request waited or began
            return client_gone(state, ticket, endpoint)
        if first[0] == "error":
            return counted(state, endpoint, arrived, failure(first[1]).response())
        if first[0] == "block":
            state.metrics.first_block.observe(time.perf_counter() - arrived)
        if parsed.stream:
            include_usage = parsed.stream_options is not None and parsed.stream_options.include_usage
            return StreamingResponse(stream(state, ticket, first, chat, include_usage, arrived, endpoint),
                                     media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
        return await whole(state, ticket, first, request, chat, arrived, endpoint)
    except BaseException:
        pool.cancel(ticket)
        raise


def job_for(state: ServerState, chat: bool, body: bytes) -> tuple[DecodingRequest, Job]:
    """The request `body` asks for, and its checked job (CPU work: run on a worker thread)."""
    model = state.model
    parsed = parse_request(ChatRequest if chat else CompletionRequest, body)
    if parsed.model != model.name:
        raise unknown_model(parsed.model, model.name)
    fields = DecodeFields(max_tokens_of(parsed, state.chat_max_tokens), parsed.temperature, parsed.top_p,
                          parsed.top_k, parsed.seed, parsed.decoder, parsed.budget, parsed.depth, parsed.mode,
                          parsed.tau)
    return parsed, build_job(model, state.engine, state.drafter, prompt_ids(state, parsed), fields)


def max_tokens_of(parsed: DecodingRequest, chat_max_tokens: int) -> int:
    """The request's max_tokens (a chat's max_completion_tokens where it names none), else the default: OpenAI's
    16 for a completion, the server's chat_max_tokens for a chat."""
    max_tokens = parsed.max_tokens
    if isinstance(parsed, ChatRequest):
        max_tokens = parsed.max_completion_tokens if max_tokens is None else max_tokens
    if max_tokens is None:
        max_tokens = chat_max_tokens if isinstance(parsed, ChatRequest) else COMPLETION_MAX_TOKENS
    return max_tokens


def prompt_ids(state: ServerState, parsed: DecodingRequest) -> list:
    """The prompt's token ids: a chat's messages through the chat template, a completion's text or ids."""
    model, tokenizer = state.model, state.model.tokenizer
    if isinstance(parsed, ChatRequest):
        if tokenizer is None or not tokenizer.chat_template:
            raise SpotError(f"the model {model.name} has no chat template",
                            "start spot serve with --chat-template FILE (a Jinja chat template), or send the "
                            "prompt text to /v1/completions")
        messages = [m.as_template_message() for m in parsed.messages]
        return tokenizer.encode(tokenizer.apply_chat_template(messages, limits=state.chat_limits))
    prompt = parsed.prompt_text_or_ids()
    if isinstance(prompt, str) and tokenizer is None:
        raise SpotError(f"the model {model.name} has no tokenizer, so a text prompt cannot be encoded",
                        "send the prompt as a list of token ids")
    check_prompt_fits(prompt, tokenizer, state.context)
    return tokenizer.encode(prompt) if isinstance(prompt, str) else prompt


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


async def next_event(ticket: Ticket, request: Request):
    """The ticket's next event, or None when the client went away meanwhile."""
    while True:
        try:
            return await asyncio.wait_for(ticket.events.get(), DISCONNECT_POLL_S)
        except asyncio.TimeoutError:        # (TimeoutError itself from Python 3.11)
            if await request.is_disconnected():
                return None


def counted(state: ServerState, endpoint: str, arrived: float, response: Response) -> Response:
    """`response`, counted in the metrics under its endpoint and status, with its latency."""
    state.metrics.requests.labels(endpoint, str(response.status_code)).inc()
    state.metrics.latency.labels(endpoint).observe(time.perf_counter() - arrived)
    return response


def client_gone(state: ServerState, ticket: Ticket, endpoint: str) -> Response:
    """The response (never sent) to a request whose client went away: its decode cancelled, counted as 499."""
    state.pool.cancel(ticket)
    state.metrics.requests.labels(endpoint, str(CLIENT_GONE)).inc()
    return Response(status_code=CLIENT_GONE)


def text_of(state: ServerState, ids: list[int]) -> str:
    return state.model.tokenizer.decode(ids) if state.model.tokenizer is not None else ""


async def whole(state: ServerState, ticket: Ticket, event, request: Request, chat: bool, arrived: float,
                endpoint: str) -> Response:
    """The whole completion, once the decode is done (`event`: its first event after "started")."""
    job, ids = ticket.job, []
    while event[0] == "block":
        ids += room_left(event[1], len(ids), job.max_tokens)
        event = await next_event(ticket, request)
        if event is None:
            return client_gone(state, ticket, endpoint)
    if event[0] == "error":
        return counted(state, endpoint, arrived, failure(event[1]).response())
    gen = event[1]
    state.metrics.completion_tokens.inc(len(ids))
    body = response_body(chat, new_id(chat), created_now(), state.model.name, text_of(state, ids), ids,
                         finish_reason(gen, job.max_tokens), usage(job, gen, len(ids), state.block_size), job.seed)
    return counted(state, endpoint, arrived, JSONResponse(body))


async def stream(state: ServerState, ticket: Ticket, event, chat: bool, include_usage: bool, arrived: float,
                 endpoint: str):
    """The completion's server-sent events: one per finished block (`event`: the first), the last one with the
    finish reason (and the usage, include_usage), then [DONE]."""
    job, rid, created_at, name = ticket.job, new_id(chat), created_now(), state.model.name
    pieces = TextStream(state.model.tokenizer) if state.model.tokenizer is not None else None
    sent, status = 0, CLIENT_GONE
    try:
        if chat:        # OpenAI's first chat chunk: the role
            yield sse(chunk_body(chat, rid, created_at, name, "", [], role=True, seed=job.seed))
        while event[0] == "block":
            ids = room_left(event[1], sent, job.max_tokens)
            sent += len(ids)
            if ids:
                piece = pieces.feed(ids) if pieces is not None else ""
                yield sse(chunk_body(chat, rid, created_at, name, piece, ids, seed=job.seed))
            event = await ticket.events.get()
        if event[0] == "error":
            status = failure(event[1]).status
            yield sse(error_body(failure(event[1]).message, "server_error"))
        else:
            gen = event[1]
            rest = pieces.end() if pieces is not None else ""
            yield sse(chunk_body(chat, rid, created_at, name, rest, [], finish_reason(gen, job.max_tokens),
                                 seed=job.seed))
            if include_usage:
                yield sse(usage_chunk_body(chat, rid, created_at, name, usage(job, gen, sent, state.block_size)))
            state.metrics.completion_tokens.inc(sent)
            status = 200
        yield "data: [DONE]\n\n"
    finally:        # (a client that went away: the response task is cancelled here)
        if status != 200:
            state.pool.cancel(ticket)
        state.metrics.requests.labels(endpoint, str(status)).inc()
        state.metrics.latency.labels(endpoint).observe(time.perf_counter() - arrived)


def sse(body: dict) -> str:
    """One server-sent event."""
    return f"data: {json.dumps(body, ensure_ascii=False)}\n\n"
