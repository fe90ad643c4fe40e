"""Statistics of a results folder's rows: per method against its baseline (speedup with a bootstrap interval,
accuracy with a Wilson interval, retention, McNemar's exact test), per category and per machine
(:func:`summarize`).

Summary metrics, per method over the prompts it shares with its baseline (``ar``; ``vllm-ar`` for the
``vllm-*`` methods when it ran, named in the summary's ``baseline``); "``ar``" below means that baseline:

- ``speedup`` = total ``ar`` wall time / total method wall time, with a 95% bootstrap interval
  over prompts (``speedup_ci95``), over the prompts where both were timed in one sitting: the method's row and an
  ``ar`` row of the same run (``run_id``, one process start: ``ar``'s own row, or its rerun in ``reruns.jsonl``
  when the method ran in a later sitting). A pair across sittings is refused, not reported: rows doing identical
  work differ by 4-7% between sittings on one CPU. Rows that name no run (written before runs were recorded) pair
  on the same machine (every row records its ``hardware``), counted in ``sitting_unrecorded``. When some pairs
  were refused, ``timed_prompts`` counts the kept ones and ``refused_speed_pairs`` the others by reason; a
  directory timed on several machines also gets ``machines``: rows, speedup and tok/s per machine;
- ``ar_reproduced``: ``ar`` rerun in a later sitting on the same problems (``loosespec bench --reproduce-ar N``,
  or to re-time ``ar`` for a problem whose methods run in a later sitting): how many reproduced their token ids;
  accuracy pairs across sittings rest on this;
- ``tokens_per_s`` = new tokens / wall time (over the same prompts);
- ``mean_accepted_length`` = emitted tokens / rounds over all rounds (Spec-Bench's and vLLM's tau;
  1 for ``ar``; for the peers from the chunks ``generate`` streams per step);
- ``acceptance_rate`` = accepted draft tokens / drafted tokens (loosespec methods);
- ``accuracy`` (scored datasets; over the pairs where both rows have a verdict: rows whose scoring failed are
  left out and counted in ``score_errors``) with a 95% Wilson interval, ``recovery`` = accuracy / ``ar``
  accuracy, the paired counts ``ar_right_method_wrong`` and ``ar_wrong_method_right`` and McNemar's exact
  p-value on them (``mcnemar_p``: two-sided binomial test of the discordant pairs, 1 when there are none);
- ``identical_to_ar`` = share of outputs whose token ids equal ``ar``'s;
- what actually ran, for the methods with a cost-aware drafter: ``draft_levels``, the share of rounds
  that drafted with the n-gram lookup alone, with the draft model, or not at all (``rounds_explore``:
  rounds a loose rule explored a long draft); for FLy, ``fly_deferrable_rounds`` (rounds whose draft was
  long enough to defer anywhere), ``fly_deferred``, the official counters ``fly_initial_mismatches`` and
  ``fly_window_rescues``, and ``fly_window_meaning`` (what ``fly_window_size`` counted: ``subsequent``
  positions, or ``counting the mismatch`` in rows written before 2026-12-04); ``draft_forwards`` and ``rounds``
  (the draft model's forwards and the rounds, where rows record them: with a fixed draft length, which records
  no levels, how often the draft model ran).

The summary counts a repeated (question, method) pair once (a row with a verdict before one whose scoring
failed, else the first written), warns how many were repeated and records the count (``repeated_pairs``), so
n, accuracy and McNemar never count a pair twice.
"""

from __future__ import annotations

import functools
import math
import random
from collections import defaultdict
from collections.abc import Sequence

from loosespec.eval.bench_methods import BASELINE, baseline_of
from loosespec.eval.peers.vllm import VLLM_BASELINE
from loosespec.eval.results import LEGACY_WINDOW_MEANING, score_status, unique_rows
from loosespec.methods import FLY_GUARD_COUNTERS, FLY_OFFICIAL_COUNTERS, FLY_ROUND_COUNTERS, METHODS

DRAFT_LEVELS = ("lookup", "model", "none")  # loosespec.decode.draftlen's rounds_<level> counters


