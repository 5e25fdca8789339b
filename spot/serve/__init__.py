"""`spot serve`: an OpenAI-compatible HTTP server over a pool of spot engines (docs/deployment.md).

  model.py       the served model: its folder, engine options, tokenizer, request defaults; opens the engines
  jobs.py        a request's fields -> a checked decode job; its decode -> the ids returned, finish reason, usage
  pool.py        engines, one request each, behind a bounded queue; events back to the asyncio loop; cancellation
  openai_api.py  the OpenAI request schemas (with spot's fields) and the response / stream-chunk / error bodies
  metrics.py     Prometheus metrics of a server
  app.py         the FastAPI routes
  run.py         uvicorn on a host and port, graceful shutdown

Only app.py, openai_api.py, metrics.py and run.py need the `serve` extra (FastAPI, uvicorn, prometheus_client);
model.py, jobs.py and pool.py are spot alone (the Triton model, spot.triton, imports model.py and jobs.py too).
"""
