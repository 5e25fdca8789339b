"""`spot serve`'s process: open the engines, bind the address, serve until SIGTERM or Ctrl-C, then stop taking
connections and finish the running requests (uvicorn's graceful shutdown) before the engines close."""
from __future__ import annotations

import signal
import socket
import threading
from dataclasses import dataclass
from typing import Callable

import uvicorn

from spot.errors import SpotError
from spot.serve.jobs import check_defaults
from spot.serve.model import ServedModel, threads_per_engine
from spot.serve.pool import EnginePool


@dataclass(frozen=True)
class ServeOptions:
    host: str = "127.0.0.1"          # loopback unless the user names another address
    port: int = 8000                 # 0: a free port (announced)
    engines: int = 1
    threads: int | None = None       # ONNX Runtime threads per engine; None: the cores shared out
    queue_size: int = 16
    api_key: str | None = None
    chat_max_tokens: int = 256
    graceful_timeout: float | None = None     # seconds to finish running requests at shutdown; None: as long as needed
    log_level: str = "warning"


def open_pool(model: ServedModel, engines: int, threads: int | None, queue_size: int,
              progress: Callable[[str], None] = lambda line: None) -> EnginePool:
    """`engines` engines over the model (its weights once), behind a queue of queue_size."""
    if engines < 1:
        raise SpotError(f"--engines must be >= 1, got {engines}")
    progress(f"opening {engines} engine{'s' * (engines > 1)} over one copy of the weights")
    slots = model.open_engines(engines, threads_per_engine(threads, engines))
    check_defaults(model, *slots[0])
    return EnginePool(slots, queue_size)


def bind(host: str, port: int) -> socket.socket:
    """A socket bound to host:port (IPv4 or IPv6, as the host resolves); SpotError saying why not."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                                             flags=socket.AI_PASSIVE)[0]
    except (socket.gaierror, UnicodeError) as e:
        raise SpotError(f"--host {host!r} is not an address this machine can listen on ({e})",
                        "e.g. --host 127.0.0.1 (this machine only) or --host 0.0.0.0 (every interface)") from None
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(address)
    except OSError as e:
        sock.close()
        raise SpotError(f"cannot listen on {host}:{port}: {e.strerror or e}",
                        "choose another --port (0: any free one), or stop what uses it") from None
    sock.set_inheritable(True)
    return sock


def url_of(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    return f"http://{'[' + host + ']' if ':' in host else host}:{port}"


def serve(model: ServedModel, options: ServeOptions, say: Callable[[str], None]) -> None:
    """Serve `model` until a signal stops it; `say`: progress and the listening line (its URL: port 0 resolved)."""
    # fastapi: optional extra (spot.serve.app imports it)
    from spot.serve.app import create_app

    if options.host not in ("127.0.0.1", "localhost", "::1") and options.api_key is None:
        say(f"warning: listening on {options.host} without --api-key: anyone who reaches it can decode")
    sock = bind(options.host, options.port)
    try:
        pool = open_pool(model, options.engines, options.threads, options.queue_size, say)
        app = create_app(model, pool, options.api_key, options.chat_max_tokens)
        config = uvicorn.Config(app, log_level=options.log_level, timeout_graceful_shutdown=options.graceful_timeout,
                                lifespan="on")
        server = AnnouncingServer(config, lambda: say(f"spot serve: {model.name} on {url_of(sock)} "
                                                      f"({options.engines} engine{'s' * (options.engines > 1)}, "
                                                      f"queue {options.queue_size}; Ctrl-C stops)"))
        with signals_ignored_after_shutdown():
            server.run(sockets=[sock])
    finally:
        sock.close()
    if not server.started:
        raise SpotError("the server did not start", "run again with --log-level info to see uvicorn's reason")
    say("spot serve: stopped (running requests finished)")


class AnnouncingServer(uvicorn.Server):
    """uvicorn.Server that calls `announce` once it listens (tests and scripts wait for the line)."""

    def __init__(self, config: uvicorn.Config, announce: Callable[[], None]):
        super().__init__(config)
        self.announce = announce

    async def startup(self, sockets=None):
        await super().startup(sockets)
        if self.started:
            self.announce()


class signals_ignored_after_shutdown:
    """uvicorn stops gracefully on SIGINT / SIGTERM, then raises the signal again under the handlers it found (spot's
    CLI exits 130 / 143 on them): ignored there instead, so that a server stopped on purpose exits 0."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __enter__(self):
        self.previous = {}
        if threading.current_thread() is threading.main_thread():
            self.previous = {sig: signal.signal(sig, signal.SIG_IGN) for sig in self.SIGNALS}
        return self

    def __exit__(self, *exc):
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)
