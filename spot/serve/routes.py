"""The HTTP routes of `spot serve`, on two routers: `operations` (/health, /ready, /metrics: no API key) and `openai`
(OpenAI's /v1/models, /v1/models/{id}, /v1/completions and /v1/chat/completions). Each route reads the server's
state through the `State` dependency (spot.serve.state); the completions are answered by spot.serve.completions."""
from __future__ import annotations

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, Response

from spot.serve.completions import answer, check_api_key
from spot.serve.http_errors import unknown_model
from spot.serve.metrics import CONTENT_TYPE
from spot.serve.openai_api import model_object
from spot.serve.state import State

operations = APIRouter()


@operations.get("/health")
async def health():
    return {"status": "ok"}


@operations.get("/ready")
async def ready(state: State):
    """200 while a request sent now would be taken (an engine free or room in the queue), 503 otherwise: what a
    load balancer or a Kubernetes readiness probe routes by."""
    model, pool = state.model, state.pool
    body = {"ready": pool.accepting, "model": model.name, "engines": pool.engines,
            "free_engines": pool.free_engines, "queue_depth": pool.queue_depth, "queue_size": pool.queue_size,
            "manifest_sha256": model.manifest_sha256, "backend": model.backend, "device": model.device}
    return JSONResponse(body, status_code=200 if body["ready"] else 503)


@operations.get("/metrics")
async def prometheus(state: State):
    return Response(state.metrics.render(), media_type=CONTENT_TYPE)


async def authorized(request: Request, state: State) -> None:
    """The API key check of a /v1/ route (an HTTPError becomes its response: spot.serve.http_errors.http_error)."""
    check_api_key(state, request)


openai = APIRouter(prefix="/v1")


@openai.get("/models", dependencies=[Depends(authorized)])
async def models(state: State):
    return {"object": "list", "data": [model_object(state.model.name, state.created, state.model.manifest_sha256)]}


@openai.get("/models/{model_id:path}", dependencies=[Depends(authorized)])
async def model_by_id(model_id: str, state: State):
    if model_id != state.model.name:
        raise unknown_model(model_id, state.model.name)
    return model_object(state.model.name, state.created, state.model.manifest_sha256)


@openai.post("/completions")
async def completions(request: Request, state: State):
    # (the API key is checked inside: a refused request is counted in the metrics like any other)
    return await answer(state, request, chat=False)


@openai.post("/chat/completions")
async def chat_completions(request: Request, state: State):
    return await answer(state, request, chat=True)
