"""Calibrating FLy (LOSSY) for the model pair at hand: theta, W, and K and the copy guard where they pay.

FLy's published theta = 0.3 and W = 5 (the official code's 6, counting the mismatch) were chosen for
8B drafts of 70B-405B targets. ``loosespec calibrate --method fly`` chooses them for the pair it runs:
the setting with the most tokens per second that keeps at least ``--min-retention`` (0.99) of the
target's accuracy on problems no benchmark reads (GSM8K's train split, MBPP's train split for code).

A full grid (settings x problems, each setting a full generation) costs many hours on a CPU, so:

1. **Baseline trace** (one run per problem): exact verification, MLA drafter, the grid's largest K
   drafted every round. It is lossless, so its output is the target's own (token for token ``ar``'s in
   int8 and float32) and is the baseline every setting's accuracy is compared with. Each round logs the
   draft, the exact-match mask and the target's top-k entropy at every drafted position.
2. **Screen** (offline, no forward): every setting of the grid replayed on those rounds
   (:func:`screen`): the deferrals it would make, its tokens per round against exact verification's on
   the same drafts (``gain``), and the problems it would touch (defer at least once). First order: a
   deferral changes what follows, which the replay does not see; it ranks settings, it decides nothing.
3. **Confirm**: the real pipeline (method fly, MLA, the cost-aware draft length) on every problem, for
   exact verification's default (the speed to beat) and for candidates taken from the screen's frontier
   (most gain for the fewest touched problems), by bisection (:func:`search_order`: the middle first, then
   looser where it kept the bound, stricter where it did not) until ``--confirm`` have run: wall tokens/s,
   retention (accuracy / baseline accuracy) with a 95% bootstrap interval over problems, answers lost and
   gained, deferrals, draft levels.
4. **Choose** the confirmed setting with the most tokens/s among those whose retention is at least the
   bound (the point estimate; the interval is reported beside it). None qualifying is reported as such.

Every (stage, setting, problem) record is appended to ``<out>.runs.jsonl`` as it finishes, so a
calibration resumes where it stopped and ``--limit`` can grow. Times are wall-clock: run it on a quiet
machine (the table records the CPU).

A record stores the scorer's verdict as the bench harness does (``score``, ``score_status``, ``score_detail``;
:mod:`loosespec.eval.run`): a scoring failure (a sandbox that could not start, a scorer's exception) is no
answer, left out of accuracy and retention and counted (``score_errors``); a resumed calibration scores its stored
text again (no generation) and appends the new verdict as a later line for the same (setting, problem), which the
reader prefers. A program under test that fails or times out stays a wrong answer.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from loosespec.config import DecodeConfig

# One process start = one sitting. Rows timed in different sittings differ by several percent for the same work on
# the same kind of machine, so every record says which sitting timed it and the report says when a comparison spans
# several.
SITTING = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
RETENTION = 0.99  # the bound the chosen setting keeps (FLy's claim: >= 99% of the target's accuracy)
BASELINE = "baseline"  # exact verification, K every round: the target's own output, traced
EXACT = "exact-default"  # exact verification with its defaults: the speed FLy has to beat


@dataclass(frozen=True)
class FlySetting:
    """One point of the grid: theta, W (positions after the mismatch), K and the copy guard (0: off)."""

    theta: float
    window: int
    k: int = 15
    copy_guard: int = 0
    boundary: str = "window"

    @property
    def name(self) -> str:
        return f"theta={self.theta:g},W={self.window},K={self.k},guard={self.copy_guard}"

    def knobs(self) -> dict:
        """The DecodeConfig knobs of this setting."""
        return {
            "fly_entropy_threshold": self.theta,
            "fly_window_size": self.window,
            "num_draft_tokens": self.k,
            "fly_copy_guard": self.copy_guard,
            "fly_boundary": self.boundary,
        }


def grid(
    thetas: Sequence[float], windows: Sequence[int], ks: Sequence[int], guards: Sequence[int] = (0,)
) -> list[FlySetting]:
    """Every combination with W < K (a window that cannot fit the draft never defers)."""
    return [
        FlySetting(float(t), int(w), int(k), int(g))
        for k in ks
        for t in thetas
        for w in windows
        for g in guards
        if w < k
    ]


# ---------------------------------------------------------------------------------------------
# 1. the baseline trace
# ---------------------------------------------------------------------------------------------


class _Recorder:
    """Wraps a rule: records each round's draft, exact-match mask and top-k entropy, then lets the rule decide."""

    def __init__(self, rule, entropy_top_k: int):
        self.rule, self.entropy_top_k, self.rounds = rule, entropy_top_k, []

    def __call__(self, draft, logits):
        from loosespec.verify.fly import topk_entropy

        k = len(draft)
        if k:
            tokens = draft.tokens.to(logits.device)
            match = tokens == logits[:k].argmax(-1)
            entropy = topk_entropy(logits[:k], self.entropy_top_k)
            self.rounds.append(
                {
                    "draft": draft.tokens.tolist(),
                    "match": "".join("1" if m else "0" for m in match.tolist()),
                    "entropy": [round(h, 4) for h in entropy.tolist()],
                }
            )
        return self.rule(draft, logits)


