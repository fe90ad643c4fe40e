"""OpenAI-compatible HTTP server: ``loosespec serve``.

Endpoints: ``GET /v1/models``, ``POST /v1/completions``, ``POST /v1/chat/completions`` (OpenAI
request and response shapes, ``stream: true`` as server-sent events ending with ``data: [DONE]``),
``GET /health`` and ``GET /metrics`` (Prometheus text).

How it runs: the engine is not thread-safe, so one worker thread runs one generation at a time,
in arrival order. Requests are validated, admitted and tokenized on arrival (a bad request is
answered 400 without waiting; admission comes before tokenizing, so a full queue answers 429
without tokenizing anything), then wait in a FIFO queue; ``max_queue`` bounds the number waiting
behind the running one (more -> 429). The worker hands each round's text to the event loop; a
client that disconnects sets its job's cancel flag and the worker stops that generation after the
current round, freeing the model for the next request. ``/health`` reports the worker's last
progress and answers 503 when a generation stalls (``stall_timeout_s``); shutdown gives the
running and waiting requests ``shutdown_timeout_s``, then answers them 503 (:func:`make_server`).

Choices (see README "Server"):

- unknown request fields are ignored (as vLLM does), except names in loosespec's own namespaces
  (``fly_*``, ``sg_*``), where a typo would silently change nothing: those get 400. OpenAI fields
  that loosespec cannot honour (``n`` > 1, ``logprobs``, ``tools``, penalties, ...) get 400 too.
- ``model`` may be omitted; when given it must be the served name or the target spec, else 404
  ``model_not_found``.
- ``--api-key`` guards ``/v1/*``; ``/health`` and ``/metrics`` stay open (as in vLLM).
- every request's ``Host`` (on a non-wildcard bind) and ``Origin`` are checked (:class:`_Access`, a guard against
  DNS rebinding); ``--allow-origin`` adds origins and host names, ``*`` any. The API key does not relax this: it
  guards ``/v1/*`` only, and a browser page allowed by origin needs CORS anyway.
- a temperature below ``SAMPLING_EPS`` (1e-5) is greedy, as in vLLM.
"""

from __future__ import annotations

import asyncio
import copy
import functools
import json
import logging
import queue
import secrets
import threading
import time
import typing
import urllib.parse
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, Literal, Optional, Union

import torch
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from pydantic import BaseModel, ConfigDict, Field, create_model
from starlette.exceptions import HTTPException as StarletteHTTPException

from loosespec import __version__
from loosespec.config import KNOBS, ConfigError, DecodeConfig, knob_help, knob_info, knob_type
from loosespec.errors import LoosespecError
from loosespec.methods import ALL_COUNTERS, METHODS
from loosespec.decode.text import encode_prompt

log = logging.getLogger("loosespec.serve.app")

MAX_BODY_BYTES = 8 * 1024 * 1024  # a request body larger than this gets 413
MAX_STOP_STRINGS = 16  # stop strings per request (OpenAI allows 4, vLLM any number)
MAX_STOP_CHARS = 256  # characters per stop string (each round matches every stop string against the text's tail)
DISCONNECT_CHECK_S = 0.5  # how often a waiting handler looks for a disconnected client
# a temperature (> 0) below this samples as greedy, as vLLM's _SAMPLING_EPS: dividing the logits by a temperature
# near 1e-38 overflows float32 (inf - inf = NaN in the softmax), and below 1e-5 sampling is greedy in all but name
SAMPLING_EPS = 1e-5
STALL_TIMEOUT_S = 300.0  # /health answers 503 when a generation made no progress for this long (0: never)
SHUTDOWN_TIMEOUT_S = 20.0  # on shutdown, requests still running or waiting after this long get 503


# ---------------------------------------------------------------------------------------------
# Settings and errors
# ---------------------------------------------------------------------------------------------


@dataclass
class ServerSettings:
    """What ``loosespec serve`` was started with; ``defaults`` are DecodeConfig fields requests may override."""

    served_model_name: str
    aliases: tuple[str, ...] = ()
    defaults: dict = field(default_factory=dict)  # method, drafter, num_draft_tokens, temperature, fly_*, sg_*, ...
    api_key: Optional[str] = None
    max_queue: int = 64
    max_tokens_default: int = 256
    max_body_bytes: int = MAX_BODY_BYTES
    host: str = "127.0.0.1"  # the address bound (--host): requests must be addressed to it (Host header)
    allow_origins: tuple[str, ...] = ()  # --allow-origin: more origins / host names accepted; "*": any
    stall_timeout_s: float = STALL_TIMEOUT_S
    shutdown_timeout_s: float = SHUTDOWN_TIMEOUT_S


class ApiError(Exception):
    """An OpenAI-style error response."""

    def __init__(self, status: int, message: str, type_: str = "invalid_request_error",
                 param: Optional[str] = None, code: Optional[str] = None):
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type_, param, code

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def response(self, headers: Optional[dict] = None) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status, headers=headers)


_STATUS_TYPES = {401: ("authentication_error", "invalid_api_key"), 403: ("invalid_request_error", "forbidden"),
                 404: ("invalid_request_error", "not_found"),
                 405: ("invalid_request_error", "method_not_allowed"),
                 413: ("invalid_request_error", "request_too_large"), 429: ("rate_limit_exceeded", "rate_limit_exceeded")}


def _http_error(status: int, message: str) -> ApiError:
    type_, code = _STATUS_TYPES.get(status, ("invalid_request_error" if status < 500 else "server_error", None))
    return ApiError(status, message, type_, None, code)


