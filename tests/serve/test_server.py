"""The OpenAI-compatible server, live on loopback: the official openai client, streaming, load,
disconnects, a fuzz run of malformed requests, auth, metrics, and the ``serve`` command.

Two servers per module, each a real uvicorn in a background thread on a free loopback port:
``smol`` (SmolLM2-135M-Instruct, float32, no draft model: the openai-client, load and disconnect
tests) and ``tiny`` (the random tiny pair with a draft model and an API key: fuzz, auth, queue
and SpecGuard tests; its engine can be slowed down per round to hold the worker busy).
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

pytest.importorskip("fastapi")
httpx = pytest.importorskip("httpx")
openai = pytest.importorskip("openai")

import torch  # noqa: E402
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from loosespec.serve.app import create_app, make_server  # noqa: E402
from loosespec.serve.protocol import CommonFields, ServerSettings  # noqa: E402

KEY = "test-key-123"
TINY_TEMPLATE = "{% for m in messages %}<{{ m.role }}>{{ m.content }}\n{% endfor %}<assistant>"


class LiveServer:
    """uvicorn serving ``app`` in a daemon thread on a free loopback port."""

    def __init__(self, app):
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", 0))
        self.port = sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.app = app
        self.server = make_server(app, log_level="warning", access_log=False)  # the server `loosespec serve` runs
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [sock]}, daemon=True)
        self.thread.start()
        deadline = time.time() + 60
        while not self.server.started:
            assert self.thread.is_alive() and time.time() < deadline, "server did not start"
            time.sleep(0.05)

    def close(self):
        self.server.should_exit = True
        self.thread.join(timeout=15)


class SlowEngine:
    """The tiny engine, with an adjustable pause after each decoding round (to keep the worker busy)."""

    def __init__(self, engine):
        self._engine = engine
        self.delay = 0.0

    def __getattr__(self, name):
        return getattr(self._engine, name)

    def stream(self, prompt, cfg, raw=False):
        gen = self._engine.stream(prompt, cfg, raw)
        inner = gen._iter

        def slowed():
            try:
                for chunk in inner:
                    if self.delay:
                        time.sleep(self.delay)
                    yield chunk
            finally:
                inner.close()

        gen._iter = slowed()
        return gen


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    """Keep CPU use modest: the models here are small."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def smol():
    from loosespec.decode.engine import Engine

    engine = Engine.load("smollm2-135m-instruct", None, dtype="float32", device="cpu", progress=False)
    settings = ServerSettings(
        served_model_name="smollm2-135m-instruct", max_queue=16, max_tokens_default=16, defaults={"method": "exact"}
    )
    server = LiveServer(create_app(engine, settings))
    yield server
    server.close()


@pytest.fixture(scope="module")
def tiny(tiny_dir):
    from loosespec.decode.engine import Engine

    engine = SlowEngine(
        Engine.load(str(tiny_dir / "target"), str(tiny_dir / "draft"), dtype="float32", device="cpu", progress=False)
    )
    engine.tokenizer.chat_template = TINY_TEMPLATE
    settings = ServerSettings(
        served_model_name="tiny",
        aliases=(str(tiny_dir / "target"),),
        api_key=KEY,
        max_queue=2,
        max_tokens_default=8,
        defaults={"method": "exact"},
    )
    server = LiveServer(create_app(engine, settings))
    server.engine = engine
    yield server
    server.close()


def client(server, key="unused", **kw) -> "openai.OpenAI":
    return openai.OpenAI(base_url=server.url + "/v1", api_key=key, max_retries=0, timeout=120, **kw)


def metric(server, name: str, **labels) -> float:
    """A sample's value from /metrics (0 when absent); the text must parse as Prometheus exposition."""
    text = httpx.get(server.url + "/metrics", timeout=30).text
    total = 0.0
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                total += s.value
    return total


def sse_events(lines) -> list:
    """Parse an SSE body: every event must be `data: <json>` and the last `data: [DONE]`."""
    events, done = [], False
    for line in lines:
        if not line:
            continue
        assert line.startswith("data: "), line
        assert not done, "event after [DONE]"
        data = line[len("data: ") :]
        if data == "[DONE]":
            done = True
            continue
        events.append(json.loads(data))
    assert done, "stream did not end with data: [DONE]"
    return events


def assert_openai_error(r, status=None):
    if status is not None:
        assert r.status_code == status, (r.status_code, r.text)
    assert 400 <= r.status_code < 500, (r.status_code, r.text)
    err = r.json()["error"]
    assert isinstance(err["message"], str) and err["message"]
    assert isinstance(err["type"], str)
    assert "param" in err and "code" in err
    return err


def spec_ok(spec: dict, method: str):
    """The speculative_decoding block: vLLM's counter names, as counts, and rates derived as vLLM derives them."""
    for k in (
        "num_drafts",
        "num_draft_tokens",
        "num_accepted_tokens",
        "num_accepted_tokens_per_pos",
        "draft_acceptance_rate",
        "mean_acceptance_length",
        "per_position_acceptance_rate",
        "num_rounds",
    ):
        assert k in spec, k
    assert spec["method"] == method
    assert 0 <= spec["num_accepted_tokens"] <= spec["num_draft_tokens"]
    assert spec["num_drafts"] <= spec["num_rounds"] and spec["num_rounds"] >= 1
    per_pos = spec["num_accepted_tokens_per_pos"]
    assert all(isinstance(c, int) for c in per_pos) and sum(per_pos) == spec["num_accepted_tokens"]
    assert all(a >= b for a, b in zip(per_pos, per_pos[1:]))  # a position is reached only past the ones before
    if spec["num_draft_tokens"]:
        assert spec["draft_acceptance_rate"] == pytest.approx(
            spec["num_accepted_tokens"] / spec["num_draft_tokens"], abs=1e-4
        )
    if spec["num_drafts"]:
        assert spec["mean_acceptance_length"] == pytest.approx(
            1 + spec["num_accepted_tokens"] / spec["num_drafts"], abs=1e-4
        )
        assert spec["per_position_acceptance_rate"] == pytest.approx(
            [c / spec["num_drafts"] for c in per_pos], abs=1e-4
        )
    assert spec["lossy"] == (method in ("fly", "specguard"))


# ---------------------------------------------------------------------------------------------
# The openai client against SmolLM2-135M
# ---------------------------------------------------------------------------------------------


@pytest.mark.real_model
def test_models_health_and_completion(smol):
    c = client(smol)
    assert [m.id for m in c.models.list().data] == ["smollm2-135m-instruct"]
    assert httpx.get(smol.url + "/health").json()["status"] == "ok"
    r = c.completions.create(
        model="smollm2-135m-instruct",
        prompt="def fibonacci(n):",
        max_tokens=12,
        extra_body={"method": "exact", "drafter": "ngram"},
    )
    assert r.object == "text_completion" and r.choices[0].text
    assert r.choices[0].finish_reason in ("stop", "length")
    assert r.usage.completion_tokens <= 12 and r.usage.prompt_tokens > 0
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
    spec = r.model_extra["metrics"]["speculative_decoding"]
    spec_ok(spec, "exact")
    # streaming gives the same text
    parts = list(
        c.completions.create(
            model="smollm2-135m-instruct",
            prompt="def fibonacci(n):",
            max_tokens=12,
            stream=True,
            extra_body={"method": "exact", "drafter": "ngram"},
        )
    )
    assert "".join(p.choices[0].text for p in parts if p.choices) == r.choices[0].text
    assert parts[-1].choices[0].finish_reason == r.choices[0].finish_reason