def wilson(k: int, n: int, z: float = 1.96) -> tuple[float, float] | None:
    """95% Wilson score interval of a proportion k/n."""
    if n == 0:
        return None
    p = k / n
    den = 1 + z * z / n
    mid = (p + z * z / (2 * n)) / den
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / den
    return round(max(0.0, mid - half), 4), round(min(1.0, mid + half), 4)


def mcnemar_exact(b: int, c: int) -> float:
    """McNemar's exact test of paired right/wrong outcomes: the two-sided binomial p-value of ``b`` discordant
    pairs one way against ``c`` the other under p = 1/2 (scipy's ``binomtest``); 1.0 without discordant pairs."""
    if b + c == 0:
        return 1.0
    from loosespec.extras import import_extra

    binomtest = import_extra("scipy.stats", "McNemar's exact test").binomtest
    return float(binomtest(b, b + c, 0.5).pvalue)


def bootstrap_ratio(
    num: Sequence[float],
    den: Sequence[float],
    reps: int = 2000,
    seed: int = 0,  # resampling seed (not a knob)
) -> tuple | None:
    """95% percentile bootstrap interval of sum(num)/sum(den), resampling paired items.

    Seeded, so a function of its arguments: remembered per process (a report summarises each method once
    per table and again per category and retention check; 0.1 s each at n = 100)."""
    return _bootstrap_ratio(tuple(num), tuple(den), reps, seed)


@functools.lru_cache(maxsize=4096)
def _bootstrap_ratio(num: tuple, den: tuple, reps: int, seed: int) -> tuple | None:
    n = len(num)
    if n < 2:
        return None
    rng = random.Random(seed)
    stats = []
    for _ in range(reps):
        idx = [rng.randrange(n) for _ in range(n)]
        d = sum(den[i] for i in idx)
        if d > 0:
            stats.append(sum(num[i] for i in idx) / d)
    stats.sort()
    return round(stats[int(0.025 * (len(stats) - 1))], 3), round(stats[int(0.975 * (len(stats) - 1))], 3)


def pooled_mean_accepted_length(new_tokens: Sequence[int], rounds: Sequence[int]) -> float | None:
    """Spec-Bench's mean accepted length over several generations: all emitted tokens / all rounds (pooled,
    not the mean of per-prompt values). The one definition every report of this project uses."""
    total = sum(rounds)
    return round(sum(new_tokens) / total, 4) if total else None


def machine_label(hw: dict | None) -> str:
    """One line naming what a row's timing ran on, e.g. ``Intel(R) Xeon(R) Processor (avx2 avx512f; 2 threads)``
    (``hw`` is a row's ``hardware``; rows written without one read ``unrecorded``). Two rows are timed on the
    same machine when their labels are equal."""
    if not hw:
        return "unrecorded"
    label = (
        f"{hw.get('cpu', '?')} ({' '.join(hw.get('cpu_flags') or []) or 'no flags of note'}; "
        f"{hw.get('threads', '?')} threads)"
    )
    return label + (f", GPU {hw['gpu']}" if hw.get("gpu") else "")


def timing_key(row: dict) -> tuple[str, str] | None:
    """(question, run) of a row that names its run (``run_id``: one process start, a sitting), else None."""
    return (row["question_id"], row["run_id"]) if row.get("run_id") else None


def ar_timings(ar_rows: Sequence[dict]) -> dict[tuple[str, str], dict]:
    """The baseline's rows (``results.jsonl``'s and ``reruns.jsonl``'s) by (question, run): what a method row timed
    in that run is paired with."""
    return {k: r for r in ar_rows if (k := timing_key(r)) is not None}


def _speed_pair(r: dict, ar: dict[str, dict], timings: dict | None) -> tuple[dict | None, str]:
    """The baseline row a method row's time is compared with, and how it was found: ``sitting`` (ar timed in the
    same run, its first row or a rerun), ``machine`` (neither row names its run, rows written before runs were
    recorded: the same machine is all that can be checked), or None and why it is refused (``other sitting``:
    timed in another process start, whose drift would enter the ratio; ``other machine``)."""
    a = ar[r["question_id"]]
    key = timing_key(r)
    if key is not None:
        t = (timings or {}).get(key) or (a if a.get("run_id") == r["run_id"] else None)
        return (t, "sitting") if t is not None else (None, "other sitting")
    if a.get("run_id"):
        return None, "other sitting"
    if machine_label(r.get("hardware")) == machine_label(a.get("hardware")):
        return a, "machine"
    return None, "other machine"


