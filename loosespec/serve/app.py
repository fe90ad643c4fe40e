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

Choices (see docs/server.md):

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

This module holds the response shaping (JSON and server-sent events), the routes (:func:`create_app`) and the
server's start and shutdown (:func:`make_server`, :func:`serve`); the pieces it joins: ``protocol`` (settings,
errors, request models), ``frontend`` (request -> prompt ids and config), ``worker`` (the generation thread),
``metrics`` (Prometheus) and ``access`` (Host / Origin checks, the API key, the body size limit).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any, Optional

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.exceptions import HTTPException as StarletteHTTPException

from loosespec import __version__
from loosespec.serve.access import _Gate
from loosespec.serve.frontend import Frontend
from loosespec.serve.metrics import Metrics, speculative_metrics
from loosespec.serve.protocol import (
    ApiError,
    ChatCompletionRequest,
    CommonFields,
    CompletionRequest,
    ServerSettings,
    _http_error,
    _validation_message,
)
from loosespec.serve.worker import Job, Worker

log = logging.getLogger(__name__)

DISCONNECT_CHECK_S = 0.5  # how often a waiting handler looks for a disconnected client


# ---------------------------------------------------------------------------------------------
# Responses
# ---------------------------------------------------------------------------------------------


def _usage(stats) -> dict:
    return {
        "prompt_tokens": stats.prompt_tokens,
        "completion_tokens": stats.new_tokens,
        "total_tokens": stats.prompt_tokens + stats.new_tokens,
    }


def _metrics(result, job: Job) -> dict:
    s = result.stats
    return {
        "lossy": job.cfg.lossy,
        "speculative_decoding": speculative_metrics(s, job.cfg),
        "timing": {
            "queue_s": round(job.started - job.arrived, 4),
            "ttft_s": round(s.ttft_s, 4),
            "generation_s": round(s.wall_s, 4),
            "tokens_per_s": round(s.tokens_per_s, 3),
        },
    }


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
            choice = {
                "index": 0,
                "message": {"role": "assistant", "content": result.text},
                "logprobs": None,
                "finish_reason": result.finish_reason,
            }
        else:
            choice = {"index": 0, "text": result.text, "logprobs": None, "finish_reason": result.finish_reason}
        return {
            **self._head("chat.completion" if self.chat else "text_completion"),
            "choices": [choice],
            "usage": _usage(result.stats),
            "metrics": _metrics(result, job),
            "system_fingerprint": f"loosespec-{__version__}",
        }

    def chunk(
        self, text: Optional[str], finish_reason: Optional[str] = None, role: bool = False, usage: Any = ...
    ) -> dict:
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
        return {
            **self._head("chat.completion.chunk" if self.chat else "text_completion"),
            "choices": [],
            "usage": _usage(result.stats),
        }


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


def create_app(engine, settings: ServerSettings) -> FastAPI:
    """The FastAPI app serving ``engine``; its worker starts and stops with the app's lifespan."""
    metrics = Metrics(settings.served_model_name)
    worker = Worker(engine, metrics, settings.max_queue, settings.stall_timeout_s)
    front = Frontend(engine, settings)

    @asynccontextmanager
    async def lifespan(app):
        await worker.start()
        try:
            yield
        finally:
            await worker.stop()

    app = FastAPI(
        title="loosespec",
        version=__version__,
        lifespan=lifespan,
        summary="OpenAI-compatible server for loose speculative decoding (FLy, SpecGuard: LOSSY)",
    )
    app.state.worker, app.state.metrics, app.state.frontend, app.state.settings = worker, metrics, front, settings
    if settings.allow_origins:  # inside the gate, which has refused every origin not allowed
        from starlette.middleware.cors import CORSMiddleware

        app.add_middleware(
            CORSMiddleware,
            allow_origins=["*"],
            allow_methods=["GET", "POST"],
            allow_headers=["*"],
            expose_headers=["X-Loosespec-Method", "X-Loosespec-Lossy"],
            max_age=600,
        )
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
        return {
            "object": "list",
            "data": [
                {
                    "id": settings.served_model_name,
                    "object": "model",
                    "created": int(time.time()),
                    "owned_by": "loosespec",
                    "root": engine.target.name,
                    "max_model_len": front.context,
                    "draft": engine.draft.name if engine.draft is not None else None,
                }
            ],
        }

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
            return StreamingResponse(
                _stream(job, shape, request, include_usage),
                media_type="text/event-stream",
                headers={**headers, "Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
            )
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


def serve(engine, settings: ServerSettings, host: str = "127.0.0.1", port: int = 8000, log_level: str = "info") -> None:
    """Run the server until interrupted."""
    import dataclasses

    settings = dataclasses.replace(settings, host=host)  # the Host check compares with the address bound
    make_server(create_app(engine, settings), host=host, port=port, log_level=log_level, access_log=False).run()
