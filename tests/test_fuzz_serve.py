"""Property-based (Hypothesis): whatever a client sends `spot serve` — any JSON, bytes that are not JSON, values
nested or huge, any field of any route with a value of any type — gets one clear answer: a 2xx, or a 4xx in OpenAI's
error shape, never a 5xx, within a bounded time; and /health answers while long requests run.

A fixed example budget; under CI (CI=true) derandomized, so that a run is the same run each time and stays within a
few minutes on 2 cores.
"""
from __future__ import annotations

import json
import os
import threading
import time
from urllib.parse import quote

import pytest

pytest.importorskip("fastapi", reason="spot serve needs the serve extra: pip install 'spot-edge[serve]'")
pytest.importorskip("uvicorn", reason="spot serve needs the serve extra: pip install 'spot-edge[serve]'")
pytest.importorskip("httpx")
pytest.importorskip("hypothesis")

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from serving import REPO, Server, health_latencies  # noqa: E402
from spot.serve.openai_api import NO_OP_VALUES, ChatRequest, CompletionRequest  # noqa: E402
from tinymodels import TEMPLATE  # noqa: E402

pytestmark = pytest.mark.slow
CI = os.environ.get("CI") == "true"
BOUND_S = 30.0      # any answer on a busy 2-core machine: refusals take milliseconds, the decodes below 16 tokens


def examples(n: int):
    """Hypothesis' settings for n examples (~0.1 s each here)."""
    return settings(max_examples=n, deadline=None, derandomize=CI, **({"database": None} if CI else {}),
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                           HealthCheck.large_base_example])


CHAT_MAX_TOKENS = 8         # what a chat body without max_tokens decodes (the server's --chat-max-tokens)
POST_ROUTES = ("/v1/completions", "/v1/chat/completions")
OTHER_ROUTES = ("/health", "/ready", "/metrics", "/v1/models", "/v1/models/x")


@pytest.fixture(scope="module")
def server(embedded_export, tmp_path_factory):
    cache, _ = embedded_export
    template = tmp_path_factory.mktemp("template") / "chat.jinja"
    template.write_text(TEMPLATE)
    env = {**os.environ, "SPOT_CACHE": str(cache), "PYTHONPATH": str(REPO)}
    s = Server(["--engines", "1", "--queue-size", "4", "--chat-template", str(template), "--chat-max-tokens",
                str(CHAT_MAX_TOKENS)], env)
    s.name = s.http.get("/v1/models").json()["data"][0]["id"]
    yield s
    assert s.stop() == 0, "".join(s.lines)


# --- what is sent ------------------------------------------------------------------------------------------------

BIG_INTS = st.sampled_from([2**31, 2**32, 2**63, -(2**63), 2**64, 10**30, -(10**30), 10**4000])
TEXT = st.text(st.characters(exclude_categories=()), max_size=20)        # lone surrogates included
SCALARS = st.none() | st.booleans() | st.integers() | BIG_INTS | st.floats() | TEXT
JSON_VALUES = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=4) |
                           st.dictionaries(TEXT, inner, max_size=4), max_leaves=12)


def deep(n: int, kind: str):
    """A value nested n deep: [[[...]]] or {"a": {"a": ...}}."""
    value = []
    for _ in range(n):
        value = [value] if kind == "list" else {"a": value}
    return value


