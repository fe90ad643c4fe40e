"""Refresh the tables in BENCHMARKS.md from the result directories they come from.

Every block between ``<!-- report DIR -->`` and ``<!-- end report -->`` is replaced by the table
``loosespec report DIR`` prints (per method, then per category when there are several), and every
block between ``<!-- drafts DIR -->`` and ``<!-- end drafts -->`` by one table comparing the result
directories under DIR (one per dataset and draft model); ``<!-- cpu DIR -->`` .. ``<!-- end cpu -->``
holds ``benchmarks/cpu_acceptance.py DIR`` (speed per category and the checks) and
``<!-- precision A B -->`` .. ``<!-- end precision -->`` ``benchmarks/precision_accuracy.py A B``
(``ar`` in two precisions), ``<!-- calibration FILE -->`` .. ``<!-- end calibration -->`` the table of
``loosespec calibrate``'s JSON (SpecGuard's signals and the chosen defaults; FLy's confirmed settings and screen), ``<!-- retention DIR... -->`` ..
``<!-- end retention -->`` whether each lossy method keeps ``ar``'s accuracy in those directories (in these two,
``A+B+C`` without spaces reads runs of one set under several seeds as one) and
``<!-- fly-default DIR -->`` .. ``<!-- end fly-default -->`` ``benchmarks/fly_acceptance.py DIR`` (FLy's default
against exact's, per category, and issue 41's checks), ``<!-- forward DIR -->`` .. ``<!-- end forward -->``
``benchmarks/forward_compare.py DIR`` and ``<!-- forward-cost FILE -->`` .. ``<!-- end forward-cost -->`` the table of
``benchmarks/forward_cost.py``'s JSON (issue 42), ``<!-- steps DIR -->`` .. ``<!-- end steps -->`` how SpecGuard
wrote its steps in DIR's rows (issue 47), ``<!-- failures DIR... -->`` .. ``<!-- end failures -->`` the answers it lost, classified, with how each
method's outputs open and end (``loosespec.eval.failures``), ``<!-- frontier DIR... -->`` .. ``<!-- end frontier -->``
every method's speedup and recovery per set with FLy's deferrals and the verdicts, and ``<!-- headline DIR... -->`` ..
``<!-- end headline -->`` per set the fastest method that keeps 99% of ``ar``'s accuracy (``loosespec.eval.frontier``;
README.md's headline). So the numbers in BENCHMARKS.md and README.md's headline are always the ones in the
``results.jsonl`` files:

    python benchmarks/update_benchmarks_md.py            # rewrite BENCHMARKS.md and README.md in place
    python benchmarks/update_benchmarks_md.py --check    # exit 1 if either is out of date
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

from loosespec.eval.report import report
from loosespec.eval.results import RESULTS, ResultsFile
from loosespec.fileio import atomic_write_text

ROOT = Path(__file__).resolve().parents[1]
FILES = (ROOT / "BENCHMARKS.md", ROOT / "README.md")  # README.md holds the headline block
BLOCK = re.compile(r"(<!-- report (\S+) -->\n)(.*?)(<!-- end report -->)", re.DOTALL)
DRAFTS = re.compile(r"(<!-- drafts (\S+) -->\n)(.*?)(<!-- end drafts -->)", re.DOTALL)
CPU = re.compile(r"(<!-- cpu (\S+) -->\n)(.*?)(<!-- end cpu -->)", re.DOTALL)
PRECISION = re.compile(r"(<!-- precision (\S+) (\S+) -->\n)(.*?)(<!-- end precision -->)", re.DOTALL)
RETENTION = re.compile(r"(<!-- retention ([^>]+?) -->\n)(.*?)(<!-- end retention -->)", re.DOTALL)
FAILURES = re.compile(r"(<!-- failures ([^>]+?) -->\n)(.*?)(<!-- end failures -->)", re.DOTALL)
CALIBRATION = re.compile(r"(<!-- calibration (\S+) -->\n)(.*?)(<!-- end calibration -->)", re.DOTALL)
FLY_DEFAULT = re.compile(r"(<!-- fly-default (\S+) -->\n)(.*?)(<!-- end fly-default -->)", re.DOTALL)
FORWARD = re.compile(r"(<!-- forward (\S+) -->\n)(.*?)(<!-- end forward -->)", re.DOTALL)
FORWARD_COST = re.compile(r"(<!-- forward-cost (\S+) -->\n)(.*?)(<!-- end forward-cost -->)", re.DOTALL)
STEPS = re.compile(r"(<!-- steps (\S+) -->\n)(.*?)(<!-- end steps -->)", re.DOTALL)
FRONTIER = re.compile(r"(<!-- frontier ([^>]+?) -->\n)(.*?)(<!-- end frontier -->)", re.DOTALL)
HEADLINE = re.compile(r"(<!-- headline ([^>]+?) -->\n)(.*?)(<!-- end headline -->)", re.DOTALL)


def calibration_table(path: Path) -> str:
    """``loosespec calibrate``'s table: SpecGuard's re-analysed from the step records in its JSON (not its stored
    analysis), so a change to the analysis or to the records shows here; FLy's (a report with a screen and
    confirmed settings) as ``loosespec calibrate --method fly`` prints it."""
    from loosespec.eval.calibrate import analyse_report, format_analysis

    rep = json.loads(path.read_text(encoding="utf-8"))
    if "confirmed" in rep:
        from loosespec.eval.calibrate_fly import format_report

        return format_report(rep)
    rep["analysis"] = analyse_report(rep)
    return format_analysis(rep)


def _f(v, spec=".2f"):
    return "-" if v is None else format(v, spec)


def drafts_table(root: Path) -> str:
    """One row per (result directory, method) under ``root``: the directories differ by draft model.
    ``draft units / target token``: draft-model tokens proposed per target token drafted (1 when the
    tokenizers are the same)."""
    head = (
        "| set | draft | method | prompts | speedup [95% CI] | tok/s | mean accepted length | acceptance rate "
        "| draft units / target token | identical to ar | scored right (ar) |"
    )
    lines = [head, "|" + " --- |" * (head.count("|") - 1)]
    for d in sorted(p for p in root.iterdir() if (p / RESULTS).exists()):
        summary, _ = report(d, draw=False, write=False)
        draft = json.loads((d / "config.json").read_text())["draft"]
        rows = ResultsFile(d / RESULTS).read()
        for m, s in summary["methods"].items():
            if m == "ar":
                continue
            mine = [r for r in rows if r["method"] == m]
            drafted = sum(r.get("drafted_tokens") or 0 for r in mine)
            units = sum(r["stats"].get("draft_units_drafted", r.get("drafted_tokens") or 0) for r in mine)
            ci = s.get("speedup_ci95")
            right = (
                f"{round(s['accuracy'] * s['scored'])}/{s['scored']} ({round(s['ar_accuracy'] * s['scored'])})"
                if s.get("scored")
                else "-"
            )
            lines.append(
                f"| {d.name.split('-')[0]} | {draft} | {m} | {s['prompts']} | {_f(s['speedup'])}x "
                f"[{_f(ci[0]) if ci else '-'}, {_f(ci[1]) if ci else '-'}] | {_f(s['tokens_per_s'])} | "
                f"{_f(s['mean_accepted_length'])} | {_f(s['acceptance_rate'])} | "
                f"{_f(units / drafted if drafted else None)} | {_f(s['identical_to_ar'])} | {right} |"
            )
    return "\n".join(lines)


sys.path.insert(0, str(Path(__file__).resolve().parent))
from cpu_acceptance import report as cpu_report  # noqa: E402
from fly_acceptance import report as fly_default_report  # noqa: E402
from forward_compare import compare as forward_compare  # noqa: E402
from forward_cost import render as forward_cost_render  # noqa: E402
from precision_accuracy import compare  # noqa: E402


def render(md: str) -> str:
    def table(m: re.Match) -> str:
        _, text = report(ROOT / m.group(2), draw=False, write=False)
        return m.group(1) + "\n" + text + "\n\n" + m.group(4)

    def drafts(m: re.Match) -> str:
        return m.group(1) + "\n" + drafts_table(ROOT / m.group(2)) + "\n\n" + m.group(4)

    def cpu(m: re.Match) -> str:  # per-category speed and the acceptance checks (benchmarks/cpu_acceptance.py)
        text, _ = cpu_report(ROOT / m.group(2))
        return m.group(1) + "\n" + text.strip() + "\n\n" + m.group(4)

    def fly_default(m: re.Match) -> str:  # FLy's default against exact's (benchmarks/fly_acceptance.py)
        text, _ = fly_default_report(ROOT / m.group(2))
        return m.group(1) + "\n" + text.strip() + "\n\n" + m.group(4)

    def precision(m: re.Match) -> str:  # ar in two precisions (benchmarks/precision_accuracy.py)
        return m.group(1) + "\n" + compare(ROOT / m.group(2), ROOT / m.group(3)) + "\n" + m.group(5)

    def calibration(m: re.Match) -> str:  # loosespec calibrate's JSON (loosespec.eval.calibrate)
        return m.group(1) + "\n" + calibration_table(ROOT / m.group(2)) + "\n\n" + m.group(4)

    def dirs(spec: str) -> list:  # "A B+C": directory A, then B and C pooled (runs of one set under two seeds)
        return [[ROOT / x for x in d.split("+")] if "+" in d else ROOT / d for d in spec.split()]

    def retention(m: re.Match) -> str:  # does each lossy method keep ar's accuracy (loosespec.eval.failures)
        from loosespec.eval.failures import retention_table

        return m.group(1) + "\n" + retention_table(dirs(m.group(2)), ROOT) + "\n\n" + m.group(4)

    def failures(m: re.Match) -> str:  # the answers lossy methods lost, classified (loosespec.eval.failures)
        from loosespec.eval.failures import failure_table

        return m.group(1) + "\n" + failure_table(dirs(m.group(2)), ROOT) + "\n\n" + m.group(4)

    def forward(m: re.Match) -> str:  # one set of prompts in several forward precisions (benchmarks/forward_compare.py)
        return m.group(1) + "\n" + forward_compare(ROOT / m.group(2)).split("\n", 2)[2].strip() + "\n\n" + m.group(4)

    def forward_cost(m: re.Match) -> str:  # a forward's cost per precision (benchmarks/forward_cost.py's JSON)
        text = forward_cost_render(json.loads((ROOT / m.group(2)).read_text(encoding="utf-8")))
        return m.group(1) + "\n" + text.split("\n", 2)[2].strip() + "\n\n" + m.group(4)

    def steps(m: re.Match) -> str:  # how SpecGuard wrote its steps (loosespec.eval.specguard_diag)
        from loosespec.eval.specguard_diag import step_use_table

        rows = ResultsFile(ROOT / m.group(2) / RESULTS).read()
        return m.group(1) + "\n" + step_use_table(rows) + "\n\n" + m.group(4)

    def frontier(
        m: re.Match,
    ) -> str:  # every method's point per set, FLy's deferrals, verdicts (loosespec.eval.frontier)
        from loosespec.eval.frontier import frontier_table

        return m.group(1) + "\n" + frontier_table([ROOT / d for d in m.group(2).split()]) + "\n\n" + m.group(4)

    def headline(m: re.Match) -> str:  # per set, the fastest method that keeps >= 99% of ar (README's headline)
        from loosespec.eval.frontier import headline_table

        return m.group(1) + "\n" + headline_table([ROOT / d for d in m.group(2).split()]) + "\n\n" + m.group(4)

    md = HEADLINE.sub(headline, FRONTIER.sub(frontier, md))
    md = STEPS.sub(steps, FORWARD_COST.sub(forward_cost, FORWARD.sub(forward, md)))
    md = FAILURES.sub(failures, RETENTION.sub(retention, md))
    md = PRECISION.sub(precision, CPU.sub(cpu, DRAFTS.sub(drafts, BLOCK.sub(table, md))))
    return FLY_DEFAULT.sub(fly_default, CALIBRATION.sub(calibration, md))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--file", type=Path, action="append", help="the file to refresh (repeatable; default: BENCHMARKS.md, README.md)"
    )
    ap.add_argument("--check", action="store_true", help="only check that the tables are current")
    args = ap.parse_args(argv)
    stale = []
    for path in args.file or FILES:
        old = path.read_text(encoding="utf-8")
        new = render(old)
        if args.check:
            stale += [path] if new != old else []
        elif new != old:
            atomic_write_text(path, new)
    for path in stale:
        print(f"{path} is out of date: run python benchmarks/update_benchmarks_md.py", file=sys.stderr)
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())
