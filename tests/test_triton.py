"""`spot triton-repo`: the repository it writes, served by the tritonserver PyTriton bundles (2 instances, the embedded
model's export), streams one response per block whose token ids equal run_decoder's.

The server runs in the PyTriton environment SPOT_TRITON_VENV names (scripts/triton_env.sh makes one; CI does). Without
one the serving test is skipped, saying so; the repository's files are checked here either way."""
from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from serving import Reference
from spot.cli import main
from spot.errors import SpotError

REPO = Path(__file__).resolve().parent.parent
VENV_NOTE = ("no PyTriton environment: make one with `scripts/triton_env.sh VENV` (PyTriton pins numpy < 2) and set "
             "SPOT_TRITON_VENV=VENV")


def test_triton_repo_writes_a_tunable_decoupled_repository(embedded_export, tmp_path):
    _, folder = embedded_export
    out = tmp_path / "repo"
    r = CliRunner().invoke(main, ["triton-repo", str(folder), "--out", str(out), "--instances", "3",
                                  "--engines", "4", "--decoder", "spot", "--temperature", "0.7"])
    assert r.exit_code == 0, r.output
    config = (out / "spot" / "config.pbtxt").read_text()
    assert 'backend: "python"' in config and "model_transaction_policy { decoupled: true }" in config
    assert "instance_group [ { count: 3 kind: KIND_CPU } ]" in config
    assert 'key: "engines" value: { string_value: "4" }' in config and "own copy of the weights" in config
    assert 'key: "decoder" value: { string_value: "spot" }' in config
    assert 'key: "temperature" value: { string_value: "0.7" }' in config
    assert 'name: "temperature" data_type: TYPE_FP64' in config      # 0.7 reaches the sampler as 0.7
    assert "from spot.triton.backend import TritonPythonModel" in (out / "spot" / "1" / "model.py").read_text()
    export = out / "spot" / "1" / "export"
    assert (export / "manifest.json").read_bytes() == (folder / "manifest.json").read_bytes()
    assert (export / "target.onnx.data").stat().st_ino == (folder / "target.onnx.data").stat().st_ino   # linked
    again = CliRunner().invoke(main, ["triton-repo", str(folder), "--out", str(out)])
    assert again.exit_code == 2 and "already exists" in again.stderr and "--overwrite" in again.stderr
    assert CliRunner().invoke(main, ["triton-repo", str(folder), "--out", str(out), "--overwrite"]).exit_code == 0
    assert "count: 1 kind" in (out / "spot" / "config.pbtxt").read_text()
    mine = tmp_path / "mine"            # a repository with the user's files and another model: written beside them
    (mine / "other" / "1").mkdir(parents=True)
    (mine / "notes.txt").write_text("keep")
    (mine / "other" / "config.pbtxt").write_text("keep")
    added = CliRunner().invoke(main, ["triton-repo", str(folder), "--out", str(mine), "--overwrite"])
    assert added.exit_code == 0 and (mine / "spot" / "config.pbtxt").is_file()
    refused = CliRunner().invoke(main, ["triton-repo", str(folder), "--out", str(mine), "--name", "other",
                                        "--overwrite"])
    assert refused.exit_code == 2 and "is not a model folder spot triton-repo wrote" in refused.stderr
    assert (mine / "notes.txt").read_text() == "keep" and (mine / "other" / "config.pbtxt").read_text() == "keep"
    bad = CliRunner().invoke(main, ["triton-repo", str(tmp_path), "--out", str(tmp_path / "x")])
    assert bad.exit_code == 2 and "manifest" in bad.stderr and not (tmp_path / "x").exists()


SERVE_BLOCKER = '''import sys
class _Blocked:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("fastapi", "uvicorn", "prometheus_client", "pydantic", "starlette"):
            raise ModuleNotFoundError(f"No module named {name!r} (no serve extra)", name=name)
        return None
sys.meta_path.insert(0, _Blocked())
'''


