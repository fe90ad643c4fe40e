"""What ``loosespec report DIR`` prints and draws, from ``DIR/results.jsonl`` alone (:func:`report`): the
summary table (:func:`format_table`), the drafting, per-category and per-machine tables, the notes under them,
``DIR/summary.json`` and the plots (``DIR/*.png``, :func:`plot`; one per swept knob, :func:`sweeps`).

Reading changes nothing; ``summary.json`` and the plots are written whole (temporary file and rename), and
only when no run holds the folder's lock (else a warning names who does and they are left to that run).
"""

from __future__ import annotations

import io
import json
import math
import warnings
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path

from loosespec.errors import LoosespecError
from loosespec.eval.bench_methods import BASELINE, base_name, is_lossy, variant_knobs
from loosespec.eval.failures import KEEP
from loosespec.eval.results import (
    CONFIG,
    RESULTS,
    SUMMARY,
    ResultsFile,
    _derived_writes,
    read_config,
    read_reruns,
    unique_rows,
)
from loosespec.eval.stats import acceptance_counts_by_position, summarize, wilson
from loosespec.fileio import atomic_write_bytes, atomic_write_text


def _fmt(v, spec: str = ".2f", none: str = "-") -> str:
    return none if v is None else format(v, spec)


def format_table(summary: dict) -> str:
    # under concurrent load (vLLM, --vllm-concurrency N) tok/s is each request's own rate; the column
    # "throughput tok/s" is what the server delivered: every request's tokens over the time the blocks took
    load = any("throughput_tokens_per_s" in s for s in summary["methods"].values())
    head = (
        "| method | n | speedup (95% CI) | tok/s |"
        + (" throughput tok/s |" if load else "")
        + " mean accepted length | acceptance rate | accuracy (95% CI) "
        "| recovery | ar right, method wrong | ar wrong, method right | McNemar p | identical to ar |"
    )
    lines = [head, "| --- |" + " ---: |" * (head.count("|") - 2)]
    for m, s in summary["methods"].items():
        ci = s.get("speedup_ci95")
        speed = "-" if s["speedup"] is None else f"{s['speedup']:.2f}x" + (f" ({ci[0]:.2f}-{ci[1]:.2f})" if ci else "")
        if "timed_prompts" in s:  # the others were timed in another sitting (or machine) than their ar row
            speed += f", {s['timed_prompts']} timed"
        acc = "-"
        if "accuracy" in s:
            a = s["accuracy_ci95"]
            acc = f"{s['accuracy']:.2f} ({a[0]:.2f}-{a[1]:.2f})"
        lines.append(
            f"| {m}{' (lossy)' if s['lossy'] else ''} | {s['prompts']} | {speed} | {_fmt(s['tokens_per_s'])} | "
            + (f"{_fmt(s.get('throughput_tokens_per_s'))} | " if load else "")
            + f"{_fmt(s['mean_accepted_length'])} | {_fmt(s['acceptance_rate'])} | {acc} | {_fmt(s.get('recovery'))} | "
            f"{s.get('ar_right_method_wrong', '-')} | {s.get('ar_wrong_method_right', '-')} | {_fmt(s.get('mcnemar_p'), '.3g')} | "
            f"{_fmt(s['identical_to_ar'])} |"
        )
    return "\n".join(lines)


