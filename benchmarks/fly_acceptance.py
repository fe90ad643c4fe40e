"""FLy's default against exact verification's default, per category, and the acceptance checks of issue 41.

Reads the two ``loosespec bench`` directories ``make bench-fly-default`` writes (Spec-Bench, 10 prompts
from each of its six categories, and HumanEval's first 40; ``ar``, ``exact-mla`` and ``fly-mla`` with their
defaults, in one run each) and prints a markdown report: per category tokens/s of each method, FLy's
tokens/s over exact's, what ran (the share of rounds per draft level, rounds long enough to defer,
deferrals) and, on HumanEval, accuracy retention against ``ar`` with lost and gained answers. Checks:
FLy's tokens/s >= 1.10x exact's as a geometric mean over the seven categories; retention on HumanEval
>= 0.97. Nothing here is measured: it only reads result files.

    python benchmarks/fly_acceptance.py results/bench/fly-default
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from loosespec.eval.stats import machine_label  # noqa: E402

EXACT, FLY = "exact-mla", "fly-mla"
FULL_SPECBENCH, FULL_HUMANEVAL = 60, 40  # the sizes: Spec-Bench 10 x 6, HumanEval's first 40


def geomean(xs):
    xs = [x for x in xs if x]
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else None


def categories(root: Path) -> tuple[dict[str, dict], dict]:
    """{category: {method: summary}} over every bench directory under ROOT, and the first row's hardware/config."""
    cats, info = {}, {}
    for d in sorted(p for p in root.iterdir() if (p / "summary.json").exists()):
        summary = json.loads((d / "summary.json").read_text())
        for cat, per in summary["categories"].items():
            cats[cat] = per
        if not info:
            row = json.loads((d / "results.jsonl").read_text().splitlines()[0])
            info = {"hardware": row.get("hardware"), "config": json.loads((d / "config.json").read_text())}
    return cats, info


def _levels(s: dict) -> str:
    lv = s.get("draft_levels")
    return " / ".join(f"{100 * lv[x]:.0f}%" for x in ("lookup", "model", "none")) if lv else "-"


def report(root: Path, min_ratio: float = 1.10, min_retention: float = 0.97) -> tuple[str, bool]:
    cats, info = categories(root)
    if not cats:
        raise SystemExit(f"no bench results under {root}")
    hw, cfg = info.get("hardware") or {}, info.get("config", {})
    out = [
        f"**FLy's default against exact's, on {machine_label(hw)}**",
        "",
        f"Target {cfg.get('target')}, draft {cfg.get('draft')}, precision {cfg.get('dtype')}, greedy, every method "
        "with its defaults (cost-aware draft length; FLy's calibrated preset). n = prompts; tok/s = new tokens / "
        "wall time over the category; draft levels = share of rounds drafted by the lookup alone / the draft "
        "model / not at all.",
        "",
        "| category | n | ar tok/s | exact-mla tok/s | fly-mla (lossy) tok/s | fly / exact | fly identical to ar "
        "| fly rounds that could defer | fly deferrals | exact / fly mean accepted length | exact draft levels "
        "| fly draft levels |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---|",
    ]
    ratios = []
    for cat, per in cats.items():
        e, f, a = per.get(EXACT), per.get(FLY), per.get("ar")
        if not (e and f and a):
            continue
        r = f["tokens_per_s"] / e["tokens_per_s"] if e.get("tokens_per_s") and f.get("tokens_per_s") else None
        ratios.append(r)
        could = f.get("fly_deferrable_rounds")
        rounds = f.get("level_rounds")
        out.append(
            f"| {cat} | {f['prompts']} | {a['tokens_per_s']:.2f} | {e['tokens_per_s']:.2f} | "
            f"{f['tokens_per_s']:.2f} | {r:.3f}x | {f['identical_to_ar']:.2f} | "
            + (f"{could} of {rounds}" if could is not None and rounds else "-")
            + f" | {f.get('fly_deferred', '-')} | {_f(e.get('mean_accepted_length'), '.2f')} / "
            f"{_f(f.get('mean_accepted_length'), '.2f')} | {_levels(e)} | {_levels(f)} |"
        )
    ratio = geomean(ratios)
    out += variants(cats)
    spec_n = sum(per[FLY]["prompts"] for cat, per in cats.items() if cat != "humaneval" and FLY in per)
    checks = [
        (
            f"FLy's default >= {min_ratio:.2f}x exact's default in tokens/s, geometric mean over the "
            f"{len(ratios)} categories ({_f(ratio, '.3f')}x)",
            ratio is not None and ratio >= min_ratio,
        )
    ]
    he = cats.get("humaneval", {}).get(FLY)
    if he and he.get("recovery") is not None:
        ci = he_recovery_ci(root)
        checks.append(
            (
                f"FLy's default keeps >= {min_retention:.2f} of ar's accuracy on HumanEval's first "
                f"{he['scored']} (retention {he['recovery']:.3f}"
                + (f", 95% interval {ci[0]:.2f}-{ci[1]:.2f}" if ci else "")
                + f": {he['ar_right_method_wrong']} lost, {he['ar_wrong_method_right']} gained; accuracy "
                f"{he['accuracy']:.3f} vs ar {he['ar_accuracy']:.3f}, McNemar p {he['mcnemar_p']:.3g})",
                he["recovery"] >= min_retention,
            )
        )
    he_n = he["prompts"] if he else 0
    full = spec_n >= FULL_SPECBENCH and he_n >= FULL_HUMANEVAL
    out += [
        "",
        "**Checks**"
        + (
            ""
            if full
            else f" (partial run: {spec_n} of the issue's {FULL_SPECBENCH} Spec-Bench "
            f"prompts and {he_n} of its {FULL_HUMANEVAL} HumanEval problems; "
            "a check on a partial run decides nothing)"
        ),
        "",
    ]
    out += [f"- {'PASS' if ok else 'FAIL'}: {text}" for text, ok in checks]
    return "\n".join(out), full and all(ok for _, ok in checks)