def test_the_triton_model_needs_no_serve_extra_and_spot_serve_names_it(embedded_export, tmp_path):
    """Triton's Python environment has spot alone: the repository is written and its model imports without FastAPI,
    uvicorn, pydantic or prometheus_client; `spot serve` without them says which extra to install."""
    cache, folder = embedded_export
    (tmp_path / "blocker").mkdir()
    (tmp_path / "blocker" / "sitecustomize.py").write_text(SERVE_BLOCKER)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path / "blocker"), str(REPO)]),
           "SPOT_CACHE": str(cache)}

    def run(*args):
        return subprocess.run([sys.executable, *args], cwd=REPO, env=env, capture_output=True, text=True,
                              timeout=300)
    assert "no serve extra" in run("-c", "import fastapi").stderr       # the blocker works
    assert run("-m", "spot", "triton-repo", str(folder), "--out", str(tmp_path / "repo")).returncode == 0
    imported = run("-c", "import spot.triton.backend as b, spot.serve.jobs, spot.serve.model; print(b.FIELD_INPUTS)")
    assert imported.returncode == 0, imported.stderr
    serve = run("-m", "spot", "serve", "--port", "0")
    assert serve.returncode == 2 and "Traceback" not in serve.stderr, serve.stderr
    assert "`spot serve` needs the" in serve.stderr and "pip install 'spot-edge[serve]'" in serve.stderr


def test_request_inputs_become_the_fields_spot_serve_checks():
    import numpy as np

    from spot.errors import SpotError
    from spot.triton.backend import request_fields

    class Words:
        def encode(self, text):
            return [len(w) for w in text.split()]

        def max_text_chars(self, tokens):
            return 3 * tokens
    inputs = {"text_input": np.array([b"ab cde"], dtype=object), "max_tokens": np.array([7], np.int32),
              "temperature": np.array([0.7]), "decoder": np.array(["spot".encode()], dtype=object)}
    prompt, fields = request_fields(inputs.get, Words())
    assert prompt == [2, 3] and fields.max_tokens == 7 and fields.temperature == 0.7 and fields.decoder == "spot"
    assert fields.seed is None and fields.budget is None
    prompt, fields = request_fields({"prompt_ids": np.array([5, 6, 7])}.get, None, default_max_tokens=3)
    assert prompt == [5, 6, 7] and fields.max_tokens == 3
    for bad, says in (({}, "exactly one of the inputs text_input"),
                      ({"text_input": np.array([b"x"], object), "prompt_ids": np.array([1])}, "exactly one"),
                      ({"text_input": np.array([b"\xff"], object)}, "input text_input is not UTF-8"),
                      ({"prompt_ids": np.array([1]), "seed": np.array([1, 2])}, "input seed must hold one value"),
                      ({"text_input": np.array([b"x"], object)}, "no tokenizer")):
        with pytest.raises(SpotError, match=says):
            request_fields(bad.get, None if "no tokenizer" in says else Words())
    # a text longer than the context holds is refused before it is encoded (Words().encode would take it)
    with pytest.raises(SpotError, match="the prompt is 7 characters, more than the model's limit of 2 tokens holds"):
        request_fields({"text_input": np.array([b"abc def"], object)}.get, Words(), context=2)


def triton_venv() -> Path:
    venv = os.environ.get("SPOT_TRITON_VENV")
    if not venv:
        pytest.skip(VENV_NOTE)
    python = Path(venv) / "bin" / "python"
    if not python.is_file():
        pytest.skip(f"SPOT_TRITON_VENV={venv} has no bin/python: {VENV_NOTE}")
    found = subprocess.run([python, "-c", "import pytriton, spot; print(spot.__file__)"], capture_output=True,
                           text=True)
    if found.returncode != 0:
        pytest.skip(f"SPOT_TRITON_VENV={venv} cannot import pytriton and spot ({found.stderr.strip()[-200:]}): "
                    f"{VENV_NOTE}")
    if Path(found.stdout.strip()).resolve() != (REPO / "spot" / "__init__.py").resolve():
        pytest.skip(f"SPOT_TRITON_VENV={venv} runs spot from {found.stdout.strip()}, not this checkout: run "
                    f"`scripts/triton_env.sh {venv}` from it")
    return python


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def events(response) -> list[dict]:
    """A generate_stream answer's server-sent events."""
    return [json.loads(line[len("data: "):]) for line in response.iter_lines() if line.startswith("data: ")]


