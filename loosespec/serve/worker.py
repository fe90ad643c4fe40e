"""The worker: :class:`Job` (one request's generation and its events) and :class:`Worker`, which runs the
generations one at a time, in arrival order, on one daemon thread (:class:`_WorkerThread`)."""

from __future__ import annotations

import asyncio
import functools
import logging
import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Optional

import torch

from loosespec.config import DecodeConfig
from loosespec.errors import LoosespecError
from loosespec.serve.metrics import Metrics
from loosespec.serve.protocol import STALL_TIMEOUT_S, ApiError

log = logging.getLogger(__name__)


@dataclass
class Job:
    prompt_ids: torch.Tensor
    cfg: DecodeConfig
    endpoint: str
    loop: asyncio.AbstractEventLoop
    events: asyncio.Queue = field(default_factory=asyncio.Queue)
    cancel: threading.Event = field(default_factory=threading.Event)
    arrived: float = field(default_factory=time.perf_counter)
    stream: bool = False  # the client wants each round's text (else only the result)
    started: float = 0.0
    checked: float = field(default_factory=time.perf_counter)  # last look for a disconnected client
    done: bool = False  # the worker has sent its last event (or never will)

    aborted: bool = False  # answered by the server (shutdown), not by the worker: its later events are dropped

    def emit(self, kind: str, payload: Any = None) -> None:
        """Hand an event to the event loop (called from the worker thread)."""
        try:
            self.loop.call_soon_threadsafe(self._put, kind, payload)
        except RuntimeError:  # the loop is closed: the server is shutting down
            pass

    def _put(self, kind: str, payload: Any) -> None:
        if not self.aborted:
            self.events.put_nowait((kind, payload))

    def abort(self, error: "ApiError") -> None:
        """Answer the request with ``error`` now and stop its generation (called on the event loop)."""
        if not self.aborted and not self.done:
            self.events.put_nowait(("error", error))
        self.aborted = True
        self.cancel.set()


class _WorkerThread:
    """One daemon thread running the generations, one after another.

    Not a ThreadPoolExecutor: its threads are joined when the interpreter exits, so a generation that never
    returns would keep the process alive after shutdown's deadline; a daemon thread does not."""

    def __init__(self):
        self._calls: queue.SimpleQueue = queue.SimpleQueue()
        self.thread = threading.Thread(target=self._loop, name="loosespec-worker", daemon=True)
        self.thread.start()

    def _loop(self) -> None:
        while True:
            item = self._calls.get()
            if item is None:
                return
            fn, loop, future = item
            try:
                result = fn()
            except BaseException as e:  # noqa: BLE001 - handed to the awaiting coroutine
                outcome = (future.set_exception, e)
            else:
                outcome = (future.set_result, result)
            try:
                loop.call_soon_threadsafe(_settle, future, *outcome)
            except RuntimeError:  # the loop is closed
                pass

    def run(self, fn) -> asyncio.Future:
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        self._calls.put((fn, loop, future))
        return future

    def stop(self) -> None:
        self._calls.put(None)


def _settle(future: asyncio.Future, setter, value) -> None:
    if not future.done():
        setter(value)


