"""Why a lossy method got a problem wrong that ``ar`` got right, and whether it keeps ``ar``'s accuracy.

Only a lossy acceptance can make a lossy method's output differ from ``ar``'s when the precision is
batch-invariant (the lossless methods' ``identical to ar`` is 1.00 there), so each answer a lossy method
loses is put in the first class that fits, read from the two result rows:

- ``repetition loop``: the method stopped at the token budget and the end of its output repeats one span of
  at most :data:`MAX_LOOP_PERIOD` tokens at least :data:`MIN_LOOP_REPEATS` times (a loop the loose acceptance
  let in; ``ar`` answered within the budget, or it would not have been right);
- ``truncated at the budget``: the method stopped at the token budget without such a loop (it wrote longer
  than ``ar`` and ran out before its answer);
- ``deferred mismatch``: FLy accepted at least one mismatching token (``fly_deferred`` > 0) and the
  continuation from there gave another answer;
- ``accepted draft step``: SpecGuard accepted at least one drafted step and the answer changed;
- ``other``: none of these (for a method whose lossy rule never fired, a divergence from ``ar`` is a bug).

Each failure also carries where the two outputs part (token index, and the text around the first differing
character), which is what a reader needs to check the class by eye, and whether each output opens by restating
the question (:func:`restates_question`: its first :data:`OPENING_CHARS` characters copy at least
:data:`RESTATE_CHARS` characters of the prompt verbatim). :func:`opening_table` counts those openings per method
over a whole set with the accuracy of each kind: a lossy acceptance that makes answers restate the question
more often than ``ar`` does shows there (MGSM zh/ja: issue 20).

:func:`endings` counts, per method and unpaired, the outputs that stopped at the token budget and those that
end in a repetition loop: at T > 0 a method's output parts from ``ar``'s wherever the two draws differ, lossy
acceptance or not, so the paired classes above say little there, while "does the lossy rule let loops in more
often than ``ar``'s own sampling does" still compares like with like.

:func:`retention` answers "does the method keep ``ar``'s accuracy?" per method: the recovery (method
accuracy / ``ar`` accuracy) with a 95% interval, and the verdict ``kept`` when the whole interval is at least
:data:`KEEP` (FLy's claim: at least 99% of the target's accuracy), ``lost`` when the whole interval is below
it, else ``not decided at n = N``. The interval comes from the paired 2x2 table (both right, only ``ar``
right, only the method right, both wrong) under a Dirichlet posterior with Jeffreys' prior (1/2 per cell),
not from a bootstrap over problems: a bootstrap of a table with no discordant pairs gives the interval
[1, 1] at any n, which would call 10 identical answers "kept". Runs of one set under several seeds can be read
as one (:func:`pooled`): every reading here takes a sequence of directories where it takes one.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Sequence

from loosespec.eval.bench_methods import BASELINE
from loosespec.eval.results import CONFIG, RESULTS, ResultsFile, read_config, read_reruns, unique_rows
from loosespec.eval.stats import summarize

MAX_LOOP_PERIOD = 64  # tokens in the repeated span, at most
MIN_LOOP_REPEATS = 3  # times the span repeats at the end of the output, at least
MIN_LOOP_TOKENS = 24  # tokens the repeating tail covers, at least (a short "\n\n\n" is not a loop)
KEEP = 0.99  # FLy's claim: at least 99% of the target's accuracy
POSTERIOR_DRAWS = 20000  # draws of the paired table's posterior for the recovery's interval
OPENING_CHARS = 200  # the opening of an output: its first characters
RESTATE_CHARS = 20  # copied from the prompt verbatim within the opening, at least: "restates the question"
CLASSES = ("repetition loop", "truncated at the budget", "deferred mismatch", "accepted draft step", "other")


def first_divergence(a: Sequence, b: Sequence) -> int | None:
    """Index of the first position where ``a`` and ``b`` differ (the shorter length when one is a prefix of
    the other); None when they are equal."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def repetition_loop(ids: Sequence[int]) -> tuple[int, int] | None:
    """(period, tokens covered) of the shortest span that the end of ``ids`` repeats at least
    :data:`MIN_LOOP_REPEATS` times over at least :data:`MIN_LOOP_TOKENS` tokens; None when there is none."""
    n = len(ids)
    for p in range(1, min(MAX_LOOP_PERIOD, n // MIN_LOOP_REPEATS) + 1):
        run = p  # the last p tokens, plus every earlier token equal to the one p after it
        while run < n and ids[n - 1 - run] == ids[n - 1 - run + p]:
            run += 1
        if run >= MIN_LOOP_REPEATS * p and run >= MIN_LOOP_TOKENS:
            return p, run
    return None


def recovery_interval(
    both: int,
    ar_only: int,
    method_only: int,
    neither: int,
    draws: int = POSTERIOR_DRAWS,
    seed: int = 0,  # (not a knob)
) -> tuple[float, float]:
    """95% equal-tailed interval of the recovery (method accuracy / ``ar`` accuracy) from the paired table's
    counts, under a Dirichlet posterior with Jeffreys' prior (1/2 per cell); numpy's Dirichlet draws."""
    import numpy as np

    p = np.random.default_rng(seed).dirichlet(np.array([both, ar_only, method_only, neither], float) + 0.5, draws)
    ratio = (p[:, 0] + p[:, 2]) / (p[:, 0] + p[:, 1])
    lo, hi = np.quantile(ratio, [0.025, 0.975])
    return round(float(lo), 4), round(float(hi), 4)


def restates_question(output: str, prompt: str) -> bool:
    """Whether ``output``'s first :data:`OPENING_CHARS` characters copy at least :data:`RESTATE_CHARS` characters
    of ``prompt`` in one verbatim span (difflib's longest common block)."""
    import difflib

    opening = output[:OPENING_CHARS]
    match = difflib.SequenceMatcher(None, opening, prompt, autojunk=False).find_longest_match(
        0, len(opening), 0, len(prompt)
    )
    return match.size >= RESTATE_CHARS


def _prompts(config: dict) -> dict[str, str]:
    """The prompt of every problem of the run ``config`` describes, by id ({} when its set cannot be read here,
    e.g. NIAH without the essays: the openings then show as "-")."""
    from loosespec.errors import LoosespecError
    from loosespec.eval.datasets import load_dataset

    try:
        problems = load_dataset(config["dataset"], None, config.get("data_dir"), **config.get("dataset_options", {}))
    except (LoosespecError, OSError, KeyError):
        return {}
    return {p.id: p.prompt for p in problems}


def _answer(dataset: str, row: dict):
    """What the scorer read from the output where it reads a number (gsm8k, mgsm); else right/wrong."""
    from loosespec.eval.datasets import DATASETS
    from loosespec.eval.scoring import extract_number, score_number

    spec = DATASETS.get(dataset)
    if spec is not None and spec.scorer is score_number:
        return extract_number(row["output"])
    return {True: "right", False: "wrong", None: "-"}[None if row.get("score") is None else bool(row["score"])]


def _gold(dataset: str, row: dict):
    """The reference answer as one table cell: none where it is a reference solution that tests stand in for
    (``DatasetSpec.short_answer``: HumanEval's is a whole function), else on one line."""
    from loosespec.eval.datasets import DATASETS

    gold, spec = row.get("answer"), DATASETS.get(dataset)
    if gold is None or (spec is not None and not spec.short_answer):
        return "-"
    return _one_line(str(gold))


def _one_line(text: str) -> str:
    """Text as one markdown table cell: newlines shown as ⏎, pipes escaped."""
    return text.replace("\n", "⏎").replace("|", "\\|")


def _snippet(text: str, at: int, before: int = 50, after: int = 40) -> str:
    return _one_line(text[max(0, at - before) : at] + "»" + text[at : at + after]).replace("`", "'")


def classify(ar_row: dict, row: dict, max_new_tokens: int, dataset: str = "", prompt: str | None = None) -> dict:
    """The class of one lost answer (see the module docstring), where the outputs part, and (given the problem's
    ``prompt``) whether each opens by restating the question."""
    stats = row.get("stats") or {}
    at_budget = row["new_tokens"] >= max_new_tokens
    loop = repetition_loop(row["token_ids"]) if at_budget else None
    if loop:
        cls = "repetition loop"
    elif at_budget:
        cls = "truncated at the budget"
    elif stats.get("fly_deferred", 0) > 0:
        cls = "deferred mismatch"
    elif stats.get("accepted_steps", 0) > 0:
        cls = "accepted draft step"
    else:
        cls = "other"
    char = first_divergence(ar_row["output"], row["output"])
    return {
        "question_id": row["question_id"],
        "method": row["method"],
        "class": cls,
        "diverged_at_token": first_divergence(ar_row["token_ids"], row["token_ids"]),
        "new_tokens": row["new_tokens"],
        "ar_new_tokens": ar_row["new_tokens"],
        "gold": _gold(dataset, row),
        "ar_answer": _answer(dataset, ar_row),
        "method_answer": _answer(dataset, row),
        "deferred": stats.get("fly_deferred"),
        "accepted_steps": stats.get("accepted_steps"),
        "loop_period": loop[0] if loop else None,
        "restates": None
        if prompt is None
        else (restates_question(ar_row["output"], prompt), restates_question(row["output"], prompt)),
        "ar_text": _snippet(ar_row["output"], char) if char is not None else "",
        "text": _snippet(row["output"], char) if char is not None else "",
    }


def _load(out: Path) -> tuple[list[dict], dict]:
    """A results directory's rows (read without changing anything; a repeated (question, method) pair once, with a
    warning) and its config (one line naming config.json when it is damaged)."""
    out = Path(out)
    return unique_rows(ResultsFile(out / RESULTS).read(), str(out / RESULTS))[0], read_config(out)


def _name(d: Path, root: Path | None) -> str:
    return str(Path(d).relative_to(root)) if root else str(d)


def _key(d: Path | Sequence[Path]):  # a directory, or a pool of them, as a dict key
    return d if isinstance(d, (str, Path)) else tuple(d)


def _label(d: Path | Sequence[Path], root: Path | None) -> str:
    return _name(d, root) if isinstance(d, (str, Path)) else " + ".join(_name(x, root) for x in d)


def _read(d: Path | Sequence[Path]) -> tuple[list[dict], dict]:
    return _load(d) if isinstance(d, (str, Path)) else pooled(d)


def _reruns(d: Path | Sequence[Path]) -> list[dict]:
    """``ar``'s reruns (``reruns.jsonl``) of a directory, or of pooled ones with their question ids prefixed as
    :func:`pooled` prefixes the rows'."""
    if isinstance(d, (str, Path)):
        return read_reruns(d)
    return [
        {**r, "question_id": f"s{read_config(x).get('seed')}:{r['question_id']}", "problem": r["question_id"]}
        for x in d
        for r in read_reruns(x)
    ]


def failures(out: Path | Sequence[Path]) -> list[dict]:
    """Every problem of the results directory ``out`` (or pooled directories, :func:`pooled`) that ``ar`` scored
    right and a lossy method wrong, classified (:func:`classify`), in the order of the problems' numbers (``gsm8k/2`` before ``gsm8k/10``)."""
    return _failures(*_read(out))


def _failures(rows: list[dict], config: dict) -> list[dict]:
    ar = {r["question_id"]: r for r in rows if r["method"] == BASELINE}
    lost = [
        r
        for r in rows
        if r["lossy"]
        and r["question_id"] in ar
        and ar[r["question_id"]].get("score")
        and r.get("score") is not None
        and not r["score"]
    ]
    prompts = _prompts(config) if lost else {}
    lost = [
        classify(
            ar[r["question_id"]],
            r,
            config["max_new_tokens"],
            config.get("dataset", ""),
            prompts.get(r.get("problem", r["question_id"])),
        )
        for r in lost
    ]
    return sorted(
        lost, key=lambda f: ([int(t) if t.isdigit() else t for t in re.split(r"(\d+)", f["question_id"])], f["method"])
    )


def openings(out: Path | Sequence[Path]) -> dict[str, dict]:
    """Per method of the results directory ``out`` (or pooled directories; ``ar`` included), over its scored rows:
    how many open by restating the question (:func:`restates_question`), and the accuracy of those and of the
    others."""
    return _openings(*_read(out))


def _openings(rows: list[dict], config: dict) -> dict[str, dict]:
    prompts = _prompts(config)
    tally: dict[str, dict[bool, list[int]]] = {}
    for r in rows:
        prompt = prompts.get(r.get("problem", r["question_id"]))
        if r.get("score") is None or prompt is None:
            continue
        kind = tally.setdefault(r["method"], {True: [0, 0], False: [0, 0]})[restates_question(r["output"], prompt)]
        kind[0] += 1
        kind[1] += bool(r["score"])
    return {
        m: {
            "scored": t[True][0] + t[False][0],
            "restates": t[True][0],
            "accuracy_restating": t[True][1] / t[True][0] if t[True][0] else None,
            "accuracy_other": t[False][1] / t[False][0] if t[False][0] else None,
        }
        for m, t in tally.items()
    }


def endings(out: Path | Sequence[Path]) -> dict[str, dict]:
    """Per method of the results directory ``out`` (``ar`` included; a sequence of directories is pooled, see
    :func:`pooled`), over its scored rows: how many stopped at the token budget, how many of those end in a
    repetition loop (:func:`repetition_loop`), and how many of those were right anyway. Unpaired, so it reads
    the same at any temperature: at T > 0, where the paired classes compare two draws, "does the lossy rule let
    loops in more often than ``ar``'s own sampling does" compares like with like."""
    return _endings(*_read(out))


def _endings(rows: list[dict], config: dict) -> dict[str, dict]:
    budget, tally = config["max_new_tokens"], {}
    for r in rows:
        if r.get("score") is None:
            continue
        t = tally.setdefault(r["method"], {"scored": 0, "at_budget": 0, "loops": 0, "right_at_budget": 0})
        t["scored"] += 1
        if r["new_tokens"] >= budget:
            t["at_budget"] += 1
            t["loops"] += repetition_loop(r["token_ids"]) is not None
            t["right_at_budget"] += bool(r["score"])
    return tally


def ending_table(dirs: Sequence[Path | Sequence[Path]], root: Path | None = None, loaded: dict | None = None) -> str:
    """One line per (result directory or pooled directories, method): :func:`endings`."""
    loaded = loaded or {}
    lines = [
        "| results | method | n | stopped at the token budget | ends in a repetition loop | right anyway |",
        "| --- | --- | ---: | ---: | ---: | ---: |",
    ]
    for d in dirs:
        for m, t in _endings(*(loaded.get(_key(d)) or _read(d))).items():
            lines.append(
                f"| {_label(d, root)} | {m} | {t['scored']} | {t['at_budget']} "
                f"({t['at_budget'] / t['scored']:.2f}) | {t['loops']} | {t['right_at_budget']} |"
            )
    return "\n".join(lines) if len(lines) > 2 else ""


def opening_table(dirs: Sequence[Path | Sequence[Path]], root: Path | None = None, loaded: dict | None = None) -> str:
    """One line per (result directory or pooled directories, method): :func:`openings`; "" when no directory's
    prompts can be read. ``loaded`` maps a directory (a tuple for a pool) to its ``(rows, config)`` when the
    caller has read them already."""
    loaded = loaded or {}
    lines = [
        "| results | method | n | opens by restating the question | accuracy when it does | "
        "accuracy when it does not |",
        "| --- | --- | ---: | ---: | ---: | ---: |",
    ]
    for d in dirs:
        for m, v in _openings(*(loaded.get(_key(d)) or _read(d))).items():
            acc = ["-" if a is None else f"{a:.2f}" for a in (v["accuracy_restating"], v["accuracy_other"])]
            lines.append(
                f"| {_label(d, root)} | {m} | {v['scored']} | {v['restates']} "
                f"({v['restates'] / v['scored']:.2f}) | {acc[0]} | {acc[1]} |"
            )
    return "\n".join(lines) if len(lines) > 2 else ""


def failure_table(dirs: Sequence[Path | Sequence[Path]], root: Path | None = None) -> str:
    """Counts per (set, method, class), the openings that restate the question per method (:func:`opening_table`),
    how each method's outputs end (:func:`ending_table`), then one line per lost answer, for the result
    directories ``dirs`` (an entry that is a sequence of directories is read as one pooled run, :func:`pooled`)."""
    counts: dict[tuple[str, str], dict[str, int]] = {}
    lines = []
    loaded = {_key(d): _read(d) for d in dirs}  # each run read once, for every table below
    for d in dirs:
        name = _label(d, root)
        for f in _failures(*loaded[_key(d)]):
            counts.setdefault((name, f["method"]), dict.fromkeys(CLASSES, 0))[f["class"]] += 1
            restates = "-" if f["restates"] is None else " / ".join("yes" if x else "no" for x in f["restates"])
            lines.append(
                f"| {f['question_id']} | {f['method']} | {f['class']} | {restates} | "
                f"{f['diverged_at_token']} | {f['ar_new_tokens']} / {f['new_tokens']} | "
                f"{f['gold']} / {f['ar_answer']} / {f['method_answer']} | `{f['ar_text']}` | `{f['text']}` |"
            )
    head = "| results | method | lost answers | " + " | ".join(CLASSES) + " |"
    table = [head, "| --- | --- |" + " ---: |" * (len(CLASSES) + 1)]
    for (name, m), c in counts.items():
        table.append(f"| {name} | {m} | {sum(c.values())} | " + " | ".join(str(c[k]) for k in CLASSES) + " |")
    if not counts:
        table.append("| " + ", ".join(_label(d, root) for d in dirs) + " | (none lost) |" + " 0 |" * (len(CLASSES) + 1))
    for extra in (opening_table(dirs, root, loaded), ending_table(dirs, root, loaded)):
        table += ["", extra] if extra else []
    if lines:
        table += [
            "",
            "| problem | method | class | restates the question (ar / method) | parts from ar at token "
            "| tokens (ar / method) | answer (gold / ar / method) | ar (» where they part) | method |",
            "| --- | --- | --- | --- | ---: | ---: | ---: | --- | --- |",
        ] + lines
    return "\n".join(table)


POOL_KEYS = ("dataset", "target", "draft", "dtype", "max_new_tokens", "temperature", "top_p", "top_k")


def pooled(dirs: Sequence[Path]) -> tuple[list[dict], dict]:
    """The rows of several results directories of one set and settings that differ only in ``--seed``, as one
    run: each question id is prefixed with its run's seed (``s1:gsm8k/7``; ``problem`` keeps the set's id), so a
    problem pairs with ``ar``'s row of the same seed only and counts once per seed. At T > 0 one seed is one
    draw per method, and ``ar``'s own draw is as noisy as the method's; pooling the seeds is what makes the paired table an estimate. The draws of
    one problem under different seeds are independent given the problem, so :func:`recovery_interval` on the
    pooled table is an interval for these problems; it does not widen for the choice of problems, which a
    larger ``--limit`` does. Raises :class:`~loosespec.errors.LoosespecError` when the runs differ in anything
    but the seed (:data:`POOL_KEYS`) or repeat a seed."""
    from loosespec.errors import LoosespecError

    missing = [str(Path(d) / f) for d in dirs for f in (RESULTS, CONFIG) if not (Path(d) / f).is_file()]
    if missing:
        raise LoosespecError(f"cannot pool: {', '.join(missing)} not found (a directory written by `loosespec bench`)")
    loaded = [_load(d) for d in dirs]
    first = loaded[0][1]
    for d, (_, cfg) in zip(dirs, loaded):
        differ = [k for k in POOL_KEYS if cfg.get(k) != first.get(k)]
        if differ:
            raise LoosespecError(
                f"cannot pool {d} with {dirs[0]}: they differ in {', '.join(differ)} (only --seed may differ)"
            )
    seeds = [cfg.get("seed") for _, cfg in loaded]
    if len(set(seeds)) < len(seeds):
        raise LoosespecError(f"cannot pool runs that repeat a seed ({seeds}): each seed's draws would count twice")
    rows = [
        {**r, "question_id": f"s{cfg.get('seed')}:{r['question_id']}", "problem": r["question_id"]}
        for rs, cfg in loaded
        for r in rs
    ]
    return rows, {**first, "seed": seeds}


def summary_recovery_interval(s: dict) -> tuple[float, float]:
    """:func:`recovery_interval` of one method's summary entry (``summary.json``'s ``methods[m]``): the paired table
    rebuilt from its counts (``scored``, ``ar_accuracy``, ``ar_right_method_wrong``, ``ar_wrong_method_right``)."""
    ar_only, method_only = s["ar_right_method_wrong"], s["ar_wrong_method_right"]
    both = round(s["ar_accuracy"] * s["scored"]) - ar_only
    return recovery_interval(both, ar_only, method_only, s["scored"] - both - ar_only - method_only)


def keep_verdict(ci: tuple[float, float], n: int) -> str:
    """``kept`` when the recovery's whole 95% interval ``ci`` is at least :data:`KEEP`, ``lost`` when it is all
    below, else ``not decided at n = N``."""
    if ci[0] >= KEEP:
        return "kept"
    if ci[1] < KEEP:
        return "lost"
    return f"not decided at n = {n}"


def retention(out: Path | Sequence[Path]) -> dict[str, dict]:
    """Per lossy method of the results directory ``out``: n, accuracies, paired counts, McNemar's exact p,
    the speedup, the recovery with its 95% interval (:func:`recovery_interval`) and the verdict against
    :data:`KEEP`. A sequence of directories (runs of one set that differ in ``--seed``) is read as one pooled
    run (:func:`pooled`)."""
    rows, _ = _read(out)
    summary = summarize(rows, reruns=_reruns(out))["methods"]
    verdicts = {}
    for m, s in summary.items():
        if not s["lossy"] or "accuracy" not in s:
            continue
        ci = summary_recovery_interval(s)
        verdict = keep_verdict(ci, s["scored"])
        verdicts[m] = {
            **{
                k: s[k]
                for k in (
                    "scored",
                    "ar_accuracy",
                    "accuracy",
                    "accuracy_ci95",
                    "recovery",
                    "ar_right_method_wrong",
                    "ar_wrong_method_right",
                    "mcnemar_p",
                    "speedup",
                    "speedup_ci95",
                )
            },
            "recovery_ci95": ci,
            "verdict": verdict,
        }
    return verdicts


def _ci(ci, spec: str = ".2f") -> str:
    return f" ({ci[0]:{spec}}-{ci[1]:{spec}})" if ci else ""


def retention_table(dirs: Sequence[Path | Sequence[Path]], root: Path | None = None) -> str:
    """One line per (result directory, lossy method): :func:`retention`. An entry of ``dirs`` that is itself a
    sequence of directories is one pooled line (:func:`pooled`), named by its directories joined with " + "."""
    lines = [
        "| results | method | n | ar accuracy | accuracy (95% CI) | recovery (95% CI) | lost / gained "
        "| McNemar p | speedup (95% CI) | keeps >= 99% of ar? |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    for d in dirs:
        name = _label(d, root)
        for m, v in retention(d).items():
            recovery = "-" if v["recovery"] is None else f"{v['recovery']:.2f}{_ci(v['recovery_ci95'])}"
            lines.append(
                f"| {name} | {m} | {v['scored']} | {v['ar_accuracy']:.2f} | "
                f"{v['accuracy']:.2f}{_ci(v['accuracy_ci95'])} | {recovery} | "
                f"{v['ar_right_method_wrong']} / {v['ar_wrong_method_right']} | {v['mcnemar_p']:.3g} | "
                + ("-" if v["speedup"] is None else f"{v['speedup']:.2f}x{_ci(v['speedup_ci95'])}")
                + f" | {v['verdict']} |"
            )
    return "\n".join(lines)