@pytest.mark.real_model
def test_chat_lossless_equals_ar(smol):
    c = client(smol)
    msgs = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Name three colors."}]
    ar = c.chat.completions.create(
        model="smollm2-135m-instruct", messages=msgs, max_tokens=16, extra_body={"method": "ar"}
    )
    ex = c.chat.completions.create(
        model="smollm2-135m-instruct",
        messages=msgs,
        max_completion_tokens=16,
        extra_body={"method": "exact", "num_draft_tokens": 4},
    )
    assert ar.object == "chat.completion" and ar.choices[0].message.role == "assistant"
    assert ex.choices[0].message.content == ar.choices[0].message.content  # lossless, float32
    assert ar.model_extra["metrics"]["speculative_decoding"]["num_draft_tokens"] == 0
    spec_ok(ex.model_extra["metrics"]["speculative_decoding"], "exact")
    assert ex.model_extra["metrics"]["lossy"] is False


@pytest.mark.real_model
def test_acceptance_chat_stream_fly_with_usage_and_metrics(smol):
    """The issue's acceptance check: stream a chat completion with extra_body={"method": "fly"}."""
    c = client(smol)
    stream = c.chat.completions.create(
        model="smollm2-135m-instruct",
        stream=True,
        stream_options={"include_usage": True},
        max_tokens=24,
        messages=[{"role": "user", "content": "Count from 1 to 20, separated by commas."}],
        extra_body={"method": "fly", "fly_window_size": 4, "seed": 3},
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert all(ch.object == "chat.completion.chunk" and ch.id == chunks[0].id for ch in chunks)
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    finals = [ch for ch in chunks if ch.choices and ch.choices[0].finish_reason]
    assert len(finals) == 1 and text
    metrics = finals[0].model_extra["metrics"]
    assert metrics["lossy"] is True
    spec = metrics["speculative_decoding"]
    spec_ok(spec, "fly")
    assert "fly_deferred" in spec and "fly_prefix_mismatches" in spec and "fly_copy_rejects" not in spec
    guarded = c.chat.completions.create(  # FLy's copy guard on: its counter is exported too
        model="smollm2-135m-instruct",
        max_tokens=8,
        messages=[{"role": "user", "content": "Count from 1 to 20."}],
        extra_body={"method": "fly", "fly_copy_guard": 1, "seed": 3},
    )
    assert "fly_copy_rejects" in guarded.model_extra["metrics"]["speculative_decoding"]
    usage = chunks[-1]
    assert usage.choices == [] and usage.usage.completion_tokens >= 1
    assert spec["num_drafts"] >= 1 and spec["num_rounds"] <= usage.usage.completion_tokens
    # the same request without streaming gives the same text (greedy)
    r = c.chat.completions.create(
        model="smollm2-135m-instruct",
        max_tokens=24,
        messages=[{"role": "user", "content": "Count from 1 to 20, separated by commas."}],
        extra_body={"method": "fly", "fly_window_size": 4, "seed": 3},
    )
    assert r.choices[0].message.content == text
    assert r.model_extra["metrics"]["speculative_decoding"]["lossy"] is True


@pytest.mark.real_model
def test_request_errors_through_openai_client(smol):
    c = client(smol)
    msgs = [{"role": "user", "content": "hi"}]
    with pytest.raises(openai.NotFoundError):
        c.chat.completions.create(model="gpt-17", messages=msgs)
    with pytest.raises(openai.BadRequestError, match="magic"):
        c.chat.completions.create(model="smollm2-135m-instruct", messages=msgs, extra_body={"method": "magic"})
    with pytest.raises(openai.BadRequestError, match="draft model"):  # no draft model on this server
        c.chat.completions.create(model="smollm2-135m-instruct", messages=msgs, extra_body={"method": "specguard"})
    with pytest.raises(openai.BadRequestError, match="context"):
        c.chat.completions.create(model="smollm2-135m-instruct", messages=msgs, max_tokens=10**6)
    with pytest.raises(openai.BadRequestError, match="rejection"):  # exact is greedy
        c.chat.completions.create(model="smollm2-135m-instruct", messages=msgs, temperature=0.8)
    with pytest.raises(openai.BadRequestError, match="fly_windw_size"):  # a typo in loosespec's namespace
        c.chat.completions.create(model="smollm2-135m-instruct", messages=msgs, extra_body={"fly_windw_size": 3})
    # unknown fields outside loosespec's namespaces are ignored, as vLLM does
    r = c.chat.completions.create(
        model="smollm2-135m-instruct", messages=msgs, max_tokens=2, extra_body={"some_vendor_field": 1}
    )
    assert r.choices[0].finish_reason in ("stop", "length")


# ---------------------------------------------------------------------------------------------
# Load: 16 streaming clients at once
# ---------------------------------------------------------------------------------------------


def _stream_chat(url: str, body: dict) -> tuple[str, dict, str]:
    """Stream one chat completion with httpx; check every event's shape; return text, metrics, id."""
    with httpx.Client(timeout=300) as h:
        with h.stream(
            "POST",
            url + "/v1/chat/completions",
            json={**body, "stream": True, "stream_options": {"include_usage": True}},
        ) as r:
            assert r.status_code == 200, r.read()
            assert r.headers["content-type"].startswith("text/event-stream")
            events = sse_events(r.iter_lines())
    ids = {e["id"] for e in events}
    assert len(ids) == 1
    assert events[0]["choices"][0]["delta"]["role"] == "assistant"
    *body_events, final, usage = events
    assert final["choices"][0]["finish_reason"] in ("stop", "length") and "metrics" in final
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] >= 1
    for e in body_events:
        assert e["object"] == "chat.completion.chunk" and e["choices"][0]["finish_reason"] is None
    text = "".join(e["choices"][0]["delta"].get("content", "") for e in body_events)
    return text, final["metrics"], ids.pop()


@pytest.mark.real_model
@pytest.mark.slow  # the tiny-model server tests run concurrent streams in make test
def test_load_16_concurrent_streams(smol):
    subjects = [
        "cats",
        "rivers",
        "bread",
        "stars",
        "trains",
        "chess",
        "tea",
        "snow",
        "bees",
        "maps",
        "glass",
        "wind",
        "salt",
        "owls",
        "clocks",
        "paper",
    ]
    methods = ["exact", "fly", "ar", "exact"]
    bodies = [
        {
            "model": "smollm2-135m-instruct",
            "max_tokens": 8,
            "seed": i,
            "messages": [{"role": "user", "content": f"One sentence about {s}."}],
            "method": methods[i % len(methods)],
        }
        for i, s in enumerate(subjects)
    ]
    c = client(smol)
    alone = [
        c.chat.completions.create(
            **{k: v for k, v in b.items() if k in ("model", "max_tokens", "seed", "messages")},
            extra_body={"method": b["method"]},
        )
        .choices[0]
        .message.content
        for b in bodies
    ]
    finished_before = metric(smol, "loosespec:request_success_total")
    with ThreadPoolExecutor(16) as pool:
        results = list(pool.map(lambda b: _stream_chat(smol.url, b), bodies))
    assert len({r[2] for r in results}) == 16  # distinct completion ids
    for body, expected, (text, metrics, _) in zip(bodies, alone, results):
        assert text == expected, body  # nothing lost or mixed up between clients
        assert metrics["speculative_decoding"]["method"] == body["method"]
    assert metric(smol, "loosespec:request_success_total") == finished_before + 16
    assert httpx.get(smol.url + "/health").json()["queue_waiting"] == 0


