"""The FastAPI app of `spot serve`: its routers (spot.serve.routes), the state they share (spot.serve.state, on
`app.state.serve`), the error handlers (spot.serve.http_errors), and the lifespan that starts and closes the engine
pool."""
from __future__ import annotations

import asyncio
from contextlib import asynccontextmanager

from fastapi import FastAPI
from starlette.exceptions import HTTPException

from spot.serve.http_errors import HTTPError, http_error, starlette_error
from spot.serve.model import ServedModel
from spot.serve.pool import EnginePool
from spot.serve.routes import openai, operations
from spot.serve.state import server_state


@asynccontextmanager
async def lifespan(app: FastAPI):
    pool = app.state.serve.pool
    pool.start()
    try:
        yield
    finally:        # uvicorn has let the running requests finish; the pool finishes what is left, then closes
        await asyncio.to_thread(pool.close)


def create_app(model: ServedModel, pool: EnginePool, api_key: str | None = None,
               chat_max_tokens: int = 256) -> FastAPI:
    """The app serving `model` on `pool` (started and closed by the app's lifespan). api_key: required as
    `Authorization: Bearer KEY` on /v1/ (not on /health, /ready, /metrics). chat_max_tokens: what a chat request
    that names no max_tokens gets."""
    state = server_state(model, pool, api_key, chat_max_tokens)
    pool.on_done = state.metrics.decoded
    app = FastAPI(title="spot serve", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    app.state.serve = state
    app.include_router(operations)
    app.include_router(openai)
    app.add_exception_handler(HTTPError, http_error)
    app.add_exception_handler(HTTPException, starlette_error)
    return app