class Worker:
    """One thread, one generation at a time, FIFO.

    Admission (:meth:`reserve`) comes before tokenization, so a flood of requests is refused (429) before it costs
    any tokenizing. ``last_progress`` (``time.monotonic()``) is when the worker last did something: a round's tokens,
    a generation starting or ending (idle since then); ``/health`` reports it and answers 503 when a generation has
    made no progress for ``stall_timeout_s``. :meth:`begin_shutdown` stops admission and gives the running and
    waiting requests a deadline, after which they are answered 503."""

    def __init__(self, engine, metrics: Metrics, max_queue: int, stall_timeout_s: float = STALL_TIMEOUT_S):
        self.engine = engine
        self.metrics = metrics
        self.max_queue = max_queue
        self.stall_timeout_s = stall_timeout_s
        self.queue: Optional[asyncio.Queue] = None
        self.thread: Optional[_WorkerThread] = None
        self.task: Optional[asyncio.Task] = None
        self.current: Optional[Job] = None
        self.reserved = 0  # admitted requests being tokenized (each holds a place in the queue)
        self.last_progress = time.monotonic()
        self.closing = False  # shutting down: no new requests
        self._deadline: Optional[asyncio.TimerHandle] = None

    async def start(self) -> None:
        self.queue = asyncio.Queue()
        self.thread = _WorkerThread()
        self.task = asyncio.create_task(self._dispatch())
        self.last_progress = time.monotonic()

    async def stop(self) -> None:
        self.abort_all("the server stopped")
        if self._deadline is not None:
            self._deadline.cancel()
        if self.task is not None:
            self.task.cancel()
            try:
                await self.task
            except (asyncio.CancelledError, Exception):
                pass
        if self.thread is not None:
            self.thread.stop()

    def begin_shutdown(self, timeout_s: float) -> None:
        """Refuse new requests (503); the running and waiting ones may finish within ``timeout_s`` seconds, then
        they are answered 503 and the running generation stops (called on the event loop)."""
        if self.closing:
            return
        self.closing = True
        busy = self.current is not None or self.waiting() > 0
        if busy:
            log.warning(
                "shutting down: %d request(s) running or waiting get %g s to finish (--shutdown-timeout)",
                self.waiting() + (self.current is not None),
                timeout_s,
            )
        self._deadline = asyncio.get_running_loop().call_later(
            max(0.0, timeout_s),
            self.abort_all,
            f"the server is shutting down and its --shutdown-timeout "
            f"({timeout_s:g} s) passed before this request finished; retry",
        )

    def abort_all(self, reason: str) -> None:
        """Answer every waiting and running request with 503 ``reason`` (called on the event loop)."""
        error = ApiError(503, reason, "server_error", None, "server_shutting_down")
        queued = []
        while self.queue is not None and not self.queue.empty():
            queued.append(self.queue.get_nowait())
        for job in queued + ([self.current] if self.current is not None else []):
            if not job.done and not job.cancel.is_set():
                self.metrics.failed.inc()
            job.abort(error)
        for job in queued:  # _dispatch drops them (cancelled)
            self.queue.put_nowait(job)

    def waiting(self) -> int:
        return self.queue.qsize() if self.queue is not None else 0

    def _refuse_if_full(self) -> None:
        if self.closing:
            raise ApiError(503, "the server is shutting down; retry", "server_error", None, "server_shutting_down")
        if self.waiting() + self.reserved >= self.max_queue:
            raise ApiError(
                429,
                f"server busy: {self.waiting() + self.reserved} requests already waiting "
                f"(--max-queue {self.max_queue}); retry later",
                "rate_limit_exceeded",
                None,
                "rate_limit_exceeded",
            )

    def reserve(self) -> None:
        """Admit a request: a place in the queue, held while it is tokenized (429 when none is left)."""
        self._refuse_if_full()
        self.reserved += 1

    def release(self) -> None:
        self.reserved -= 1

    def submit(self, job: Job) -> None:
        self._refuse_if_full()
        self.queue.put_nowait(job)
        self.metrics.waiting.set(self.waiting())

    def health(self) -> tuple[int, dict]:
        """(status code, body) for ``GET /health``."""
        quiet = time.monotonic() - self.last_progress
        running = self.current is not None
        if self.task is None or self.task.done():
            status = "down"  # the dispatcher died (a bug): nothing will run
        elif self.closing:
            status = "shutting_down"
        elif running and self.stall_timeout_s > 0 and quiet > self.stall_timeout_s:
            status = "stalled"
        else:
            status = "ok"
        body = {
            "status": status,
            "queue_waiting": self.waiting(),
            "running": running,
            "last_progress_s": round(quiet, 3),
            "stall_timeout_s": self.stall_timeout_s,
        }
        return (200 if status == "ok" else 503), body

    def progress(self) -> None:
        self.last_progress = time.monotonic()

    async def _dispatch(self) -> None:
        while True:
            job = await self.queue.get()
            self.metrics.waiting.set(self.waiting())
            if job.cancel.is_set():  # the client left while waiting, or the server answered it (shutdown)
                if not job.aborted:
                    self.metrics.cancelled.inc()
                job.done = True
                continue
            self.current = job
            self.progress()
            self.metrics.running.set(1)
            try:
                await self.thread.run(functools.partial(self._run, job))
            except asyncio.CancelledError:
                raise
            except Exception:  # _run catches everything; this is a last line of defence
                log.exception("worker failed")
            finally:
                self.current = None
                self.progress()
                self.metrics.running.set(0)

    def _run(self, job: Job) -> None:
        """Run one generation in the worker thread, emitting ("chunk", Chunk) events, then one of
        ("done", GenerationResult), ("cancelled", None), ("error", ApiError)."""
        m = self.metrics
        job.started = time.perf_counter()
        m.queue_time.observe(job.started - job.arrived)
        gen, first = None, True
        try:
            with torch.inference_mode():
                gen = self.engine.stream(job.prompt_ids, job.cfg)
                it = iter(gen)
                try:
                    for chunk in it:
                        if first:
                            m.ttft.observe(time.perf_counter() - job.arrived)
                            first = False
                        self.progress()
                        if job.cancel.is_set():
                            break
                        if job.stream:
                            job.emit("chunk", chunk)
                finally:
                    it.close()  # runs the generation's own finally (stats)
            m.record(job, gen.stats)
            if job.cancel.is_set():
                if not job.aborted:  # an aborted job (shutdown) was answered and counted as failed already
                    m.cancelled.inc()
                job.emit("cancelled")
                return
            result = gen.result()
            m.finished.labels(job.cfg.method, result.finish_reason).inc()
            m.latency.labels(job.endpoint).observe(time.perf_counter() - job.arrived)
            job.emit("done", result)
        except LoosespecError as e:
            m.failed.inc()
            job.emit("error", ApiError(400, str(e)))
        except Exception as e:  # a bug or a device error: answer it, keep the worker alive
            log.exception("generation failed")
            m.failed.inc()
            job.emit("error", ApiError(500, f"generation failed: {type(e).__name__}: {e}", "server_error"))
        finally:
            job.done = True
