"""Calibrating SpecGuard's threshold tau, weight beta and confidence variant on a public set.

The papers publish no tau. ``loosespec calibrate --method specguard --dataset gsm8k-train --limit N``
runs SpecGuard with tau above 1, so the target writes every step (draft-assisted, exact: the
output is the target's own greedy output) while every step's chosen candidate is still drafted
and scored. Calibrate on a split the benchmarks never use: ``gsm8k-train`` (GSM8K's train split),
while ``loosespec bench --dataset gsm8k`` reads the test split.

Each step gets two labels:

- ``agrees``: the target wrote exactly the candidate (strict: a reworded but equivalent step is a
  disagreement);
- ``target_prefers``: the target's own preference, read with one teacher-forced target forward per
  step: the candidate's mean token log-probability under the target, given the same context, is
  within ``margin`` nats of the mean log-probability of the step the target wrote itself
  (``preference_gap = lp(candidate) - lp(own) >= -margin``). It asks whether the target finds the
  draft's step about as likely as its own, not whether the words match.

From the step records :func:`analyse` reports the ROC AUC of C (both variants: ``min`` and
``mean``), G and S against each label, the rank correlation of each with the continuous preference
gap, and the length bias of each signal (its rank correlation with the step's length; exp(min
log-prob) falls with length by construction). It then chooses the confidence variant and beta that
maximise S's AUC against ``target_prefers`` and the tau that accepts the share of steps the target
prefers (:func:`propose_tau`). The selection variant (``--sg-select``) changes which candidate is
scored, so it is compared by calibrating once per variant.

The per-problem step records are appended to ``<out>.steps.jsonl`` as each problem finishes, so a
calibration resumes where it stopped and ``--limit`` can grow.
"""

from __future__ import annotations

import dataclasses
import json
import statistics
from collections.abc import Sequence
from pathlib import Path

import torch

from loosespec.config import DecodeConfig
from loosespec.eval.signal_stats import auc_ci95, propose_tau, rank_correlation, roc_auc  # noqa: F401 (re-exported)
from loosespec.eval.specguard_diag import (
    BETAS,
    add_grounding_variants,
    diagnose,
    format_diagnosis,
    format_heldout,
    heldout,
)
from loosespec.presets import SG_RULES


def _quantiles(values: Sequence[float]) -> dict | None:
    if not values:
        return None
    q = statistics.quantiles(values, n=10, method="inclusive") if len(values) > 1 else [values[0]] * 9
    return {
        "n": len(values),
        "mean": round(statistics.fmean(values), 4),
        "min": round(min(values), 4),
        "p10": round(q[0], 4),
        "p50": round(q[4], 4),
        "p90": round(q[8], 4),
        "max": round(max(values), 4),
    }


PREFERENCE_MARGIN = 0.1  # nats per token: exp(-0.1) = 0.905, the candidate about as likely as the target's own step


@torch.inference_mode()
def target_preference(
    lm, prompt_ids: torch.Tensor, output_ids: Sequence[int], steps: list[dict], margin: float = PREFERENCE_MARGIN
) -> None:
    """Add ``lp_candidate``, ``lp_own``, ``preference_gap`` and ``target_prefers`` to each step record.

    ``lm``: the target's :class:`~loosespec.decode.kv.CachedLM`; ``steps`` in order, each with its
    ``candidate`` (target ids) and ``written`` (tokens the target committed). Per step: one forward over
    the candidate after the step's context, then one over the target's own step (which is the next
    step's context), so the cache is reused throughout."""
    out = torch.tensor(list(output_ids), dtype=torch.long)
    pos = 0
    for st in steps:
        ctx = torch.cat([prompt_ids, out[:pos]])
        own = out[pos : pos + st["written"]]
        lps = []
        for toks in (torch.tensor(st["candidate"], dtype=torch.long), own):
            if toks.numel() == 0:
                lps.append(None)
                continue
            logits = lm.logits(torch.cat([ctx, toks]), rows=toks.numel() + 1)[:-1]  # row i predicts toks[i]
            lp = torch.log_softmax(logits, dim=-1).gather(1, toks.to(logits.device)[:, None])
            lps.append(float(lp.mean()))
        st["lp_candidate"], st["lp_own"] = lps
        gap = None if None in lps else lps[0] - lps[1]
        st["preference_gap"] = None if gap is None else round(gap, 6)
        st["target_prefers"] = None if gap is None else gap >= -margin
        pos += st["written"]


def _signal(step: dict, name: str, beta: float | None = None) -> float:
    if name == "G":
        return step["grounding"]
    if name in ("C_min", "C_mean"):
        return step["confidence_" + name[2:]]
    c = step["confidence_" + name.split("_")[1]]  # "S_min" / "S_mean"
    return beta * c + (1 - beta) * step["grounding"]