# ---------------------------------------------------------------------------------------------
# Disconnect
# ---------------------------------------------------------------------------------------------


def _wait_for(predicate, timeout=20.0, what=""):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what() if callable(what) else what}")


@pytest.mark.real_model
def test_disconnect_mid_stream_frees_the_model(smol):
    cancelled = metric(smol, "loosespec:requests_cancelled_total")
    tokens_before = metric(smol, "loosespec:generation_tokens_total", method="ar")
    body = {
        "model": "smollm2-135m-instruct",
        "prompt": "1, 2, 3, 4, 5,",
        "max_tokens": 4000,
        "stream": True,
        "method": "ar",
    }
    with httpx.Client(timeout=60) as h:
        with h.stream("POST", smol.url + "/v1/completions", json=body) as r:
            assert r.status_code == 200
            got = 0
            for line in r.iter_lines():
                if line.startswith("data: {"):
                    got += 1
                    if got == 2:
                        break
    # the worker notices within a round, counts the request as cancelled and goes idle
    _wait_for(lambda: metric(smol, "loosespec:requests_cancelled_total") == cancelled + 1, what="cancellation")
    _wait_for(lambda: not httpx.get(smol.url + "/health").json()["running"], what="idle worker")
    assert metric(smol, "loosespec:generation_tokens_total", method="ar") - tokens_before < 400
    t = time.time()
    r = client(smol).completions.create(model="smollm2-135m-instruct", prompt="Hello", max_tokens=4)
    assert r.choices[0].text is not None and time.time() - t < 30


# ---------------------------------------------------------------------------------------------
# Tiny server: auth, queue, SpecGuard, fuzz
# ---------------------------------------------------------------------------------------------


def test_auth(tiny):
    body = {"model": "tiny", "prompt": "abc", "max_tokens": 2}
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": KEY}, {"Authorization": f"Basic {KEY}"}):
        for method, path, kw in (
            ("POST", "/v1/completions", {"json": body}),
            ("GET", "/v1/models", {}),
            ("POST", "/v1/chat/completions", {"content": b"{not json"}),
        ):
            r = httpx.request(method, tiny.url + path, headers=headers, **kw)
            err = assert_openai_error(r, 401)
            assert err["type"] == "authentication_error"
    good = {"Authorization": f"Bearer {KEY}"}
    assert httpx.post(tiny.url + "/v1/completions", json=body, headers=good).status_code == 200
    assert httpx.get(tiny.url + "/v1/models", headers=good).json()["data"][0]["id"] == "tiny"
    # /health and /metrics stay open
    assert httpx.get(tiny.url + "/health").status_code == 200
    assert httpx.get(tiny.url + "/metrics").status_code == 200
    with pytest.raises(openai.AuthenticationError):
        client(tiny, key="wrong").models.list()
    assert client(tiny, key=KEY).models.list().data[0].id == "tiny"
    assert metric(tiny, "loosespec:http_requests_total", endpoint="/v1/completions", status="401") >= 4


def test_specguard_and_fly_on_the_tiny_pair(tiny):
    c = client(tiny, key=KEY)
    r = c.completions.create(
        model="tiny",
        prompt="def f(x):\n",
        max_tokens=16,
        extra_body={"method": "specguard", "sg_max_step_tokens": 6, "sg_candidates": 2},
    )
    spec = r.model_extra["metrics"]["speculative_decoding"]
    assert spec["method"] == "specguard" and spec["lossy"] is True and spec["sg_steps"] >= 1
    assert 0 <= spec["sg_accepted_steps"] <= spec["sg_steps"]
    r = c.chat.completions.create(
        model=str(tiny.engine.target.name),
        max_tokens=12,  # the alias works too
        messages=[{"role": "user", "content": "abcabcabc"}],
        extra_body={
            "method": "fly",
            "drafter": "model",
            "fly_entropy_threshold": 0.0,
            # the tiny draft costs as much as its target: the
            # cost-aware length would rightly draft nothing
            "adaptive_draft_length": False,
        },
    )
    spec_ok(r.model_extra["metrics"]["speculative_decoding"], "fly")
    assert metric(tiny, "loosespec:specguard_steps_total") >= 1
    fly = r.model_extra["metrics"]["speculative_decoding"]
    assert metric(tiny, "loosespec:spec_decode_num_draft_tokens_total", method="fly") == fly["num_draft_tokens"] >= 1
    assert metric(tiny, "loosespec:spec_decode_num_drafts_total", method="fly") == fly["num_drafts"]
    assert (
        metric(tiny, "loosespec:spec_decode_num_accepted_tokens_per_pos_total", method="fly", position="0")
        == fly["num_accepted_tokens_per_pos"][0]
    )
    families = list(text_string_to_metric_families(httpx.get(tiny.url + "/metrics").text))
    # vLLM's model_name label, the served model name, on every sample of every loosespec metric
    unnamed = [
        s.name
        for f in families
        if f.name.startswith("loosespec:")
        for s in f.samples
        if s.labels.get("model_name") != "tiny"
    ]
    assert not unnamed, unnamed
    names = {f.name for f in families}
    for name in (
        "loosespec:http_requests",
        "loosespec:generation_tokens",
        "loosespec:spec_decode_num_drafts",
        "loosespec:spec_decode_num_draft_tokens",
        "loosespec:spec_decode_num_accepted_tokens",
        "loosespec:spec_decode_num_accepted_tokens_per_pos",
        "loosespec:fly_deferred",
        "loosespec:specguard_accepted_steps",
        "loosespec:e2e_request_latency_seconds",
        "loosespec:time_to_first_token_seconds",
        "loosespec:requests_cancelled",
        "loosespec:num_requests_waiting",
        "loosespec:num_requests_running",
    ):
        assert name in names, name


def test_the_harness_reads_a_loosespec_server_as_it_reads_vllm(tiny):
    """bench's vLLM counter reader (eval/peers/vllm.spec_counters) reads the same counters from `loosespec serve`."""
    from loosespec.eval.peers.vllm import spec_counters

    before = spec_counters(tiny.url)
    c = client(tiny, key=KEY)
    r = c.completions.create(
        model="tiny",
        prompt="abcabcabcabc",
        max_tokens=12,
        extra_body={"method": "exact", "drafter": "ngram", "adaptive_draft_length": False},
    )
    spec = r.model_extra["metrics"]["speculative_decoding"]
    after = spec_counters(tiny.url)
    assert spec["num_draft_tokens"] >= 1
    assert after["draft_tokens"] - before["draft_tokens"] == spec["num_draft_tokens"]
    assert after["accepted"] - before["accepted"] == spec["num_accepted_tokens"]
    assert after["drafts"] - before["drafts"] == spec["num_drafts"]