# ---------------------------------------------------------------------------------------------
# Request models (OpenAI fields + loosespec's extra fields, sent by clients as extra_body)
# ---------------------------------------------------------------------------------------------

_NAMESPACES = ("fly_", "sg_")


class _Base(BaseModel):
    # strict: "5" is not an int, "true" not a bool; NaN / Infinity are refused; unknown fields are kept
    # (model_extra) so that typos in loosespec's namespaces can be refused and the rest ignored
    model_config = ConfigDict(extra="allow", strict=True, allow_inf_nan=False)


def _request_field(name: str):
    """A knob as an optional request field: the declaration's type, bounds and choices (loosespec.config)."""
    k = knob_info(name)
    kind = knob_type(name)
    if k.choices is not None:
        kind = Literal[k.choices]
    elif typing.get_origin(kind) is Union:  # Optional[X] -> X; None is "not sent"
        kind = next(a for a in typing.get_args(kind) if a is not type(None))
    if name == "drafter":  # "none": the method's default drafter, as vLLM clients may send it
        kind = Literal[k.choices + ("none",)]
    return (Optional[kind], Field(None, description=knob_help(name), **k.bounds))


# loosespec's per-request method selection: every knob declared as a request field in loosespec.config, with the
# CLI's names (--fly-window-size -> fly_window_size), derived from that one declaration
SpecFields = create_model("SpecFields", __base__=_Base,
                          **{name: _request_field(name) for name in KNOBS if knob_info(name).request})


class StreamOptions(_Base):
    include_usage: bool = False


class CommonFields(SpecFields):
    model: Optional[str] = None
    max_tokens: Optional[int] = None  # range checked against the context, with a clear message
    stop: Optional[Union[str, list[str]]] = None
    stream: Optional[bool] = False
    stream_options: Optional[StreamOptions] = None
    n: Optional[int] = None
    user: Optional[str] = None
    # OpenAI fields accepted only at their no-op values
    logprobs: Optional[Union[bool, int]] = None
    top_logprobs: Optional[int] = None
    presence_penalty: Optional[float] = None
    frequency_penalty: Optional[float] = None
    logit_bias: Optional[dict[str, float]] = None
    best_of: Optional[int] = None
    echo: Optional[bool] = None
    suffix: Optional[str] = None
    tools: Optional[list] = None
    tool_choice: Optional[Any] = None
    response_format: Optional[dict] = None


class TextPart(_Base):
    type: str
    text: Optional[str] = None


class ChatMessage(_Base):
    role: Literal["system", "developer", "user", "assistant"]
    content: Union[str, list[TextPart], None] = None
    name: Optional[str] = None


class ChatCompletionRequest(CommonFields):
    messages: list[ChatMessage] = Field(..., min_length=1)
    max_completion_tokens: Optional[int] = None


class CompletionRequest(CommonFields):
    prompt: Union[str, list[str], list[int]]


# ---------------------------------------------------------------------------------------------
# Metrics
# ---------------------------------------------------------------------------------------------

_LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 30, 60, 120, 300, 600)


class Metrics:
    """Prometheus metrics in the app's own registry (not the process-global one).

    Names follow vLLM's (``vllm:prompt_tokens``, ``vllm:spec_decode_num_drafts``, ...) under a
    ``loosespec:`` prefix, with vLLM's definitions: the speculative-decoding counters are counts
    (drafts, draft tokens, accepted tokens, accepted tokens per draft position), and rates are
    derived from them as vLLM derives them (acceptance rate = accepted / draft tokens, mean
    acceptance length = 1 + accepted / drafts). Metrics vLLM has no name for keep loosespec's own.
    """

    def __init__(self):
        r = self.registry = CollectorRegistry()
        m = ("method",)
        p = "loosespec:"
        self.requests = Counter(p + "http_requests", "HTTP requests to /v1/* by endpoint and status code",
                                ("endpoint", "status"), registry=r)
        self.finished = Counter(p + "request_success", "Generations run to the end, by method and finish reason "
                                "(vLLM's vllm:request_success)", ("method", "finished_reason"), registry=r)
        self.cancelled = Counter(p + "requests_cancelled", "Generations stopped (or dropped from the queue) "
                                 "because the client disconnected", registry=r)
        self.failed = Counter(p + "requests_failed", "Generations that ended with an error", registry=r)
        self.waiting = Gauge(p + "num_requests_waiting", "Requests waiting for the worker", registry=r)
        self.running = Gauge(p + "num_requests_running", "Generations running (0 or 1)", registry=r)
        self.prompt_tokens = Counter(p + "prompt_tokens", "Prompt tokens processed", m, registry=r)
        self.generation_tokens = Counter(p + "generation_tokens", "Tokens generated", m, registry=r)
        self.num_drafts = Counter(p + "spec_decode_num_drafts", "Rounds that drafted at least one token (an "
                                  "accepted SpecGuard step counts as one)", m, registry=r)
        self.num_draft_tokens = Counter(p + "spec_decode_num_draft_tokens", "Draft tokens proposed", m, registry=r)
        self.num_accepted_tokens = Counter(p + "spec_decode_num_accepted_tokens", "Draft tokens accepted", m,
                                           registry=r)
        self.accepted_per_pos = Counter(p + "spec_decode_num_accepted_tokens_per_pos", "Draft tokens accepted at "
                                        "each draft position (0-based)", ("method", "position"), registry=r)
        # each rule counter a method of the registry reports (loosespec.methods), by method
        self.rule_counters = {name: Counter(p + name, f"{name} summed over rounds (the rule's own counter; see "
                                            "loosespec.decode.stats)", m, registry=r) for name in ALL_COUNTERS}
        self.sg_steps = Counter(p + "specguard_steps", "SpecGuard (lossy): steps scored", registry=r)
        self.sg_accepted = Counter(p + "specguard_accepted_steps", "SpecGuard (lossy): draft steps accepted",
                                   registry=r)
        self.latency = Histogram(p + "e2e_request_latency_seconds", "Arrival to last token", ("endpoint",),
                                 buckets=_LATENCY_BUCKETS, registry=r)
        self.queue_time = Histogram(p + "request_queue_time_seconds", "Arrival to start of generation",
                                    buckets=_LATENCY_BUCKETS, registry=r)
        self.ttft = Histogram(p + "time_to_first_token_seconds", "Arrival to first committed token",
                              buckets=_LATENCY_BUCKETS, registry=r)
        self.generation_time = Histogram(p + "request_inference_time_seconds", "Generation wall time (prefill + "
                                         "decode)", m, buckets=_LATENCY_BUCKETS, registry=r)

    def record(self, job: "Job", stats) -> None:
        """Token-level counters of one generation, finished or not (called from the worker)."""
        s, method = stats, job.cfg.method
        self.prompt_tokens.labels(method).inc(s.prompt_tokens)
        self.generation_tokens.labels(method).inc(s.new_tokens)
        self.num_drafts.labels(method).inc(s.drafts)
        self.num_draft_tokens.labels(method).inc(s.drafted_tokens)
        self.num_accepted_tokens.labels(method).inc(s.accepted_tokens)
        for pos, count in enumerate(s.accepted_at):
            self.accepted_per_pos.labels(method, str(pos)).inc(count)
        for name in METHODS[method].counters:
            self.rule_counters[name].labels(method).inc(s.events.get(name, 0))
        if s.steps:
            self.sg_steps.inc(len(s.steps))
            self.sg_accepted.inc(sum(1 for r in s.steps if r["accepted"]))
        self.generation_time.labels(method).observe(s.wall_s)


