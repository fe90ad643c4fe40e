"""The speed and accuracy frontier of scored results directories (issue 48's second evidence round): per set and
method, the speedup over ``ar`` (timed in the same sitting only, :mod:`loosespec.eval.stats`) and the accuracy
recovery, each with its 95% interval; the verdict against FLy's claim (at least :data:`~loosespec.eval.failures.KEEP`
of ``ar``'s accuracy); what FLy actually did (deferrals, rounds long enough to defer, draft levels), so a verdict
says how much of FLy's rule it judged; and per set the fastest method that keeps the claim at this sample size.

A method keeps ``ar``'s accuracy when it is lossless and every output is ``ar``'s token for token (``lossless``:
exactly, not estimated), or when the recovery's whole 95% interval is at least ``KEEP`` (``kept``,
:func:`loosespec.eval.failures.retention`'s rule, applied here to every method, lossless ones whose outputs differ
from ``ar``'s included). Reading changes nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from loosespec.eval.bench_methods import BASELINE
from loosespec.eval.failures import KEEP, _read, _reruns, keep_verdict, summary_recovery_interval
from loosespec.eval.stats import summarize

LOSSLESS = "lossless"  # the verdict of a lossless method whose every output is ar's
SET_NAMES = {"gsm8k": "GSM8K", "humaneval": "HumanEval", "mgsm": "MGSM", "math500": "MATH-500"}


def ran(out: Path) -> bool:
    """Whether a results directory holds any rows yet (a set of a round still to run holds none)."""
    from loosespec.eval.results import RESULTS

    return (Path(out) / RESULTS).exists()


def set_label(out: Path) -> str:
    """A results directory's set as a reader names it, from its ``config.json`` (``MGSM zh + ja``, ``GSM8K``); a
    directory not run yet by its name."""
    from loosespec.eval.results import read_config

    if not ran(out):
        return SET_NAMES.get(Path(out).name, Path(out).name)
    cfg = read_config(Path(out))
    name = SET_NAMES.get(cfg.get("dataset"), cfg.get("dataset", Path(out).name))
    lang = (cfg.get("dataset_options") or {}).get("lang")
    return f"{name} {' + '.join(lang.split(','))}" if lang else name


def points(out: Path | Sequence[Path]) -> dict:
    """One results directory (or pooled seeds, :func:`loosespec.eval.failures.pooled`): ``methods``, per scored
    method but ``ar``, its point (speedup and interval, recovery and interval, answers lost and gained, verdict,
    FLy's counters and the draft levels where they ran); ``ar_accuracy``, ``n`` and ``ar_reproduced``."""
    rows, _ = _read(out)
    summary = summarize(rows, reruns=_reruns(out))
    ar = summary["methods"].get(BASELINE, {})
    found = {}
    for m, s in summary["methods"].items():
        if m == BASELINE or "accuracy" not in s:
            continue
        ci = summary_recovery_interval(s)
        same = s["identical_to_ar"] == 1.0
        p = {
            "lossy": s["lossy"],
            "scored": s["scored"],
            "speedup": s["speedup"],
            "speedup_ci95": s["speedup_ci95"],
            "timed_prompts": s.get("timed_prompts", s["prompts"]),
            "refused_speed_pairs": s.get("refused_speed_pairs", {}),
            "recovery": s["recovery"],
            "recovery_ci95": ci,
            "lost": s["ar_right_method_wrong"],
            "gained": s["ar_wrong_method_right"],
            "identical_to_ar": s["identical_to_ar"],
            "verdict": LOSSLESS if same and not s["lossy"] else keep_verdict(ci, s["scored"]),
        }
        for k in ("fly_deferred", "fly_deferrable_rounds", "level_rounds", "draft_levels", "draft_forwards", "rounds"):
            if k in s:
                p[k] = s[k]
        found[m] = p
    return {
        "methods": found,
        "n": ar.get("prompts", 0),
        "ar_accuracy": ar.get("accuracy"),
        "ar_reproduced": summary.get("ar_reproduced"),
    }


def keeps(p: dict) -> bool:
    """Whether a point keeps ``ar``'s accuracy at this sample size (lossless with ``ar``'s outputs, or kept)."""
    return p["verdict"] in (LOSSLESS, "kept")


def fastest_kept(found: dict[str, dict]) -> str | None:
    """The method with the highest speedup among those that keep ``ar``'s accuracy (None: none does, or none was
    timed in a sitting with ``ar``)."""
    kept = [(p["speedup"], m) for m, p in found.items() if keeps(p) and p["speedup"] is not None]
    return max(kept)[1] if kept else None


def _pair(v, ci, unit: str = "", digits: int = 2) -> str:
    if v is None:
        return "-"
    return f"{v:.{digits}f}{unit}" + (f" ({ci[0]:.{digits}f}-{ci[1]:.{digits}f})" if ci else "")


def _recovery(p: dict) -> str:
    """The recovery and its 95% interval to two decimals, or three where two would round a bound onto
    :data:`KEEP` (0.987 would read 0.99, and its ``lost`` would seem to contradict it)."""
    ci = p["recovery_ci95"]
    near = ci is not None and any(b != KEEP and f"{b:.2f}" == f"{KEEP:.2f}" for b in ci)
    return _pair(p["recovery"], ci, digits=3 if near else 2)


def _fly(p: dict) -> str:
    if "fly_deferred" not in p:
        return "-"
    return f"{p['fly_deferred']} in {p.get('fly_deferrable_rounds', '?')}"


def _levels(p: dict) -> str:
    lv = p.get("draft_levels")
    if not lv:
        return "-"
    return f"{lv['lookup']:.0%} / {lv['model']:.0%} / {lv['none']:.0%}"


def _draft_forwards(p: dict) -> str:
    return f"{p['draft_forwards'] / p['rounds']:.2f}" if p.get("rounds") else "-"


def frontier_table(dirs: Sequence[Path]) -> str:
    """Every scored method of every set (results directories): the picture's points as a table, with what FLy did
    and the verdict against FLy's claim; the fastest method that keeps it is marked. A set not run yet says so."""
    lines = [
        "| set | n | method | speedup over `ar` (95% CI) | recovery (95% CI) | lost / gained | identical to `ar` "
        "| FLy deferrals (in rounds that could defer) | rounds: lookup / draft model / no draft "
        f"| draft-model forwards per round | keeps >= {KEEP:.0%} of `ar`? |",
        "| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    for d in dirs:
        if not ran(d):
            lines.append(f"| {set_label(d)} | 0 | not run yet |" + " - |" * 8)
            continue
        label, pts = set_label(d), points(d)
        best = fastest_kept(pts["methods"])
        for m, p in pts["methods"].items():
            name = f"`{m}`" + (" (lossy)" if p["lossy"] else "") + (" **fastest that keeps**" if m == best else "")
            speed = _pair(p["speedup"], p["speedup_ci95"], "x")
            if p["timed_prompts"] < p["scored"]:
                speed += f", {p['timed_prompts']} timed"
            lines.append(
                f"| {label} | {p['scored']} | {name} | {speed} | {_recovery(p)} | "
                f"{p['lost']} / {p['gained']} | {p['identical_to_ar']:.2f} | {_fly(p)} | {_levels(p)} | "
                f"{_draft_forwards(p)} | {p['verdict']} |"
            )
    return "\n".join(lines)


def headline_table(dirs: Sequence[Path]) -> str:
    """Per set (results directory): the fastest method that keeps at least KEEP of ``ar``'s accuracy at this
    sample size (:func:`fastest_kept`), or "none decided"; with ``ar``'s reproduction across sittings. A set not run
    yet says so."""
    lines = [
        f"| set | n | `ar` accuracy | fastest method that keeps >= {KEEP:.0%} of `ar` | speedup over `ar` (95% CI) "
        "| recovery (95% CI) | why it keeps | `ar` reproduced across sittings |",
        "| --- | ---: | ---: | --- | ---: | ---: | --- | ---: |",
    ]
    for d in dirs:
        if not ran(d):
            lines.append(f"| {set_label(d)} | 0 | - | not run yet |" + " - |" * 4)
            continue
        label, pts = set_label(d), points(d)
        rep = pts["ar_reproduced"]
        again = f"{rep['identical']} of {rep['problems']}" if rep else "not checked"
        acc = "-" if pts["ar_accuracy"] is None else f"{pts['ar_accuracy']:.2f}"
        best = fastest_kept(pts["methods"])
        if best is None:
            lines.append(f"| {label} | {pts['n']} | {acc} | none decided | - | - | - | {again} |")
            continue
        p = pts["methods"][best]
        why = "every output `ar`'s" if p["verdict"] == LOSSLESS else "recovery interval >= 0.99"
        lines.append(
            f"| {label} | {p['scored']} | {acc} | `{best}`{' (lossy)' if p['lossy'] else ''} | "
            f"{_pair(p['speedup'], p['speedup_ci95'], 'x')} | {_recovery(p)} | {why} | "
            f"{again} |"
        )
    return "\n".join(lines)