def test_full_queue_gets_429_and_queued_disconnects_are_dropped(tiny):
    auth = {"Authorization": f"Bearer {KEY}"}
    cancelled = metric(tiny, "loosespec:requests_cancelled_total")
    started = metric(tiny, "loosespec:request_queue_time_seconds_count")  # observed when a generation starts
    tiny.engine.delay = 0.05  # each round holds the worker 50 ms
    try:
        long = {"model": "tiny", "prompt": "x", "max_tokens": 900, "stream": True, "method": "ar"}
        short = {"model": "tiny", "prompt": "y", "max_tokens": 2}
        with httpx.Client(timeout=60, headers=auth) as h, ThreadPoolExecutor(1) as pool:
            with h.stream("POST", tiny.url + "/v1/completions", json=long) as running:
                assert running.status_code == 200
                lines = running.iter_lines()  # keep a reference: a collected iterator closes the stream
                next(line for line in lines if line.startswith("data: {"))  # it runs
                # two requests wait behind it (max_queue=2): one plain, one streaming that will give up
                waiting = pool.submit(httpx.post, tiny.url + "/v1/completions", json=short, headers=auth, timeout=120)
                with httpx.Client(timeout=60, headers=auth) as h2:
                    with h2.stream("POST", tiny.url + "/v1/completions", json={**short, "stream": True}) as quitter:
                        assert quitter.status_code == 200
                        _wait_for(
                            lambda: httpx.get(tiny.url + "/health").json()["queue_waiting"] == 2,
                            what=lambda: f"2 waiting: {httpx.get(tiny.url + '/health').json()}",
                        )
                        r = httpx.post(tiny.url + "/v1/completions", json=short, headers=auth)  # the third: refused
                        err = assert_openai_error(r, 429)
                        assert err["code"] == "rate_limit_exceeded" and "busy" in err["message"]
                # the streaming client left while queued; now the running one goes too
            assert waiting.result().status_code == 200
        # the running one stopped, the plain one ran, the one that left while queued never started
        _wait_for(lambda: metric(tiny, "loosespec:requests_cancelled_total") == cancelled + 2, what="cancels")
        assert metric(tiny, "loosespec:request_queue_time_seconds_count") == started + 2
        assert metric(tiny, "loosespec:http_requests_total", endpoint="/v1/completions", status="429") >= 1
        assert httpx.get(tiny.url + "/health").json()["queue_waiting"] == 0
    finally:
        tiny.engine.delay = 0.0


def test_non_streaming_client_that_gives_up_is_cancelled(tiny):
    auth = {"Authorization": f"Bearer {KEY}"}
    cancelled = metric(tiny, "loosespec:requests_cancelled_total")
    tiny.engine.delay = 0.05
    try:
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(
                tiny.url + "/v1/completions",
                headers=auth,
                timeout=1.0,
                json={"model": "tiny", "prompt": "x", "max_tokens": 900, "method": "ar"},
            )
        _wait_for(lambda: metric(tiny, "loosespec:requests_cancelled_total") == cancelled + 1, what="cancellation")
        _wait_for(lambda: not httpx.get(tiny.url + "/health").json()["running"], what="idle worker")
    finally:
        tiny.engine.delay = 0.0


def test_body_size_limit(tiny):
    headers = {"Authorization": f"Bearer {KEY}", "content-type": "application/json"}
    big = b'{"prompt": "' + b"a" * (9 * 1024 * 1024) + b'"}'

    def chunked():  # no Content-Length: cut off while reading
        for i in range(0, len(big), 1 << 20):
            yield big[i : i + (1 << 20)]

    for content in (big, chunked()):
        err = assert_openai_error(
            httpx.post(tiny.url + "/v1/completions", content=content, headers=headers, timeout=60), 413
        )
        assert err["code"] == "request_too_large"


def _fuzz_requests(rng: random.Random, big_prompt: str):
    """(method, path, kwargs) for httpx.request: malformed, odd and some valid requests."""
    chat, comp = "/v1/chat/completions", "/v1/completions"
    junk_values = [
        None,
        True,
        False,
        0,
        -1,
        1.5,
        -1e308,
        10**30,
        "",
        "x" * 50,
        [],
        [1, "a"],
        {},
        {"a": 1},
        "NaN",
        [[1]],
        [{"role": "user"}],
    ]
    fields = [
        "model",
        "messages",
        "prompt",
        "max_tokens",
        "max_completion_tokens",
        "temperature",
        "top_p",
        "top_k",
        "stop",
        "stream",
        "stream_options",
        "seed",
        "n",
        "method",
        "drafter",
        "num_draft_tokens",
        "fly_window_size",
        "fly_entropy_threshold",
        "fly_entropy_top_k",
        "fly_sampling",
        "sg_candidates",
        "sg_temperature",
        "sg_beta",
        "sg_tau",
        "sg_delimiter",
        "sg_embedder",
        "sg_on_reject",
        "sg_verify",
        "sg_max_step_tokens",
        "logprobs",
        "tools",
        "response_format",
        "user",
        "logit_bias",
    ]
    good_values = {
        "method": ["ar", "exact", "rejection", "fly", "specguard"],
        "drafter": ["ngram", "model", "mla"],
        "temperature": [0, 0.0, 0.7],
        "max_tokens": [1, 3, 8],
        "seed": [0, 7],
        "stream": [True, False],
        "stop": ["a", ["b", "c"]],
        "num_draft_tokens": [1, 4],
        "top_k": [0, 5],
        "top_p": [0.5, 1],
    }

    def valid(chat_: bool) -> dict:
        b = {"model": rng.choice(["tiny", None]), "max_tokens": rng.randint(1, 6)}
        if chat_:
            b["messages"] = [{"role": rng.choice(["user", "system"]), "content": rng.choice(["hi", "abc" * 3])}]
        else:
            b["prompt"] = rng.choice(["abc", "def f(x):", [5, 6, 7]])
        return {k: v for k, v in b.items() if v is not None}

    def raw(body: bytes) -> dict:
        return {"content": body, "headers": {"content-type": "application/json"}}

    fixed = [
        ("POST", chat, raw(b"{bad json")),
        ("POST", chat, raw(b"")),
        ("POST", chat, {"content": b"{bad json"}),
        ("POST", comp, raw(b"\xff\xfe\x00garbage")),
        ("POST", chat, raw(b"null")),
        ("POST", chat, raw(b"[]")),
        ("POST", chat, raw(b'"str"')),
        ("POST", comp, raw(b'{"prompt": "a"' * 1000)),
        ("POST", chat, raw(b'{"messages": [{"role": "user", "content": "hi"}], "max_tokens": NaN}')),
        ("POST", chat, raw(b'{"messages": [{"role": "user", "content": "hi"}], "temperature": Infinity}')),
        ("POST", chat, {"json": {"messages": []}}),
        ("POST", chat, {"json": {"messages": "hi"}}),
        ("POST", chat, {"json": {"messages": [{"role": "user", "content": "hi"}], "max_tokens": -5}}),
        ("POST", chat, {"json": {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 0}}),
        ("POST", chat, {"json": {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 10**12}}),
        ("POST", chat, {"json": {"messages": [{"role": "user", "content": "hi"}], "method": "magic"}}),
        ("POST", chat, {"json": {"messages": [{"role": "wizard", "content": "hi"}]}}),
        ("POST", chat, {"json": {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}}),
        ("POST", chat, {"json": {"messages": [{"role": "user", "content": "hi"}], "n": 3}}),
        ("POST", chat, {"json": {"messages": [{"role": "user", "content": "hi"}], "stream_options": {}}}),
        ("POST", chat, {"json": {"messages": [{"role": "user", "content": big_prompt}]}}),
        ("POST", comp, {"json": {"prompt": big_prompt, "max_tokens": 4}}),
        ("POST", comp, {"json": {"prompt": ""}}),
        ("POST", comp, {"json": {"prompt": []}}),
        ("POST", comp, {"json": {"prompt": ["a", "b"]}}),
        ("POST", comp, {"json": {"prompt": [10**9]}}),
        ("POST", comp, {"json": {"prompt": "a", "stop": [""]}}),
        ("POST", comp, {"json": {"prompt": "a", "fly_entropy_top_k": 10**5}}),
        ("POST", comp, {"json": {"prompt": "a", "seed": -1}}),
        ("POST", comp, {"json": {"prompt": "a", "method": "exact", "temperature": 1.0}}),
        ("POST", comp, {"data": {"prompt": "a"}}),  # form-encoded
        ("POST", comp, {"content": b'{"prompt": "a"}', "headers": {"content-type": "text/plain"}}),
        ("GET", chat, {}),
        ("PUT", comp, {}),
        ("DELETE", "/v1/models", {}),
        ("GET", "/v1/nothing", {}),
        ("POST", "/health", {}),
        ("GET", "/../../etc/passwd", {}),
    ]
    yield from fixed
    for _ in range(300 - len(fixed)):
        kind = rng.random()
        path = rng.choice([chat, comp])
        if kind < 0.15:  # random bytes
            yield "POST", path, raw(bytes(rng.getrandbits(8) for _ in range(rng.randint(0, 64))))
        elif kind < 0.25:  # random text that is almost JSON
            s = json.dumps(valid(path == chat))
            cut = rng.randint(0, len(s))
            yield "POST", path, raw((s[:cut] + rng.choice(["", "}", ",", "]", "\x00"])).encode())
        elif kind < 0.75:  # a valid body with a few fields replaced by junk or odd values
            b = valid(path == chat)
            for _ in range(rng.randint(1, 3)):
                f = rng.choice(fields)
                b[f] = rng.choice(junk_values + good_values.get(f, []))
            yield "POST", path, {"json": b}
        elif kind < 0.85:  # a field dropped
            b = valid(path == chat)
            b.pop(rng.choice(list(b)))
            yield "POST", path, {"json": b}
        else:  # valid requests with random loosespec parameters
            b = valid(path == chat)
            for f in rng.sample(list(good_values), rng.randint(0, 3)):
                b[f] = rng.choice(good_values[f])
            yield "POST", path, {"json": b}