def speculative_metrics(result_stats, cfg: DecodeConfig) -> dict:
    """Per-response ``metrics.speculative_decoding``: vLLM's counter names and definitions, plus loosespec's.

    Counts as vLLM counts them: ``num_drafts`` (rounds that drafted; an accepted SpecGuard step is one),
    ``num_draft_tokens``, ``num_accepted_tokens``, ``num_accepted_tokens_per_pos``; rates derived as vLLM
    derives them: ``draft_acceptance_rate`` = accepted / draft tokens, ``mean_acceptance_length`` =
    1 + accepted / drafts (1 when nothing was drafted), ``per_position_acceptance_rate[i]`` = accepted
    at position i / drafts. ``num_rounds`` is loosespec's: target verification rounds (drafting or not)
    plus accepted SpecGuard steps; ``completion_tokens / num_rounds`` is Spec-Bench's mean accepted length.
    """
    s = result_stats
    drafts = s.drafts
    spec = {
        "method": cfg.method, "drafter": cfg.drafter, "lossy": cfg.lossy,
        "num_drafts": drafts,
        "num_draft_tokens": s.drafted_tokens,
        "num_accepted_tokens": s.accepted_tokens,
        "num_accepted_tokens_per_pos": list(s.accepted_at),
        "draft_acceptance_rate": round(s.acceptance_rate, 4),
        "mean_acceptance_length": round(1 + s.accepted_tokens / drafts, 4) if drafts else 1.0,
        "per_position_acceptance_rate": [round(a / drafts, 4) for a in s.accepted_at] if drafts else [],
        "num_rounds": s.rounds,
        "target_forwards": s.target_forwards,
        "draft_forwards": s.draft_forwards,
    }
    d = s.to_dict()
    for k in (*ALL_COUNTERS, "steps", "accepted_steps", "target_steps", "candidates_drafted", "step_accept_rate",
              "mean_grounding", "mean_confidence", "mean_score"):  # the rules' counters (FLy's), SpecGuard's steps
        if k in d:
            spec[k if k.startswith("fly_") else f"sg_{k}"] = d[k]
    return spec


# ---------------------------------------------------------------------------------------------
# Jobs and the worker
# ---------------------------------------------------------------------------------------------


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
            log.warning("shutting down: %d request(s) running or waiting get %g s to finish (--shutdown-timeout)",
                        self.waiting() + (self.current is not None), timeout_s)
        self._deadline = asyncio.get_running_loop().call_later(
            max(0.0, timeout_s), self.abort_all, f"the server is shutting down and its --shutdown-timeout "
            f"({timeout_s:g} s) passed before this request finished; retry")

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
            raise ApiError(429, f"server busy: {self.waiting() + self.reserved} requests already waiting "
                           f"(--max-queue {self.max_queue}); retry later", "rate_limit_exceeded", None,
                           "rate_limit_exceeded")

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
        body = {"status": status, "queue_waiting": self.waiting(), "running": running,
                "last_progress_s": round(quiet, 3), "stall_timeout_s": self.stall_timeout_s}
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


# ---------------------------------------------------------------------------------------------
# Request -> (prompt ids, config)
# ---------------------------------------------------------------------------------------------

_SPEC_FIELDS = tuple(SpecFields.model_fields)
_UNSUPPORTED = {  # OpenAI field -> its accepted no-op values
    "n": (None, 1), "logprobs": (None, False, 0), "top_logprobs": (None, 0), "presence_penalty": (None, 0),
    "frequency_penalty": (None, 0), "best_of": (None, 1), "echo": (None, False), "suffix": (None, ""),
    "tools": (None,), "tool_choice": (None, "none", "auto"), "logit_bias": (None,),
}