@pytest.fixture(scope="module")
def tritonserver(embedded_export, tmp_path_factory):
    httpx = pytest.importorskip("httpx")
    python = triton_venv()
    cache, folder = embedded_export
    from spot.triton.repo import TritonRepoOptions, write_triton_repo
    repo = write_triton_repo(folder, tmp_path_factory.mktemp("triton") / "repo", TritonRepoOptions(engines=2))
    port = free_port()
    log = tmp_path_factory.mktemp("triton-log") / "tritonserver.log"
    with open(log, "w") as out:
        proc = subprocess.Popen([python, REPO / "scripts" / "pytriton_server.py", "--model-repository", repo,
                                 "--http-address", "127.0.0.1", "--http-port", str(port), "--allow-grpc", "false",
                                 "--allow-metrics", "false", "--exit-timeout-secs", "5"],
                                env={**os.environ, "SPOT_CACHE": str(cache)}, stdin=subprocess.DEVNULL, stdout=out,
                                stderr=subprocess.STDOUT)
    http = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=120)
    try:
        end = time.monotonic() + 180
        while time.monotonic() < end and proc.poll() is None:
            try:
                if http.get("/v2/models/spot/ready").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            time.sleep(0.25)
        else:
            raise AssertionError(f"tritonserver did not get ready:\n{log.read_text()[-4000:]}")
        yield http
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()


@pytest.mark.slow
def test_tritonserver_streams_run_decoders_tokens_block_by_block(tritonserver, embedded_export):
    reference = Reference(embedded_export[1])
    cases = [("def add(a, b):", "spot", 0.7, 3, 40), ("import os", "standard", 1.0, 5, 12),
             (list(range(100, 140)), "threshold", 0.0, 0, 20), ("class Stack:", "tree", 1.0, 8, 36)]
    answers: dict[int, list[dict]] = {}

    def ask(i):
        prompt, decoder, temperature, seed, max_tokens = cases[i]
        body = {"decoder": decoder, "temperature": temperature, "seed": seed, "max_tokens": max_tokens,
                **({"text_input": prompt} if isinstance(prompt, str) else {"prompt_ids": prompt})}
        with tritonserver.stream("POST", "/v2/models/spot/generate_stream", json=body) as r:
            answers[i] = events(r)
    threads = [threading.Thread(target=ask, args=(i,)) for i in range(len(cases))]    # 2 engines, 4 requests
    for t in threads:
        t.start()
    for t in threads:
        t.join(180)
    for i, (prompt, decoder, temperature, seed, max_tokens) in enumerate(cases):
        got = answers[i]
        assert all("error" not in e for e in got), got
        ids = sum((e["token_ids"] for e in got), [])
        assert ids == reference(prompt, decoder, temperature, seed, max_tokens), (decoder, got)
        assert "".join(e["text_output"] for e in got) == reference.tokenizer.decode(ids)
        usage = json.loads(got[-1]["usage"])
        assert got[-1]["finish_reason"] == "length" and usage["completion_tokens"] == max_tokens
        # a response per block: each one after the first is stored by a fused pass (docs/spec.md §1)
        assert len([e for e in got if e["token_ids"]]) == usage["passes"]["fused"] + 1
        assert usage["decoder"] == decoder and usage["seed"] == seed
    with tritonserver.stream("POST", "/v2/models/spot/generate_stream",
                             json={"text_input": "x", "decoder": "fastest"}) as r:
        said = events(r)
    assert re.search(r"unknown decoder 'fastest'", json.dumps(said)), said