# every float field of the requests (loosespec's knobs and OpenAI's), read from the request model
FLOAT_FIELDS = [name for name, f in CommonFields.model_fields.items() if "float" in str(f.annotation)]
EXTREME_FLOATS = [
    1e-40,
    -1e-40,
    5e-324,
    1e-38,
    2.2250738585072014e-308,
    1e-5,
    1e308,
    -1e308,
    1.7976931348623157e308,
    -0.0,
]
NON_FINITE = ["NaN", "Infinity", "-Infinity", "1e999", "-1e999"]  # not JSON, but what many encoders write


def _extreme_float_requests():
    """(method, path, kwargs): each float field at each extreme value (and each non-finite spelling, as raw bodies),
    in bodies that sample (temperature 0.7) with each lossy or sampling method, so the value reaches the sampler."""
    methods = ["rejection", "fly", "specguard"]
    i = 0
    for name in FLOAT_FIELDS:
        for value in EXTREME_FLOATS:
            for method in methods if name == "temperature" else [methods[i % 3]]:
                i += 1
                body = {
                    "max_tokens": 2,
                    "method": method,
                    "temperature": 0.7,
                    name: {"7": value} if name == "logit_bias" else value,
                }
                if i % 2:
                    yield "POST", "/v1/completions", {"json": {**body, "prompt": "abc"}}
                else:
                    yield (
                        "POST",
                        "/v1/chat/completions",
                        {"json": {**body, "messages": [{"role": "user", "content": "abc"}]}},
                    )
        for raw in NON_FINITE:
            value = f'{{"7": {raw}}}' if name == "logit_bias" else raw
            yield (
                "POST",
                "/v1/completions",
                {
                    "content": f'{{"prompt": "a", "max_tokens": 2, "method": "rejection", '
                    f'"temperature": 0.7, "{name}": {value}}}'.encode(),
                    "headers": {"content-type": "application/json"},
                },
            )


def test_fuzz_never_5xx(tiny):
    assert {
        "temperature",
        "top_p",
        "presence_penalty",
        "frequency_penalty",
        "logit_bias",
        "sg_temperature",
        "sg_tau",
        "sg_beta",
        "fly_entropy_threshold",
        "draft_confidence_threshold",
    } <= set(FLOAT_FIELDS)
    rng = random.Random(1234)
    big_prompt = "lorem ipsum " * 200  # byte-level tokens: over the tiny model's 1024-token context
    statuses: dict[int, int] = {}
    auth = {"Authorization": f"Bearer {KEY}"}
    extreme = list(_extreme_float_requests())
    with httpx.Client(timeout=60) as h:
        for method, path, kw in [*_fuzz_requests(rng, big_prompt), *extreme]:
            headers = {**auth, **kw.pop("headers", {})}
            r = h.request(method, tiny.url + path, headers=headers, **kw)
            statuses[r.status_code] = statuses.get(r.status_code, 0) + 1
            assert r.status_code < 500, (method, path, kw, r.status_code, r.text)
            if r.status_code >= 400:
                assert_openai_error(r)
            elif r.headers["content-type"].startswith("text/event-stream"):
                events = sse_events(r.text.splitlines())
                assert all("error" not in e for e in events), events
            else:
                out = r.json()
                assert "choices" in out or "data" in out or out.get("status") == "ok", out
    assert sum(statuses.values()) == 300 + len(extreme)
    assert statuses.get(200, 0) >= 20 and sum(v for k, v in statuses.items() if 400 <= k < 500) >= 150, statuses
    health = httpx.get(tiny.url + "/health")
    assert health.status_code == 200
    assert {k: v for k, v in health.json().items() if k in ("status", "model", "queue_waiting", "running")} == {
        "status": "ok",
        "model": "tiny",
        "queue_waiting": 0,
        "running": False,
    }
    r = client(tiny, key=KEY).chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "ok"}], max_tokens=3
    )
    assert r.choices[0].finish_reason in ("stop", "length")
    assert metric(tiny, "loosespec:http_requests_total", status="500") == 0


# ---------------------------------------------------------------------------------------------
# Requests the server must refuse or survive; health, shutdown, Host / Origin (issue 43)
# ---------------------------------------------------------------------------------------------


