"""What every route of `spot serve` reads, built once per app: the served model, its engine pool, the metrics, and the
limits of a request. The app keeps it on `app.state.serve`; a route asks for it as a FastAPI dependency (`State`)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Request

from spot.chat_template import RenderLimits
from spot.serve.metrics import ServeMetrics
from spot.serve.model import ServedModel
from spot.serve.openai_api import created_now
from spot.serve.pool import EnginePool


@dataclass(frozen=True)
class ServerState:
    """model on pool; engine, drafter: any slot of the pool (only the model's shape is read outside the engine's
    thread); context: the model's limit in tokens; chat_limits: where a chat template's rendering stops (None: no
    tokenizer); api_key: required as `Authorization: Bearer KEY` on /v1/ (None: none); chat_max_tokens: what a chat
    request that names no max_tokens gets; created: when the server started (the model object's `created`)."""

    model: ServedModel
    pool: EnginePool
    metrics: ServeMetrics
    engine: object
    drafter: object
    context: int
    chat_limits: RenderLimits | None
    api_key: str | None
    chat_max_tokens: int
    created: int

    @property
    def block_size(self) -> int:
        return self.engine.block_size


def server_state(model: ServedModel, pool: EnginePool, api_key: str | None, chat_max_tokens: int) -> ServerState:
    """The state of a server of `model` on `pool`."""
    engine, drafter = pool.slots[0]
    context = engine.max_context
    # a chat prompt's rendering stops where it could no longer fit in the context (and the vocabulary is read now)
    chat_limits = RenderLimits(max_chars=model.tokenizer.max_text_chars(context)) if model.tokenizer else None
    return ServerState(model, pool, ServeMetrics(pool, engine.block_size), engine, drafter, context, chat_limits,
                       api_key, chat_max_tokens, created_now())


async def state_of(request: Request) -> ServerState:
    """The app's ServerState (async: a plain function would be run on a worker thread of its own)."""
    return request.app.state.serve


State = Annotated[ServerState, Depends(state_of)]