def context_length(engine) -> int:
    cfg = engine.target.model.config
    for name in ("max_position_embeddings", "n_positions", "max_sequence_length"):
        v = getattr(cfg, name, None)
        if isinstance(v, int) and v > 0:
            return v
    return 2048


class Frontend:
    """Validation, tokenization and response building; owns nothing the worker touches."""

    def __init__(self, engine, settings: ServerSettings):
        self.engine = engine
        self.settings = settings
        self.names = {settings.served_model_name, *settings.aliases}
        self.context = context_length(engine)
        self.vocab_size = int(getattr(engine.target.model.config, "vocab_size", 0) or len(engine.tokenizer))
        # the engine's tokenizer belongs to the worker (Rust tokenizers are not safe to share between
        # threads); requests are tokenized with a copy, one at a time, off the event loop
        self.tokenizer = copy.deepcopy(engine.tokenizer)
        self.tokenizer_lock = threading.Lock()

    # -- checks ---------------------------------------------------------------------------------

    def check_common(self, req: CommonFields) -> None:
        if req.model is not None and req.model not in self.names:
            raise ApiError(404, f"The model '{req.model}' does not exist; this server serves "
                           f"'{self.settings.served_model_name}' (GET /v1/models)", "invalid_request_error",
                           "model", "model_not_found")
        for name, ok in _UNSUPPORTED.items():
            value = getattr(req, name)
            if value in ok or (name == "logit_bias" and not value) or (name == "tools" and not value):
                continue
            raise ApiError(400, f"'{name}' is not supported by loosespec (got {value!r})", param=name,
                           code="unsupported_parameter")
        if req.response_format is not None and req.response_format.get("type", "text") != "text":
            raise ApiError(400, "only response_format {'type': 'text'} is supported", param="response_format",
                           code="unsupported_parameter")
        if req.stream_options is not None and not req.stream:
            raise ApiError(400, "stream_options is only allowed when stream is true", param="stream_options")
        typos = [k for k in (req.model_extra or {}) if k.startswith(_NAMESPACES)]
        if typos:
            raise ApiError(400, f"unknown parameter '{typos[0]}'; loosespec's parameters are: "
                           f"{', '.join(_SPEC_FIELDS)}", param=typos[0], code="unknown_parameter")
        if req.stop is not None:
            stop = [req.stop] if isinstance(req.stop, str) else req.stop
            if len(stop) > MAX_STOP_STRINGS:
                raise ApiError(400, f"at most {MAX_STOP_STRINGS} stop strings, got {len(stop)}", param="stop")
            for s in stop:
                if not s:
                    raise ApiError(400, "stop strings must be non-empty", param="stop")
                if len(s) > MAX_STOP_CHARS:
                    raise ApiError(400, f"a stop string may have at most {MAX_STOP_CHARS} characters, got one of "
                                   f"{len(s)}", param="stop")
        if req.fly_entropy_top_k is not None and req.fly_entropy_top_k > self.vocab_size:
            raise ApiError(400, f"fly_entropy_top_k must be <= the vocabulary size {self.vocab_size}",
                           param="fly_entropy_top_k")
        if req.model_extra:
            log.debug("ignoring unknown request fields: %s", ", ".join(req.model_extra))

    def decode_config(self, req: CommonFields, max_new_tokens: int) -> DecodeConfig:
        d = self.settings.defaults
        method = req.method if req.method is not None else d.get("method", "exact")
        kw: dict = {}
        # server defaults, then the request's fields; the server's drafter and K only go with its method
        same_method = method == d.get("method", "exact")
        for k, v in d.items():
            if k in ("method",) or (k in ("drafter", "num_draft_tokens") and not same_method):
                continue
            kw[k] = v
        for k in _SPEC_FIELDS:
            v = getattr(req, k)
            if v is not None:
                kw[k] = v
        kw.pop("method", None)
        if kw.get("drafter") == "none":
            kw["drafter"] = None
        if kw.get("top_k") == -1:  # vLLM's "disabled"
            kw["top_k"] = 0
        if req.stop is not None:  # count and length checked by check_common
            kw["stop"] = [req.stop] if isinstance(req.stop, str) else list(req.stop)
        temperature = kw.get("temperature")
        if temperature is not None and temperature < SAMPLING_EPS:  # 1e-40 is greedy (as in vLLM), not a NaN
            kw["temperature"] = 0.0
        sg_temperature = kw.get("sg_temperature")
        if sg_temperature is not None and sg_temperature < SAMPLING_EPS:
            raise ApiError(400, f"sg_temperature must be >= {SAMPLING_EPS:g} (the first SpecGuard candidate is "
                           f"already the greedy one), got {sg_temperature!r}", param="sg_temperature")
        has_draft = self.engine.draft is not None
        try:
            cfg = DecodeConfig.create(method, kw.pop("drafter", None), kw.pop("num_draft_tokens", None),
                                      has_draft_model=has_draft, max_new_tokens=max_new_tokens, **kw)
        except ConfigError as e:  # names the field: the request's own name for it
            raise ApiError(400, e.render("field"), param=e.field) from None
        except TypeError as e:  # a wrong type that slipped through (should not happen)
            raise ApiError(400, f"bad parameter: {e}") from None
        if not has_draft and (cfg.drafter in ("model", "mla") or cfg.method == "specguard"):
            what = "method 'specguard'" if cfg.method == "specguard" else f"drafter '{cfg.drafter}'"
            raise ApiError(400, f"{what} needs a draft model, but this server has none (start it with "
                           "--draft); use drafter 'ngram' or method 'ar'", param="drafter" if cfg.method !=
                           "specguard" else "method")
        return cfg

    def max_new_tokens(self, requested: Optional[int], prompt_len: int, param: str, chat: bool) -> int:
        room = self.context - prompt_len
        if room < 1:
            raise ApiError(400, f"the prompt has {prompt_len} tokens; this model's context is {self.context} "
                           "tokens, leaving no room for a completion", param="messages" if chat else "prompt",
                           code="context_length_exceeded")
        if requested is None:
            return min(self.settings.max_tokens_default, room)
        if requested < 1:
            raise ApiError(400, f"{param} must be a positive integer, got {requested}", param=param)
        if requested > room:
            raise ApiError(400, f"this model's context is {self.context} tokens; the prompt has {prompt_len} "
                           f"and {param} asks for {requested} more (at most {room})", param=param,
                           code="context_length_exceeded")
        return requested

    # -- tokenization (in a thread) -------------------------------------------------------------

    def _encode(self, prompt, raw: bool) -> torch.Tensor:
        with self.tokenizer_lock:
            try:
                return encode_prompt(self.tokenizer, prompt, raw)
            except Exception as e:  # no chat template, a template raising on odd roles, ...
                first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
                raise ApiError(400, f"cannot format the prompt: {first[:300]}") from None

    def chat_prompt(self, req: ChatCompletionRequest) -> list[dict]:
        messages = []
        for i, msg in enumerate(req.messages):
            content = msg.content
            if isinstance(content, list):
                if any(p.type != "text" or p.text is None for p in content):
                    raise ApiError(400, "only text content parts are supported", param=f"messages.{i}.content")
                content = "".join(p.text for p in content)
            if content is None:
                raise ApiError(400, "a message needs content", param=f"messages.{i}.content")
            messages.append({"role": "system" if msg.role == "developer" else msg.role, "content": content})
        return messages

    async def prepare(self, req: CommonFields, chat: bool) -> tuple[torch.Tensor, DecodeConfig]:
        """Tokenize (in a thread) and build the request's config; run after :meth:`check_common` and the
        worker's admission (:meth:`Worker.reserve`), so that a refused request costs no tokenizing."""
        from starlette.concurrency import run_in_threadpool

        if chat:
            ids = await run_in_threadpool(self._encode, self.chat_prompt(req), False)
            requested, param = (req.max_completion_tokens if req.max_completion_tokens is not None
                                else req.max_tokens), ("max_completion_tokens" if req.max_completion_tokens
                                                       is not None else "max_tokens")
        else:
            prompt = req.prompt
            if isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
                if any(t < 0 or t >= self.vocab_size for t in prompt):
                    raise ApiError(400, f"token ids must lie in [0, {self.vocab_size})", param="prompt")
                ids = torch.tensor(prompt, dtype=torch.long)
            else:
                if isinstance(prompt, list):
                    if len(prompt) != 1:
                        raise ApiError(400, "one prompt per request (batched prompts are not supported)",
                                       param="prompt")
                    prompt = prompt[0]
                ids = await run_in_threadpool(self._encode, prompt, True) if prompt else torch.zeros(0)
            requested, param = req.max_tokens, "max_tokens"
        if ids.numel() == 0:
            raise ApiError(400, "the prompt is empty", param="messages" if chat else "prompt")
        cfg = self.decode_config(req, self.max_new_tokens(requested, int(ids.numel()), param, chat))
        return ids, cfg


