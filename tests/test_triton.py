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
import threading
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from serving import Reference
from spot.cli import main

REPO = Path(__file__).resolve().parent.parent
VENV_NOTE = ("no PyTriton environment: make one with `scripts/triton_env.sh VENV` (PyTriton pins numpy < 2) and set "
             "SPOT_TRITON_VENV=VENV")


def test_triton_repo_writes_a_tunable_decoupled_repository(embedded_export, tmp_path):
    _, folder = embedded_export
    out = tmp_path / "repo"
    r = CliRunner().invoke(main, ["triton-repo", str(folder), "--out", str(out), "--instances", "3",
                                  "--decoder", "spot", "--temperature", "0.7"])
    assert r.exit_code == 0, r.output
    config = (out / "spot" / "config.pbtxt").read_text()
    assert 'backend: "python"' in config and "model_transaction_policy { decoupled: true }" in config
    assert "instance_group [ { count: 3 kind: KIND_CPU } ]" in config
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
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep")
    refused = CliRunner().invoke(main, ["triton-repo", str(folder), "--out", str(mine), "--overwrite"])
    assert refused.exit_code == 2 and "is not a repository spot triton-repo wrote" in refused.stderr
    assert (mine / "notes.txt").read_text() == "keep"
    bad = CliRunner().invoke(main, ["triton-repo", str(tmp_path), "--out", str(tmp_path / "x")])
    assert bad.exit_code == 2 and "manifest" in bad.stderr and not (tmp_path / "x").exists()


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
    repo = write_triton_repo(folder, tmp_path_factory.mktemp("triton") / "repo", TritonRepoOptions(instances=2))
    port = free_port()
    log = tmp_path_factory.mktemp("triton-log") / "tritonserver.log"
    with open(log, "w") as out:
        proc = subprocess.Popen([python, REPO / "scripts" / "pytriton_server.py", "--model-repository", repo,
                                 "--http-address", "127.0.0.1", "--http-port", str(port), "--allow-grpc", "false",
                                 "--allow-metrics", "false", "--exit-timeout-secs", "10"],
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
    threads = [threading.Thread(target=ask, args=(i,)) for i in range(len(cases))]    # 2 instances, 4 requests
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
        assert len([e for e in got if e["token_ids"]]) == usage["passes"]["store"]    # a response per block
        assert usage["decoder"] == decoder and usage["seed"] == seed
    with tritonserver.stream("POST", "/v2/models/spot/generate_stream",
                             json={"text_input": "x", "decoder": "fastest"}) as r:
        said = events(r)
    assert re.search(r"unknown decoder 'fastest'", json.dumps(said)), said