@torch.inference_mode()
def trace(engine, ids: torch.Tensor, max_new_tokens: int, k: int) -> dict:
    """Exact verification, MLA, K drafted every round, each round recorded (see :class:`_Recorder`)."""
    from loosespec.decode.loop import decode
    from loosespec.decode.stats import Stats
    from loosespec.hardware import sync

    cfg = DecodeConfig.create(
        "exact", "mla", k, has_draft_model=True, max_new_tokens=max_new_tokens, adaptive_draft_length=False
    )
    drafter, rule, _ = engine.build(cfg, ids)
    recorder = _Recorder(rule, cfg.fly_entropy_top_k)
    engine.target_lm.reset()
    engine.draft_lm.reset()
    stats = Stats(prompt_tokens=int(ids.shape[0]))
    sync(engine.device)
    t0 = time.perf_counter()
    out: list[int] = []
    for chunk in decode(engine.target_lm, drafter, recorder, ids, max_new_tokens, k, engine.stop_ids, stats):
        out += chunk
    sync(engine.device)
    return {
        "token_ids": out,
        "text": engine.detokenize(out),
        "wall_s": round(time.perf_counter() - t0, 4),
        "rounds": recorder.rounds,
    }


# ---------------------------------------------------------------------------------------------
# 2. the screen
# ---------------------------------------------------------------------------------------------


def replay_round(rnd: dict, s: FlySetting, guard=None) -> tuple[int, int, int]:
    """(kept by exact, kept by the setting, deferrals) on one traced round, its draft cut to the setting's K."""
    from loosespec.verify.exact import first_false
    from loosespec.verify.fly import fly_mask

    k = min(s.k, len(rnd["draft"]))
    match = torch.tensor([c == "1" for c in rnd["match"][:k]], dtype=torch.bool)
    entropy = torch.tensor(rnd["entropy"][:k])
    copy = guard(torch.tensor(rnd["draft"][:k], dtype=torch.long)) if guard is not None else None
    accept = fly_mask(match, entropy, s.theta, s.window, s.k, copy, s.boundary)
    kept = first_false(accept)
    return first_false(match), kept, int((accept[:kept] & ~match[:kept]).sum())


def screen(traces: dict[str, dict], prompts: dict[str, list[int]], settings: Sequence[FlySetting]) -> list[dict]:
    """Each setting replayed on every traced round (first order, see the module docstring): ``gain`` = tokens
    per round under the setting / under exact verification on the same drafts, ``deferrals``, ``touched``
    (problems with at least one deferral)."""
    from loosespec.verify.fly import PromptCopyGuard

    guards: dict[tuple[str, int], PromptCopyGuard] = {}
    out = []
    for s in settings:
        exact_tokens = tokens = deferrals = rounds = 0
        touched = 0
        for pid, tr in traces.items():
            guard = None
            if s.copy_guard:
                key = (pid, s.copy_guard)
                if key not in guards:
                    guards[key] = PromptCopyGuard(prompts[pid], s.copy_guard)
                guard = guards[key]
            here = 0
            for rnd in tr["rounds"]:
                e, kept, d = replay_round(rnd, s, guard)
                exact_tokens, tokens, here, rounds = exact_tokens + e + 1, tokens + kept + 1, here + d, rounds + 1
            deferrals += here
            touched += here > 0
        out.append(
            {
                "setting": asdict(s),
                "name": s.name,
                "rounds": rounds,
                "deferrals": deferrals,
                "touched": touched,
                "problems": len(traces),
                "gain": round(tokens / exact_tokens, 4) if exact_tokens else None,
            }
        )
    return out


def frontier(screened: Sequence[dict], min_gain: float = 1.0) -> list[dict]:
    """The screened settings no other beats on both counts (more gain, fewer touched problems), with gain above
    ``min_gain``, ordered from the fewest touched problems up."""
    rows = [r for r in screened if r["gain"] is not None and r["gain"] > min_gain]
    rows.sort(key=lambda r: (r["touched"], -r["gain"]))
    out, best = [], 0.0
    for r in rows:
        if r["gain"] > best:
            out.append(r)
            best = r["gain"]
    return out