# ---------------------------------------------------------------------------------------------
# Responses
# ---------------------------------------------------------------------------------------------


def _usage(stats) -> dict:
    return {"prompt_tokens": stats.prompt_tokens, "completion_tokens": stats.new_tokens,
            "total_tokens": stats.prompt_tokens + stats.new_tokens}


def _metrics(result, job: Job) -> dict:
    s = result.stats
    return {"lossy": job.cfg.lossy, "speculative_decoding": speculative_metrics(s, job.cfg),
            "timing": {"queue_s": round(job.started - job.arrived, 4), "ttft_s": round(s.ttft_s, 4),
                       "generation_s": round(s.wall_s, 4), "tokens_per_s": round(s.tokens_per_s, 3)}}


def _sse(obj: Any) -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False, allow_nan=False)}\n\n"


class _Shape:
    """The two endpoints' response shapes."""

    def __init__(self, chat: bool, model: str):
        self.chat = chat
        self.model = model
        self.id = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"
        self.created = int(time.time())

    def _head(self, obj: str) -> dict:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model}

    def full(self, result, job: Job) -> dict:
        if self.chat:
            choice = {"index": 0, "message": {"role": "assistant", "content": result.text}, "logprobs": None,
                      "finish_reason": result.finish_reason}
        else:
            choice = {"index": 0, "text": result.text, "logprobs": None, "finish_reason": result.finish_reason}
        return {**self._head("chat.completion" if self.chat else "text_completion"), "choices": [choice],
                "usage": _usage(result.stats), "metrics": _metrics(result, job),
                "system_fingerprint": f"loosespec-{__version__}"}

    def chunk(self, text: Optional[str], finish_reason: Optional[str] = None, role: bool = False,
              usage: Any = ...) -> dict:
        if self.chat:
            delta = {}
            if role:
                delta["role"] = "assistant"
            if text is not None:
                delta["content"] = text
            choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
        else:
            choice = {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish_reason}
        out = {**self._head("chat.completion.chunk" if self.chat else "text_completion"), "choices": [choice]}
        if usage is not ...:
            out["usage"] = usage
        return out

    def usage_chunk(self, result) -> dict:
        return {**self._head("chat.completion.chunk" if self.chat else "text_completion"), "choices": [],
                "usage": _usage(result.stats)}