def _server_on(tiny, **settings) -> LiveServer:
    """Another server (keyless unless told) on the tiny module server's engine; one generation at a time anyway."""
    base = dict(served_model_name="tiny", max_queue=2, max_tokens_default=8, defaults={"method": "exact"})
    return LiveServer(create_app(tiny.engine, ServerSettings(**{**base, **settings})))


def _health(server) -> dict:
    return httpx.get(server.url + "/health", timeout=30).json()


def test_a_temperature_near_zero_samples_greedily(tiny):
    """1e-40 divided the logits into infinities (a 500): below 1e-5 a temperature is greedy, as in vLLM."""
    auth = {"Authorization": f"Bearer {KEY}"}

    def post(**body):
        return httpx.post(
            tiny.url + "/v1/completions",
            headers=auth,
            timeout=60,
            json={"model": "tiny", "prompt": "abcabc", "max_tokens": 6, "seed": 3, **body},
        )

    def text(**body):
        r = post(**body)
        assert r.status_code == 200, (body, r.text)
        return r.json()["choices"][0]["text"]

    for method in ("rejection", "fly", "specguard", "exact"):
        greedy = text(method=method, temperature=0)
        for t in (1e-40, 5e-324, 1e-38, -0.0, 9e-6):
            assert text(method=method, temperature=t) == greedy, (method, t)
    assert text(method="rejection", temperature=2e-5)  # above the threshold: sampled, and still no overflow
    err = assert_openai_error(post(method="specguard", temperature=0.7, sg_temperature=1e-40), 400)
    assert err["param"] == "sg_temperature" and "1e-05" in err["message"]


def test_stop_strings_are_capped(tiny):
    auth = {"Authorization": f"Bearer {KEY}"}
    base = {"model": "tiny", "prompt": "abc", "max_tokens": 4}
    r = httpx.post(tiny.url + "/v1/completions", headers=auth, json={**base, "stop": ["\x01" * 256] * 16}, timeout=60)
    assert r.status_code == 200, r.text
    for stop, words in (
        (["a"] * 17, "at most 16 stop strings"),
        ("y" * 257, "at most 256 characters"),
        (["z", "w" * 100_000], "at most 256 characters"),
        (["z", ""], "non-empty"),
    ):
        r = httpx.post(tiny.url + "/v1/completions", headers=auth, json={**base, "stop": stop}, timeout=60)
        err = assert_openai_error(r, 400)
        assert err["param"] == "stop" and words in err["message"], err


@contextlib.contextmanager
def _queue_full(server, auth: dict, waiting: int = 2):
    """The worker busy with a long streaming generation and ``waiting`` requests queued behind it (the tiny
    server's --max-queue); on exit the stream is closed (cancelled) and the waiting ones run."""
    server.engine.delay = 0.05
    long = {"model": "tiny", "prompt": "x", "max_tokens": 900, "stream": True, "method": "ar"}
    short = {"model": "tiny", "prompt": "y", "max_tokens": 2}
    try:
        with httpx.Client(timeout=60, headers=auth) as h, ThreadPoolExecutor(waiting) as pool:
            with h.stream("POST", server.url + "/v1/completions", json=long) as running:
                assert running.status_code == 200
                lines = running.iter_lines()  # keep a reference: a collected iterator closes the stream
                next(line for line in lines if line.startswith("data: {"))
                futures = [
                    pool.submit(httpx.post, server.url + "/v1/completions", json=short, headers=auth, timeout=120)
                    for _ in range(waiting)
                ]
                _wait_for(lambda: _health(server)["queue_waiting"] == waiting, what=lambda: _health(server))
                yield futures
            for f in futures:
                assert f.result().status_code == 200
    finally:
        server.engine.delay = 0.0


def test_a_full_queue_refuses_before_tokenizing(tiny, monkeypatch):
    """Admission (429) comes before tokenizing: a flood of huge prompts costs the server no tokenizer time."""
    auth = {"Authorization": f"Bearer {KEY}"}
    front = tiny.app.state.frontend
    calls = []
    encode = front._encode
    monkeypatch.setattr(front, "_encode", lambda *a: calls.append(a[1]) or encode(*a))
    huge = "lorem ipsum " * 200_000  # 2.4 MB
    with _queue_full(tiny, auth):
        calls.clear()
        for path, body in (
            ("/v1/chat/completions", {"messages": [{"role": "user", "content": huge}]}),
            ("/v1/completions", {"prompt": huge}),
        ):
            err = assert_openai_error(
                httpx.post(tiny.url + path, headers=auth, json={"model": "tiny", **body}, timeout=60), 429
            )
            assert err["code"] == "rate_limit_exceeded"
        assert calls == []  # neither was tokenized
        # a request refused for a bad field is still refused for that field (checked before admission)
        err = assert_openai_error(
            httpx.post(
                tiny.url + "/v1/completions", headers=auth, timeout=60, json={"prompt": huge, "stop": ["a"] * 17}
            ),
            400,
        )
        assert err["param"] == "stop" and calls == []


def test_health_reports_the_workers_progress_and_a_stall(tiny):
    server = _server_on(tiny, stall_timeout_s=0.8)
    try:
        r = httpx.get(server.url + "/health")
        assert r.status_code == 200
        body = r.json()
        assert body["status"] == "ok" and body["running"] is False and body["stall_timeout_s"] == 0.8
        assert body["last_progress_s"] >= 0
        with ThreadPoolExecutor(1) as pool:
            # each round makes progress (0.2 s apart): never stalled, though the generation outlasts the timeout
            tiny.engine.delay = 0.2
            done = pool.submit(
                httpx.post,
                server.url + "/v1/completions",
                timeout=60,
                json={"prompt": "x", "max_tokens": 8, "method": "ar"},
            )
            _wait_for(lambda: _health(server)["running"] or done.done(), what="a running generation")
            seen = set()
            while not done.done():
                r = httpx.get(server.url + "/health")
                seen.add((r.status_code, r.json()["status"]))
                time.sleep(0.05)
            assert done.result().status_code == 200 and seen <= {(200, "ok")}, seen
            # a round that lasts longer than the timeout: stalled (503) while it lasts, and says for how long
            tiny.engine.delay = 3.0
            done = pool.submit(
                httpx.post,
                server.url + "/v1/completions",
                timeout=60,
                json={"prompt": "x", "max_tokens": 2, "method": "ar"},
            )
            _wait_for(lambda: httpx.get(server.url + "/health").status_code == 503, timeout=10, what="503")
            body = httpx.get(server.url + "/health").json()
            assert body["status"] == "stalled" and body["running"] is True and body["last_progress_s"] > 0.8
            tiny.engine.delay = 0.0
            assert done.result().status_code == 200
        _wait_for(lambda: httpx.get(server.url + "/health").status_code == 200, what="ok again")
        assert _health(server)["status"] == "ok"
    finally:
        tiny.engine.delay = 0.0
        server.close()