# ---------------------------------------------------------------------------------------------
# 3. confirm, 4. choose
# ---------------------------------------------------------------------------------------------


def search_order(front: Sequence[dict], confirm: int, passed):
    """The frontier's settings to confirm, in order: a bisection for the loosest that keeps the bound, assuming
    that a setting touching more problems loses more (the frontier is ordered so). Yields a row, then reads
    ``passed(row)`` (after its run) to go looser or stricter; at most ``confirm`` rows."""
    lo, hi, n = 0, len(front) - 1, 0
    while lo <= hi and n < confirm:
        mid = (lo + hi) // 2
        yield front[mid]
        n += 1
        if passed(front[mid]):
            lo = mid + 1
        else:
            hi = mid - 1


def confirm_config(setting: FlySetting | None, max_new_tokens: int) -> DecodeConfig:
    """The real pipeline for a setting (FLy, MLA, cost-aware length), or exact verification's defaults (None)."""
    if setting is None:
        return DecodeConfig.create("exact", "mla", has_draft_model=True, max_new_tokens=max_new_tokens)
    return DecodeConfig.create("fly", "mla", has_draft_model=True, max_new_tokens=max_new_tokens, **setting.knobs())


def run_record(engine, ids: torch.Tensor, cfg: DecodeConfig) -> dict:
    r = engine.generate(ids, cfg)
    st = r.stats.to_dict()
    keep = (
        "rounds",
        "drafts",
        "draft_forwards",
        "fly_deferred",
        "fly_deferrable_rounds",
        "fly_initial_mismatches",
        "fly_window_rescues",
        "rounds_lookup",
        "rounds_model",
        "rounds_none",
        "rounds_explore",
    )
    return {
        "token_ids": r.token_ids,
        "text": r.text,
        "wall_s": round(r.stats.wall_s, 4),
        "stats": {k: st[k] for k in keep if k in st},
    }


def summarize_run(records: dict[str, dict], baseline: dict[str, dict], min_retention: float = RETENTION) -> dict:
    """Speed and retention of one confirmed setting over the problems both have (see the module docstring)."""
    from loosespec.eval.results import score_status
    from loosespec.eval.stats import bootstrap_ratio, mcnemar_exact

    ids = [p for p in records if p in baseline]
    # a verdict on both sides: a record whose scoring failed is no answer (left out of accuracy and retention)
    answered = [
        p
        for p in ids
        if score_status(records[p]) in ("right", "wrong") and score_status(baseline[p]) in ("right", "wrong")
    ]
    right = [score_status(records[p]) == "right" for p in answered]
    base = [score_status(baseline[p]) == "right" for p in answered]
    wall = sum(records[p]["wall_s"] for p in ids)
    toks = sum(len(records[p]["token_ids"]) for p in ids)
    lost = sum(b and not r for r, b in zip(right, base))
    gained = sum(r and not b for r, b in zip(right, base))
    retention = sum(right) / sum(base) if sum(base) else None
    ci = bootstrap_ratio([float(x) for x in right], [float(x) for x in base])
    levels = {lv: sum(records[p]["stats"].get(f"rounds_{lv}", 0) for p in ids) for lv in ("lookup", "model", "none")}
    total = sum(levels.values())
    return {
        "problems": len(ids),
        "tokens_per_s": round(toks / wall, 3) if wall else None,
        "new_tokens": toks,
        "wall_s": round(wall, 2),
        "accuracy": round(sum(right) / len(answered), 4) if answered else None,
        "baseline_accuracy": round(sum(base) / len(answered), 4) if answered else None,
        "scored": len(answered),
        "score_errors": sum(score_status(records[p]) == "error" for p in ids),
        "retention": None if retention is None else round(retention, 4),
        "retention_ci95": ci,
        "lost": lost,
        "gained": gained,
        "mcnemar_p": mcnemar_exact(lost, gained),
        "identical": sum(records[p]["token_ids"] == baseline[p]["token_ids"] for p in ids),
        "deferrals": sum(records[p]["stats"].get("fly_deferred", 0) for p in ids),
        "deferrable_rounds": sum(records[p]["stats"].get("fly_deferrable_rounds", 0) for p in ids),
        "rounds": sum(records[p]["stats"].get("rounds", 0) for p in ids),
        "draft_levels": {lv: round(c / total, 3) for lv, c in levels.items()} if total else None,
        "explore_rounds": sum(records[p]["stats"].get("rounds_explore", 0) for p in ids),
        "sittings": sorted({records[p].get("sitting") or "unrecorded" for p in ids}),
        "meets_bound": retention is not None and retention >= min_retention,
    }