async def _next_event(job: Job, request: Request) -> tuple[str, Any]:
    """The worker's next event; a client seen gone (checked every half second) cancels the job."""
    while True:
        now = time.perf_counter()
        if now - job.checked >= DISCONNECT_CHECK_S:
            job.checked = now
            if await request.is_disconnected():
                job.cancel.set()
        try:
            return await asyncio.wait_for(job.events.get(), timeout=DISCONNECT_CHECK_S)
        except asyncio.TimeoutError:
            pass


# ---------------------------------------------------------------------------------------------
# The app
# ---------------------------------------------------------------------------------------------


_LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")
_DEFAULT_PORTS = {"http": 80, "https": 443, "ws": 80, "wss": 443}


def _host_port(value: str) -> Optional[tuple[str, Optional[int]]]:
    """``name[:port]`` (a Host header, an origin's authority) as (lower-case name, port or None); None if malformed
    (``evil:80@127.0.0.1`` is malformed here: no user part)."""
    try:
        parts = urllib.parse.urlsplit("//" + value.strip())
        name, port = parts.hostname, parts.port
    except ValueError:
        return None
    if not name or parts.path or parts.query or parts.fragment or "@" in parts.netloc:
        return None
    return name.rstrip("."), port


def _origin(value: str) -> Optional[tuple[str, str, Optional[int]]]:
    """``scheme://name[:port]`` as (scheme, name, port: the scheme's default when none is written); None if
    malformed (a path, ``null``)."""
    scheme, sep, rest = value.strip().partition("://")
    if not sep or not scheme or not all(c.isalnum() or c in "+.-" for c in scheme):
        return None
    authority = _host_port(rest)
    if authority is None:
        return None
    scheme = scheme.lower()
    return scheme, authority[0], authority[1] if authority[1] is not None else _DEFAULT_PORTS.get(scheme)


def parse_allow_origins(values) -> tuple[str, ...]:
    """``--allow-origin`` values (each may list several, comma-separated): ``*``, origins
    (``http://localhost:3000``) or host names (``gpu-box.lan``, ``gpu-box.lan:8000``). Raises ValueError naming a
    value that is neither."""
    out: list[str] = []
    for value in values or ():
        for item in str(value).split(","):
            item = item.strip()
            if not item:
                continue
            if item != "*":
                shown = item[:-1] if item.endswith("/") and "://" in item else item
                if ("://" in item and _origin(shown) is None) or ("://" not in item and _host_port(item) is None):
                    raise ValueError(f"--allow-origin {item!r} is neither an origin (scheme://host[:port], no path), "
                                     "a host name (host[:port]) nor '*'")
                item = shown
            out.append(item)
    return tuple(dict.fromkeys(out))


class _Access:
    """Which requests the server answers, by their ``Host`` and ``Origin`` headers: a guard against DNS rebinding
    (a web page whose name an attacker resolves to 127.0.0.1 would otherwise drive a server on loopback).

    ``Host`` must name the bound address, a loopback name (localhost, 127.0.0.1, ::1) or the address the connection
    arrived at, with the server's port when a port is written, or a host of ``--allow-origin``; not checked on a
    wildcard bind (0.0.0.0, ::: the server is open to the network and reachable by names it cannot know; use
    --api-key). ``Origin``, when sent (browsers do), must be listed by ``--allow-origin`` (an origin, or a host name:
    any scheme and port) or be the request's own origin (the Host's: FastAPI's /docs page). ``*`` allows any."""

    def __init__(self, bind_host: str, allow: tuple[str, ...]):
        self.any = "*" in allow
        bind = bind_host.strip().strip("[]").lower().rstrip(".")
        self.wildcard = bind in ("", "0.0.0.0", "::")
        self.names = set(_LOOPBACK_NAMES) | (set() if self.wildcard else {bind})
        self.origins: set[tuple] = set()  # (scheme, name, port)
        self.hosts: set[tuple[str, Optional[int]]] = set()  # for Host: (name, port or None: any)
        self.origin_hosts: set[tuple[str, Optional[int]]] = set()  # for Origin, any scheme: the host names listed
        for item in allow:
            if item == "*":
                continue
            if "://" in item:
                origin = _origin(item)
                self.origins.add(origin)
                self.hosts.add((origin[1], None))  # a proxy in front may forward the origin's name
            else:
                self.hosts.add(_host_port(item))
                self.origin_hosts.add(_host_port(item))

    @staticmethod
    def _listed(entries, name: str, port: Optional[int]) -> bool:
        return any(name == n and (p is None or p == port) for n, p in entries)

    def check(self, host: Optional[str], origin: Optional[str], server, scheme: str = "http") -> Optional[ApiError]:
        if self.any:
            return None
        local_name, local_port = (server[0], server[1]) if server else (None, None)
        if host is not None and not self.wildcard:
            authority = _host_port(host)
            names = self.names | ({str(local_name).lower()} if local_name else set())
            ok = authority is not None and (
                (authority[0] in names and authority[1] in (None, local_port)) or self._listed(self.hosts, *authority))
            if not ok:
                return ApiError(403, f"Host {host!r} is not allowed: this server answers requests addressed to "
                                f"{', '.join(sorted(names))} (port {local_port}), a guard against DNS rebinding; "
                                "to accept this name, start it with --allow-origin NAME", "invalid_request_error",
                                None, "host_not_allowed")
        if origin is not None:
            o = _origin(origin)
            same = None
            if o is not None and host is not None and (authority := _host_port(host)) is not None:
                same = (o[0] == scheme and authority[0] == o[1]
                        and (authority[1] or _DEFAULT_PORTS.get(scheme)) == o[2])
            if o is None or not (o in self.origins or self._listed(self.origin_hosts, o[1], o[2]) or same):
                return ApiError(403, f"Origin {origin!r} is not allowed: web pages may call this server only from "
                                "origins named by --allow-origin (a guard against DNS rebinding and cross-site "
                                "requests)", "invalid_request_error", None, "origin_not_allowed")
        return None