def _method_summary(mine: list[dict], ar: dict[str, dict], timings: dict | None = None) -> dict:
    paired = [r for r in mine if r["question_id"] in ar]
    # a method's time is compared with ar's on the same prompt only where both were timed in one sitting (one
    # process start: the rows' run_id; ``timings`` adds ar's reruns), or, for rows that name no run, on the same
    # machine; other pairs are refused, counted in ``refused_speed_pairs`` (``timed_prompts``: how many were kept)
    pairs, refused, by_machine = [], defaultdict(int), 0
    for r in paired:
        a, how = _speed_pair(r, ar, timings)
        if a is None:
            refused[how] += 1
        else:
            pairs.append((r, a))
            by_machine += how == "machine"
    timed = [r for r, _ in pairs]
    wall = sum(r["wall_time"] for r in timed)
    ar_wall = sum(a["wall_time"] for _, a in pairs)
    toks = sum(r["new_tokens"] for r in timed)
    drafted = [r["drafted_tokens"] for r in paired if r.get("drafted_tokens") is not None]
    accepted = [r["accepted_tokens"] for r in paired if r.get("accepted_tokens") is not None]
    s = {
        "prompts": len(paired),
        "lossy": any(r["lossy"] for r in mine),
        "speedup": round(ar_wall / wall, 4) if wall > 0 else None,
        "speedup_ci95": bootstrap_ratio([a["wall_time"] for _, a in pairs], [r["wall_time"] for r in timed]),
        "wall_s": round(wall, 3),
        "new_tokens": toks,
        "tokens_per_s": round(toks / wall, 4) if wall > 0 else None,
        "mean_accepted_length": pooled_mean_accepted_length(
            [r["new_tokens"] for r in paired], [r["rounds"] for r in paired]
        ),
        "acceptance_rate": round(sum(accepted) / sum(drafted), 4) if drafted and sum(drafted) else None,
        "identical_to_ar": round(
            sum(r["token_ids"] == ar[r["question_id"]]["token_ids"] for r in paired) / len(paired), 4
        )
        if paired
        else None,
    }
    if len(timed) < len(paired):
        s["timed_prompts"] = len(timed)
        s["refused_speed_pairs"] = dict(refused)
    if by_machine:  # rows that name no run: paired by machine alone
        s["sitting_unrecorded"] = by_machine
    # a verdict on both sides: a row whose scoring failed (score_status "error") is no answer, left out and counted
    answered = ("right", "wrong")
    scored = [
        (score_status(r) == "right", score_status(ar[r["question_id"]]) == "right")
        for r in paired
        if score_status(r) in answered and score_status(ar[r["question_id"]]) in answered
    ]
    errors = sum(score_status(r) == "error" for r in mine)
    if errors:
        s["score_errors"] = errors
    if scored:
        right = sum(m for m, _ in scored)
        ar_right = sum(a for _, a in scored)
        acc, ar_acc = right / len(scored), ar_right / len(scored)
        s.update(
            {
                "scored": len(scored),
                "accuracy": round(acc, 4),
                "accuracy_ci95": wilson(right, len(scored)),
                "ar_accuracy": round(ar_acc, 4),
                "recovery": round(acc / ar_acc, 4) if ar_acc else None,
                "ar_right_method_wrong": sum(a and not m for m, a in scored),
                "ar_wrong_method_right": sum(m and not a for m, a in scored),
            }
        )
        s["mcnemar_p"] = mcnemar_exact(s["ar_right_method_wrong"], s["ar_wrong_method_right"])
    blocks = {
        (b["makespan_s"], b["new_tokens"]): b["vllm_counters"] for r in paired if (b := r.get("stats", {}).get("block"))
    }
    if blocks:  # vLLM under concurrent load: tokens of all requests / time the blocks took
        s["throughput_tokens_per_s"] = round(sum(t for _, t in blocks) / sum(m for m, _ in blocks), 4)
        drafted_in_blocks = sum(c["draft_tokens"] for c in blocks.values())
        if s["acceptance_rate"] is None and drafted_in_blocks:  # rows cannot split the counters; blocks can
            s["acceptance_rate"] = round(sum(c["accepted"] for c in blocks.values()) / drafted_in_blocks, 4)
    steps = [r["stats"].get("steps") for r in paired if r.get("stats", {}).get("steps")]
    if steps:
        s["step_accept_rate"] = round(
            sum(r["stats"]["accepted_steps"] for r in paired if r["stats"].get("steps")) / sum(steps), 4
        )
    # fly_prefix_mismatches was fly_mismatches in rows written before 2026-12-01 (renamed: not the paper's count)
    fly = {
        "fly_prefix_mismatches": sum(
            r["stats"].get("fly_prefix_mismatches", r["stats"].get("fly_mismatches", 0)) for r in paired
        ),
        "fly_deferred": sum(r["stats"].get("fly_deferred", 0) for r in paired),
    }
    for name in FLY_GUARD_COUNTERS:  # only when FLy's copy guard was on (--fly-copy-guard)
        if any(name in r["stats"] for r in paired):
            fly[name] = sum(r["stats"].get(name, 0) for r in paired)
    for name in FLY_OFFICIAL_COUNTERS + FLY_ROUND_COUNTERS:  # rows written before 2026-12-04 lack them
        if any(name in r["stats"] for r in paired):
            fly[name] = sum(r["stats"].get(name, 0) for r in paired)
    if fly["fly_prefix_mismatches"] or any(_runs_fly(r) for r in paired):
        s.update(fly)
        meanings = {r.get("config", {}).get("fly_window_meaning", LEGACY_WINDOW_MEANING) for r in paired}
        s["fly_window_meaning"] = meanings.pop() if len(meanings) == 1 else "mixed"
    if any("draft_forwards" in r.get("stats", {}) for r in paired):  # how often the draft model ran, per round
        s["draft_forwards"] = sum(r["stats"].get("draft_forwards", 0) for r in paired)
        s["rounds"] = sum(r["rounds"] for r in paired)
    s.update(_levels(paired))
    return s