def _accuracy(records) -> float | None:
    """Right / answered over records with a verdict (a failed scoring is no answer)."""
    from loosespec.eval.results import score_status

    answered = [score_status(r) for r in records if score_status(r) in ("right", "wrong")]
    return round(answered.count("right") / len(answered), 4) if answered else None


def choose(confirmed: dict[str, dict]) -> str | None:
    """The confirmed FLy setting with the most tokens/s among those that meet the retention bound."""
    ok = [(s["tokens_per_s"], name) for name, s in confirmed.items() if name != EXACT and s["meets_bound"]]
    return max(ok)[1] if ok else None


class RunsFile:
    """``<out>.runs.jsonl``: one line per (stage, setting, problem), flushed as each finishes; a later line for the
    same (setting, problem) supersedes an earlier one (a record scored again)."""

    def __init__(self, path: Path | None):
        self.path = path
        self.rows: dict[tuple[str, str], dict] = {}
        if path is not None and path.exists():
            for line in path.read_text(encoding="utf-8").splitlines():
                if line.strip():
                    try:
                        r = json.loads(line)
                    except ValueError:  # a torn last line: that pair runs again
                        continue
                    self.rows[(r["setting"], r["problem"])] = r

    def get(self, setting: str, problem: str) -> dict | None:
        return self.rows.get((setting, problem))

    def add(self, row: dict) -> None:
        self.rows[(row["setting"], row["problem"])] = row
        if self.path is not None:
            with open(self.path, "a", encoding="utf-8") as f:
                f.write(json.dumps(row, ensure_ascii=False) + "\n")
                f.flush()

    def of(self, setting: str) -> dict[str, dict]:
        return {p: r for (s, p), r in self.rows.items() if s == setting}


def calibrate_fly(
    engine,
    problems: Sequence,
    settings: Sequence[FlySetting],
    *,
    max_new_tokens: int,
    encode,
    scorer,
    confirm: int = 3,
    min_retention: float = RETENTION,
    min_gain: float = 1.0,
    runs_file: Path | None = None,
    progress: bool = True,
    log=None,
) -> dict:
    """The four stages (module docstring); returns the report (screen, confirmed rows, the choice)."""
    from tqdm.auto import tqdm

    from loosespec.eval.results import score_status
    from loosespec.eval.run import judge_output

    runs = RunsFile(runs_file)
    say = log or (lambda _: None)
    k_max = max(s.k for s in settings)
    prompts = {p.id: encode(p) for p in problems}

    def verdict(p, text: str) -> tuple[dict, BaseException | None]:
        v, failure = judge_output(scorer, p, text)
        return {"score": v.score, "score_status": v.status, "score_detail": dict(v.detail)}, failure

    def each(setting_name: str, make, desc: str) -> dict[str, dict]:
        for p in problems:  # records whose scoring failed: scored again from their text, nothing generated
            rec = runs.get(setting_name, p.id)
            if rec is not None and score_status(rec) == "error":
                fields, failure = verdict(p, rec["text"])
                runs.add(
                    {
                        **rec,
                        **fields,
                        "score_history": list(rec.get("score_history") or [])
                        + [{"status": "error", "detail": rec.get("score_detail") or {}}],
                    }
                )
                say(f"{p.id:24} {setting_name:44} scored again: {fields['score_status']}")
                if failure is not None:
                    raise failure
        todo = [p for p in problems if runs.get(setting_name, p.id) is None]
        for p in tqdm(todo, desc=desc, unit="problem", disable=not progress or not todo, dynamic_ncols=True):
            rec = make(prompts[p.id])
            fields, failure = verdict(p, rec["text"])
            rec.update(setting=setting_name, problem=p.id, **fields, sitting=SITTING)
            runs.add(rec)
            say(
                f"{p.id:24} {setting_name:44} {len(rec['token_ids']):4d} tok {rec['wall_s']:8.2f} s "
                f"{fields['score_status']}"
            )
            if failure is not None:
                raise failure
        return {p.id: runs.get(setting_name, p.id) for p in problems}

    base = each(BASELINE, lambda ids: trace(engine, ids, max_new_tokens, k_max), f"baseline trace (exact, K={k_max})")
    screened = screen(base, {pid: ids.tolist() for pid, ids in prompts.items()}, settings)
    front = frontier(screened, min_gain)
    confirmed: dict[str, dict] = {}
    exact = each(
        EXACT,
        lambda ids: run_record(engine, ids, confirm_config(None, max_new_tokens)),
        "confirm: exact-mla (defaults)",
    )
    confirmed[EXACT] = summarize_run(exact, base, min_retention)
    by_name = {s.name: s for s in settings}
    for row in search_order(front, confirm, lambda row: confirmed[row["name"]]["meets_bound"]):
        s = by_name[row["name"]]
        recs = each(
            s.name, lambda ids, s=s: run_record(engine, ids, confirm_config(s, max_new_tokens)), f"confirm: {s.name}"
        )
        confirmed[s.name] = {**summarize_run(recs, base, min_retention), "screen": row}
    chosen = choose(confirmed)
    return {
        "problems": [p.id for p in problems],
        "max_new_tokens": max_new_tokens,
        "min_retention": min_retention,
        "baseline": {
            "method": "exact",
            "drafter": "mla",
            "num_draft_tokens": k_max,
            "adaptive_draft_length": False,
            "accuracy": _accuracy(base.values()),
        },
        "screen": screened,
        "frontier": [r["name"] for r in front],
        "confirmed": confirmed,
        "chosen": None if chosen is None else {"name": chosen, **asdict(by_name[chosen])},
    }