class _Gate:
    """Pure ASGI middleware: Host / Origin check (:class:`_Access`), body size limit, bearer-token auth on /v1/*,
    request counting."""

    def __init__(self, app, settings: ServerSettings, metrics: Metrics):
        self.app = app
        self.settings = settings
        self.metrics = metrics
        self.key = settings.api_key.encode() if settings.api_key else None
        self.access = _Access(settings.host, settings.allow_origins)
        self.cors = bool(settings.allow_origins)  # a CORS middleware inside answers allowed origins' preflights

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        path = scope.get("path", "")
        endpoint = path if path in ("/v1/completions", "/v1/chat/completions", "/v1/models") else None
        status_box = [500]

        async def counting_send(message):
            if message["type"] == "http.response.start":
                status_box[0] = message["status"]
            await send(message)

        try:
            error = self._check(scope, path)
            if error is not None:
                headers = {"WWW-Authenticate": "Bearer"} if error.status == 401 else None
                status_box[0] = error.status
                await error.response(headers)(scope, receive, send)
                return
            await self.app(scope, self._limited(receive), counting_send)
        finally:
            if endpoint is not None:
                self.metrics.requests.labels(endpoint, str(status_box[0])).inc()

    def _check(self, scope, path: str) -> Optional[ApiError]:
        headers: dict = {}
        for name, value in scope.get("headers") or []:
            if name in headers and name in (b"host", b"origin") and headers[name] != value:
                return ApiError(400, f"more than one {name.decode()} header")
            headers[name] = value
        host, origin = headers.get(b"host"), headers.get(b"origin")
        error = self.access.check(host.decode("latin-1") if host is not None else None,
                                  origin.decode("latin-1") if origin is not None else None, scope.get("server"),
                                  scope.get("scheme", "http"))
        if error is not None:
            return error
        if self.cors and scope.get("method") == "OPTIONS" and b"access-control-request-method" in headers:
            return None  # a CORS preflight from an allowed origin: it carries no credentials
        if self.key is not None and path.startswith("/v1"):
            auth = headers.get(b"authorization", b"")
            scheme, _, token = auth.partition(b" ")
            if scheme.lower() != b"bearer" or not secrets.compare_digest(token.strip(), self.key):
                return ApiError(401, "missing or wrong API key: send 'Authorization: Bearer <key>'",
                                "authentication_error", None, "invalid_api_key")
        length = headers.get(b"content-length")
        if length is not None:
            try:
                too_big = int(length) > self.settings.max_body_bytes
            except ValueError:
                return ApiError(400, "bad Content-Length header")
            if too_big:
                return ApiError(413, f"request body over {self.settings.max_body_bytes} bytes",
                                code="request_too_large")
        return None

    def _limited(self, receive):
        limit, seen = self.settings.max_body_bytes, [0]

        async def wrapped():
            message = await receive()
            if message["type"] == "http.request":
                seen[0] += len(message.get("body", b""))
                if seen[0] > limit:  # a chunked body without Content-Length: cut it off
                    raise ApiError(413, f"request body over {limit} bytes", code="request_too_large")
            return message

        return wrapped


def _validation_message(exc: RequestValidationError) -> tuple[str, Optional[str]]:
    errors = exc.errors()
    if not errors:
        return "invalid request", None
    e = errors[0]
    loc = [str(x) for x in e.get("loc", ()) if x not in ("body",)]
    # union members add their type to the location (messages.0.content.str): keep the field path
    param = ".".join(x for x in loc if not any(c in x for c in "[]()") and x not in
                     ("str", "int", "float", "bool", "list", "dict", "list[str]", "list[int]")) or None
    if e.get("type") == "json_invalid":
        return f"the request body is not valid JSON: {e.get('ctx', {}).get('error', e.get('msg'))}", None
    if not loc and e.get("type") == "missing":
        return "the request body is missing: send a JSON object (Content-Type: application/json)", None
    if not loc:
        return "the request body must be a JSON object (Content-Type: application/json)", None
    msg = str(e.get("msg", "invalid value"))
    value = e.get("input")
    if isinstance(value, (str, int, float, bool)) and len(repr(value)) <= 80:
        msg += f", got {json.dumps(value)}"
    more = f" (and {len(errors) - 1} more problem{'s' if len(errors) > 2 else ''})" if len(errors) > 1 else ""
    return (f"{param}: {msg}" if param else msg) + more, param


