"""`spot serve` end to end: the server runs as users start it (`python -m spot serve`, the embedded model's ORT export
by default, 127.0.0.1), and the official `openai` client, httpx and prometheus_client's parser talk to it. Every
answer's token ids are compared with run_decoder's for the same prompt, seed and decoder."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

pytest.importorskip("fastapi", reason="spot serve needs the serve extra: pip install 'spot-edge[serve]'")
pytest.importorskip("uvicorn", reason="spot serve needs the serve extra: pip install 'spot-edge[serve]'")
openai = pytest.importorskip("openai", reason="the serve tests talk to the server with the openai client")
httpx = pytest.importorskip("httpx")
prometheus_parser = pytest.importorskip("prometheus_client.parser")

from serving import REPO, Reference, Server, health_latencies  # noqa: E402
from tinymodels import TEMPLATE  # noqa: E402  (a ChatML-like chat template)

pytestmark = pytest.mark.slow
PROMPT = "def add(a, b):"


@pytest.fixture(scope="module")
def exported(embedded_export, tmp_path_factory):
    """The embedded model's export (conftest), the servers' environment (its cache) and a chat template file."""
    cache, folder = embedded_export
    env = {**os.environ, "SPOT_CACHE": str(cache), "PYTHONPATH": str(REPO)}
    template = tmp_path_factory.mktemp("template") / "chat.jinja"
    template.write_text(TEMPLATE)
    return folder, env, template


@pytest.fixture(scope="module")
def reference(exported):
    """run_decoder on an engine of the same export: the ids a request must get (its first max_tokens)."""
    return Reference(exported[0], TEMPLATE)


@pytest.fixture(scope="module")
def server(exported):
    _, env, template = exported
    s = Server(["--engines", "2", "--chat-template", str(template)], env)
    yield s
    assert s.stop() == 0, "".join(s.lines)


def model_name(server) -> str:
    return server.http.get("/v1/models").json()["data"][0]["id"]


LONG_IDS = list(range(100, 140))      # 40 ids: a prefill pass, then a block opened by 8 of them

CASES = [  # endpoint, stream, decoder, temperature, seed, max_tokens, prompt
    ("completions", False, "standard", 0.0, 0, 12, PROMPT),
    ("completions", True, "spot", 0.7, 3, 40, PROMPT),            # two blocks: two chunks
    ("completions", False, "standard", 1.0, 9, 30, LONG_IDS),
    ("completions", True, "threshold", 1.0, 4, 20, LONG_IDS),
    ("chat", False, "spot-sets", 1.0, 5, 10, "hello"),
    ("chat", True, "tree", 0.7, 6, 40, "hello"),
]


@pytest.mark.parametrize("endpoint, stream, decoder, temperature, seed, max_tokens, prompt", CASES)
def test_the_openai_client_gets_run_decoders_tokens(server, reference, endpoint, stream, decoder, temperature, seed,
                                                    max_tokens, prompt):
    client, name = server.client(), model_name(server)
    common = dict(model=name, max_tokens=max_tokens, temperature=temperature, seed=seed,
                  extra_body={"decoder": decoder})
    chat = endpoint == "chat"
    if chat:
        call = lambda **kw: client.chat.completions.create(messages=[{"role": "user", "content": prompt}], **kw)  # noqa: E731
    else:
        call = lambda **kw: client.completions.create(prompt=prompt, **kw)  # noqa: E731
    expected = reference(prompt, decoder, temperature, seed, max_tokens, chat)
    assert len(expected) == max_tokens
    if stream:
        chunks = list(call(stream=True, stream_options={"include_usage": True}, **common))
        usage = chunks[-1].usage
        choices = [c.choices[0] for c in chunks if c.choices]
        ids = sum((c.token_ids for c in choices), [])
        text = "".join((c.delta.content or "") if chat else c.text for c in choices)
        finish = choices[-1].finish_reason
        blocks = [c for c in choices if c.token_ids]
        # one chunk per finished block: each one after the first is stored by a fused pass (docs/spec.md §1)
        assert len(blocks) == usage.model_extra["passes"]["fused"] + 1
        assert all(c.finish_reason is None for c in choices[:-1])
    else:
        response = call(**common)
        choice, usage = response.choices[0], response.usage
        ids = choice.token_ids
        text = choice.message.content if chat else choice.text
        finish = choice.finish_reason
        assert response.seed == seed
    assert ids == expected
    assert text == reference.tokenizer.decode(expected)
    assert finish == "length" and usage.completion_tokens == max_tokens
    figures = usage.model_extra
    assert figures["decoder"] == decoder and figures["seed"] == seed
    assert figures["target_passes"] == sum(figures["passes"].values())
    if decoder == "standard":      # static standard decoding: exactly the passes the block structure implies
        assert figures["static_passes"] == figures["target_passes"] and figures["passes_reduction"] == 1.0
    assert figures["passes"]["prefill"] == (1 if prompt is LONG_IDS else 0)


def test_eight_concurrent_clients_on_two_engines_get_their_own_answers(server, reference):
    name = model_name(server)
    jobs = [(f"{PROMPT} # {i}", ("standard", "spot", "threshold", "tree")[i % 4], (0.0, 0.7, 1.0)[i % 3], 100 + i)
            for i in range(8)]
    results: dict[int, list[int]] = {}
    errors: list[BaseException] = []
    start = threading.Barrier(8)

    def client(i):
        prompt, decoder, temperature, seed = jobs[i]
        try:
            start.wait()
            response = server.client().completions.create(model=name, prompt=prompt, max_tokens=8, seed=seed,
                                                          temperature=temperature, extra_body={"decoder": decoder})
            results[i] = response.choices[0].token_ids
        except BaseException as e:      # noqa: BLE001 - reported below
            errors.append(e)
    threads = [threading.Thread(target=client, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors and sorted(results) == list(range(8))
    for i, (prompt, decoder, temperature, seed) in enumerate(jobs):
        assert results[i] == reference(prompt, decoder, temperature, seed, 8), f"client {i} ({decoder})"
    assert len({tuple(r) for r in results.values()}) > 1        # different requests: not one answer eight times


def post(server, path, body, **kw):
    return server.post(path, body, **kw)


DEEP = json.loads("[" * 900 + "]" * 900)     # nested 900 deep: a message quoted all of it


def test_bad_requests_are_400_with_a_message(server):
    name = model_name(server)
    ok = {"model": name, "prompt": PROMPT, "max_tokens": 4}
    cases = [
        ("/v1/completions", {**ok, "decoder": "fastest"}, "unknown decoder 'fastest', expected one of standard"),
        ("/v1/completions", {**ok, "decoder": "spot", "budget": "lots"}, "budget takes a number of nodes or auto"),
        ("/v1/completions", {**ok, "decoder": "spot", "budget": 0}, "budget must be >= 1 node"),
        ("/v1/completions", {**ok, "decoder": "tree", "budget": 16, "depth": 99}, "depth must be in 1..32"),
        ("/v1/completions", {**ok, "max_tokens": 4000}, "more than the model's limit of 2048"),
        ("/v1/completions", {**ok, "prompt": list(range(2046))}, "more than the model's limit of 2048"),
        ("/v1/completions", {**ok, "prompt": [5, 99999]}, "outside the vocabulary"),
        ("/v1/completions", b'{"model": "m\xff\xfe", "prompt": "x"}', "the request body is not UTF-8"),
        ("/v1/completions", b'{"model": ', "the request body is not JSON"),
        ("/v1/completions", {"prompt": PROMPT}, "the request has no 'model' field"),
        ("/v1/completions", {"model": name}, "the request has no 'prompt' field"),
        ("/v1/chat/completions", {"model": name}, "the request has no 'messages' field"),
        ("/v1/chat/completions", {"model": name, "messages": [{"content": "hi"}]},
         "the request has no 'messages.0.role' field"),
        ("/v1/completions", {**ok, "max_tokens": "many"}, "field 'max_tokens': Input should be a valid integer"),
        ("/v1/completions", {**ok, "temperature": -1}, "temperature must be 0 or a finite number"),
        ("/v1/completions", {**ok, "decoder": "threshold", "tau": 1.5}, "tau must be in [0, 1), got 1.5"),
        ("/v1/completions", {**ok, "n": 2}, "n is not supported by spot serve"),
        ("/v1/completions", {**ok, "prompt": ["one", "two"]}, "prompt holds 2 prompts, expected one"),
        # hostile bodies: each was a 500, or took seconds of the event loop
        ("/v1/completions", b"[" * 100_000, "the request body nests arrays or objects too deeply to read"),
        ("/v1/chat/completions", b'{"messages": ' + b"[" * 100_000, "nests arrays or objects too deeply"),
        ("/v1/completions", {**ok, "n": DEEP}, "n is not supported by spot serve, got [[[[...]]]]"),
        ("/v1/completions", {**ok, "prompt": DEEP}, "token ids must be integers, got [[[[...]]]] at index 0"),
        ("/v1/chat/completions", {"model": name, "messages": [{"role": "user", "content": DEEP}]},
         "message content parts must be"),
        ("/v1/completions", b'{"max_tokens": ' + b"9" * 5000 + b"}", "the request body holds a number too long"),
        ("/v1/completions", {**ok, "prompt": [1, 2.5]}, "token ids must be integers, got 2.5 at index 1"),
        ("/v1/completions", {**ok, "prompt": [1, True]}, "token ids must be integers, got True at index 1"),
        ("/v1/completions", {**ok, "budget": [16]}, "field 'budget"),
        ("/v1/completions", {**ok, "stream_options": "yes"}, "field 'stream_options'"),
        ("/v1/chat/completions", {"model": name, "messages": "hi"}, "field 'messages'"),
        ("/v1/chat/completions", {"model": name, "messages": [{"role": 7, "content": "hi"}]},
         "field 'messages.0.role'"),
        ("/v1/completions", {**ok, "prompt": "x" * 10_000_000},
         "the prompt is 10000000 characters, more than the model's limit of 2048 tokens holds"),
        ("/v1/completions", {**ok, "prompt": [5] * 3000}, "the prompt is 3000 token ids, more than the model's limit"),
        ("/v1/chat/completions", {"model": name, "messages": [{"role": "user", "content": "x" * 200_000}]},
         "the chat template rendered more than 113664 characters"),
        ("/v1/chat/completions", {"model": name, "messages": [{"role": "\udc80", "content": "hi"}]},
         "character 12 is the byte 0x80, which is not UTF-8"),
    ]
    for path, body, says in cases:
        start = time.monotonic()
        r = post(server, path, body)
        assert r.status_code == 400, (str(body)[:200], r.text)
        error = r.json()["error"]
        assert says in error["message"] and error["type"] == "invalid_request_error", (str(body)[:200], error)
        assert time.monotonic() - start < 10, str(body)[:200]      # (a 10 MB prompt was encoded first: 44 s)
        assert len(error["message"]) < 1100
    huge = post(server, "/v1/completions", b'{"model": "' + b"x" * (17 * 2**20) + b'"}')
    assert huge.status_code == 413 and "larger than 16 MiB" in huge.json()["error"]["message"]
    r = post(server, "/v1/completions", {**ok, "model": "gpt-4"})
    assert r.status_code == 404 and f"this server serves {name!r}" in r.json()["error"]["message"]
    for model in ("\ud800", "x" * 1_000_000):    # a response that quoted a lone surrogate failed to encode: 500
        r = post(server, "/v1/completions", {**ok, "model": model})
        assert r.status_code == 404 and len(r.json()["error"]["message"]) < 300, r.text[:300]
    with pytest.raises(openai.BadRequestError, match="unknown decoder"):      # as the client raises it
        server.client().completions.create(model=name, prompt=PROMPT, extra_body={"decoder": "fastest"})


def test_every_error_body_encodes_and_stays_short():
    """A message may quote what a client sent: a template's raise_exception('unknown role ' + role) with a role
    holding a lone surrogate made the response fail to encode (a 500); a 16 MiB value made a 16 MiB error."""
    from fastapi.responses import JSONResponse

    from spot.serve.openai_api import MAX_MESSAGE_CHARS, error_body
    body = json.loads(JSONResponse(error_body("the chat template failed to render (unknown role \ud800x)")).body)
    assert body["error"]["message"] == "the chat template failed to render (unknown role \\ud800x)"
    long = json.loads(JSONResponse(error_body("got " + "x" * 10**6)).body)["error"]["message"]
    assert len(long) == MAX_MESSAGE_CHARS + 3 and long.endswith("...")


def test_a_hostile_chat_template_is_a_400_in_bounded_time_and_health_answers(exported, reference, tmp_path):
    """A template of loops nested over range(100000) rendered on the event loop for hours: nothing else was
    answered. Now it renders in its own process, killed after 5 s."""
    _, env, _ = exported
    template = tmp_path / "slow.jinja"
    template.write_text("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}")
    s = Server(["--engines", "1", "--chat-template", str(template)], env)
    try:
        name = model_name(s)
        with health_latencies(s) as latencies:
            start = time.monotonic()
            r = post(s, "/v1/chat/completions", {"model": name, "messages": [{"role": "user", "content": "hi"}]})
            assert r.status_code == 400 and "the chat template took longer than 5 s" in r.json()["error"]["message"]
            assert time.monotonic() - start < 60
        assert len(latencies) > 10 and max(latencies) < 1.0, latencies
        r = post(s, "/v1/completions", {"model": name, "prompt": PROMPT, "max_tokens": 4, "temperature": 0})
        assert r.json()["choices"][0]["token_ids"] == reference(PROMPT, "standard", 0.0, 0, 4)
    finally:
        assert s.stop() == 0, "".join(s.lines)


def test_budget_auto_decodes_with_the_budget_spot_tune_recorded(server, reference, exported, monkeypatch):
    from spot.runtime.step import CommitRule
    from spot.app.tuned_budgets import save_tuning, tuning_key
    name, folder, env = model_name(server), exported[0], exported[1]
    body = {"model": name, "prompt": PROMPT, "max_tokens": 8, "decoder": "tree", "budget": "auto",
            "temperature": 1.0, "seed": 4}
    missing = post(server, "/v1/completions", body)
    assert missing.status_code == 400 and "no tuned budget" in missing.json()["error"]["message"]
    assert "spot tune --backend ort --device cpu --decoder tree --temperature 1" in missing.json()["error"]["message"]
    monkeypatch.setenv("SPOT_CACHE", env["SPOT_CACHE"])       # where the server looks
    key = tuning_key(reference.engine, "ort", folder, "tree", None, CommitRule())
    record = save_tuning(key, {"temperature": 0.9, "choice": {"nodes": 5, "depth": 3}})
    r = post(server, "/v1/completions", body)
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["budget"] == {"nodes": 5, "depth": 3, "tuned": {"temperature": 0.9,
                                                                            "record": str(record)}}
    assert r.json()["choices"][0]["token_ids"] == reference(PROMPT, "tree", 1.0, 4, 8)
    given = post(server, "/v1/completions", {**body, "budget": 7, "depth": 2}).json()["usage"]["budget"]
    assert given == {"nodes": 7, "depth": 2, "tuned": None}
    assert post(server, "/v1/completions", {**body, "decoder": "standard"}).json()["usage"]["budget"] is None


def test_jobs_are_checked_before_they_queue(exported, reference):
    """build_job (in process): the fields a request leaves out come from the defaults, and what no engine could
    decode is refused before the queue — a drafting decoder on a server without a drafter too."""
    from dataclasses import replace

    from spot.errors import SpotError
    from spot.serve.jobs import DecodeFields, build_job, check_defaults
    from spot.serve.model import RequestDefaults, ServedModel
    model, engine = ServedModel("m", exported[0], "ort", tokenizer=reference.tokenizer), reference.engine
    job = build_job(model, engine, reference.drafter, [5, 6], DecodeFields(4, decoder="spot", budget=8, depth=3,
                                                                           temperature=0.5))
    assert job.tree == {"nodes": 8, "depth": 3, "tuned": None} and job.request.sampling.temperature == 0.5
    assert 0 <= job.seed < 2**32 and job.prompt_ids == [5, 6] and job.max_tokens == 4
    chain = build_job(model, engine, None, [5], DecodeFields(4, decoder="chain", depth=3, seed=1))
    assert chain.tree == {"nodes": 4, "depth": 3, "tuned": None} and chain.seed == 1    # a chain: depth + 1 nodes
    plain = build_job(model, engine, None, [5], DecodeFields(4))
    assert plain.decoder == "standard" and plain.tree is None and plain.request.sampling.temperature == 1.0
    with pytest.raises(SpotError, match="needs a drafter"):
        build_job(model, engine, None, [5, 6], DecodeFields(4, decoder="spot"))
    with pytest.raises(SpotError, match="needs a drafter"):
        check_defaults(replace(model, defaults=RequestDefaults(decoder="spot-sets")), engine, None)
    with pytest.raises(SpotError, match="budget 99 nodes exceeds"):
        check_defaults(replace(model, defaults=RequestDefaults(decoder="tree", budget="99")), engine, None)


def test_metrics_parse_as_prometheus_text(server):
    name = model_name(server)
    assert post(server, "/v1/completions", {"model": name, "prompt": PROMPT, "max_tokens": 4,
                                            "decoder": "spot", "seed": 1}).status_code == 200
    r = server.http.get("/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    families = {f.name: f for f in prometheus_parser.text_string_to_metric_families(r.text)}
    for family, kind in (("spot_requests", "counter"), ("spot_target_passes", "counter"),
                         ("spot_static_passes", "counter"), ("spot_completion_tokens", "counter"),
                         ("spot_queue_depth", "gauge"), ("spot_engines_busy", "gauge"),
                         ("spot_request_seconds", "histogram"), ("spot_queue_wait_seconds", "histogram"),
                         ("spot_first_block_seconds", "histogram")):
        assert families[family].type == kind, family
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for f in families.values() for s in f.samples}
    assert samples[("spot_requests_total", (("endpoint", "completions"), ("status", "200")))] >= 1
    assert samples[("spot_target_passes_total", (("decoder", "spot"),))] >= 1
    assert samples[("spot_engines", ())] == 2


def test_health_ready_and_models(server, exported):
    from spot.serve.model import manifest_sha256
    assert server.http.get("/health").json() == {"status": "ok"}
    ready = server.http.get("/ready")
    assert ready.status_code == 200
    body = ready.json()
    assert body["free_engines"] == 2 and body["queue_depth"] == 0
    assert body["manifest_sha256"] == manifest_sha256(exported[0]) and len(body["manifest_sha256"]) == 64
    assert [m.id for m in server.client().models.list()] == [exported[0].name]
    for path, method in (("/v1/nothing", "GET"), ("/health", "POST"), ("/v1/completions", "GET")):
        r = server.http.request(method, path)         # FastAPI's own 404 / 405: in OpenAI's error shape too
        assert r.status_code in (404, 405) and r.json()["error"]["message"], r.text


def test_the_openai_client_lists_retrieves_completes_chats_and_streams(server, reference, exported):
    """The official client's calls a program makes first: models.retrieve was a 404 (no GET /v1/models/{id})."""
    client, name = server.client(), exported[0].name
    assert [m.id for m in client.models.list()] == [name]
    model = client.models.retrieve(name)
    assert model.id == name and model.object == "model" and model.owned_by == "spot"
    with pytest.raises(openai.NotFoundError) as e:
        client.models.retrieve("gpt-4")
    assert e.value.body["code"] == "model_not_found" and "gpt-4" in e.value.body["message"]
    completion = client.completions.create(model=name, prompt=PROMPT, max_tokens=5, temperature=0)
    assert completion.choices[0].token_ids == reference(PROMPT, "standard", 0.0, 0, 5)
    chat = client.chat.completions.create(model=name, messages=[{"role": "user", "content": "hello"}], max_tokens=5,
                                          temperature=0)
    assert chat.choices[0].token_ids == reference("hello", "standard", 0.0, 0, 5, chat=True)
    assert chat.choices[0].message.content == reference.tokenizer.decode(chat.choices[0].token_ids)
    chunks = list(client.chat.completions.create(model=name, messages=[{"role": "user", "content": "hello"}],
                                                 max_tokens=40, temperature=0, stream=True))
    assert sum((c.choices[0].token_ids for c in chunks), []) == reference("hello", "standard", 0.0, 0, 40, chat=True)


