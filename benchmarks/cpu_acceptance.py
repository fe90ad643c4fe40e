"""Speed on the machine at hand, per category, and the acceptance checks of issue 16.

Reads the ``loosespec bench`` directories under ROOT (``make bench-cpu`` writes them: one per
category, every method measured in the same run as its ``ar``) and prints a markdown report: what
the runs ran on (from the result rows), speedup over ``ar`` per category and the geometric mean,
tokens/s, mean accepted length, the share of outputs identical to ``ar``, and each check with
PASS/FAIL. Nothing here is measured: it only reads result files.

    python benchmarks/cpu_acceptance.py results/bench/cpu
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

from loosespec.eval.stats import machine_label

PEERS = ("hf-", "llamacpp-", "vllm-")


def geomean(xs):
    xs = [x for x in xs if x]
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else None


def load(root: Path) -> tuple[dict, dict]:
    """{category: summary['methods']}, and the first result row's hardware and config."""
    sets, info = {}, {}
    for d in sorted(p for p in root.iterdir() if (p / "summary.json").exists()):
        sets[d.name] = json.loads((d / "summary.json").read_text())["methods"]
        if not info:
            row = json.loads((d / "results.jsonl").read_text().splitlines()[0])
            info = {"hardware": row.get("hardware"), "config": json.loads((d / "config.json").read_text())}
    return sets, info


def report(root: Path) -> tuple[str, bool]:
    sets, info = load(root)
    if not sets:
        raise SystemExit(f"no bench results under {root}")
    cats = list(sets)
    methods = list(dict.fromkeys(m for s in sets.values() for m in s))
    hw, cfg = info.get("hardware") or {}, info.get("config", {})
    out = [
        f"**Speed on {machine_label(hw)}**",
        "",
        f"Target {cfg.get('target')}, draft {cfg.get('draft')}, precision {cfg.get('dtype')}, "
        f"{cfg.get('max_new_tokens')} new tokens, greedy, cost-aware draft length: "
        f"{cfg.get('adaptive_draft_length')}; n = prompts per category. Speedup = ar wall time / method "
        "wall time on the same prompts in the same run.",
        "",
    ]
    out.append(
        "| method | " + " | ".join(f"{c} speedup" for c in cats) + " | geomean speedup | geomean tok/s |"
        " mean accepted length (per category) | identical to ar |"
    )
    out.append("|---|" + "---:|" * (len(cats) + 4))
    geo, tps = {}, {}
    for m in methods:
        sp = [sets[c].get(m, {}).get("speedup") for c in cats]
        geo[m] = geomean(sp)
        tps[m] = geomean([sets[c].get(m, {}).get("tokens_per_s") for c in cats])
        tau = " / ".join(
            f"{sets[c][m]['mean_accepted_length']:.2f}" if sets[c].get(m, {}).get("mean_accepted_length") else "-"
            for c in cats
        )
        ident = [sets[c].get(m, {}).get("identical_to_ar") for c in cats]
        ident_s = f"{min(i for i in ident if i is not None):.2f}" if any(i is not None for i in ident) else "-"
        lossy = " (lossy)" if any(sets[c].get(m, {}).get("lossy") for c in cats) else ""
        n = "/".join(str(sets[c].get(m, {}).get("prompts", 0)) for c in cats)
        out.append(
            f"| {m}{lossy} (n {n}) | "
            + " | ".join(f"{x:.2f}x" if x else "-" for x in sp)
            + f" | {geo[m]:.2f}x | {tps[m]:.2f} | {tau} | {ident_s} |"
        )
    ours = [m for m in methods if m != "ar" and not m.startswith(PEERS)]
    fly = [m for m in ours if m.startswith("fly-")]
    checks = []
    worst = min(
        ((sets[c][m]["speedup"], m, c) for m in ours for c in cats if sets[c].get(m, {}).get("speedup")), default=None
    )
    if worst:
        checks.append(
            (
                f"every loosespec method >= 0.95x ar in every category (lowest: {worst[1]} on {worst[2]}, "
                f"{worst[0]:.2f}x)",
                worst[0] >= 0.95,
            )
        )
    for c in ("humaneval", "specbench-summarization"):
        s = sets.get(c, {}).get("exact-ngram", {}).get("speedup")
        if s is not None:
            checks.append((f"exact-ngram >= 1.3x ar on {c} ({s:.2f}x)", s >= 1.3))
    if fly:
        best = max(fly, key=lambda m: geo[m] or 0)
        checks.append(
            (
                f"best FLy configuration ({best}) >= 2x ar as a geometric mean over the categories ({geo[best]:.2f}x)",
                geo[best] >= 2.0,
            )
        )
        if "llamacpp-ar" in tps and tps["llamacpp-ar"]:
            r = tps[best] / tps["llamacpp-ar"]
            checks.append(
                (
                    f"{best} tokens/s >= 1.3x llamacpp-ar's (geometric means {tps[best]:.2f} vs "
                    f"{tps['llamacpp-ar']:.2f} tok/s: {r:.2f}x)",
                    r >= 1.3,
                )
            )
    for m in ours:
        if not m.startswith("fly-"):
            ident = [
                sets[c][m]["identical_to_ar"] for c in cats if sets[c].get(m, {}).get("identical_to_ar") is not None
            ]
            if ident:
                checks.append(
                    (f"lossless {m} identical to ar on every prompt (lowest share {min(ident):.2f})", min(ident) == 1.0)
                )
    out += ["", "**Checks**", ""] + [f"- {'PASS' if ok else 'FAIL'}: {text}" for text, ok in checks]
    return "\n".join(out) + "\n", all(ok for _, ok in checks)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("root", type=Path, help="directory holding one loosespec bench directory per category")
    args = ap.parse_args(argv)
    text, _ = report(args.root)
    print(text, end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