def analyse(steps: Sequence[dict], beta: float, accept_rate: float | None = None) -> dict:
    """AUC of every signal against both labels, rank correlation with the preference gap, length bias;
    the choice of confidence variant, beta and tau (see the module docstring)."""
    steps = [s for s in steps if s.get("target_prefers") is not None and s.get("agrees") is not None]
    if not steps:
        raise ValueError("no scored steps with both labels to calibrate on")
    agrees = [bool(s["agrees"]) for s in steps]
    prefers = [bool(s["target_prefers"]) for s in steps]
    gaps = [s["preference_gap"] for s in steps]
    lengths = [s["tokens"] for s in steps]

    problems = [s.get("problem", "") for s in steps]

    def row(values):
        auc_a, auc_p = roc_auc(values, agrees), roc_auc(values, prefers)
        return {
            "auc_agrees": None if auc_a is None else round(auc_a, 4),
            "auc_target_prefers": None if auc_p is None else round(auc_p, 4),
            "auc_target_prefers_ci95": auc_ci95(values, prefers, problems),
            "rho_preference_gap": rank_correlation(values, gaps),
            "rho_length": rank_correlation(values, lengths),
        }

    table = {name: row([_signal(s, name) for s in steps]) for name in ("C_min", "C_mean", "G")}
    for variant in ("min", "mean"):
        table[f"S_{variant} (beta {beta})"] = row([_signal(s, f"S_{variant}", beta) for s in steps])
    grid = []
    for variant in ("min", "mean"):
        for b in BETAS:
            auc = roc_auc([_signal(s, f"S_{variant}", b) for s in steps], prefers)
            grid.append(
                {"sg_confidence": variant, "sg_beta": b, "auc_target_prefers": None if auc is None else round(auc, 4)}
            )
    ranked = sorted(
        (g for g in grid if g["auc_target_prefers"] is not None),
        key=lambda g: (-g["auc_target_prefers"], g["sg_confidence"] != "mean", abs(g["sg_beta"] - beta)),
    )
    choice = ranked[0] if ranked else {"sg_confidence": "min", "sg_beta": beta}
    chosen = [_signal(s, "S_" + choice["sg_confidence"], choice["sg_beta"]) for s in steps]
    rate = (sum(prefers) / len(prefers)) if accept_rate is None else accept_rate
    tau = propose_tau(chosen, prefers, rate)
    return {
        "steps": len(steps),
        "agree_rate": round(sum(agrees) / len(steps), 4),
        "target_prefers_rate": round(sum(prefers) / len(steps), 4),
        "signals": table,
        "grid": grid,
        "choice": {**choice, "sg_tau": tau["tau"], "at_tau": tau},
    }


def analyse_report(report: dict) -> dict:
    """:func:`analyse` of a calibration report's step records, each labelled with the report's margin
    (records resumed from an earlier run carry the margin of that run)."""
    for s in report["steps"]:
        if s.get("preference_gap") is not None:
            s["target_prefers"] = s["preference_gap"] >= -report["margin"]
    return analyse(report["steps"], report["config"]["sg_beta"], report.get("accept_rate"))


def _done(path: Path | None) -> dict[str, dict]:
    if path is None or not path.exists():
        return {}
    out = {}
    for line in path.read_text().splitlines():
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            continue  # a torn last line (killed mid-write): that problem runs again
        out[rec["problem"]] = rec
    return out


def calibrate_specguard(
    engine,
    problems,
    cfg: DecodeConfig,
    accept_rate: float | None = None,
    progress: bool = True,
    steps_file: Path | None = None,
    margin: float = PREFERENCE_MARGIN,
) -> dict:
    """Run every problem with all steps written by the target, label each step, analyse the scores.
    ``steps_file``: per-problem step records, appended as each problem finishes and read back to resume."""
    from tqdm.auto import tqdm

    from loosespec.decode.text import encode_prompt

    run_cfg = dataclasses.replace(cfg, sg_tau=1.01, sg_on_reject="draft-assisted", sg_verify="exact", sg_steps="always")
    done = _done(steps_file)
    for p in tqdm([p for p in problems if p.id not in done], desc="calibrating", unit="problem", disable=not progress):
        ids = encode_prompt(engine.tokenizer, p.prompt)
        r = engine.generate(ids, run_cfg)
        steps = [dict(s) for s in r.stats.steps]
        target_preference(engine.target_lm, ids, r.token_ids, steps, margin)
        if engine.bridge is None:  # the candidates' ids are the target's: the variants can be read from them
            add_grounding_variants(engine.draft_lm.model, ids, r.token_ids, steps)
        done[p.id] = {"problem": p.id, "new_tokens": len(r.token_ids), "steps": steps}
        if steps_file is not None:
            with steps_file.open("a") as f:
                f.write(json.dumps(done[p.id]) + "\n")
                f.flush()
    steps = [{"problem": p.id, **s} for p in problems if p.id in done for s in done[p.id]["steps"]]
    scores = [s["score"] for s in steps]
    labels = [bool(s["agrees"]) for s in steps]
    report = {
        "proposal": propose_tau(scores, labels, accept_rate),
        "scores": {
            "all": _quantiles(scores),
            "agreeing": _quantiles([s for s, y in zip(scores, labels) if y]),
            "disagreeing": _quantiles([s for s, y in zip(scores, labels) if not y]),
        },
        "problems": len(problems),
        "margin": margin,
        "steps": steps,
        "accept_rate": accept_rate,
        "config": {**engine.config_dict(run_cfg, raw=False), "sg_tau": None},
    }
    report["analysis"] = analyse_report(report)
    return report