def test_shutdown_answers_what_is_left_at_its_deadline(tiny):
    """Shutdown no longer drains the whole queue: after --shutdown-timeout the running request gets an error event,
    the waiting ones 503, and the server exits."""
    server = _server_on(tiny, shutdown_timeout_s=1.0, max_queue=4)
    tiny.engine.delay = 0.1  # the running generation would take 90 s

    def stream():
        body = {"prompt": "x", "max_tokens": 900, "stream": True, "method": "ar"}
        with httpx.stream("POST", server.url + "/v1/completions", json=body, timeout=60) as r:
            return r.status_code, sse_events(r.iter_lines())

    try:
        with ThreadPoolExecutor(3) as pool:
            running = pool.submit(stream)
            _wait_for(lambda: _health(server)["running"], what="a running generation")
            waiting = [
                pool.submit(
                    httpx.post, server.url + "/v1/completions", timeout=60, json={"prompt": "y", "max_tokens": 2}
                )
                for _ in range(2)
            ]
            _wait_for(lambda: _health(server)["queue_waiting"] == 2, what="2 waiting")
            start = time.monotonic()
            server.server.should_exit = True  # what SIGTERM and Ctrl-C do
            for f in waiting:
                r = f.result(timeout=30)
                assert r.status_code == 503, r.text
                assert r.json()["error"]["code"] == "server_shutting_down"
            status, events = running.result(timeout=30)
            assert status == 200 and events[-1]["error"]["code"] == "server_shutting_down", events[-1]
            assert any(e.get("choices") for e in events[:-1])  # it ran until the deadline
        server.thread.join(timeout=15)
        took = time.monotonic() - start
        assert not server.thread.is_alive() and 0.9 <= took < 8, took
    finally:
        tiny.engine.delay = 0.0
        server.close()


def test_host_and_origin_are_checked_against_dns_rebinding(tiny):
    """A keyless server on loopback answers only requests addressed to it: a web page whose name an attacker resolves
    to 127.0.0.1 (DNS rebinding) sends its own name as Host, and browsers send the page's Origin."""
    server = _server_on(tiny)  # no API key, bound to 127.0.0.1
    port = server.port
    try:
        body = {"prompt": "abc", "max_tokens": 2}
        for host in (
            f"evil.example:{port}",
            "evil.example",
            f"127.0.0.1:{port}.evil.example",
            f"localhost:{port + 1}",
            f"evil.example:{port}@127.0.0.1",
            "127.0.0.2",
            "",
        ):
            for method, path in (
                ("GET", "/health"),
                ("GET", "/metrics"),
                ("GET", "/v1/models"),
                ("POST", "/v1/completions"),
            ):
                r = httpx.request(
                    method,
                    server.url + path,
                    headers={"Host": host},
                    json=body if method == "POST" else None,
                    timeout=30,
                )
                err = assert_openai_error(r, 403)
                assert err["code"] == "host_not_allowed" and "--allow-origin" in err["message"], (host, err)
        for host in (f"127.0.0.1:{port}", f"localhost:{port}", "localhost", f"[::1]:{port}", f"LocalHost:{port}"):
            assert httpx.get(server.url + "/v1/models", headers={"Host": host}).status_code == 200, host
        for origin in (
            "http://evil.example",
            f"http://evil.example:{port}",
            "null",
            f"http://localhost:{port + 1}",
            f"https://127.0.0.1:{port}",
            "http://127.0.0.1",
            "not an origin",
        ):
            r = httpx.post(server.url + "/v1/completions", headers={"Origin": origin}, json=body, timeout=30)
            err = assert_openai_error(r, 403)
            assert err["code"] == "origin_not_allowed", (origin, err)
        # the server's own origin (FastAPI's /docs page) and clients that send no Origin are answered
        r = httpx.post(server.url + "/v1/completions", headers={"Origin": f"http://127.0.0.1:{port}"}, json=body)
        assert r.status_code == 200, r.text
        assert client(server).completions.create(model="tiny", prompt="abc", max_tokens=2).choices
        assert metric(server, "loosespec:http_requests_total", endpoint="/v1/completions", status="403") >= 14
    finally:
        server.close()


def test_allow_origin(tiny):
    from loosespec.serve.access import parse_allow_origins

    assert parse_allow_origins(["http://ui.example:3000/, gpu-box.lan", "*", "gpu-box.lan"]) == (
        "http://ui.example:3000",
        "gpu-box.lan",
        "*",
    )
    for bad in ("http://ui.example/app", "http://", "a b:x"):
        with pytest.raises(ValueError, match="--allow-origin"):
            parse_allow_origins([bad])
    allowed = parse_allow_origins(["http://ui.example:3000", "gpu-box.lan"])
    server = _server_on(tiny, api_key=KEY, allow_origins=allowed)
    port, auth = server.port, {"Authorization": f"Bearer {KEY}"}
    body = {"prompt": "abc", "max_tokens": 2}
    ui = {"Origin": "http://ui.example:3000"}
    try:
        # a browser at the listed origin: its preflight (which carries no key) is answered, then its requests
        r = httpx.options(
            server.url + "/v1/chat/completions",
            headers={
                **ui,
                "Access-Control-Request-Method": "POST",
                "Access-Control-Request-Headers": "authorization,content-type",
            },
        )
        assert r.status_code == 200, r.text
        assert r.headers["access-control-allow-origin"] in ("*", "http://ui.example:3000")
        assert "authorization" in r.headers["access-control-allow-headers"].lower()
        r = httpx.post(server.url + "/v1/completions", headers={**ui, **auth}, json=body, timeout=60)
        assert r.status_code == 200 and r.headers["access-control-allow-origin"], r.text
        assert "x-loosespec-method" in r.headers["access-control-expose-headers"].lower()
        assert_openai_error(httpx.post(server.url + "/v1/completions", headers=ui, json=body), 401)  # key still needed
        # a listed host name: requests addressed to it, and pages on it (any scheme, any port)
        assert httpx.get(server.url + "/health", headers={"Host": f"gpu-box.lan:{port}"}).status_code == 200
        assert httpx.get(server.url + "/health", headers={"Host": "ui.example"}).status_code == 200
        assert httpx.get(server.url + "/health", headers={"Origin": "https://gpu-box.lan:8443"}).status_code == 200
        # nothing else
        for headers, code in (
            ({"Origin": "http://ui.example:3001"}, "origin_not_allowed"),
            ({"Origin": "http://evil.example"}, "origin_not_allowed"),
            ({"Host": "evil.example"}, "host_not_allowed"),
        ):
            r = httpx.options(
                server.url + "/v1/completions", headers={**headers, "Access-Control-Request-Method": "POST"}
            )
            assert assert_openai_error(r, 403)["code"] == code
            assert assert_openai_error(httpx.get(server.url + "/health", headers=headers), 403)["code"] == code
    finally:
        server.close()
    # '*' accepts any Host and Origin
    server = _server_on(tiny, allow_origins=("*",))
    try:
        r = httpx.get(server.url + "/v1/models", headers={"Host": "evil.example", "Origin": "http://evil.example"})
        assert r.status_code == 200
    finally:
        server.close()
    # a wildcard bind is reachable by names the server cannot know: the Host is not checked there; Origin still is
    server = _server_on(tiny, host="0.0.0.0")
    try:
        assert httpx.get(server.url + "/health", headers={"Host": "gpu-box.lan:8000"}).status_code == 200
        r = httpx.get(server.url + "/health", headers={"Host": "gpu-box.lan:8000", "Origin": "http://evil.example"})
        assert assert_openai_error(r, 403)["code"] == "origin_not_allowed"
    finally:
        server.close()


