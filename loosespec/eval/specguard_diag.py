"""What SpecGuard's grounding signal G measures, and SpecGuard's rule calibrated on steps it was not fitted on.

Issue 47: on the first calibration (241 GSM8K-train steps, ``results/calibration/specguard.md``) G's AUC against
"the target prefers the draft's step" was 0.451, worse than chance, and its rank correlation with step length
-0.79. Two readings: the attention rollout is not measuring what the seed means (mass on the first, "sink",
positions counts as grounding; the minimum over a step's tokens punishes long steps), or the signal does not
transfer to a 0.5B draft. :func:`grounding_variants` measures G several ways on the same step, so the step records
can tell them apart:

- ``rollout3``: attention rollout over the draft's last 3 layers, as SpecGuard's G
  (:func:`loosespec.verify.grounding.attention_rollout`); ``rollout_all``: over every layer;
- ``last``: the last layer's head-mean attention, no rollout; ``layer_mean``: each layer's, one value per layer;
- ``_nosink``: the mass on the context after the first :data:`SINK` positions, over the mass on every position
  after them (the sink's share left out of both);
- ``_min`` / ``_mean``: the minimum or the mean over the step's tokens (G is ``rollout3_min``).

Each value is the share of a step token's attention (or rollout) mass that lies on the context: the prompt and
the steps committed before it. One eager-attention forward of the draft over context + candidate, every layer's
head-mean map kept (``[layers, L, L]``).

:func:`diagnose` gives each variant's AUC against both labels (with a 95% interval from a bootstrap over problems)
and its rank correlation with step length. :func:`heldout` splits the problems in two (the first
:data:`FIT_SHARE` fit, the rest held out), chooses on the fit part, for each rule, the confidence variant, the
grounding variant and their thresholds, and scores the choice on the held-out part: the weighted rule
``S = beta C + (1 - beta) G >= tau`` (SpecGuard's implementation) and the seed's "both signals agree",
``C >= tau_c and G >= tau_g`` (``--sg-decision both``), each once over every grounding variant and once with
SpecGuard's own G (the one the step loop computes, so the one a default can use: :data:`loosespec.presets.SG_RULES`).
All are fitted to accept the share of fit steps the target prefers.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from loosespec.eval.signal_stats import auc_ci95, propose_tau, rank_correlation, roc_auc

SINK = 4  # the first positions that collect attention whatever the content (StreamingLLM's attention sinks)
FIT_SHARE = 0.6  # the first 60% of the problems choose; the rest only score the choice
SCALAR_VARIANTS = (
    "rollout3_min",
    "rollout3_mean",
    "rollout3_nosink_min",
    "rollout3_nosink_mean",
    "rollout_all_mean",
    "rollout_all_nosink_mean",
    "last_min",
    "last_mean",
    "last_nosink_mean",
)
CONFIDENCE_VARIANTS = ("min", "mean")
BETAS = tuple(round(0.1 * i, 1) for i in range(11))  # the weight grid of S = beta C + (1 - beta) G
THRESHOLD_QUANTILES = 40  # the AND rule's threshold grid: this many quantiles of each signal on the fit steps
# the G the step loop computes (loosespec.decode.steps.grounding): the only one a shipped rule can use
SPECGUARD_G = "rollout3_min"
# the held-out table's rules; the "SpecGuard's G" rows are what loosespec.presets.SG_RULES ships
WEIGHTED_ANY = "weighted (S = beta C + (1 - beta) G), any G variant"
WEIGHTED_SHIPPED = "weighted, SpecGuard's G"
BOTH_ANY = "both agree (C >= tau_c and G >= tau_g), any G variant"
BOTH_SHIPPED = "both agree, SpecGuard's G"
DEFAULTS_ROW = "the defaults, as they are (not refitted)"


def head_mean_attentions(model: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    """Every layer's attention probabilities of one forward over ``ids`` ([L] int64), averaged over heads:
    [layers, L, L], float32 on the CPU. No cache: the context rows are needed too (the rollout of a step row
    runs through them). Eager attention (the only one returning its maps), switched for this forward alone."""
    from loosespec.decode.steps import attention_modules, eager_attention

    mods = attention_modules(model)
    maps: list[torch.Tensor | None] = [None] * len(mods)

    def keep(i):
        def hook(module, args, out):
            if isinstance(out, tuple) and len(out) > 1 and isinstance(out[1], torch.Tensor):
                maps[i] = out[1][0].float().mean(dim=0).cpu()

        return hook

    handles = [m.register_forward_hook(keep(i)) for i, m in enumerate(mods)]
    device = next(model.parameters()).device
    try:
        with torch.inference_mode(), eager_attention(model):
            model(input_ids=ids[None].to(device), use_cache=False)
    finally:
        for h in handles:
            h.remove()
    if not maps or any(m is None for m in maps):
        raise RuntimeError("the draft model's attention modules returned no attention maps")
    return torch.stack(maps)


def _context_share(rows: torch.Tensor, ctx: int, sink: int | None) -> torch.Tensor:
    """Per row of ``rows`` ([S, L] attention or rollout of the step tokens): the mass on positions < ``ctx``; with
    ``sink``, the mass on ``sink <= j < ctx`` over the mass on ``j >= sink``."""
    if sink is None:
        return rows[:, :ctx].sum(dim=-1)
    return rows[:, sink:ctx].sum(dim=-1) / rows[:, sink:].sum(dim=-1).clamp_min(1e-12)


def grounding_variants(maps: torch.Tensor, ctx: int, sink: int = SINK) -> dict:
    """Every grounding variant of the step occupying positions ``ctx ..`` of ``maps`` ([layers, L, L] head-mean
    attention, :func:`head_mean_attentions`): :data:`SCALAR_VARIANTS` and ``layer_mean`` (per layer, first to
    last, the sink-free mean), rounded to 6 places."""
    from loosespec.verify.grounding import ROLLOUT_LAYERS, attention_rollout

    if not 0 < sink < ctx < maps.shape[-1]:
        raise ValueError(f"need 0 < sink ({sink}) < context ({ctx}) < sequence ({maps.shape[-1]})")
    out: dict = {}
    for name, rows in (
        ("rollout3", attention_rollout(maps[-ROLLOUT_LAYERS:, None])[ctx:]),
        ("rollout_all", attention_rollout(maps[:, None])[ctx:]),
        ("last", maps[-1, ctx:]),
    ):
        for tag, s in (("", None), ("_nosink", sink)):
            share = _context_share(rows, ctx, s)
            out[f"{name}{tag}_min"], out[f"{name}{tag}_mean"] = float(share.min()), float(share.mean())
    out = {k: round(v, 6) for k, v in out.items() if k in SCALAR_VARIANTS}
    out["layer_mean"] = [round(float(_context_share(m[ctx:], ctx, sink).mean()), 6) for m in maps]
    return out


def add_grounding_variants(model: torch.nn.Module, prompt_ids: torch.Tensor, output_ids, steps: list[dict]) -> None:
    """Add ``g_variants`` (:func:`grounding_variants`) to each step record of a calibration run, in order: step i's
    context is the prompt and the tokens the target committed before it (``written`` per step, as
    :func:`loosespec.eval.calibrate.target_preference` reads them), its candidate the draft's chosen one. Only
    for a draft sharing the target's tokenizer (the candidate's ids are the target's)."""
    out = torch.as_tensor(list(output_ids), dtype=torch.long)
    pos = 0
    for st in steps:
        ctx = torch.cat([prompt_ids.cpu(), out[:pos]])
        cand = torch.tensor(st["candidate"], dtype=torch.long)
        if cand.numel():
            maps = head_mean_attentions(model, torch.cat([ctx, cand]))
            st["g_variants"] = grounding_variants(maps, int(ctx.shape[0]))
        pos += st["written"]