def _runs_fly(row: dict) -> bool:
    """Whether a loosespec row's method verified with FLy's window rule (its config names the method)."""
    method = METHODS.get(row.get("config", {}).get("method"))
    return method is not None and method.loose_window


def _levels(rows: list[dict]) -> dict:
    """The share of rounds per draft level (``draft_levels``), and the exploration rounds, over rows with counts."""
    counts = {lv: sum(r.get("stats", {}).get(f"rounds_{lv}", 0) for r in rows) for lv in DRAFT_LEVELS}
    total = sum(counts.values())
    if not total:
        return {}
    out = {"draft_levels": {lv: round(c / total, 4) for lv, c in counts.items()}, "level_rounds": total}
    explore = sum(r.get("stats", {}).get("rounds_explore", 0) for r in rows)
    if explore:
        out["rounds_explore"] = explore
    return out


def reproduction(ar_rows: Sequence[dict], reruns: Sequence[dict]) -> dict | None:
    """Whether ``ar`` reproduced its outputs across sittings: per problem with a rerun timed in another run than its
    first row, whether the rerun's token ids equal the first row's (``problems``, ``identical``, and the problems
    that differ, ``differ``); None without such reruns."""
    first = {r["question_id"]: r for r in ar_rows}
    checked: dict[str, bool] = {}
    for r in reruns:
        a = first.get(r["question_id"])
        if a is not None and r.get("run_id") != a.get("run_id"):
            checked[r["question_id"]] = checked.get(r["question_id"], True) and r["token_ids"] == a["token_ids"]
    if not checked:
        return None
    return {
        "problems": len(checked),
        "identical": sum(checked.values()),
        "differ": sorted(q for q, same in checked.items() if not same),
    }