def format_drafting_table(summary: dict) -> str:
    """What actually ran, per method with a cost-aware drafter or FLy: the share of rounds per draft level, and for
    FLy the rounds long enough to defer, the deferrals and the official accept rate (rescues / initial
    mismatches). Empty when no method has these counts."""
    rows = [(m, s) for m, s in summary["methods"].items() if "draft_levels" in s or "fly_deferred" in s]
    if not rows:
        return ""
    lines = [
        "| method | rounds | lookup only | draft model | no draft | explored | could defer | deferrals "
        "| official accept rate (rescues / mismatches) | window counts |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    for m, s in rows:
        lv = s.get("draft_levels") or {}
        pct = lambda x: "-" if x is None else f"{100 * x:.0f}%"  # noqa: E731
        deferrable = s.get("fly_deferrable_rounds")
        total = s.get("level_rounds") or s.get("rounds")  # a fixed draft length records no levels, only rounds
        rate = "-"
        if s.get("fly_initial_mismatches"):
            rate = (
                f"{s['fly_window_rescues'] / s['fly_initial_mismatches']:.3f} ({s['fly_window_rescues']} / "
                f"{s['fly_initial_mismatches']})"
            )
        lines.append(
            f"| {m}{' (lossy)' if s['lossy'] else ''} | {total if total else '-'} | {pct(lv.get('lookup'))} | "
            f"{pct(lv.get('model'))} | {pct(lv.get('none'))} | {s.get('rounds_explore', 0) if lv else '-'} | "
            + (f"{deferrable}" + (f" ({pct(deferrable / total)})" if total else "") if deferrable is not None else "-")
            + f" | {s.get('fly_deferred', '-')} | {rate} | {s.get('fly_window_meaning', '-')} |"
        )
    return "\n".join(lines)


def format_machine_table(summary: dict) -> str:
    """Where a set was timed on several machines: per machine and method, n, speedup (95% CI) and tok/s."""
    lines = ["| machine | method | n | speedup (95% CI) | tok/s |", "| --- | --- | ---: | ---: | ---: |"]
    for label, on in summary.get("machines", {}).items():
        for m, s in on["methods"].items():
            ci = s.get("speedup_ci95")
            lines.append(
                f"| {label} | {m} | {s['prompts']} | {_fmt(s['speedup'])}x"
                + (f" ({ci[0]:.2f}-{ci[1]:.2f})" if ci else "")
                + f" | {_fmt(s['tokens_per_s'])} |"
            )
    return "\n".join(lines)


def format_category_table(summary: dict) -> str:
    """Per category and method: n, speedup, mean accepted length, accuracy, recovery, identical to ar."""
    lines = [
        "| category | method | n | speedup | mean accepted length | accuracy | recovery | identical to ar |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for cat, per in summary["categories"].items():
        for m, s in per.items():
            lines.append(
                f"| {cat} | {m}{' (lossy)' if s['lossy'] else ''} | {s['prompts']} | {_fmt(s['speedup'])}x | "
                f"{_fmt(s['mean_accepted_length'])} | {_fmt(s.get('accuracy'))} | {_fmt(s.get('recovery'))} | "
                f"{_fmt(s['identical_to_ar'])} |"
            )
    return "\n".join(lines)


def summary_notes(summary: dict) -> list[str]:
    """Lines under the printed table for what the numbers leave out: rows whose scoring failed (per method), speed
    pairs refused across sittings, rows paired by machine alone, ar's reruns, and repeated (question, method)
    pairs."""
    notes = []
    errors = {m: s["score_errors"] for m, s in summary["methods"].items() if s.get("score_errors")}
    if errors:
        notes.append(
            f"Scoring failed for {sum(errors.values())} row(s) ("
            + ", ".join(f"{m} {n}" for m, n in errors.items())
            + "): no answer, left out of accuracy, "
            "recovery and McNemar; a resumed `loosespec bench` scores them again."
        )
    refused = {m: s["refused_speed_pairs"] for m, s in summary["methods"].items() if s.get("refused_speed_pairs")}
    if refused:
        notes.append(
            "Speed pairs refused (method and ar timed in different sittings, whose drift would enter the ratio; "
            "`loosespec bench` re-times ar where a problem's methods run in a later sitting): "
            + "; ".join(f"{m} " + ", ".join(f"{n} {why}" for why, n in r.items()) for m, r in refused.items())
            + "."
        )
    unrecorded = [s.get("sitting_unrecorded", 0) for m, s in summary["methods"].items() if m != BASELINE]
    if any(unrecorded):
        n = max(unrecorded)
        notes.append(
            f"Rows written before runs were recorded ({n} prompt(s)): their speed pairs are checked for the same "
            "machine only, not the same sitting."
        )
    rep = summary.get("ar_reproduced")
    if rep:
        notes.append(
            f"ar rerun in a later sitting on {rep['problems']} problem(s): {rep['identical']} reproduced their "
            "tokens" + (f"; differ: {', '.join(rep['differ'])}" if rep["differ"] else "") + "."
        )
    if summary.get("repeated_pairs"):
        notes.append(
            f"results.jsonl repeats {summary['repeated_pairs']} (question, method) pair row(s) (two runs "
            "appended to one folder?): each pair is counted once."
        )
    return notes


def _save(plt, fig, path: Path) -> Path:
    """The figure written whole (temporary file and rename): a reader never sees half a plot."""
    fig.tight_layout()
    buf = io.BytesIO()
    # "tight": the image takes in the legends placed outside the axes (_legend_outside)
    fig.savefig(buf, dpi=120, format=Path(path).suffix.lstrip(".") or "png", bbox_inches="tight")
    plt.close(fig)
    atomic_write_bytes(path, buf.getvalue())
    return path


def _legend_outside(ax) -> None:
    """The legend right of the axes, outside them: it covers no bar, line or point."""
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0.0)


def _ci_err(values: Sequence, intervals: Sequence) -> list[list[float]]:
    """Error bar lengths [below, above] of each value from its 95% interval ``(lo, hi)`` as summary.json has it;
    0 where the value or its interval is missing (a single prompt has none)."""
    below, above = [], []
    for v, ci in zip(values, intervals):
        ok = v is not None and ci is not None and None not in ci
        below.append(max(0.0, v - ci[0]) if ok else 0.0)
        above.append(max(0.0, ci[1] - v) if ok else 0.0)
    return [below, above]


def _recovery_ci(s: dict) -> tuple[float, float] | None:
    """The recovery's 95% interval of a method's summary entry (None without the paired counts)."""
    from loosespec.eval.failures import summary_recovery_interval

    keys = ("scored", "ar_accuracy", "ar_right_method_wrong", "ar_wrong_method_right")
    if any(s.get(k) is None for k in keys):
        return None
    return summary_recovery_interval(s)


def plot(rows: Sequence[dict], summary: dict, out: Path) -> list[Path]:
    """speedup_by_category.png, recovery_vs_speedup.png (scored sets), accepted_lengths.png,
    acceptance_by_position.png (pooled over prompts: rounds accepting draft position i / rounds drafting it).
    Speedups carry their 95% bootstrap interval from the summary (``speedup_ci95``) as error bars; legends sit
    outside the axes, so none covers data."""
    from loosespec.extras import import_extra

    import_extra("matplotlib", "the bench plots; --no-plots skips them").use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    methods = [m for m in summary["methods"] if m != BASELINE]
    cats = list(summary["categories"])
    if methods and cats:
        fig, ax = plt.subplots(figsize=(max(6, 1.2 * len(cats) * max(1, len(methods)) / 3) + 2.5, 4))
        width = 0.8 / len(methods)
        for i, m in enumerate(methods):
            per = [summary["categories"][c].get(m, {}) for c in cats]
            ys = [s.get("speedup") for s in per]
            xs = [j + i * width for j in range(len(cats))]
            # a method that did not run in a category has no bar (and says so), never a bar of height 0; the
            # error bar is the speedup's 95% bootstrap interval (speedup_ci95)
            ax.bar(
                xs,
                [math.nan if y is None else y for y in ys],
                width,
                yerr=_ci_err(ys, [s.get("speedup_ci95") for s in per]),
                capsize=2,
                error_kw={"elinewidth": 0.8},
                label=m + (" (lossy)" if is_lossy(m) else ""),
            )
            for x, y in zip(xs, ys):
                if y is None:
                    ax.text(
                        x,
                        0.02,
                        "n/a",
                        rotation=90,
                        ha="center",
                        va="bottom",
                        fontsize=6,
                        transform=ax.get_xaxis_transform(),
                    )
        ax.axhline(1.0, color="black", lw=0.8, ls="--")
        ax.set_xticks([j + 0.4 - width / 2 for j in range(len(cats))], cats, rotation=20, ha="right")
        ax.set_ylabel("speedup over ar (wall time)")
        ax.set_title("Speedup by category (bars: 95% interval)")
        _legend_outside(ax)
        paths.append(_save(plt, fig, out / "speedup_by_category.png"))
    scored = [m for m in methods if summary["methods"][m].get("recovery") is not None]
    if scored:
        fig, ax = plt.subplots(figsize=(8, 4.5))
        for m in scored:
            s = summary["methods"][m]
            # the bars: the speedup's 95% bootstrap interval, the recovery's from the paired right/wrong table;
            # a method without a speed pair timed in one sitting has no point, and the legend says so
            ax.errorbar(
                [math.nan if s["speedup"] is None else s["speedup"]],
                [s["recovery"]],
                xerr=_ci_err([s["speedup"]], [s.get("speedup_ci95")]),
                # lossless with every output ar's: recovery is 1 by construction, not an estimate
                yerr=_ci_err(
                    [s["recovery"]], [None if not s["lossy"] and s["identical_to_ar"] == 1 else _recovery_ci(s)]
                ),
                fmt="x" if s["lossy"] else "o",
                capsize=3,
                elinewidth=0.8,
                label=m + (" (lossy)" if s["lossy"] else "") + (" (no speed pair)" if s["speedup"] is None else ""),
            )
        ax.axhline(1.0, color="black", lw=0.8, ls="--")
        # FLy's claim: a method keeps >= 99% of ar's accuracy; named in the legend (outside the axes), where a label
        # beside the line would cover the fastest methods' points
        ax.axhline(KEEP, color="tab:red", lw=0.8, ls=":", label=f"{KEEP:g} of ar's accuracy (FLy's claim)")
        ax.axvline(1.0, color="black", lw=0.8, ls="--")
        ax.set_xlabel("speedup over ar (timed in the same sitting)")
        ax.set_ylabel("accuracy recovery (method / ar)")
        dataset = summary.get("config", {}).get("dataset")
        n = summary["methods"].get(BASELINE, {}).get("prompts")
        ax.set_title(
            (f"{dataset}, n = {n}: " if dataset and n else "") + "recovery vs speedup (x: lossy; bars: 95% intervals)",
            fontsize=10,
        )
        _legend_outside(ax)
        paths.append(_save(plt, fig, out / "recovery_vs_speedup.png"))
    lengths = {m: [x for r in rows if r["method"] == m for x in r["accept_lengths"]] for m in summary["methods"]}
    lengths = {m: v for m, v in lengths.items() if v and m != BASELINE}
    if lengths:
        top = max(max(v) for v in lengths.values())
        fig, ax = plt.subplots(figsize=(8, 4))
        bins = [x + 0.5 for x in range(0, top + 1)]
        for m, v in lengths.items():
            ax.hist(v, bins=bins, histtype="step", density=True, label=m, lw=1.4)
        ax.set_xlabel("tokens emitted per round (accepted + 1)")
        ax.set_ylabel("share of rounds")
        ax.set_title("Accepted lengths per method")
        _legend_outside(ax)
        paths.append(_save(plt, fig, out / "accepted_lengths.png"))
    paths += _plot_sweeps(plt, summary, out)
    per_pos = acceptance_counts_by_position(rows)
    if per_pos:
        fig, ax = plt.subplots(figsize=(8, 4))
        for m, counts in per_pos.items():
            xs = range(1, len(counts) + 1)
            line = ax.plot(
                xs, [a / d for a, d in counts], marker="o", ms=3, label=m + (" (lossy)" if is_lossy(m) else "")
            )[0]
            # the rate's 95% Wilson interval, each round that drafted the position taken as one trial
            bands = [wilson(a, d) for a, d in counts]
            ax.fill_between(xs, [b[0] for b in bands], [b[1] for b in bands], color=line.get_color(), alpha=0.15, lw=0)
        ax.set_xlabel("draft position")
        ax.set_ylabel("acceptance (rounds accepting it / rounds drafting it)")
        ax.set_ylim(0, 1.02)
        ax.set_title("Acceptance by draft position (bands: 95% interval)")
        _legend_outside(ax)
        paths.append(_save(plt, fig, out / "acceptance_by_position.png"))
    return paths


def sweeps(methods: Sequence[str]) -> dict[str, dict[str, list[tuple[float, str]]]]:
    """{knob: {base method: [(value, variant name), ...] sorted by value}} for the knobs that at least two
    variants of one method set (and nothing else): what ``--sweep`` runs."""
    out: dict[str, dict[str, list]] = defaultdict(lambda: defaultdict(list))
    for m in methods:
        knobs = variant_knobs(m)
        if len(knobs) != 1:
            continue
        ((knob, value),) = knobs.items()
        try:
            x = float(value)
        except ValueError:
            continue  # a categorical knob has no axis
        out[knob][base_name(m)].append((x, m))
    return {
        k: {b: sorted(v) for b, v in per.items() if len(v) > 1}
        for k, per in out.items()
        if any(len(v) > 1 for v in per.values())
    }


def _plot_sweeps(plt, summary: dict, out: Path) -> list[Path]:
    """speedup_by_<knob>.png per swept knob: speedup over ar (95% bootstrap interval as bars where there is one)
    and, on a scored set, accuracy against the knob's value, one line per method; every point is a run."""
    paths = []
    for knob, per_base in sweeps(list(summary["methods"])).items():
        scored = any(summary["methods"][m].get("accuracy") is not None for v in per_base.values() for _, m in v)
        fig, axes = plt.subplots(1, 2 if scored else 1, figsize=(13 if scored else 7.5, 4), squeeze=False)
        for base, points in per_base.items():
            label = base + (" (lossy)" if is_lossy(base) else "")
            xs = [x for x, _ in points]
            s = [summary["methods"][m] for _, m in points]
            # each panel: the value with its 95% interval from the summary
            for ax, key in ((axes[0][0], "speedup"), *(((axes[0][1], "accuracy"),) if scored else ())):
                ys = [r.get(key) for r in s]
                ax.errorbar(
                    xs,
                    [math.nan if y is None else y for y in ys],
                    yerr=_ci_err(ys, [r.get(key + "_ci95") for r in s]),
                    marker="o",
                    ms=4,
                    capsize=3,
                    label=label,
                )
        axes[0][0].axhline(1.0, color="black", lw=0.8, ls="--")
        axes[0][0].set_xlabel(knob)
        axes[0][0].set_ylabel("speedup over ar (wall time)")
        axes[0][0].set_title(f"Speedup against {knob} (bars: 95% interval)")
        _legend_outside(axes[0][0])
        if scored:
            ar_acc = next(
                (
                    summary["methods"][m].get("ar_accuracy")
                    for v in per_base.values()
                    for _, m in v
                    if summary["methods"][m].get("ar_accuracy") is not None
                ),
                None,
            )
            if ar_acc is not None:
                axes[0][1].axhline(ar_acc, color="black", lw=0.8, ls="--", label="ar")
            axes[0][1].set_xlabel(knob)
            axes[0][1].set_ylabel("accuracy")
            axes[0][1].set_title(f"Accuracy against {knob} (bars: 95% interval)")
            _legend_outside(axes[0][1])
        paths.append(_save(plt, fig, out / f"speedup_by_{knob}.png"))
    return paths


def report(
    out: Path, methods: Sequence[str] | None = None, config: dict | None = None, draw: bool = True, write: bool = True
) -> tuple[dict, str]:
    """(Re)build ``summary.json`` (unless not ``write``), the table and the plots from ``DIR/results.jsonl``.

    Reading changes nothing (a torn last line is skipped, :meth:`ResultsFile.read`); ``summary.json`` and the
    plots are replaced whole, and only when no other run holds the folder's lock (else a warning says who does and
    they are left to that run)."""
    out = Path(out)
    if not (out / RESULTS).exists():
        raise LoosespecError(f"no {RESULTS} in {out}: run `loosespec bench --out {out}` first")
    rows = ResultsFile(out / RESULTS).read()
    if not rows:
        raise LoosespecError(f"{out / RESULTS} holds no results yet")
    if config is None and (out / CONFIG).exists():
        config = read_config(out)
    summary = summarize(rows, methods, read_reruns(out))
    if BASELINE not in summary["methods"]:
        raise LoosespecError(f"{out} has no ar results: speedup and recovery are measured against ar")
    summary["config"] = config or {}
    summary["rows"] = len(rows)
    text = format_table(summary)
    notes = summary_notes(summary)
    if notes:
        text += "\n\n" + "\n".join(notes)
    drafting = format_drafting_table(summary)
    if drafting:
        text += (
            "\n\nWhat ran (share of rounds by draft level; FLy: rounds long enough to defer, deferrals):\n\n" + drafting
        )
    if len(summary["categories"]) > 1:
        text += "\n\nBy category:\n\n" + format_category_table(summary)
    if summary.get("machines"):
        text += (
            "\n\nTimed on several machines; speedup pairs each row with ar's on the same prompt and machine. "
            "By machine:\n\n" + format_machine_table(summary)
        )
    if write or draw:
        with _derived_writes(out) as holder:
            if holder is not None:
                warnings.warn(
                    f"{out} is being written by another run ({holder}): summary.json and the plots are left to it",
                    stacklevel=2,
                )
            else:
                if write:
                    atomic_write_text(out / SUMMARY, json.dumps(summary, indent=1) + "\n")
                if draw:
                    plot(unique_rows(rows, warn=False)[0], summary, out)
    return summary, text