# ---------------------------------------------------------------------------------------------
# Analysis of the step records
# ---------------------------------------------------------------------------------------------


def _labelled(steps: Sequence[dict]) -> list[dict]:
    return [s for s in steps if s.get("g_variants") and s.get("target_prefers") is not None]


def _row(values, prefers, agrees, lengths, problems) -> dict:

    auc_p, auc_a = roc_auc(values, prefers), roc_auc(values, agrees)
    return {
        "auc_target_prefers": None if auc_p is None else round(auc_p, 4),
        "auc_target_prefers_ci95": auc_ci95(values, prefers, problems),
        "auc_agrees": None if auc_a is None else round(auc_a, 4),
        "rho_length": rank_correlation(values, lengths),
    }


def diagnose(steps: Sequence[dict]) -> dict:
    """Per grounding variant (and per layer), against the labels: AUC with its interval, rank correlation with
    the step's length; the confidence variants beside them for scale. Steps without ``g_variants`` are left out."""
    steps = _labelled(steps)
    if not steps:
        raise ValueError("no step records with grounding variants and labels")
    prefers = [bool(s["target_prefers"]) for s in steps]
    agrees = [bool(s["agrees"]) for s in steps]
    lengths = [s["tokens"] for s in steps]
    problems = [s.get("problem", "") for s in steps]
    table = {v: _row([s["g_variants"][v] for s in steps], prefers, agrees, lengths, problems) for v in SCALAR_VARIANTS}
    for c in CONFIDENCE_VARIANTS:
        table[f"C_{c}"] = _row([s["confidence_" + c] for s in steps], prefers, agrees, lengths, problems)
    n_layers = len(steps[0]["g_variants"]["layer_mean"])
    layers = [
        _row([s["g_variants"]["layer_mean"][i] for s in steps], prefers, agrees, lengths, problems)
        for i in range(n_layers)
    ]
    informative = [
        v
        for v in SCALAR_VARIANTS
        if table[v]["auc_target_prefers_ci95"] and table[v]["auc_target_prefers_ci95"][0] > 0.5
    ]
    return {
        "steps": len(steps),
        "problems": len(set(problems)),
        "target_prefers_rate": round(sum(prefers) / len(steps), 4),
        "signals": table,
        "layers": layers,
        "informative": informative,
        "sink": SINK,
    }