# ---------------------------------------------------------------------------------------------
# The serve command
# ---------------------------------------------------------------------------------------------

ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}


def test_serve_help_and_bad_method():
    from conftest import run_cli

    p = run_cli("serve", "--help")
    assert p.returncode == 0
    flat = " ".join(p.stdout.split())
    for m in ("fly", "specguard"):
        at = flat.index(f"{m}: ")
        assert "LOSSY" in flat[at : at + 400], m
    for opt in (
        "--host",
        "--port",
        "--api-key",
        "--max-queue",
        "127.0.0.1",
        "--allow-origin",
        "DNS rebinding",
        "--stall-timeout",
        "--shutdown-timeout",
    ):
        assert opt in flat
    p = run_cli("serve", "--method", "magic", "--target", "smollm2-135m-instruct")
    assert p.returncode == 2 and "Traceback" not in p.stderr
    assert p.stderr.strip().startswith("loosespec: error:") and "magic" in p.stderr
    for args, words in (
        (("--allow-origin", "http://ui.example/app"), "--allow-origin 'http://ui.example/app'"),
        (("--shutdown-timeout", "-1"), "--shutdown-timeout"),
        (("--stall-timeout", "nan"), "--stall"),
    ):
        p = run_cli("serve", *args)  # refused before any model is loaded
        assert p.returncode == 2 and "Traceback" not in p.stderr and words in p.stderr, p.stderr


def test_serve_without_server_extra():
    code = (
        "import sys; sys.modules['fastapi'] = None; sys.argv = ['loosespec', 'serve']; "
        "from loosespec.cli import main; main()"
    )
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=ENV, timeout=300)
    assert p.returncode == 2 and "pip install 'loosespec[server]'" in p.stderr, p.stderr


def test_serve_command_end_to_end(tiny_dir):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "loosespec.cli",
            "serve",
            "--target",
            str(tiny_dir / "target"),
            "--draft",
            str(tiny_dir / "draft"),
            "--dtype",
            "float32",
            "--device",
            "cpu",
            "--port",
            str(port),
            "--served-model-name",
            "tiny",
            "--api-key",
            KEY,
            "--log-level",
            "warning",
            "--allow-origin",
            "gpu-box.lan",
            "--stall-timeout",
            "60",
            "--shutdown-timeout",
            "2",
        ],
        env=ENV,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        url = f"http://127.0.0.1:{port}"

        def up():
            assert proc.poll() is None, proc.communicate()
            try:
                return httpx.get(url + "/health", timeout=2).status_code == 200
            except httpx.TransportError:
                return False

        _wait_for(up, timeout=120, what="loosespec serve")
        c = openai.OpenAI(base_url=url + "/v1", api_key=KEY, max_retries=0)
        r = c.completions.create(model="tiny", prompt="abc", max_tokens=5, extra_body={"method": "fly"})
        assert r.model_extra["metrics"]["speculative_decoding"]["method"] == "fly"
        assert r.model_extra["metrics"]["speculative_decoding"]["drafter"] == "mla"
        assert httpx.get(url + "/health").json()["stall_timeout_s"] == 60
        assert httpx.get(url + "/health", headers={"Host": f"gpu-box.lan:{port}"}).status_code == 200
        assert assert_openai_error(httpx.get(url + "/health", headers={"Host": f"evil.example:{port}"}), 403)
        # SIGTERM with a generation running: it is answered at the 2 s deadline and the process exits
        with httpx.Client(timeout=60) as h:
            with h.stream(
                "POST",
                url + "/v1/completions",
                headers={"Authorization": f"Bearer {KEY}"},
                json={"prompt": "x", "max_tokens": 1000, "method": "ar", "stream": True, "stop": ["\x00never"]},
            ) as running:
                lines = running.iter_lines()
                next(line for line in lines if line.startswith("data: {"))
                proc.terminate()
                start = time.monotonic()
                for _ in lines:  # the stream ends: its last events, or the deadline's error
                    pass
        assert proc.wait(timeout=20) is not None and time.monotonic() - start < 15
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def test_a_request_takes_vllms_speculative_config(tiny):
    """speculative_config in a request: vLLM's keys as the request's knobs; a bad one is a 400 naming the key."""
    auth = {"Authorization": f"Bearer {KEY}"}

    def post(**body):
        body = {"model": "tiny", "prompt": "abcabcabc", "max_tokens": 8, "adaptive_draft_length": False, **body}
        return httpx.post(tiny.url + "/v1/completions", headers=auth, json=body, timeout=60)

    r = post(speculative_config={"method": "ngram", "num_speculative_tokens": 3, "rejection_sample_method": "fly"})
    assert r.status_code == 200, r.text
    spec = r.json()["metrics"]["speculative_decoding"]
    assert (spec["method"], spec["drafter"], spec["lossy"]) == ("fly", "ngram", True)
    assert spec["num_draft_tokens"] <= 3 * spec["num_drafts"]  # K = 3
    draft = tiny.engine.draft.name  # the server's own draft model may be named
    r = post(speculative_config={"method": "draft_model", "model": draft, "num_speculative_tokens": 2})
    assert r.status_code == 200, r.text
    spec = r.json()["metrics"]["speculative_decoding"]
    assert spec["drafter"] == "model" and spec["draft_forwards"] >= 1
    assert spec["num_draft_tokens"] <= 2 * spec["num_drafts"]
    for body, param, words in (
        ({"speculative_config": {"method": "eagle"}}, "speculative_config.method", "'eagle'"),
        ({"speculative_config": {"num_lookahead_slots": 1}}, "speculative_config.num_lookahead_slots", "accepts"),
        (
            {"speculative_config": {"num_speculative_tokens": 0}},
            "speculative_config.num_speculative_tokens",
            "num_speculative_tokens must be >= 1",
        ),
        (
            {"num_draft_tokens": 4, "speculative_config": {"num_speculative_tokens": 5}},
            "speculative_config.num_speculative_tokens",
            "num_speculative_tokens is 5 but num_draft_tokens is 4",
        ),
        ({"speculative_config": {"model": "another/draft"}}, "speculative_config.model", "'another/draft'"),
        ({"speculative_config": "ngram"}, "speculative_config", "dict"),
    ):
        err = assert_openai_error(post(**body), 400)
        assert err["param"] == param and words in err["message"], (body, err)


def test_serve_takes_speculative_config():
    from conftest import run_cli

    p = run_cli("serve", "--help")
    flat = " ".join(p.stdout.split())
    assert "--speculative-config" in flat and "vLLM's speculative_config" in flat  # rich may clip the rest
    p = run_cli("serve", "--speculative-config", '{"method": "mtp"}')  # refused before any model is loaded
    assert p.returncode == 2 and "Traceback" not in p.stderr, p.stderr
    assert "--speculative-config method 'mtp'" in p.stderr, p.stderr
    p = run_cli("serve", "--num-draft-tokens", "4", "--speculative-config", '{"num_speculative_tokens": 6}')
    assert p.returncode == 2 and "--num-draft-tokens is 4" in p.stderr, p.stderr
