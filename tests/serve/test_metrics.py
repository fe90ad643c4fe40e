"""The server's Prometheus metrics (:class:`loosespec.serve.metrics.Metrics`) and per-response block
(:func:`loosespec.serve.metrics.speculative_metrics`), without a model."""

from __future__ import annotations

from types import SimpleNamespace

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from loosespec.config import DecodeConfig
from loosespec.decode.stats import Stats
from loosespec.serve.metrics import Metrics, speculative_metrics


def fly_stats() -> Stats:
    s = Stats(prompt_tokens=5, wall_s=0.5)
    s.record_round(drafted=4, accepted=2, emitted=3, events={"fly_deferred": 1})
    s.record_round(drafted=0, accepted=0, emitted=1)
    s.record_round(drafted=4, accepted=4, emitted=5)
    return s


def samples(metrics: Metrics) -> list:
    text = generate_latest(metrics.registry).decode()
    return [(f.name, s) for f in text_string_to_metric_families(text) for s in f.samples]


def test_every_metric_carries_the_served_model_name():
    m = Metrics("my-served-model")
    job = SimpleNamespace(cfg=SimpleNamespace(method="fly"))
    m.record(job, fly_stats())  # every per-method counter, the per-position one, the rule counters
    m.requests.labels("/v1/completions", "200").inc()
    m.finished.labels("fly", "length").inc()
    m.latency.labels("/v1/completions").observe(0.7)
    m.cancelled.inc()
    m.failed.inc()
    m.waiting.set(2)
    m.running.set(1)
    m.queue_time.observe(0.01)
    m.ttft.observe(0.2)
    m.sg_steps.inc()
    m.sg_accepted.inc()
    got = samples(m)
    families = {name for name, _ in got}
    assert all(name.startswith("loosespec:") for name in families)
    assert {"loosespec:fly_deferred", "loosespec:specguard_steps", "loosespec:request_queue_time_seconds"} <= families
    # vLLM's label name (vllm/v1/metrics/loggers.py: model_name=<served model name>) on each sample, none without
    assert {s.labels.get("model_name") for _, s in got} == {"my-served-model"}
    by = {(s.name, tuple(sorted(s.labels.items()))): s.value for _, s in got}
    mine = ("model_name", "my-served-model")
    assert by[("loosespec:spec_decode_num_drafts_total", (("method", "fly"), mine))] == 2
    assert by[("loosespec:spec_decode_num_accepted_tokens_total", (("method", "fly"), mine))] == 6
    assert (
        by[("loosespec:spec_decode_num_accepted_tokens_per_pos_total", (("method", "fly"), mine, ("position", "3")))]
        == 1
    )
    assert by[("loosespec:http_requests_total", (("endpoint", "/v1/completions"), mine, ("status", "200")))] == 1
    assert by[("loosespec:requests_cancelled_total", (mine,))] == 1
    assert by[("loosespec:num_requests_waiting", (mine,))] == 2


def test_an_unlabelled_metric_shows_from_the_start():
    got = dict((s.name, s) for _, s in samples(Metrics("m")))
    assert got["loosespec:requests_failed_total"].value == 0
    assert got["loosespec:requests_failed_total"].labels == {"model_name": "m"}


def test_the_response_block_and_the_summary_agree_on_vllms_names():
    s = fly_stats()
    spec = speculative_metrics(s, DecodeConfig.create("fly", "ngram"))
    d = s.to_dict()
    for name in ("num_drafts", "num_draft_tokens", "num_accepted_tokens", "num_accepted_tokens_per_pos"):
        assert spec[name] == d[name], name
    assert (spec["num_drafts"], spec["num_draft_tokens"], spec["num_accepted_tokens"]) == (2, 8, 6)
    assert spec["mean_acceptance_length"] == 1 + 6 / 2 and spec["num_rounds"] == 3