def split_problems(steps: Sequence[dict], share: float = FIT_SHARE) -> tuple[list[dict], list[dict]]:
    """(fit, held-out) steps: the first ``share`` of the problems, in the order their steps come, and the rest."""
    order = list(dict.fromkeys(s.get("problem", "") for s in steps))
    fit = set(order[: max(1, math.floor(share * len(order)))])
    return [s for s in steps if s.get("problem", "") in fit], [s for s in steps if s.get("problem", "") not in fit]


def _quality(accepted: Sequence[bool], labels: Sequence[bool]) -> dict:
    """Accept rate, precision (accepted steps the target prefers) and recall (preferred steps accepted)."""
    import numpy as np

    a, y = np.asarray(accepted, dtype=bool), np.asarray(labels, dtype=bool)
    hits = int((a & y).sum())
    return {
        "accept_rate": round(float(a.mean()), 4) if len(a) else None,
        "precision": round(hits / int(a.sum()), 4) if a.any() else None,
        "recall": round(hits / int(y.sum()), 4) if y.any() else None,
    }


def _weighted(s: dict, conf: str, g: str, beta: float) -> float:
    return beta * s["confidence_" + conf] + (1 - beta) * s["g_variants"][g]


def _fit_weighted(
    fit: Sequence[dict], prefers: Sequence[bool], rate: float, groundings: Sequence[str] = SCALAR_VARIANTS
) -> dict:

    best = None
    for conf in CONFIDENCE_VARIANTS:
        for g in groundings:
            for beta in sorted(BETAS, reverse=True):
                auc = roc_auc([_weighted(s, conf, g, beta) for s in fit], prefers)
                # ties go to the first: the higher beta (less weight on G), then the order of the variants
                if auc is not None and (best is None or auc > best["fit_auc"] + 1e-12):
                    best = {"sg_confidence": conf, "grounding": g, "sg_beta": beta, "fit_auc": round(auc, 4)}
    tau = propose_tau(
        [_weighted(s, best["sg_confidence"], best["grounding"], best["sg_beta"]) for s in fit], prefers, rate
    )
    return {**best, "sg_tau": tau["tau"]}


def _fit_both(
    fit: Sequence[dict], prefers: Sequence[bool], rate: float, groundings: Sequence[str] = SCALAR_VARIANTS
) -> dict:
    """``C >= tau_c and G >= tau_g``: on a quantile grid of each signal, the pair accepting at most ``rate`` of the
    fit steps (and at least ``rate`` - 0.05) with the highest precision; ties to the higher accept rate."""
    import numpy as np

    best = None
    qs = np.linspace(0, 1, THRESHOLD_QUANTILES + 1)
    for conf in CONFIDENCE_VARIANTS:
        c = np.array([s["confidence_" + conf] for s in fit])
        for g in groundings:
            gv = np.array([s["g_variants"][g] for s in fit])
            for tc in np.unique(np.quantile(c, qs)):
                for tg in np.unique(np.quantile(gv, qs)):
                    q = _quality((c >= tc) & (gv >= tg), prefers)
                    if q["precision"] is None or not rate - 0.05 <= q["accept_rate"] <= rate + 1e-9:
                        continue
                    key = (q["precision"], q["accept_rate"])
                    if best is None or key > best["_key"]:
                        best = {
                            "sg_confidence": conf,
                            "grounding": g,
                            "tau_c": round(float(tc), 6),
                            "tau_g": round(float(tg), 6),
                            "_key": key,
                        }
    if best is None:
        return {}
    best.pop("_key")
    return best


