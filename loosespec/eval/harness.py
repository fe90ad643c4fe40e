"""The bench driver: every missing (prompt, method) pair of a results folder run, scored and appended.

``loosespec bench --dataset NAME --out DIR`` runs the chosen methods (:mod:`loosespec.eval.bench_methods`) on the
same prompts in one process (models load once; one short warm-up per method is excluded from timing; methods
interleave per prompt so machine drift hits all alike; :mod:`loosespec.eval.run` runs one) and appends one JSON
line per prompt and method to ``DIR/results.jsonl`` (:mod:`loosespec.eval.results`, which also holds the
folder's lock and ``config.json``). ``DIR/summary.json``, the printed table and ``DIR/*.png`` are derived from
that file alone (:mod:`loosespec.eval.stats`, :mod:`loosespec.eval.report`), so ``loosespec report DIR``
redraws them at any time.

Resuming: every finished (question, method) pair is a flushed line; a rerun with the same command
skips those. Speed is compared only within one sitting (process start, the rows' ``run_id``;
:mod:`loosespec.eval.stats`): where a problem's ``ar`` row comes from an earlier sitting and some of its methods
run in this one, ``ar`` runs again first and its row goes to ``DIR/reruns.jsonl`` (:func:`ar_reruns`), as it does
for the first N problems with ``--reproduce-ar N`` (whether ``ar``'s outputs reproduce across sittings). ``DIR/config.json`` holds what the numbers depend on (models, dtype, device, dataset and its
options, token budget, sampling, seed, SpecGuard's tau); running a different configuration into the same DIR
is an error. The prompt limit and the method list may grow between runs: only the missing pairs run.

Scoring failures are not wrong answers: a row whose scoring failed (``score_status`` ``error``) has no answer,
is left out of accuracy, recovery and McNemar, is counted per method (``score_errors``, and a line under the
printed table), and a resumed run scores its stored output again (no generation, :func:`rescore_errors`): the
run holding the lock replaces those rows in place (``results.jsonl`` rewritten whole through a temporary file
and a rename, every other line byte for byte; the earlier verdicts kept in the row's ``score_history``).
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from loosespec.decode.stats import VLLM_NAMES
from loosespec.errors import LoosespecError
from loosespec.eval.bench_methods import BASELINE
from loosespec.eval.results import RERUNS, RESULTS, ResultsFile, RunLock, _writing, lock_holder, score_status
from loosespec.eval.run import Outcome, judge_output, result_row, run_method
from loosespec.eval.scoring import Verdict

WARMUP_TOKENS = 32  # 8 left transformers' assisted generation paying its one-off set-up in the first timed run
TIMING_POLL_S = 5.0  # how often a run waiting for another run's timing (machine_timing) looks again
WARMUP_PROMPT_TOKENS = 64  # the warm-up's prompt: the first prompt's start (a long prefill would only cost time)


def pending_pairs(problems: Sequence, methods: Sequence[str], done: set[tuple[str, str]]) -> list[tuple]:
    """(problem, method) pairs still to run, problem by problem, methods interleaved."""
    return [(p, m) for p in problems for m in methods if (p.id, m) not in done]


@contextlib.contextmanager
def machine_timing(out: Path, log: Callable[[str], None] | None = None, poll_s: float = TIMING_POLL_S):
    """Hold this machine's timing lock (``$LOOSESPEC_CACHE/timing``, a :class:`RunLock`) while a run times anything:
    a second ``loosespec bench`` on the same machine, on any folder, waits here until the first one's timing ends
    (saying whose it waits for) instead of timing beside it, where the two would share the cores and both runs'
    speed rows would measure that. ``LOOSESPEC_SHARED_TIMING=1`` skips the lock (timings then may share the
    machine; the test suite, which times nothing, sets it)."""
    if os.environ.get("LOOSESPEC_SHARED_TIMING", "") not in ("", "0"):
        yield
        return
    from loosespec.weights.store import cache_root

    lock = RunLock(cache_root() / "timing", f"loosespec bench --out {out}")
    try:
        free = lock.try_acquire()
    except OSError as e:  # a cache this user cannot write (a shared, read-only one): no lock to take
        if log is not None:
            log(f"cannot take this machine's timing lock in {lock.out} ({e}): timing without it")
        yield
        return
    if not free:
        if log is not None:
            log(
                f"another run is timing on this machine ({lock_holder(lock.out)}): waiting for it to end, so the "
                "two runs do not time on shared cores (LOOSESPEC_SHARED_TIMING=1 skips this wait)"
            )
        while not lock.try_acquire():
            time.sleep(poll_s)
        if log is not None:
            log("the other run's timing ended: this run goes on")
    try:
        yield
    finally:
        lock.release()


def ar_reruns(
    problems: Sequence, todo: Sequence[tuple], rows: Sequence[dict], reruns: Sequence[dict], reproduce: int = 0
) -> list[str]:
    """Problems whose ``ar`` runs again in this sitting (into ``reruns.jsonl``), in problem order: each problem with
    an ``ar`` row from an earlier sitting and methods still to run (``todo``: their speed pairs need ``ar`` timed in
    this process start), and, with ``reproduce`` = N, the first N problems with an ``ar`` row that no rerun from
    another sitting has checked yet (whether ``ar``'s outputs reproduce across sittings)."""
    first: dict[str, dict] = {}
    for r in rows:  # a repeated pair counts its first row, as everywhere (results.unique_rows)
        if r["method"] == BASELINE:
            first.setdefault(r["question_id"], r)
    pending = {p.id for p, m in todo if m != BASELINE}
    checked = {r["question_id"] for r in reruns if r.get("run_id") != first.get(r["question_id"], {}).get("run_id")}
    sample = [p.id for p in problems if p.id in first][: max(0, reproduce)]
    want = {q for q in pending if q in first} | {q for q in sample if q not in checked}
    return [p.id for p in problems if p.id in want]


def run_bench(
    engine,
    problems: Sequence,
    methods: Sequence[str],
    out: Path,
    *,
    dataset: str,
    settings: dict,
    encode: Callable,
    scorer: Callable[[object, str], "bool | None | Verdict"],
    model_id: str,
    progress: bool = True,
    log: Callable[[str], None] | None = None,
    vllm=None,
    reproduce_ar: int = 0,
) -> list[dict]:
    """Run every missing (problem, method) pair, appending each result as soon as it is scored, under the folder's
    lock (the one this process holds, e.g. :func:`open_run`'s, or one taken here). Rows whose scoring failed are
    scored again first (:func:`rescore_errors`). ``scorer`` returns a Verdict, or a bool / None.
    ``vllm``: :class:`loosespec.eval.peers.vllm.VllmSettings` for the ``vllm-*`` methods. ``ar`` runs again
    where :func:`ar_reruns` says (``reproduce_ar``: its N), into ``reruns.jsonl``, before the problem's methods."""
    with _writing(out) as lock:
        return _run_bench(
            engine,
            problems,
            methods,
            out,
            lock,
            dataset=dataset,
            settings=settings,
            encode=encode,
            scorer=scorer,
            model_id=model_id,
            progress=progress,
            log=log,
            vllm=vllm,
            reproduce_ar=reproduce_ar,
        )


def _run_bench(
    engine,
    problems: Sequence,
    methods: Sequence[str],
    out: Path,
    lock: RunLock,
    *,
    dataset: str,
    settings: dict,
    encode: Callable,
    scorer: Callable,
    model_id: str,
    progress: bool,
    log: Callable[[str], None] | None,
    vllm,
    reproduce_ar: int = 0,
) -> list[dict]:
    from tqdm.auto import tqdm

    from loosespec.eval.peers.vllm import is_vllm_method

    results = ResultsFile(out / RESULTS, run_id=lock.run_id)
    rows = rescore_errors(out, problems, methods, scorer=scorer, log=log)
    done = {(r["question_id"], r["method"]) for r in rows}
    todo = pending_pairs(problems, [m for m in methods if not is_vllm_method(m)], done)
    reruns = ResultsFile(out / RERUNS, run_id=lock.run_id)
    rerun_rows = reruns.repair() if reruns.path.exists() else []
    again = set(ar_reruns(problems, todo, rows, rerun_rows, reproduce_ar))
    # ar's rerun first, then the problem's methods: a problem's speed pairs are all timed in this sitting
    jobs = [(p, BASELINE, True) for p in problems if p.id in again] + [(p, m, False) for p, m in todo]
    order = {p.id: i for i, p in enumerate(problems)}
    jobs.sort(key=lambda job: (order[job[0].id], not job[2]))  # stable: the methods keep their order
    vllm_todo = {m: [p for p in problems if (p.id, m) not in done] for m in methods if is_vllm_method(m)}
    if not jobs and not any(vllm_todo.values()):
        return rows
    with machine_timing(out, log):
        for m, mine in vllm_todo.items():
            _run_vllm_method(
                m,
                mine,
                out,
                results,
                rows,
                dataset=dataset,
                settings=settings,
                encode=encode,
                scorer=scorer,
                model_id=model_id,
                vllm=vllm,
                progress=progress,
                log=log,
            )
        if not jobs:
            return rows
        warm = list(dict.fromkeys(m for _, m, _ in jobs))
        first_ids = encode(jobs[0][0])[:WARMUP_PROMPT_TOKENS]
        warm_bar = tqdm(warm, desc="warm-up (not timed)", unit="method", disable=not progress, dynamic_ncols=True)
        for m in warm_bar:
            # one short untimed run per method: kernel, allocator and generate() set-up
            short = {**settings, "max_new_tokens": min(WARMUP_TOKENS, settings["max_new_tokens"])}
            run_method(engine, m, first_ids, short)
        ids_cache: dict[str, object] = {}
        bar = tqdm(jobs, desc=f"bench {dataset}", unit="run", disable=not progress, dynamic_ncols=True)
        for problem, method, rerun in bar:
            name = f"{method} (rerun)" if rerun else method
            bar.set_postfix_str(f"{problem.id} {name}")
            if problem.id not in ids_cache:
                ids_cache.clear()
                ids_cache[problem.id] = encode(problem)
            outcome = run_method(engine, method, ids_cache[problem.id], settings)
            target, kept = (reruns, rerun_rows) if rerun else (results, rows)
            _record(
                problem,
                method,
                outcome,
                target,
                kept,
                dataset=dataset,
                scorer=scorer,
                model_id=model_id,
                log=log,
                label=name,
            )
    return rows


def _verdict_note(v: Verdict) -> str:
    if v.status == "error":
        return f"  scoring failed ({v.detail.get('error', 'no detail')}): no answer, scored again on resume"
    return "" if v.status == "unscored" else f"  {v.status}"


def _record(
    problem,
    method: str,
    outcome: Outcome,
    results: "ResultsFile",
    rows: list[dict],
    *,
    dataset: str,
    scorer: Callable,
    model_id: str,
    log: Callable[[str], None] | None,
    label: str | None = None,
) -> None:
    """Score one finished run, append its row (flushed) and log it (as ``label``, else the method). A scoring failure is stored as such
    (``score_status`` ``error``), never as a wrong answer; bad scoring options are raised after the row is written."""
    verdict, failure = judge_output(scorer, problem, outcome.text)
    row = result_row(problem, dataset, method, outcome, verdict, model_id, run_id=results.run_id)
    results.append(row)
    rows.append(row)
    if log is not None:
        log(
            f"{problem.id:24} {label or method:20} {row['new_tokens']:4d} tok {row['wall_time']:8.2f} s"
            + _verdict_note(verdict)
        )
    if failure is not None:
        raise failure


def rescore_errors(
    out: Path, problems: Sequence, methods: Sequence[str], *, scorer: Callable, log: Callable[[str], None] | None = None
) -> list[dict]:
    """Score again, from their stored outputs (no generation), the rows of ``problems`` x ``methods`` whose scoring
    failed (``score_status`` ``error``), once per run, under the folder's lock; replace those rows in
    ``results.jsonl`` (rewritten whole through a temporary file and a rename, every other line as it was), the
    earlier verdicts kept in ``score_history``. Repairs a torn last line first. Returns every row."""
    out = Path(out)
    by_id = {p.id: p for p in problems}
    wanted = set(methods)
    with _writing(out) as lock:
        results = ResultsFile(out / RESULTS)
        rows = results.repair()
        new: dict[int, dict] = {}
        failure = None
        for i, r in enumerate(rows):
            pair = (r["question_id"], r["method"])
            if (
                score_status(r) != "error"
                or pair in lock.rescored
                or r["question_id"] not in by_id
                or r["method"] not in wanted
            ):
                continue
            lock.rescored.add(pair)
            verdict, failure = judge_output(scorer, by_id[r["question_id"]], r.get("output", ""))
            history = list(r.get("score_history") or []) + [
                {
                    "status": "error",
                    "detail": r.get("score_detail") or {},
                    "tstamp": r.get("scored_at", r.get("tstamp")),
                }
            ]
            new[i] = {
                **r,
                "score": verdict.score,
                "score_status": verdict.status,
                "score_detail": dict(verdict.detail),
                "score_history": history,
                "scored_at": time.time(),
            }
            if log is not None:
                log(
                    f"{r['question_id']:24} {r['method']:20} scored again from its stored output:"
                    + (_verdict_note(verdict) or "  unscored")
                )
            if failure is not None:
                break
        if new:
            results.replace(new)
            rows = [new.get(i, r) for i, r in enumerate(rows)]
        if failure is not None:
            raise failure
        return rows


def _run_vllm_method(
    method: str,
    problems: Sequence,
    out: Path,
    results: "ResultsFile",
    rows: list[dict],
    *,
    dataset: str,
    settings: dict,
    encode: Callable,
    scorer: Callable,
    model_id: str,
    vllm,
    progress: bool,
    log: Callable[[str], None] | None,
) -> None:
    """One ``vllm serve`` for ``method``: an untimed warm-up request, then its pending prompts in turn."""
    from tqdm.auto import tqdm

    from loosespec.eval.peers.vllm import (
        VllmServer,
        fly_record,
        served,
        size_for_shared_gpu,
        speculative_tokens,
        vllm_generate,
    )

    if not problems:
        return
    if vllm is None:
        raise LoosespecError(f"method '{method}' needs vLLM settings (the CLI passes them)")
    vllm, sized = size_for_shared_gpu(vllm)  # the engine may hold part of the GPU vLLM is about to claim
    if sized and log is not None:
        log(sized)
    s = settings
    kw = dict(
        max_new_tokens=s["max_new_tokens"],
        temperature=s["temperature"],
        seed=s["seed"],
        top_p=s["top_p"],
        top_k=s["top_k"],
    )
    serves, drafter = served(method)  # the loosespec method it serves, its drafter (None: no speculation)
    server_info = {
        "dtype": vllm.dtype,
        "num_speculative_tokens": None if drafter is None else speculative_tokens(method, vllm),
        "fly": serves.loose_window,
        "concurrency": vllm.concurrency,
        "gpu_memory_utilization": vllm.gpu_memory_utilization,
        **fly_record(method, vllm),
    }  # FLy's path (vLLM's native FLy or the plugin) and why

    def finish(problem, text, token_ids, wall, stats, request):
        outcome = Outcome(
            text,
            token_ids,
            wall,
            [],
            stats,
            {"method": method, "engine": "vllm", "request": request, "server": server_info},
        )
        _record(problem, method, outcome, results, rows, dataset=dataset, scorer=scorer, model_id=model_id, log=log)

    with VllmServer(method, vllm, out / "vllm.log") as server:
        first = [int(i) for i in encode(problems[0])[:WARMUP_PROMPT_TOKENS]]
        vllm_generate(server.base_url, first, **{**kw, "max_new_tokens": min(WARMUP_TOKENS, s["max_new_tokens"])})
        bar = tqdm(
            total=len(problems), desc=f"bench {dataset} {method}", unit="run", disable=not progress, dynamic_ncols=True
        )
        if vllm.concurrency == 1:  # batch of one: each request's own counters
            for problem in problems:
                text, token_ids, wall, delta, request = vllm_generate(
                    server.base_url, [int(i) for i in encode(problem)], **kw
                )
                drafts = int(delta["drafts"])
                counts = {
                    "drafts": drafts,
                    "drafted_tokens": int(delta["draft_tokens"]),
                    "accepted_tokens": int(delta["accepted"]),
                }
                finish(
                    problem,
                    text,
                    token_ids,
                    wall,
                    {
                        "new_tokens": len(token_ids),
                        "rounds": drafts if drafts else len(token_ids),
                        **counts,
                        # vLLM's own names for them, as a loosespec row's stats has them (Stats.to_dict)
                        **{vllm: counts[ours] for vllm, ours in VLLM_NAMES.items()},
                        "wall_s": round(wall, 4),
                        "vllm_counters": delta,
                    },
                    request,
                )
                bar.update()
        else:  # concurrent load: blocks of `concurrency` requests in flight; counters per block
            from concurrent.futures import ThreadPoolExecutor

            from loosespec.eval.peers.vllm import spec_counters

            n = vllm.concurrency
            with ThreadPoolExecutor(n) as pool:
                for b in range(0, len(problems), n):
                    block = problems[b : b + n]
                    before, t = spec_counters(server.base_url), time.perf_counter()
                    futures = [
                        pool.submit(vllm_generate, server.base_url, [int(i) for i in encode(p)], counters=False, **kw)
                        for p in block
                    ]
                    done = [f.result() for f in futures]
                    makespan = time.perf_counter() - t
                    after = spec_counters(server.base_url)
                    delta = {k: after[k] - before[k] for k in after}
                    toks = sum(len(d[1]) for d in done)
                    tau = 1 + delta["accepted"] / delta["drafts"] if delta["drafts"] else 1.0
                    for problem, (text, token_ids, wall, _, request) in zip(block, done):
                        # vLLM's counters cannot be split between requests in flight together: each row's
                        # rounds come from its block's mean accepted length
                        finish(
                            problem,
                            text,
                            token_ids,
                            wall,
                            {
                                "new_tokens": len(token_ids),
                                "rounds": max(1, round(len(token_ids) / tau)),
                                "rounds_from_block": True,
                                "wall_s": round(wall, 4),
                                "block": {
                                    "requests": len(block),
                                    "makespan_s": round(makespan, 4),
                                    "new_tokens": toks,
                                    "vllm_counters": delta,
                                },
                            },
                            request,
                        )
                        bar.update()
        bar.close()