def summarize(rows: Sequence[dict], methods: Sequence[str] | None = None, reruns: Sequence[dict] = ()) -> dict:
    """Per method (``methods``) and per category (``categories``); see the module docstring. A repeated
    (question, method) pair counts once (:func:`unique_rows`, with a warning; ``repeated_pairs``). ``reruns``:
    ``ar`` run again in later sittings (``reruns.jsonl``): the baseline of the methods timed in those sittings,
    and ``ar_reproduced`` (:func:`reproduction`)."""
    rows, repeated = unique_rows(rows)
    methods = list(methods or dict.fromkeys(r["method"] for r in rows))
    present = {r["method"] for r in rows}
    base = {b: {r["question_id"]: r for r in rows if r["method"] == b} for b in (BASELINE, VLLM_BASELINE)}
    timings = {
        BASELINE: ar_timings([*base[BASELINE].values(), *reruns]),
        VLLM_BASELINE: ar_timings(base[VLLM_BASELINE].values()),
    }
    out = {"methods": {}, "categories": {}}
    for m in methods:
        mine = [r for r in rows if r["method"] == m]
        if mine:
            b = baseline_of(m, present)
            out["methods"][m] = {
                **_method_summary(mine, base[b], timings[b]),
                **({"baseline": b} if b != BASELINE else {}),
            }
    for cat in sorted({r["category"] for r in rows}):
        out["categories"][cat] = {}
        for m in methods:
            mine = [r for r in rows if r["method"] == m and r["category"] == cat]
            if mine:
                b = baseline_of(m, present)
                cat_base = {q: r for q, r in base[b].items() if r["category"] == cat}
                out["categories"][cat][m] = _method_summary(mine, cat_base, timings[b])
    machines = dict.fromkeys(machine_label(r.get("hardware")) for r in rows)
    if len(machines) > 1:  # speed per machine (accuracy is the whole set's, above)
        out["machines"] = {}
        for label in machines:
            here = [r for r in rows if machine_label(r.get("hardware")) == label]
            on = {"rows": len(here), "methods": {}}
            here_base = {b: {r["question_id"]: r for r in here if r["method"] == b} for b in base}
            for m in methods:
                mine = [r for r in here if r["method"] == m]
                b = baseline_of(m, present)
                if mine and here_base[b]:
                    ms = _method_summary(mine, here_base[b], timings[b])
                    on["methods"][m] = {k: ms[k] for k in ("prompts", "speedup", "speedup_ci95", "tokens_per_s")}
            out["machines"][label] = on
    reproduced = reproduction(list(base[BASELINE].values()), reruns)
    if reproduced is not None:
        out["ar_reproduced"] = reproduced
    if repeated:
        out["repeated_pairs"] = repeated
    return out


def acceptance_counts_by_position(rows: Sequence[dict]) -> dict[str, list[tuple[int, int]]]:
    """Per method, pooled over its rows: (rounds accepting, rounds drafting) each draft position, for the positions
    some round drafted (rows with the counts)."""
    drafted: dict[str, list[int]] = defaultdict(list)
    accepted: dict[str, list[int]] = defaultdict(list)
    for r in rows:
        st = r.get("stats") or {}
        d, a = st.get("num_drafted_per_pos"), st.get("num_accepted_tokens_per_pos")
        if not d or a is None:
            continue
        for counts, new in ((drafted[r["method"]], d), (accepted[r["method"]], a)):
            counts.extend([0] * (len(new) - len(counts)))
            for i, x in enumerate(new):
                counts[i] += x
    return {
        m: [(a, d) for a, d in zip(accepted[m] + [0] * (len(drafted[m]) - len(accepted[m])), drafted[m]) if d]
        for m in drafted
        if any(drafted[m])
    }


def acceptance_by_position(rows: Sequence[dict]) -> dict[str, list[float]]:
    """Per method, pooled over its rows: accepted / drafted at each draft position (rows with the counts)."""
    return {m: [a / d for a, d in counts] for m, counts in acceptance_counts_by_position(rows).items()}
