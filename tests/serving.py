"""Shared by the serving tests: `spot serve` started as users start it (Server), and what a served request must
return, computed in the test's own process (Reference: run_decoder on an engine of the same export, with the prompt
encoded as the server encodes it, and the servers' defaults: budget 16 nodes at the default depth, tau 0.9, top_p 1;
the Triton tests use it too)."""
from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


class Server:
    """`python -m spot serve --port 0 ARGS` from this checkout; url once it listens; stop() sends SIGTERM."""

    def __init__(self, args, env, timeout=120):
        import httpx
        self.proc = subprocess.Popen([sys.executable, "-m", "spot", "serve", "--port", "0", *args], cwd=REPO,
                                     env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True)
        self.lines: list[str] = []
        self.listening = threading.Event()
        threading.Thread(target=self._read, daemon=True).start()
        if not self.listening.wait(timeout) or self.proc.poll() is not None:
            self.proc.kill()
            raise AssertionError("spot serve did not start:\n" + "".join(self.lines))
        self.url = re.search(r" on (http://\S+) ", "".join(self.lines)).group(1)
        self.http = httpx.Client(base_url=self.url, timeout=120)

    def _read(self):
        for line in self.proc.stderr:
            self.lines.append(line)
            if line.startswith("spot serve: ") and " on http://" in line:
                self.listening.set()

    def client(self, **kw):
        import openai
        return openai.OpenAI(base_url=self.url + "/v1", api_key=kw.pop("api_key", "unused"), max_retries=0, **kw)

    def post(self, path, body, **kw):
        """POST `body` (bytes as they are, anything else as JSON) to `path`."""
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        return self.http.post(path, content=data, headers={"Content-Type": "application/json"}, **kw)

    def stop(self, timeout=60) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()


class health_latencies:
    """GET /health every 20 ms on a thread of its own while the block runs: the list of its response times (inf for
    an answer other than 200)."""

    def __init__(self, server):
        self.server, self.latencies, self.done = server, [], threading.Event()

    def __enter__(self):
        self.thread = threading.Thread(target=self._poll)
        self.thread.start()
        return self.latencies

    def _poll(self):
        import httpx
        with httpx.Client(base_url=self.server.url, timeout=120) as http:
            while not self.done.wait(0.02):
                start = time.monotonic()
                ok = http.get("/health").status_code == 200
                self.latencies.append(time.monotonic() - start if ok else float("inf"))

    def __exit__(self, *exc):
        self.done.set()
        self.thread.join()


class Reference:
    def __init__(self, folder, chat_template: str | None = None):
        from spot.engines.ort_engine import OrtEngine
        from spot.runtime.drafter import load_drafter
        from spot.tokenizer import load_tokenizer
        self.engine, self.drafter = OrtEngine(folder, threads=1), load_drafter(folder)
        self.tokenizer, self.chat_template = load_tokenizer(folder), chat_template

    def prompt_ids(self, prompt, chat: bool = False) -> list[int]:
        from spot.tokenizer import render_chat_template
        if chat:
            return self.tokenizer.encode(render_chat_template(self.chat_template, [{"role": "user", "content": prompt}]))
        return self.tokenizer.encode(prompt) if isinstance(prompt, str) else list(prompt)

    def __call__(self, prompt, decoder: str, temperature: float, seed: int, max_tokens: int, chat: bool = False):
        """The first max_tokens ids run_decoder gives."""
        from spot.runtime.decode_plan import DecodeRequest, run_decoder
        from spot.runtime.spot import TreeBudget
        from spot.runtime.step import Sampling
        req = DecodeRequest(max_tokens, sampling=Sampling(temperature, seed=seed), budget=TreeBudget(16))
        ids = self.prompt_ids(prompt, chat)
        return run_decoder(decoder, self.engine, ids, req, self.drafter).token_ids[:max_tokens]