def diagnosis_sections(report: dict) -> str:
    """The grounding diagnosis and the held-out calibration (:mod:`loosespec.eval.specguard_diag`) of a report
    whose step records carry grounding variants; "" for one that predates them."""

    if not any(s.get("g_variants") for s in report["steps"]):
        return ""
    out = "\n\n**What G measures**\n\n" + format_diagnosis(diagnose(report["steps"]))
    try:
        rule = SG_RULES[((report.get("config") or {}).get("sg_select") or "embedding", "weighted")]
        default = {k: rule[k] for k in ("sg_confidence", "sg_beta", "sg_tau")}
        return out + "\n\n**Held-out calibration**\n\n" + format_heldout(heldout(report["steps"], default=default))
    except ValueError as e:  # too few problems or labels to hold some out
        return out + f"\n\nNo held-out calibration: {e}."


def format_analysis(report: dict) -> str:
    """The calibration as markdown: signals against both labels, and the choice."""
    a = report["analysis"]
    f = lambda v: "-" if v is None else f"{v:.3f}"  # noqa: E731
    lines = [
        f"{a['steps']} steps of {report['problems']} problems; the target wrote exactly the candidate in "
        f"{a['agree_rate']:.1%}, preferred it (gap >= -{report['margin']} nats/token) in "
        f"{a['target_prefers_rate']:.1%}.",
        "",
        "| signal | AUC, agrees | AUC, target prefers [95% CI] | rho with preference gap | rho with step length |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    for name, r in a["signals"].items():
        ci = r.get("auc_target_prefers_ci95")
        ci = f" [{ci[0]:.3f}, {ci[1]:.3f}]" if ci else ""
        lines.append(
            f"| {name} | {f(r['auc_agrees'])} | {f(r['auc_target_prefers'])}{ci} | "
            f"{f(r['rho_preference_gap'])} | {f(r['rho_length'])} |"
        )
    best = {}
    for g in a.get("grid", []):
        if g["auc_target_prefers"] is not None and (
            g["sg_confidence"] not in best or g["auc_target_prefers"] > best[g["sg_confidence"]]["auc_target_prefers"]
        ):
            best[g["sg_confidence"]] = g
    if best:
        lines += [
            "",
            "Best beta per confidence variant (AUC of S against target prefers, beta in 0, 0.1 .. 1): "
            + "; ".join(f"{v}: beta {g['sg_beta']} ({g['auc_target_prefers']:.3f})" for v, g in best.items())
            + ".",
        ]
    c = a["choice"]
    t = c["at_tau"]
    lines += [
        "",
        f"Choice (highest AUC against target prefers): sg_confidence {c['sg_confidence']}, "
        f"sg_beta {c['sg_beta']}, sg_tau {c['sg_tau']} (accepts {t['accept_rate']:.1%} of steps; precision "
        f"{f(t['precision'])}, recall {f(t['recall'])}).",
    ]
    cfg = report.get("config")
    if cfg:
        hw = cfg.get("hardware") or {}
        lines += [
            "",
            f"Run: `{report.get('command', 'loosespec calibrate')}`; target {cfg['target']['spec']}, draft "
            f"{cfg['draft']['spec']}, {(cfg.get('precision') or {}).get('name', cfg['target']['dtype'])}, "
            f"sg_select {cfg.get('sg_select')}, sg_first {cfg.get('sg_first', 'greedy')}, on {hw.get('cpu', '?')} ({' '.join(hw.get('cpu_flags', []))})"
            + (f", GPU {hw['gpu']}" if hw.get("gpu") else "")
            + ".",
        ]
    return "\n".join(lines) + diagnosis_sections(report)
