"""The generation worker: one generation at a time, in arrival order, off the event loop.

MLX work runs on one worker thread; the HTTP side submits a `Job` and reads its messages
(`Text` pieces, then `Done` or `Failed`) from an asyncio queue that the worker fills through
the event loop. The worker keeps ONE generation `Session` (the target's sequence, the drafter,
a policy per sampler) alive across requests, so a prompt that extends the previous one (a
chat's next turn) prefills only what is new, as `ChatSession` does, and a request with another
temperature keeps the same drafter and its cache. A job cancelled while it waits is dropped;
one cancelled while it runs stops at its next step, and the closed generator leaves the caches
consistent.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Literal

from specmlx.api.config import GenerationConfig
from specmlx.api.models import Models
from specmlx.api.session import Session
from specmlx.engine.cache import Sequence
from specmlx.engine.stats import Stats
from specmlx.server.stops import StopText

logger = logging.getLogger("specmlx.server")


@dataclass(frozen=True)
class Text:
    text: str


@dataclass(frozen=True)
class Done:
    finish: str  # "stop", "length", or "cancelled" (nobody reads that one)
    stats: Stats


@dataclass(frozen=True)
class Failed:
    message: str
    status: int = 500


Message = Text | Done | Failed


@dataclass(frozen=True)
class Record:
    """One line of the request log."""

    request_id: str
    prompt_tokens: int
    completion_tokens: int
    tokens_per_sec: float
    acceptance_rate: float | None  # None: nothing was drafted
    finish: str
    seconds: float  # from submission to the end: queueing included


class QueueFull(Exception):
    """More requests wait than --max-queue allows."""


State = Literal["waiting", "running", "done"]


class Job:
    """One request's generation, as the worker and the HTTP handler both see it."""

    def __init__(
        self,
        request_id: str,
        prompt_ids: list[int],
        config: GenerationConfig,
        stops: tuple[str, ...],
    ):
        self.request_id = request_id
        self.prompt_ids = prompt_ids
        self.config = config
        self.stops = stops
        self.state: State = "waiting"  # guarded by the engine's lock
        self.cancelled = threading.Event()
        self.submitted = time.perf_counter()
        self._loop = asyncio.get_running_loop()
        self._messages: asyncio.Queue[Message] = asyncio.Queue()

    def send(self, message: Message) -> None:
        """From the worker thread: hand a message to the request's event loop."""
        try:
            self._loop.call_soon_threadsafe(self._messages.put_nowait, message)
        except RuntimeError:  # the loop is closed: nobody is listening any more
            self.cancelled.set()

    async def messages(self) -> AsyncIterator[Message]:
        """Text pieces, then one Done or Failed."""
        while True:
            message = await self._messages.get()
            yield message
            if not isinstance(message, Text):
                return


class Engine:
    """Runs jobs one at a time on a worker thread; at most `max_queue` wait behind it."""

    def __init__(
        self,
        models: Models,
        config: GenerationConfig,
        max_queue: int = 16,
        log: Callable[[Record], None] | None = None,
    ):
        self.models = models
        self.config = config  # method, options and k; each request brings its sampling
        self.session = Session(models, config)
        self.method = self.session.method.name
        self.k: int | str | None = None
        if self.method != "none":
            self.k = "auto" if config.k is None else config.k
        self.max_queue = max_queue
        self.log = log
        self._jobs: queue.Queue[Job | None] = queue.Queue()
        self._lock = threading.Lock()
        self._live: set[Job] = set()
        self._thread: threading.Thread | None = None

    @property
    def waiting(self) -> int:
        with self._lock:
            return sum(job.state == "waiting" for job in self._live)

    @property
    def busy(self) -> bool:
        with self._lock:
            return any(job.state == "running" for job in self._live)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._work, name="specmlx-engine", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        """Cancel every job (a running one stops at its next step) and end the worker."""
        with self._lock:
            live = list(self._live)
        for job in live:
            job.cancelled.set()
            job.send(Failed("the server is shutting down", status=503))
        self._jobs.put(None)
        if self._thread is not None:
            self._thread.join(timeout)

    def submit(
        self,
        request_id: str,
        prompt_ids: list[int],
        config: GenerationConfig,
        stops: tuple[str, ...] = (),
    ) -> Job:
        """Queue a generation (from the event loop); QueueFull when too many wait."""
        job = Job(request_id, prompt_ids, config, stops)
        with self._lock:
            # Live jobs: the one running (if any) and those waiting behind it.
            if len(self._live) > self.max_queue:
                raise QueueFull
            self._live.add(job)
        self._jobs.put(job)
        return job

    def cancel(self, job: Job) -> None:
        """The client is gone: drop the job if it waits, stop it if it runs."""
        job.cancelled.set()
        with self._lock:
            if job.state == "waiting":
                job.state = "done"  # the worker skips it; its queue slot is free now
                self._live.discard(job)

    def _work(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            with self._lock:
                if job.state != "waiting":
                    continue
                job.state = "running"
            try:
                self._run(job)
            finally:
                with self._lock:
                    job.state = "done"
                    self._live.discard(job)

    @property
    def target(self) -> Sequence:
        """The target's sequence, which holds the last request's tokens."""
        return self.session.target

    def _run(self, job: Job) -> None:
        stats = Stats(prompt_tokens=len(job.prompt_ids))
        stop_text = StopText(job.stops)
        finish: str | None = None
        try:
            events = self.session.stream(job.prompt_ids, job.config)
            try:
                for event in events:
                    stats = event.stats
                    if job.cancelled.is_set():
                        break
                    text = stop_text.feed(event.text)
                    if stop_text.stopped:
                        finish = "stop"
                    elif event.step.finish is not None:
                        finish = event.step.finish
                        text += stop_text.flush()
                    if text:
                        job.send(Text(text))
                    if finish is not None:
                        break
            finally:
                events.close()  # decode restores the caches in its own finally
        except Exception as exc:
            logger.exception("request %s failed", job.request_id)
            # Whatever state the failure left behind goes; the next request starts clean.
            self.session.reset()
            job.send(Failed(f"internal error: {type(exc).__name__}: {exc}"))
            self._record(job, stats, "error")
            return
        finish = finish or "cancelled"
        job.send(Done(finish, stats))
        self._record(job, stats, finish)

    def _record(self, job: Job, stats: Stats, finish: str) -> None:
        if self.log is None:
            return
        record = Record(
            job.request_id,
            stats.prompt_tokens,
            stats.tokens,
            stats.tokens_per_sec,
            stats.acceptance_rate if stats.drafted else None,
            finish,
            time.perf_counter() - job.submitted,
        )
        try:
            self.log(record)
        except Exception:  # a broken log never takes a request down
            logger.exception("could not log request %s", job.request_id)