def format_report(report: dict) -> str:
    """The calibration table (markdown): confirmed settings, then the screen's frontier and the choice."""
    lines = [
        f"FLy calibration (LOSSY method) on {len(report['problems'])} problems, {report['max_new_tokens']} new "
        f"tokens; baseline: exact verification, MLA, K = {report['baseline']['num_draft_tokens']} every round "
        f"(the target's own output), accuracy {report['baseline']['accuracy']}.",
        "",
        "Confirmed (the real pipeline: MLA, cost-aware draft length; retention = accuracy / baseline accuracy, "
        "95% bootstrap interval over problems):",
        "",
        "| setting | tok/s | vs exact | retention (95% CI) | lost | gained | deferrals | could defer | "
        "lookup / model / none | identical |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- | ---: |",
    ]
    exact = report["confirmed"].get(EXACT, {}).get("tokens_per_s")
    for name, s in report["confirmed"].items():
        ci = s.get("retention_ci95")
        lv = s.get("draft_levels") or {}
        lines.append(
            f"| {name}{'' if name == EXACT else ' (lossy)'} | {s['tokens_per_s']} | "
            f"{s['tokens_per_s'] / exact:.3f}x | {s['retention']}"
            + (f" ({ci[0]:.2f}-{ci[1]:.2f})" if ci else "")
            + f" | {s['lost']} | {s['gained']} | {s['deferrals']} | {s['deferrable_rounds']} of {s['rounds']} | "
            + " / ".join(f"{100 * lv.get(x, 0):.0f}%" for x in ("lookup", "model", "none"))
            + f" | "
            f"{s['identical']} of {s['problems']} |"
        )
    sittings = sorted({x for s in report["confirmed"].values() for x in s.get("sittings", ["unrecorded"])})
    if len(sittings) > 1 or sittings == ["unrecorded"]:
        lines += [
            "",
            "Timed in "
            + (
                f"{len(sittings)} sittings ({', '.join(sittings)})"
                if "unrecorded" not in sittings
                else "sittings not all recorded (rows written before 2026-12-04 do not say)"
            )
            + ": rows of different sittings differ by several percent for the same work, so a tokens/s "
            "difference of that size between them decides nothing.",
        ]
    lines += [
        "",
        "Screen (first order, on the baseline's rounds; the frontier: most gain for fewest touched problems):",
        "",
        "| setting | gain in tokens per round | deferrals | problems touched | on the frontier |",
        "| --- | ---: | ---: | ---: | --- |",
    ]
    front = set(report["frontier"])
    for r in sorted(report["screen"], key=lambda r: -(r["gain"] or 0)):
        lines.append(
            f"| {r['name']} | {r['gain']} | {r['deferrals']} | {r['touched']} of {r['problems']} | "
            f"{'yes' if r['name'] in front else ''} |"
        )
    chosen = report.get("chosen")
    lines += [
        "",
        f"Chosen: {chosen['name']} (the most tokens/s with retention >= {report['min_retention']})."
        if chosen
        else f"Chosen: none: no confirmed setting kept retention >= {report['min_retention']}.",
    ]
    if report.get("command"):
        lines += ["", f"Command: `{report['command']}`"]
    if report.get("hardware"):
        lines += ["", f"Timed on: {report['hardware']}"]
    return "\n".join(lines)
