"""Calibrating SpecGuard's threshold tau on a public set.

The papers publish no tau. ``loosespec calibrate --method specguard --dataset gsm8k --limit N``
runs SpecGuard with tau above 1, so the target writes every step (draft-assisted, exact: the
output is the target's own greedy output) while every step's medoid candidate is still drafted
and scored. Each step then has a score S and a label: did the target write exactly the candidate
(``agrees``)? From those pairs :func:`propose_tau` picks the tau that accepts a chosen share of
steps (by default the share the target agreed with) and reports how well S separates agreeing
from disagreeing steps (precision and recall of the accepted set, ROC AUC).
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Sequence

from loosespec.config import DecodeConfig


def roc_auc(scores: Sequence[float], labels: Sequence[bool]) -> float | None:
    """P(score of a random agreeing step > score of a random disagreeing one), ties count half."""
    pos = [s for s, y in zip(scores, labels) if y]
    neg = [s for s, y in zip(scores, labels) if not y]
    if not pos or not neg:
        return None
    wins = sum((p > n) + 0.5 * (p == n) for p in pos for n in neg)
    return wins / (len(pos) * len(neg))


def propose_tau(scores: Sequence[float], labels: Sequence[bool], accept_rate: float | None = None) -> dict:
    """tau accepting ``accept_rate`` of the steps (the highest-scoring ones), with its quality.

    >>> propose_tau([0.9, 0.8, 0.4, 0.2], [True, True, False, False], 0.5)["tau"]
    0.8
    """
    if not scores:
        raise ValueError("no scored steps to calibrate on")
    agree_rate = sum(labels) / len(labels)
    rate = agree_rate if accept_rate is None else accept_rate
    ranked = sorted(scores, reverse=True)
    n_accept = round(rate * len(ranked))
    tau = ranked[n_accept - 1] if n_accept > 0 else ranked[0] + 1e-6  # accepted iff S >= tau
    accepted = [y for s, y in zip(scores, labels) if s >= tau]
    return {
        "tau": round(tau, 6),
        "requested_accept_rate": round(rate, 4),
        "accept_rate": round(len(accepted) / len(scores), 4),
        "precision": round(sum(accepted) / len(accepted), 4) if accepted else None,  # accepted steps that agree
        "recall": round(sum(accepted) / sum(labels), 4) if sum(labels) else None,  # agreeing steps accepted
        "agree_rate": round(agree_rate, 4),
        "roc_auc": None if (auc := roc_auc(scores, labels)) is None else round(auc, 4),
    }


def _quantiles(values: Sequence[float]) -> dict | None:
    if not values:
        return None
    q = statistics.quantiles(values, n=10, method="inclusive") if len(values) > 1 else [values[0]] * 9
    return {"n": len(values), "mean": round(statistics.fmean(values), 4), "min": round(min(values), 4),
            "p10": round(q[0], 4), "p50": round(q[4], 4), "p90": round(q[8], 4), "max": round(max(values), 4)}


def calibrate_specguard(engine, problems, cfg: DecodeConfig, accept_rate: float | None = None,
                        progress: bool = True) -> dict:
    """Run every problem with all steps written by the target; propose tau from the step records."""
    from tqdm.auto import tqdm

    run_cfg = dataclasses.replace(cfg, sg_tau=1.01, sg_on_reject="draft-assisted", sg_verify="exact")
    steps = []
    for p in tqdm(problems, desc="calibrating", unit="problem", disable=not progress):
        r = engine.generate(p.prompt, run_cfg)
        steps += [{"problem": p.id, **s} for s in r.stats.steps]
    scores = [s["score"] for s in steps]
    labels = [bool(s["agrees"]) for s in steps]
    return {
        "proposal": propose_tau(scores, labels, accept_rate),
        "scores": {"all": _quantiles(scores),
                   "agreeing": _quantiles([s for s, y in zip(scores, labels) if y]),
                   "disagreeing": _quantiles([s for s, y in zip(scores, labels) if not y])},
        "problems": len(problems),
        "steps": steps,
        "config": {**engine.config_dict(run_cfg, raw=False), "sg_tau": None},
    }