def variants(cats: dict[str, dict]) -> list[str]:
    """Other FLy settings run beside the default (``fly-mla@...``, e.g. the paper preset), against exact's
    default on the same prompts; not part of the checks."""
    names = sorted({m for per in cats.values() for m in per if m.startswith(FLY + "@")})
    if not names:
        return []
    out = [
        "",
        "Other FLy settings on the same prompts (lossy; not part of the checks):",
        "",
        "| category | setting | n | tok/s | / exact | identical to ar | deferrals | mean accepted length "
        "| retention vs ar (lost / gained) |",
        "|---|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    for name in names:
        for cat, per in cats.items():
            v, e = per.get(name), per.get(EXACT)
            if not (v and e and v.get("tokens_per_s") and e.get("tokens_per_s")):
                continue
            keep = (
                f"{v['recovery']:.3f} ({v['ar_right_method_wrong']} / {v['ar_wrong_method_right']})"
                if v.get("recovery") is not None
                else "-"
            )
            out.append(
                f"| {cat} | {name.split('@', 1)[1]} | {v['prompts']} | {v['tokens_per_s']:.2f} | "
                f"{v['tokens_per_s'] / e['tokens_per_s']:.3f}x | {v['identical_to_ar']:.2f} | "
                f"{v.get('fly_deferred', '-')} | {_f(v.get('mean_accepted_length'), '.2f')} | {keep} |"
            )
    return out


def he_recovery_ci(root: Path):
    """FLy's retention interval against ar on HumanEval: the project's own (``loosespec.eval.failures.retention``,
    as in BENCHMARKS.md's retention tables), from the bench directory whose results are HumanEval's."""
    from loosespec.eval.failures import retention

    for d in sorted(p for p in root.iterdir() if (p / "summary.json").exists()):
        if "humaneval" in json.loads((d / "summary.json").read_text()).get("categories", {}):
            return retention(d).get(FLY, {}).get("recovery_ci95")
    return None


def _f(v, spec):
    return "-" if v is None else format(v, spec)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("root", type=Path)
    args = ap.parse_args(argv)
    text, _ = report(args.root)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
