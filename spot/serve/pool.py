"""Engines, one request each, behind a bounded queue: `submit` refuses a job when every engine is busy and
`queue_size` jobs already wait (the server answers 429); each engine's thread decodes one job at a time and posts
its events to the asyncio loop that waits for them: ("started", None), ("block", ids) per finished block,
then ("done", Generation) or ("error", exception). A cancelled job leaves the queue at once, or ends after the block
it is decoding (run_decoder's on_block returning True)."""
from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import deque
from typing import Callable

from spot.errors import SpotError
from spot.serve.jobs import Job

log = logging.getLogger("spot.serve")


class QueueFull(Exception):
    """Every engine is busy and the queue is full."""


class PoolClosed(Exception):
    """The pool is shutting down: it takes no new job."""


class Ticket:
    """One submitted job: its events (an asyncio queue filled from the engine's thread), its cancellation flag, and
    when it was submitted, started and finished (time.perf_counter)."""

    def __init__(self, job: Job, loop: asyncio.AbstractEventLoop):
        self.job, self.loop = job, loop
        self.events: asyncio.Queue = asyncio.Queue()
        self.cancelled = threading.Event()
        self.submitted = time.perf_counter()
        self.started: float | None = None
        self.finished: float | None = None

    def post(self, kind: str, value=None) -> None:
        """Hand an event to the waiting coroutine (called from the engine's thread)."""
        try:
            self.loop.call_soon_threadsafe(self.events.put_nowait, (kind, value))
        except RuntimeError:        # the loop has closed: nobody waits any more
            pass


class EnginePool:
    """slots: (engine, drafter or None) pairs, one per concurrent request (a job carries the drafter it was
    checked with: spot.serve.jobs.Job). on_done(ticket, generation): called on the
    engine's thread after each decode that ran (cancelled ones too), for metrics."""

    def __init__(self, slots: list[tuple], queue_size: int, on_done: Callable | None = None):
        if not slots:
            raise SpotError("a pool needs at least one engine", "e.g. --engines 1")
        if queue_size < 0:
            raise SpotError(f"the queue size must be >= 0, got {queue_size}", "e.g. --queue-size 16")
        self.slots, self.queue_size, self.on_done = list(slots), queue_size, on_done
        self._waiting: deque[Ticket] = deque()
        self._busy = 0
        self._closing = False
        self._cv = threading.Condition()
        self._threads: list[threading.Thread] = []

    @property
    def engines(self) -> int:
        return len(self.slots)

    @property
    def free_engines(self) -> int:
        return self.engines - self._busy

    @property
    def queue_depth(self) -> int:
        """Jobs waiting for an engine."""
        return len(self._waiting)

    @property
    def accepting(self) -> bool:
        """Whether a job submitted now would be taken (not closing, an engine free or room in the queue)."""
        return not self._closing and len(self._waiting) + self._busy < self.engines + self.queue_size

    def start(self) -> None:
        for i, (engine, _) in enumerate(self.slots):
            thread = threading.Thread(target=self._work, args=(engine,), name=f"spot-engine-{i}", daemon=True)
            thread.start()
            self._threads.append(thread)

    def submit(self, job: Job, loop: asyncio.AbstractEventLoop) -> Ticket:
        """Queue `job`; QueueFull when every engine is busy and queue_size jobs wait, PoolClosed while closing."""
        with self._cv:
            if self._closing:
                raise PoolClosed()
            if len(self._waiting) + self._busy >= self.engines + self.queue_size:
                raise QueueFull()
            ticket = Ticket(job, loop)
            self._waiting.append(ticket)
            self._cv.notify()
        return ticket

    def cancel(self, ticket: Ticket) -> None:
        """The job's client went away: out of the queue now, or ended after the block being decoded."""
        ticket.cancelled.set()
        with self._cv:
            try:
                self._waiting.remove(ticket)
            except ValueError:      # running or finished
                pass

    def close(self) -> None:
        """Finish the queued and running jobs, stop the threads, release the engines."""
        with self._cv:
            self._closing = True
            self._cv.notify_all()
        for thread in self._threads:
            thread.join()
        for engine, _ in self.slots:
            engine.close()

    def _work(self, engine) -> None:
        while True:
            with self._cv:
                while not self._waiting and not self._closing:
                    self._cv.wait()
                if not self._waiting:
                    return
                ticket = self._waiting.popleft()
                self._busy += 1
            last = None
            try:
                last = self._run(engine, ticket)
            finally:
                with self._cv:      # free before the request hears it is done: /ready never lags its answer
                    self._busy -= 1
                if last is not None:
                    ticket.post(*last)

    def _run(self, engine, ticket: Ticket) -> tuple | None:
        """Decode the ticket's job; its last event: ("done", generation) or ("error", exception), None when it was
        cancelled before it began."""
        job = ticket.job
        if ticket.cancelled.is_set():       # cancelled between the queue and here
            return None
        ticket.started = time.perf_counter()
        ticket.post("started")

        def on_block(ids: list[int]) -> bool:
            ticket.post("block", ids)
            return ticket.cancelled.is_set()
        try:
            gen = job.run(engine, on_block)
        except SpotError as e:      # a request the checks before the queue could not see (e.g. a missing drafter)
            return "error", e
        except Exception as e:      # noqa: BLE001 - the engine's failure goes to its request, the server stays up
            log.exception("decoding failed")
            return "error", e
        finally:
            ticket.finished = time.perf_counter()
        if self.on_done is not None:
            try:
                self.on_done(ticket, gen)
            except Exception:       # noqa: BLE001 - a metrics failure must not take the engine's thread down
                log.exception("recording a decode's metrics failed")
        return "done", gen