NESTED = st.builds(deep, st.integers(1, 900), st.sampled_from(["list", "dict"]))       # json.dumps recurses too
HUGE_TEXT = st.integers(0, 15 * 2**20).map(lambda n: "é" * (n // 2) if n % 2 else "x" * n)  # under the 16 MiB cap
ANY_VALUE = JSON_VALUES | NESTED | HUGE_TEXT | st.lists(st.integers(), min_size=1000, max_size=5000)


def decode_bounded(value):
    """A max_tokens the decode would take long to reach (17..2048) made one past the context: refusals and short
    decodes are what this suite runs; long ones are tests/test_serve.py's."""
    return value + 4096 if type(value) is int and 16 < value <= 2048 else value


MESSAGE = st.dictionaries(st.sampled_from(["role", "content", "name", "tool_calls"]), ANY_VALUE, max_size=3) | \
    st.fixed_dictionaries({"role": st.sampled_from(["user", "system", "assistant"]) | ANY_VALUE,
                           "content": TEXT | st.lists(st.fixed_dictionaries({"type": st.just("text") | ANY_VALUE,
                                                                             "text": TEXT | ANY_VALUE}), max_size=3)
                           | ANY_VALUE})
# every field either route reads, and the OpenAI fields it refuses: plausible values and values of any type
PLAUSIBLE = {
    "prompt": st.just("def add(a, b):") | st.lists(st.integers(0, 2047), max_size=40),
    "messages": st.lists(MESSAGE, max_size=3),
    "max_tokens": st.integers(-2, 16), "max_completion_tokens": st.integers(-2, 16),
    "decoder": st.sampled_from(["standard", "spot", "spot-sets", "tree", "chain", "threshold"]),
    "budget": st.integers(-1, 70) | st.just("auto"), "depth": st.integers(-1, 40),
    "mode": st.sampled_from(["static", "threshold"]), "stream": st.booleans(),
    "stream_options": st.fixed_dictionaries({"include_usage": st.booleans()}),
    "temperature": st.floats(0, 2), "top_p": st.floats(0, 1), "tau": st.floats(0, 1), "top_k": st.integers(-1, 3000),
    "seed": st.integers(-1, 2**32),
}
FIELDS = sorted(set(CompletionRequest.model_fields) | set(ChatRequest.model_fields) | set(NO_OP_VALUES) | {"user"})


def field_value(name: str):
    value = (PLAUSIBLE[name] | ANY_VALUE) if name in PLAUSIBLE else ANY_VALUE
    return value.map(decode_bounded) if name in ("max_tokens", "max_completion_tokens") else value


@st.composite
def route_bodies(draw):
    """A route and a body that is valid but for the fields drawn over it: each of any type."""
    route = draw(st.sampled_from(POST_ROUTES))
    body = {"max_tokens": 2}
    body.update({"prompt": "def add(a, b):"} if route == POST_ROUTES[0] else
                {"messages": [{"role": "user", "content": "hello"}]})
    for name in draw(st.lists(st.sampled_from(FIELDS), min_size=1, max_size=4, unique=True)):
        body[name] = draw(field_value(name))
    return route, body


HOSTILE_BYTES = (
    st.builds(lambda n, head: head * n, st.integers(1, 200_000),
              st.sampled_from([b"[", b'{"a":', b'{"messages":[', b'{"prompt":[', b'{"model":{"a":']))
    | st.integers(4000, 6000).map(lambda n: b'{"max_tokens": ' + b"9" * n + b"}")
    | st.binary(max_size=300)
    | st.sampled_from([b"", b"null", b"[]", b"{}", b'"x"', b"NaN", b"-Infinity", b"1e999", b'{"model": "\\ud800"}',
                       b'{"a": 1} trailing', b"\xef\xbb\xbf{}", b'{"model": "\xff"}'])
)


def dumps(body) -> bytes:
    """JSON as a client may send it: NaN and Infinity too (Python's json reads them)."""
    return json.dumps(body, allow_nan=True).encode()


def answer_of(server, method: str, path: str, content: bytes | None = None):
    start = time.monotonic()
    r = server.http.request(method, path, content=content, headers={"Content-Type": "application/json"},
                            timeout=BOUND_S + 60)
    return r, time.monotonic() - start


def check_answer(r, seconds: float, sent) -> None:
    what = f"{str(sent)[:300]} -> {r.status_code} {r.text[:500]}"
    assert r.status_code < 500, what
    assert seconds < BOUND_S, what
    if r.status_code >= 400:
        error = r.json()["error"]
        assert error["message"] and error["type"], what


# --- properties --------------------------------------------------------------------------------------------------

@examples(300)
@given(sent=route_bodies())
def test_any_field_of_any_type_gets_a_clear_answer(server, sent):
    route, body = sent
    body = {"model": server.name, **body}       # the served model unless the draw put something else there
    check_answer(*answer_of(server, "POST", route, dumps(body)), sent)


@examples(200)
@given(route=st.sampled_from(POST_ROUTES), body=ANY_VALUE | st.dictionaries(st.sampled_from(FIELDS), ANY_VALUE))
def test_any_json_body_gets_a_clear_answer(server, route, body):
    check_answer(*answer_of(server, "POST", route, dumps(body)), body)


@examples(150)
@given(route=st.sampled_from(POST_ROUTES + OTHER_ROUTES), content=HOSTILE_BYTES)
def test_bytes_that_are_not_a_request_get_a_clear_answer(server, route, content):
    check_answer(*answer_of(server, "POST", route, content), content)


@examples(150)
@given(route=st.sampled_from(OTHER_ROUTES), model_id=TEXT, content=st.none() | HOSTILE_BYTES)
def test_the_other_routes_answer_any_request(server, route, model_id, content):
    path = "/v1/models/" + quote(model_id.encode("utf-8", "surrogatepass"), safe="") if route == "/v1/models/x" \
        else route
    r, seconds = answer_of(server, "GET", path, content)
    check_answer(r, seconds, (path, content))
    assert r.status_code in ((200, 404) if route == "/v1/models/x" else (200, 503))


def test_health_answers_while_long_requests_run(server):
    """A long decode on the engine, a 15 MB prompt (its encoding took the event loop for seconds: /health waited
    44 s on a 10 MB one), a body nested 100,000 deep and a chat of 100,000 characters (rendered, then encoded), all at
    once: /health answers within a second throughout."""
    long = {"model": server.name, "prompt": "def f(x):", "max_tokens": 1500, "temperature": 0, "stream": True}
    bodies = [(POST_ROUTES[0], {"model": server.name, "prompt": "x" * 15_000_000}),
              (POST_ROUTES[0], b"[" * 100_000),
              (POST_ROUTES[1], {"model": server.name, "messages": [{"role": "user", "content": "y" * 100_000}],
                                "max_tokens": 1})]
    with health_latencies(server) as latencies:
        with server.http.stream("POST", POST_ROUTES[0], content=dumps(long)) as stream:
            lines = stream.iter_lines()
            assert next(lines).startswith("data: {")        # decoding
            answers: list = []
            threads = [threading.Thread(target=lambda r=route, b=body: answers.append(server.post(r, b)))
                       for route, body in bodies]
            for t in threads:
                t.start()
            for t in threads:
                t.join(BOUND_S * 4)
            assert [a.status_code for a in answers] == [400] * 3, [a.text[:200] for a in answers]
            # on a quiet machine the three refusals take less than three polls: keep polling while the decode runs
            deadline = time.monotonic() + BOUND_S
            while len(latencies) < 3 and time.monotonic() < deadline:
                time.sleep(0.02)
            assert next(line for line in lines if line).startswith("data: {")      # still decoding afterwards
    assert len(latencies) >= 3 and max(latencies) < 1.0, sorted(latencies)[-5:]