def create_app(engine, settings: ServerSettings) -> FastAPI:
    """The FastAPI app serving ``engine``; its worker starts and stops with the app's lifespan."""
    metrics = Metrics()
    worker = Worker(engine, metrics, settings.max_queue, settings.stall_timeout_s)
    front = Frontend(engine, settings)

    @asynccontextmanager
    async def lifespan(app):
        await worker.start()
        try:
            yield
        finally:
            await worker.stop()

    app = FastAPI(title="loosespec", version=__version__, lifespan=lifespan,
                  summary="OpenAI-compatible server for loose speculative decoding (FLy, SpecGuard: LOSSY)")
    app.state.worker, app.state.metrics, app.state.frontend, app.state.settings = worker, metrics, front, settings
    if settings.allow_origins:  # inside the gate, which has refused every origin not allowed
        from starlette.middleware.cors import CORSMiddleware

        app.add_middleware(CORSMiddleware, allow_origins=["*"], allow_methods=["GET", "POST"], allow_headers=["*"],
                           expose_headers=["X-Loosespec-Method", "X-Loosespec-Lossy"], max_age=600)
    app.add_middleware(_Gate, settings=settings, metrics=metrics)

    @app.exception_handler(ApiError)
    async def _api_error(request: Request, exc: ApiError):
        return exc.response()

    @app.exception_handler(RequestValidationError)
    async def _validation_error(request: Request, exc: RequestValidationError):
        message, param = _validation_message(exc)
        return ApiError(400, message, param=param).response()

    @app.exception_handler(StarletteHTTPException)
    async def _http_error_handler(request: Request, exc: StarletteHTTPException):
        if isinstance(exc.__cause__, ApiError):  # raised while FastAPI read the body (over the size limit)
            return exc.__cause__.response()
        detail = str(exc.detail)
        if exc.status_code == 400 and detail == "There was an error parsing the body":  # e.g. not UTF-8
            detail = "the request body could not be parsed: send a UTF-8 JSON object"
        return _http_error(exc.status_code, detail).response(getattr(exc, "headers", None))

    @app.exception_handler(Exception)
    async def _internal_error(request: Request, exc: Exception):
        log.exception("unhandled error")
        return ApiError(500, f"internal server error: {type(exc).__name__}", "server_error").response()

    @app.get("/health")
    async def health():
        status, body = worker.health()
        return JSONResponse({"model": settings.served_model_name, **body}, status_code=status)

    @app.get("/metrics")
    async def prometheus():
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": settings.served_model_name, "object": "model",
                                            "created": int(time.time()), "owned_by": "loosespec",
                                            "root": engine.target.name,
                                            "max_model_len": front.context,
                                            "draft": engine.draft.name if engine.draft is not None else None}]}

    async def run(req: CommonFields, request: Request, chat: bool, endpoint: str):
        front.check_common(req)  # cheap checks, then admission (429), then tokenizing: a flood costs no tokenizing
        worker.reserve()
        try:
            ids, cfg = await front.prepare(req, chat)
        finally:
            worker.release()
        job = Job(ids, cfg, endpoint, asyncio.get_running_loop(), stream=bool(req.stream))
        worker.submit(job)  # takes the place reserved above (no await in between)
        shape = _Shape(chat, settings.served_model_name)
        headers = {"X-Loosespec-Method": cfg.method, "X-Loosespec-Lossy": str(cfg.lossy).lower()}
        if req.stream:
            include_usage = bool(req.stream_options and req.stream_options.include_usage)
            return StreamingResponse(_stream(job, shape, request, include_usage), media_type="text/event-stream",
                                     headers={**headers, "Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        try:
            while True:
                kind, payload = await _next_event(job, request)
                if kind == "done":
                    return JSONResponse(shape.full(payload, job), headers=headers)
                if kind == "error":
                    return payload.response()
                if kind == "cancelled":
                    return ApiError(499, "client closed the request").response()
        finally:
            job.cancel.set()  # no-op when finished; stops the generation when this handler is cancelled

    async def _stream(job: Job, shape: _Shape, request: Request, include_usage: bool) -> AsyncIterator[str]:
        usage = None if include_usage else ...
        try:
            if shape.chat:
                yield _sse(shape.chunk("", role=True, usage=usage))
            while True:
                kind, payload = await _next_event(job, request)
                if kind == "chunk":
                    if payload.text:
                        yield _sse(shape.chunk(payload.text, usage=usage))
                elif kind == "done":
                    final = shape.chunk(None if shape.chat else "", payload.finish_reason, usage=usage)
                    final["metrics"] = _metrics(payload, job)
                    yield _sse(final)
                    if include_usage:
                        yield _sse(shape.usage_chunk(payload))
                    break
                elif kind == "error":
                    yield _sse(payload.body())
                    break
                else:  # cancelled: the client is gone
                    return
            yield "data: [DONE]\n\n"
        finally:
            job.cancel.set()  # no-op when finished; stops the generation on a disconnect

    @app.post("/v1/completions")
    async def completions(req: CompletionRequest, request: Request):
        return await run(req, request, chat=False, endpoint="/v1/completions")

    @app.post("/v1/chat/completions")
    async def chat_completions(req: ChatCompletionRequest, request: Request):
        return await run(req, request, chat=True, endpoint="/v1/chat/completions")

    return app


def make_server(app: FastAPI, **config):
    """A uvicorn server for ``app`` (made by :func:`create_app`) with loosespec's shutdown: when it begins (a signal,
    ``should_exit``), new requests get 503 and the running and waiting ones get ``settings.shutdown_timeout_s`` to
    finish; then they are answered 503 (streams get an error event) and the process exits, even with a generation
    that never returns (the worker is a daemon thread). ``config``: uvicorn.Config's arguments."""
    import uvicorn

    settings: ServerSettings = app.state.settings
    worker: Worker = app.state.worker

    class _Server(uvicorn.Server):
        async def shutdown(self, sockets=None):
            worker.begin_shutdown(settings.shutdown_timeout_s)
            await super().shutdown(sockets)

    # uvicorn's own deadline, a little later, for a connection our deadline does not end (a client not reading)
    config.setdefault("timeout_graceful_shutdown", max(1, round(settings.shutdown_timeout_s + 5)))
    return _Server(uvicorn.Config(app, **config))


def serve(engine, settings: ServerSettings, host: str = "127.0.0.1", port: int = 8000,
          log_level: str = "info") -> None:
    """Run the server until interrupted."""
    import dataclasses

    settings = dataclasses.replace(settings, host=host)  # the Host check compares with the address bound
    make_server(create_app(engine, settings), host=host, port=port, log_level=log_level, access_log=False).run()