def wait_until(check, timeout=30.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if check():
            return True
        time.sleep(0.05)
    return False


def test_a_full_queue_gives_429_and_a_client_that_leaves_frees_its_engine(exported, reference):
    _, env, _ = exported
    s = Server(["--engines", "1", "--queue-size", "1", "--api-key", "sesame"], env)
    try:
        assert post(s, "/v1/completions", {"model": "x", "prompt": "y"}).status_code == 401
        name = s.http.get("/v1/models", headers={"Authorization": "Bearer sesame"}).json()["data"][0]["id"]
        auth = {"Authorization": "Bearer sesame", "Content-Type": "application/json"}
        long = {"model": name, "prompt": PROMPT, "max_tokens": 1500, "stream": True, "temperature": 0}
        queued: dict = {}

        def waiting_request():
            r = s.http.post("/v1/completions", headers=auth, content=json.dumps(
                {"model": name, "prompt": PROMPT, "max_tokens": 8, "seed": 2, "temperature": 1.0}))
            queued["response"] = r
        with s.http.stream("POST", "/v1/completions", headers=auth, content=json.dumps(long)) as stream:
            lines = stream.iter_lines()
            assert next(lines).startswith("data: {")        # the first block: the engine is busy with it
            waiter = threading.Thread(target=waiting_request)
            waiter.start()
            assert wait_until(lambda: s.http.get("/ready").json()["queue_depth"] == 1)
            assert s.http.get("/ready").status_code == 503          # full: a load balancer sends no more
            full = s.http.post("/v1/completions", headers=auth, content=json.dumps({"model": name, "prompt": "x"}))
            assert full.status_code == 429 and full.json()["error"]["code"] == "queue_full"
        # the stream's client went away: its decode ends at the next block, the waiting request gets the engine
        waiter.join(60)
        r = queued["response"]
        assert r.status_code == 200 and r.json()["choices"][0]["token_ids"] == reference(PROMPT, "standard", 1.0, 2, 8)
        assert wait_until(lambda: s.http.get("/ready").json()["free_engines"] == 1)
        families = {f.name: f for f in prometheus_parser.text_string_to_metric_families(s.http.get("/metrics").text)}
        assert [x.value for x in families["spot_cancelled_decodes"].samples if x.name.endswith("_total")] == [1]
        decoded = sum(x.value for x in families["spot_decoded_tokens"].samples if x.name.endswith("_total"))
        assert decoded < 8 + 1500 / 2        # the long decode stopped early (its 47 blocks were not all decoded)
    finally:
        assert s.stop() == 0, "".join(s.lines)


def test_shutdown_finishes_the_running_requests(exported, reference):
    _, env, _ = exported
    s = Server(["--engines", "1", "--queue-size", "2"], env)
    name = model_name(s)
    done: dict = {}

    def waiting_request():
        done["response"] = post(s, "/v1/completions", {"model": name, "prompt": PROMPT, "max_tokens": 8, "seed": 7,
                                                       "temperature": 0.7, "decoder": "spot"})
    body = {"model": name, "prompt": PROMPT, "max_tokens": 60, "stream": True, "temperature": 0}
    with s.http.stream("POST", "/v1/completions", content=json.dumps(body),
                       headers={"Content-Type": "application/json"}) as stream:
        lines = stream.iter_lines()
        first = next(lines)
        waiter = threading.Thread(target=waiting_request)
        waiter.start()
        assert wait_until(lambda: s.http.get("/ready").json()["queue_depth"] == 1)
        s.proc.send_signal(signal.SIGTERM)
        rest = [line for line in (first, *lines) if line]      # (events are separated by empty lines)
    waiter.join(60)
    ids = sum((json.loads(line[6:])["choices"][0]["token_ids"] for line in rest
               if line.startswith("data: {") and json.loads(line[6:])["choices"]), [])
    assert rest[-1] == "data: [DONE]" and ids == reference(PROMPT, "standard", 0.0, 0, 60)
    assert done["response"].status_code == 200
    assert done["response"].json()["choices"][0]["token_ids"] == reference(PROMPT, "spot", 0.7, 7, 8)
    assert s.stop() == 0 and "stopped (running requests finished)" in "".join(s.lines)


@pytest.mark.parametrize("args, says", [
    (["--port", "{taken}"], "error: cannot listen on 127.0.0.1:{taken}"),
    (["--port", "0", "--decoder", "tree", "--depth", "99"], "error: depth must be in 1..32"),
    (["--port", "0", "--decoder", "spot", "--budget", "auto"], "error: no tuned budget"),
])
def test_serve_refuses_a_bad_start_in_one_line(exported, args, says):
    """An address in use, or defaults no request could decode with (nothing tuned for spot here): one error line,
    exit 2."""
    import socket
    _, env, _ = exported
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        r = subprocess.run([sys.executable, "-m", "spot", "serve", *(a.format(taken=port) for a in args)], cwd=REPO,
                           env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and says.format(taken=port) in r.stderr and "Traceback" not in r.stderr, r.stderr


def test_the_load_test_checks_every_answer_against_spot_generate(exported, tmp_path):
    """benchmarks/serve_load.py at a tiny size: its own server, clients, and the comparison with `spot generate`."""
    _, env, _ = exported
    out = tmp_path / "load.json"
    r = subprocess.run([sys.executable, REPO / "benchmarks" / "serve_load.py", "--clients", "2", "--requests", "4",
                        "--distinct", "3", "--engines", "1", "--max-tokens", "4", "--prompt-tokens", "8",
                        "--out", str(out)], cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    report = json.loads(out.read_text())
    assert report["answered"] == 4 and report["identical_to_spot_generate"] == 4
    assert report["lost"] == report["failed"] == report["unsent"] == report["mismatched"] == 0
    assert report["latency_p50_s"] <= report["latency_p99_s"] and report["requests_per_s"] > 0