def _fit_confidence_only(fit: Sequence[dict], prefers: Sequence[bool], rate: float) -> dict:

    aucs = {c: roc_auc([s["confidence_" + c] for s in fit], prefers) for c in CONFIDENCE_VARIANTS}
    conf = max(aucs, key=lambda c: -1 if aucs[c] is None else aucs[c])
    tau = propose_tau([s["confidence_" + conf] for s in fit], prefers, rate)
    return {"sg_confidence": conf, "sg_beta": 1.0, "sg_tau": tau["tau"], "fit_auc": round(aucs[conf], 4)}


def heldout(steps: Sequence[dict], share: float = FIT_SHARE, default: dict | None = None) -> dict:
    """Each rule chosen on the fit problems and scored on the held-out ones: precision, recall and accept rate
    against ``target_prefers`` (and, for the scored rules, AUC) on both parts. ``default``: a weighted rule
    already chosen (``sg_confidence``, ``sg_beta``, ``sg_tau``; G is SpecGuard's, ``rollout3_min``), scored on
    both parts as it is."""

    steps = _labelled(steps)
    fit, held = split_problems(steps, share)
    if not fit or not held:
        raise ValueError("too few problems to hold some out")
    y_fit = [bool(s["target_prefers"]) for s in fit]
    y_held = [bool(s["target_prefers"]) for s in held]
    if len(set(y_fit)) < 2:
        raise ValueError("the fit steps carry one label only: nothing to choose a threshold on")
    rate = sum(y_fit) / len(y_fit)
    rules = {}
    chosen = [
        (WEIGHTED_ANY, _fit_weighted(fit, y_fit, rate)),
        (WEIGHTED_SHIPPED, _fit_weighted(fit, y_fit, rate, (SPECGUARD_G,))),
        ("confidence alone (beta 1)", _fit_confidence_only(fit, y_fit, rate)),
    ]
    if default is not None:
        c = {"grounding": SPECGUARD_G, **default}
        c["fit_auc"] = round(
            roc_auc([_weighted(s, c["sg_confidence"], c["grounding"], c["sg_beta"]) for s in fit], y_fit), 4
        )
        chosen.append((DEFAULTS_ROW, c))
    for name, choice in chosen:

        def score(s, choice=choice):
            g = s["g_variants"][choice["grounding"]] if "grounding" in choice else 0.0
            return choice["sg_beta"] * s["confidence_" + choice["sg_confidence"]] + (1 - choice["sg_beta"]) * g

        rules[name] = {
            "choice": choice,
            "fit": {**_quality([score(s) >= choice["sg_tau"] for s in fit], y_fit), "auc": choice["fit_auc"]},
            "held_out": {
                **_quality([score(s) >= choice["sg_tau"] for s in held], y_held),
                "auc": None if (a := roc_auc([score(s) for s in held], y_held)) is None else round(a, 4),
            },
        }
    for name, groundings in ((BOTH_ANY, SCALAR_VARIANTS), (BOTH_SHIPPED, (SPECGUARD_G,))):
        both = _fit_both(fit, y_fit, rate, groundings)
        if not both:
            continue

        def accept(s, both=both):
            return (
                s["confidence_" + both["sg_confidence"]] >= both["tau_c"]
                and s["g_variants"][both["grounding"]] >= both["tau_g"]
            )

        rules[name] = {
            "choice": both,
            "fit": {**_quality([accept(s) for s in fit], y_fit), "auc": None},
            "held_out": {**_quality([accept(s) for s in held], y_held), "auc": None},
        }
    if DEFAULTS_ROW in rules:  # last, under the rules it is compared with
        rules[DEFAULTS_ROW] = rules.pop(DEFAULTS_ROW)
    problems = list(dict.fromkeys(s.get("problem", "") for s in steps))
    return {
        "fit_problems": len(problems) - len({s.get("problem", "") for s in held}),
        "held_out_problems": len({s.get("problem", "") for s in held}),
        "fit_steps": len(fit),
        "held_out_steps": len(held),
        "fit_target_prefers_rate": round(rate, 4),
        "held_out_target_prefers_rate": round(sum(y_held) / len(y_held), 4),
        "rules": rules,
    }


def _f(v, spec=".3f") -> str:
    return "-" if v is None else format(v, spec)


def _auc(r: dict) -> str:
    """A row's AUC against "target prefers" with its interval."""
    ci = r["auc_target_prefers_ci95"]
    return _f(r["auc_target_prefers"]) + (f" [{ci[0]:.3f}, {ci[1]:.3f}]" if ci else "")


