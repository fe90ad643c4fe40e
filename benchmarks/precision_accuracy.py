"""What a precision costs in accuracy: ``ar`` in one precision against ``ar`` in another, same problems.

Reads two ``loosespec bench`` directories of the same set (``make bench-precision`` writes them: ``ar``
alone, e.g. int8 and float32) and prints, over the problems both have scored: accuracy with 95%
Wilson intervals, the paired counts (right in one, wrong in the other, both ways), an exact
McNemar p-value, and the share of outputs identical token for token. Nothing is measured here, and
no timing is reported: these runs are about accuracy (speed is ``make bench-cpu``'s).

    python benchmarks/precision_accuracy.py results/bench/precision/gsm8k-int8 results/bench/precision/gsm8k-float32
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from loosespec.eval.results import ResultsFile
from loosespec.eval.stats import mcnemar_exact, wilson


def ar_rows(d: Path) -> tuple[dict, dict]:
    rows = {
        r["question_id"]: r
        for r in ResultsFile(d / "results.jsonl").read()
        if r["method"] == "ar" and r.get("score") is not None
    }
    return rows, json.loads((d / "config.json").read_text())


def compare(a_dir: Path, b_dir: Path) -> str:
    a, ca = ar_rows(a_dir)
    b, cb = ar_rows(b_dir)
    if ca["dataset"] != cb["dataset"]:
        raise SystemExit(f"different sets: {ca['dataset']} vs {cb['dataset']}")
    ids = [q for q in a if q in b]
    if not ids:
        raise SystemExit("no problem scored in both directories")
    n = len(ids)
    ka = sum(bool(a[q]["score"]) for q in ids)
    kb = sum(bool(b[q]["score"]) for q in ids)
    a_only = sum(bool(a[q]["score"]) and not b[q]["score"] for q in ids)
    b_only = sum(bool(b[q]["score"]) and not a[q]["score"] for q in ids)
    same = sum(a[q]["token_ids"] == b[q]["token_ids"] for q in ids)
    pa, pb = ca["dtype"], cb["dtype"]
    hw = next(iter(a.values())).get("hardware") or {}

    def alone(r):
        k = sum(bool(x["score"]) for x in r.values())
        lo, hi = wilson(k, len(r))
        return f"{k}/{len(r)} = {k / len(r):.2f} ({lo:.2f}-{hi:.2f})"

    def acc(k):
        lo, hi = wilson(k, n)
        return f"{k}/{n} = {k / n:.2f} ({lo:.2f}-{hi:.2f})"

    return (
        "\n".join(
            [
                f"{ca['dataset']} ({ca['target']}, ar, greedy, {ca['max_new_tokens']} new tokens, first {n} problems; "
                f"{hw.get('cpu', '?')}, {' '.join(hw.get('cpu_flags', []))})",
                "",
                "| precision | accuracy (95% CI) |",
                "|---|---:|",
                f"| {pa} | {acc(ka)} |",
                f"| {pb} | {acc(kb)} |",
                "",
                f"right in {pa} only: {a_only}; right in {pb} only: {b_only}; exact McNemar p = "
                f"{mcnemar_exact(a_only, b_only):.3f}; outputs identical token for token: {same}/{n}",
            ]
            + [f"{p} on all {len(r)} problems it has scored: {alone(r)}" for p, r in ((pa, a), (pb, b)) if len(r) > n]
        )
        + "\n"
    )


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("a", type=Path)
    ap.add_argument("b", type=Path)
    args = ap.parse_args(argv)
    print(compare(args.a, args.b), end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