class FakeTriton:
    """The part of Triton's Python-backend module (triton_python_backend_utils) spot's model uses, in this process:
    requests with input tensors and response senders that record what they were sent, from which thread."""

    TRITONSERVER_RESPONSE_COMPLETE_FINAL = 1

    class TritonModelException(Exception):
        pass

    class TritonError:
        def __init__(self, message):
            self.message = message

    class Tensor:
        def __init__(self, name, array):
            self.name, self.array = name, array

        def as_numpy(self):
            return self.array

    class InferenceResponse:
        def __init__(self, output_tensors=None, error=None):
            self.tensors, self.error = list(output_tensors or []), error

        def output_tensors(self):
            return self.tensors

    @staticmethod
    def using_decoupled_model_transaction_policy(config):
        return config["model_transaction_policy"]["decoupled"]

    @staticmethod
    def get_input_tensor_by_name(request, name):
        return request.inputs.get(name)


class Sender:
    def __init__(self):
        self.responses, self.threads, self.done = [], set(), threading.Event()

    def send(self, response, flags=0):
        self.responses.append(response)
        self.threads.add(threading.current_thread().name)
        if flags == FakeTriton.TRITONSERVER_RESPONSE_COMPLETE_FINAL:
            self.done.set()

    def token_ids(self) -> list[int]:
        return [int(i) for r in self.responses for t in r.tensors if t.name == "token_ids" for i in t.array]


class FakeRequest:
    def __init__(self, **inputs):
        import numpy as np
        self.inputs = {k: FakeTriton.Tensor(k, np.asarray(v, dtype=object if isinstance(v[0], bytes) else None))
                       for k, v in inputs.items()}
        self.sender = Sender()

    def get_response_sender(self):
        return self.sender


def test_one_instance_decodes_its_engines_requests_at_once_over_one_copy_of_the_weights(embedded_export,
                                                                                         monkeypatch):
    """The model of a repository written with --engines 2, run by a stand-in for Triton's Python backend: one
    instance opens two engines over one set of sessions; execute() only queues (a bad request is answered at once)
    and both engines' threads answer the requests, each with run_decoder's tokens block by block."""
    monkeypatch.setitem(sys.modules, "triton_python_backend_utils", FakeTriton)
    from spot.triton.backend import TritonPythonModel
    folder = embedded_export[1]
    reference = Reference(folder)
    config = {"name": "spot", "model_transaction_policy": {"decoupled": True}, "instance_group": [{"count": 1}],
              "parameters": {"export": {"string_value": str(folder)}, "engines": {"string_value": "2"},
                             "decoder": {"string_value": "standard"}}}
    model = TritonPythonModel()
    model.initialize({"model_config": json.dumps(config), "model_repository": str(folder.parent),
                      "model_version": "1"})
    try:
        (first, _), (second, _) = model.slots
        assert second.session is first.session and second._k is not first._k
        decoders = ("standard", "spot", "tree", "threshold")
        cases = [(list(range(100 + 9 * i, 130 + 9 * i)), decoders[i], (0.0, 0.7)[i % 2], i + 1, 12) for i in range(4)]
        requests = [FakeRequest(prompt_ids=prompt, decoder=[d.encode()], temperature=[t], seed=[seed],
                                max_tokens=[n]) for prompt, d, t, seed, n in cases]
        bad = FakeRequest(prompt_ids=[1, 2], decoder=[b"fastest"])
        assert model.execute(requests + [bad]) is None
        assert bad.sender.done.is_set() and "unknown decoder 'fastest'" in bad.sender.responses[0].error.message
        for request, (prompt, decoder, temperature, seed, n) in zip(requests, cases):
            assert request.sender.done.wait(300), decoder
            assert request.sender.token_ids() == reference(prompt, decoder, temperature, seed, n), decoder
        answered_by = set().union(*(r.sender.threads for r in requests))
        assert answered_by == {"spot-engine-0", "spot-engine-1"}
    finally:
        model.finalize()
    assert first.closed and second.closed
    with pytest.raises(SpotError, match="engines parameter must be an integer >= 1"):
        from spot.triton.backend import engine_count
        engine_count({"engines": "0"})
