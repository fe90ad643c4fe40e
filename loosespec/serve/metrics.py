"""Prometheus metrics (:class:`Metrics`, vLLM's names under ``loosespec:``) and the per-response
``metrics.speculative_decoding`` block (:func:`speculative_metrics`)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from loosespec.config import DecodeConfig
from loosespec.methods import ALL_COUNTERS, METHODS

_LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 30, 60, 120, 300, 600)
# the label naming the served model on every metric: vLLM's (its PrometheusStatLogger in vllm/v1/metrics/loggers.py
# labels each metric model_name=<served model name>, engine=<index>)
MODEL_NAME_LABEL = "model_name"


class _ForModel:
    """A metric family whose first label is the served model's name: ``labels(*others)`` fills it in."""

    def __init__(self, family, model_name: str):
        self.family, self.model_name = family, model_name

    def labels(self, *values: str):
        return self.family.labels(self.model_name, *values)


def _for_model(kind, model_name: str):
    """``kind`` (Counter, Gauge, Histogram) with ``model_name`` as its first label. A metric with no other label
    is its one child (``inc``, ``set``, ``observe`` as before, shown from the start); one with others is a
    :class:`_ForModel` whose ``labels`` takes them."""

    def make(name: str, documentation: str, labelnames=(), **kw):
        family = kind(name, documentation, (MODEL_NAME_LABEL, *labelnames), **kw)
        return _ForModel(family, model_name) if labelnames else family.labels(model_name)

    return make


class Metrics:
    """Prometheus metrics in the app's own registry (not the process-global one).

    Names follow vLLM's (``vllm:prompt_tokens``, ``vllm:spec_decode_num_drafts``, ...) under a
    ``loosespec:`` prefix, with vLLM's definitions: the speculative-decoding counters are counts
    (drafts, draft tokens, accepted tokens, accepted tokens per draft position), and rates are
    derived from them as vLLM derives them (acceptance rate = accepted / draft tokens, mean
    acceptance length = 1 + accepted / drafts). Metrics vLLM has no name for keep loosespec's own.
    Every metric carries vLLM's ``model_name`` label, the served model name (``model_name``), before its own.
    """

    def __init__(self, model_name: str):
        r = self.registry = CollectorRegistry()
        self.model_name = model_name
        counter, gauge, histogram = (_for_model(kind, model_name) for kind in (Counter, Gauge, Histogram))
        m = ("method",)
        p = "loosespec:"
        self.requests = counter(
            p + "http_requests",
            "HTTP requests to /v1/* by endpoint and status code",
            ("endpoint", "status"),
            registry=r,
        )
        self.finished = counter(
            p + "request_success",
            "Generations run to the end, by method and finish reason (vLLM's vllm:request_success)",
            ("method", "finished_reason"),
            registry=r,
        )
        self.cancelled = counter(
            p + "requests_cancelled",
            "Generations stopped (or dropped from the queue) because the client disconnected",
            registry=r,
        )
        self.failed = counter(p + "requests_failed", "Generations that ended with an error", registry=r)
        self.waiting = gauge(p + "num_requests_waiting", "Requests waiting for the worker", registry=r)
        self.running = gauge(p + "num_requests_running", "Generations running (0 or 1)", registry=r)
        self.prompt_tokens = counter(p + "prompt_tokens", "Prompt tokens processed", m, registry=r)
        self.generation_tokens = counter(p + "generation_tokens", "Tokens generated", m, registry=r)
        self.num_drafts = counter(
            p + "spec_decode_num_drafts",
            "Rounds that drafted at least one token (an accepted SpecGuard step counts as one)",
            m,
            registry=r,
        )
        self.num_draft_tokens = counter(p + "spec_decode_num_draft_tokens", "Draft tokens proposed", m, registry=r)
        self.num_accepted_tokens = counter(
            p + "spec_decode_num_accepted_tokens", "Draft tokens accepted", m, registry=r
        )
        self.accepted_per_pos = counter(
            p + "spec_decode_num_accepted_tokens_per_pos",
            "Draft tokens accepted at each draft position (0-based)",
            ("method", "position"),
            registry=r,
        )
        # each rule counter a method of the registry reports (loosespec.methods), by method
        self.rule_counters = {
            name: counter(
                p + name,
                f"{name} summed over rounds (the rule's own counter; see loosespec.decode.stats)",
                m,
                registry=r,
            )
            for name in ALL_COUNTERS
        }
        self.sg_steps = counter(p + "specguard_steps", "SpecGuard (lossy): steps scored", registry=r)
        self.sg_accepted = counter(
            p + "specguard_accepted_steps", "SpecGuard (lossy): draft steps accepted", registry=r
        )
        self.latency = histogram(
            p + "e2e_request_latency_seconds",
            "Arrival to last token",
            ("endpoint",),
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.queue_time = histogram(
            p + "request_queue_time_seconds", "Arrival to start of generation", buckets=_LATENCY_BUCKETS, registry=r
        )
        self.ttft = histogram(
            p + "time_to_first_token_seconds", "Arrival to first committed token", buckets=_LATENCY_BUCKETS, registry=r
        )
        self.generation_time = histogram(
            p + "request_inference_time_seconds",
            "Generation wall time (prefill + decode)",
            m,
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )

    def record(self, job, stats) -> None:
        """Token-level counters of one generation, finished or not (called from the worker with its
        :class:`loosespec.serve.worker.Job`, which is not imported here: the worker imports this module)."""
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
        "method": cfg.method,
        "drafter": cfg.drafter,
        "lossy": cfg.lossy,
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
    for k in (
        *ALL_COUNTERS,
        "steps",
        "accepted_steps",
        "target_steps",
        "skipped_steps",
        "attempts_by_k",
        "candidates_drafted",
        "step_accept_rate",
        "mean_grounding",
        "mean_confidence",
        "mean_score",
    ):  # the rules' counters (FLy's), SpecGuard's steps
        if k in d:
            spec[k if k.startswith("fly_") else f"sg_{k}"] = d[k]
    return spec