def format_diagnosis(d: dict) -> str:
    """The diagnosis as markdown: one row per grounding variant (then the confidence variants), one per layer."""
    lines = [
        f"Grounding measured {len(SCALAR_VARIANTS)} ways on {d['steps']} steps of {d['problems']} problems (the "
        f"target prefers the draft's step in {d['target_prefers_rate']:.1%}); `_nosink`: the first {d['sink']} "
        'positions left out; `_min` / `_mean`: over the step\'s tokens. AUC against "target prefers" with a 95% '
        "interval (bootstrap over problems).",
        "",
        "| signal | AUC, target prefers [95% CI] | AUC, agrees | rho with step length |",
        "| --- | ---: | ---: | ---: |",
    ]
    for name, r in d["signals"].items():
        lines.append(f"| {name} | {_auc(r)} | {_f(r['auc_agrees'])} | {_f(r['rho_length'])} |")
    lines += ["", "Per layer (head-mean attention, no rollout, sink left out, mean over the step's tokens):", ""]
    lines += ["| layer | AUC, target prefers [95% CI] | rho with step length |", "| ---: | ---: | ---: |"]
    for i, r in enumerate(d["layers"]):
        lines.append(f"| {i} | {_auc(r)} | {_f(r['rho_length'])} |")
    lines += [
        "",
        "Variants whose interval lies above 0.5: "
        + (", ".join(d["informative"]) if d["informative"] else "none")
        + f" ({len(SCALAR_VARIANTS)} variants are tested, so one may clear 0.5 by chance; the held-out calibration "
        "below is the check).",
    ]
    return "\n".join(lines)


def format_heldout(h: dict) -> str:
    """The held-out calibration as markdown: per rule, its choice and its quality on both parts."""
    lines = [
        f"Chosen on the first {h['fit_problems']} problems ({h['fit_steps']} steps; the target prefers "
        f"{h['fit_target_prefers_rate']:.1%}), scored on the other {h['held_out_problems']} ({h['held_out_steps']} "
        f"steps; {h['held_out_target_prefers_rate']:.1%}). Each rule accepts about the share of fit steps the "
        "target prefers.",
        "",
        "| rule | choice | fit precision / recall / accepts | held-out precision / recall / accepts | AUC fit / held out |",
        "| --- | --- | ---: | ---: | ---: |",
    ]
    for name, r in h["rules"].items():
        c = r["choice"]
        if "tau_c" in c:
            what = f"C_{c['sg_confidence']} >= {c['tau_c']:.3f}, {c['grounding']} >= {c['tau_g']:.3f}"
        else:
            what = (
                f"C_{c['sg_confidence']}"
                + (f", {c['grounding']}, beta {c['sg_beta']}" if "grounding" in c else "")
                + f", tau {c['sg_tau']:.3f}"
            )
        fit, held = r["fit"], r["held_out"]
        lines.append(
            f"| {name} | {what} | {_f(fit['precision'])} / {_f(fit['recall'])} / {_f(fit['accept_rate'])} | "
            f"{_f(held['precision'])} / {_f(held['recall'])} / {_f(held['accept_rate'])} | "
            f"{_f(fit['auc'])} / {_f(held['auc'])} |"
        )
    return "\n".join(lines)


def step_use_table(rows: Sequence[dict]) -> str:
    """How SpecGuard wrote its steps in a bench run's rows (``results.jsonl``), per SpecGuard method: the steps the
    target wrote alone (``sg_steps adaptive`` found attempts dearer there), the attempts by number of candidates,
    and how many attempts kept the draft's step. What actually ran, beside the speed and accuracy tables."""
    lines = [
        "| method | answers | steps | target alone | attempted | attempts by candidates | draft's step kept |",
        "| --- | ---: | ---: | ---: | ---: | --- | ---: |",
    ]
    methods = sorted({r["method"] for r in rows if r["stats"].get("steps") is not None})
    for m in methods:
        mine = [r["stats"] for r in rows if r["method"] == m]
        attempted = sum(s.get("steps") or 0 for s in mine)
        alone = sum(s.get("skipped_steps") or 0 for s in mine)
        kept = sum(s.get("accepted_steps") or 0 for s in mine)
        by_k: dict[int, int] = {}
        for s in mine:
            for k, n in (s.get("attempts_by_k") or {}).items():
                by_k[int(k)] = by_k.get(int(k), 0) + n
        ks = ", ".join(f"{k}: {n}" for k, n in sorted(by_k.items())) or "-"
        share = f"{kept} ({kept / attempted:.2f})" if attempted else "0"
        lines.append(f"| {m} | {len(mine)} | {attempted + alone} | {alone} | {attempted} | {ks} | {share} |")
    return "\n".join(lines)
