"""`spot serve`: an OpenAI-compatible HTTP server over a pool of spot engines (docs/deployment.md).

  model.py       the served model: its folder, engine options, tokenizer, request defaults; opens the engines
  jobs.py        a request's fields -> a checked decode job; its decode -> the ids returned, finish reason, usage
  pool.py        engines, one request each, behind a bounded queue; events back to the asyncio loop; cancellation
  openai_api.py  the OpenAI request schemas (with spot's fields) and the response / stream-chunk / error bodies
  metrics.py     Prometheus metrics of a server
  state.py       what the routes share (model, pool, metrics, limits): on app.state, a FastAPI dependency
  http_errors.py the error responses (OpenAI's shape) and the app's handlers
  completions.py a completion request -> its job on the pool -> the whole answer or its stream of blocks
  routes.py      the routes as module-level functions on two APIRouters (operations, OpenAI's /v1)
  app.py         the FastAPI app: routers, state, handlers, the pool's lifespan
  run.py         uvicorn on a host and port, graceful shutdown

model.py, jobs.py and pool.py are spot alone (the Triton model, spot.triton, imports model.py and jobs.py too); the
others need the `serve` extra (FastAPI, uvicorn, prometheus_client).
"""
