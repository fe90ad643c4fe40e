"""FLy's calibration: the grid, the screen on traced rounds, the frontier, the choice, resuming, end to end on the
tiny pair; and that the calibrated preset is what the committed calibration chose."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from loosespec.config import FLY_PRESETS
from loosespec.eval.calibrate_fly import (
    BASELINE,
    EXACT,
    SITTING,
    FlySetting,
    RunsFile,
    calibrate_fly,
    choose,
    format_report,
    frontier,
    grid,
    replay_round,
    screen,
    summarize_run,
)
from loosespec.eval.datafiles import Problem

ROOT = Path(__file__).resolve().parents[2]


def test_grid_drops_windows_that_cannot_fit_the_draft():
    g = grid([0.3, 0.6], [2, 5], [4, 15], [0])
    assert FlySetting(0.3, 5, 4) not in g and FlySetting(0.3, 2, 4) in g and FlySetting(0.6, 5, 15) in g
    assert len(g) == 6
    assert FlySetting(0.3, 5).knobs() == {
        "fly_entropy_threshold": 0.3,
        "fly_window_size": 5,
        "num_draft_tokens": 15,
        "fly_copy_guard": 0,
        "fly_boundary": "window",
    }


# a traced round: draft of 8, mismatch at 2 (entropy 0.8), the rest matching
ROUND = {"draft": [5, 6, 7, 8, 9, 10, 11, 12], "match": "11011111", "entropy": [0, 0, 0.8, 0, 0, 0, 0, 0]}


@pytest.mark.parametrize(
    "setting,expected",
    [
        (FlySetting(0.3, 3, 15), (2, 8, 1)),  # gate open, window 3..5 matches, 2 + 3 < 8: deferred, all 8 kept
        (FlySetting(0.9, 3, 15), (2, 2, 0)),  # gate closed at theta 0.9
        (FlySetting(0.3, 6, 15), (2, 2, 0)),  # 2 + 6 = 8: the window does not fit the drafted 8
        (FlySetting(0.3, 2, 4), (2, 2, 0)),  # K = 4 cuts the round to 4 drafted: 2 + 2 = 4, no room
        (FlySetting(0.3, 1, 4), (2, 4, 1)),  # ... 2 + 1 < 4: deferred, all 4 kept
    ],
)
def test_replay_round(setting, expected):
    assert replay_round(ROUND, setting) == expected


def test_screen_gain_deferrals_touched_and_the_frontier():
    traces = {"a": {"rounds": [ROUND, ROUND]}, "b": {"rounds": [{**ROUND, "entropy": [0.0] * 8}]}}
    rows = {
        r["name"]: r
        for r in screen(
            traces, {"a": [1, 2], "b": [1, 2]}, [FlySetting(0.3, 3), FlySetting(0.9, 3), FlySetting(0.3, 2)]
        )
    }
    loose = rows[FlySetting(0.3, 3).name]
    # exact keeps 2 + 1 tokens per round (3 rounds: 9); the setting 8 + 1 on a's two rounds, 3 on b's: 21
    assert loose["deferrals"] == 2 and loose["touched"] == 1 and loose["gain"] == pytest.approx(21 / 9, abs=1e-4)
    assert rows[FlySetting(0.9, 3).name]["gain"] == 1.0 and rows[FlySetting(0.9, 3).name]["touched"] == 0
    front = frontier(list(rows.values()))
    assert [r["name"] for r in front] == [FlySetting(0.3, 3).name]  # (0.3, 2) ties it on both counts; 0.9 gains nothing
    guarded = screen(traces, {"a": [9, 7, 8, 9, 10], "b": [1]}, [FlySetting(0.3, 3, copy_guard=3)])[0]
    assert guarded["deferrals"] == 0  # the kept 7 8 9 copies the prompt of a


def test_search_order_bisects_the_frontier():
    from loosespec.eval.calibrate_fly import search_order

    front = [{"name": str(i)} for i in range(15)]
    keeps = lambda limit: lambda row: int(row["name"]) <= limit  # noqa: E731  settings up to `limit` keep the bound
    assert [r["name"] for r in search_order(front, 3, keeps(9))] == ["7", "11", "9"]
    assert [r["name"] for r in search_order(front, 3, keeps(2))] == ["7", "3", "1"]
    assert [r["name"] for r in search_order(front, 10, keeps(14))] == ["7", "11", "13", "14"]
    assert list(search_order([], 3, keeps(0))) == []


def _rec(score, tokens=10, wall=1.0, **stats):
    return {"score": score, "token_ids": list(range(tokens)), "wall_s": wall, "stats": stats}


def test_summarize_run_and_choose():
    base = {p: _rec(s) for p, s in zip("abcd", (True, True, True, False))}
    fast_lossy = {
        "a": _rec(True, wall=0.5),
        "b": _rec(False, wall=0.5),
        "c": _rec(True, wall=0.5),
        "d": _rec(False, wall=0.5),
    }
    slow_kept = {
        p: _rec(r["score"], wall=0.8, fly_deferred=1, rounds_lookup=2, rounds_model=1, rounds_none=1)
        for p, r in base.items()
    }
    a = summarize_run(fast_lossy, base)
    assert a["retention"] == pytest.approx(2 / 3, abs=1e-4) and a["lost"] == 1 and a["gained"] == 0
    assert not a["meets_bound"] and a["tokens_per_s"] == 20.0
    b = summarize_run(slow_kept, base)
    assert b["meets_bound"] and b["retention"] == 1.0 and b["deferrals"] == 4
    assert b["draft_levels"] == {"lookup": 0.5, "model": 0.25, "none": 0.25}
    assert choose({EXACT: summarize_run(base, base), "fast": a, "kept": b}) == "kept"
    assert choose({EXACT: summarize_run(base, base), "fast": a}) is None  # exact is the reference, never the choice


def test_report_says_when_its_rows_span_sittings():
    """tokens/s of rows timed in different process starts are not comparable to a few percent: the table says so."""
    base = {p: _rec(True) for p in "ab"}
    one = {p: {**_rec(True), "sitting": "2026-12-04T10:00:00Z"} for p in "ab"}
    other = {p: {**_rec(True), "sitting": "2026-12-04T20:00:00Z"} for p in "ab"}
    report = {
        "problems": ["a", "b"],
        "max_new_tokens": 8,
        "min_retention": 0.99,
        "screen": [],
        "frontier": [],
        "baseline": {"num_draft_tokens": 15, "accuracy": 1.0},
        "chosen": None,
        "confirmed": {EXACT: summarize_run(one, base), "x": summarize_run(one, base)},
    }
    assert "sittings" not in format_report(report)
    report["confirmed"]["y"] = summarize_run(other, base)
    assert "Timed in 2 sittings (2026-12-04T10:00:00Z, 2026-12-04T20:00:00Z)" in format_report(report)
    report["confirmed"]["z"] = summarize_run(base, base)  # rows from before sittings were recorded
    assert "sittings not all recorded" in format_report(report)


def test_runs_file_resumes_and_survives_a_torn_line(tmp_path):
    path = tmp_path / "fly.runs.jsonl"
    runs = RunsFile(path)
    runs.add({"setting": BASELINE, "problem": "p1", "score": True})
    with open(path, "a") as f:
        f.write('{"setting": "x", "problem"')  # killed mid-write
    again = RunsFile(path)
    assert again.get(BASELINE, "p1")["score"] is True and again.get("x", "p1") is None


def test_calibrate_fly_end_to_end_on_the_tiny_pair(tiny_engine, tmp_path):
    """The four stages on the tiny pair: the baseline trace is exact verification (the target's own greedy
    output), the exact default and frontier settings confirmed, a report written; rerun, nothing runs again."""
    from loosespec.config import DecodeConfig

    problems = [
        Problem(f"t/{i}", "t", p, None)
        for i, p in enumerate(["def add(a, b):\n    return a + b\n\ndef sub(a", "one two three one two three one two"])
    ]
    encode = lambda p: tiny_engine.tokenizer(p.prompt, return_tensors="pt").input_ids[0]  # noqa: E731
    scorer = lambda p, text: len(text) % 2 == 0  # noqa: E731  (any deterministic verdict)
    settings = grid([0.0, 0.5], [1, 2], [6], [0])
    runs = tmp_path / "fly.runs.jsonl"
    report = calibrate_fly(
        tiny_engine,
        problems,
        settings,
        max_new_tokens=24,
        encode=encode,
        scorer=scorer,
        confirm=2,
        runs_file=runs,
        progress=False,
    )
    ar = [tiny_engine.generate(encode(p), DecodeConfig.create("ar", max_new_tokens=24)).token_ids for p in problems]
    base = RunsFile(runs).of(BASELINE)
    assert [base[p.id]["token_ids"] for p in problems] == ar  # lossless: the target's own output
    assert all(len(r["draft"]) == len(r["match"]) == len(r["entropy"]) for b in base.values() for r in b["rounds"])
    assert len(report["screen"]) == 4 and EXACT in report["confirmed"]
    assert set(report["confirmed"]) - {EXACT} <= set(report["frontier"])
    text = format_report(report)
    assert "| setting | tok/s |" in text and "sittings" not in text  # all timed in this one sitting
    assert {r["sitting"] for r in RunsFile(runs).rows.values()} == {SITTING}
    lines = runs.read_text().count("\n")
    calibrate_fly(
        tiny_engine,
        problems,
        settings,
        max_new_tokens=24,
        encode=encode,
        scorer=scorer,
        confirm=2,
        runs_file=runs,
        progress=False,
    )
    assert runs.read_text().count("\n") == lines  # resumed: every record was there


def test_summarize_run_leaves_failed_scorings_out_of_retention():
    """A record whose scoring failed (the sandbox did not start) is no answer, not a lost one; legacy records
    (no score_status) read from score."""

    def rec(status, score=None):
        r = {"token_ids": [1], "wall_s": 1.0, "stats": {}, "score": score}
        if status is not None:
            r["score_status"] = status
        return r

    base = {"a": rec("right", True), "b": rec("right", True), "c": rec(None, False)}
    runs = {"a": rec("error"), "b": rec("right", True), "c": rec("wrong", False)}
    s = summarize_run(runs, base)
    assert s["lost"] == 0 and s["retention"] == 1.0 and s["accuracy"] == 0.5
    assert s["problems"] == 3 and s["scored"] == 2 and s["score_errors"] == 1


def test_a_failed_scoring_is_scored_again_on_resume_without_generating(tiny_engine, tmp_path):
    from loosespec.eval.scoring import ScoringError

    problems = [
        Problem(f"t/{i}", "t", p, None)
        for i, p in enumerate(["def add(a, b):\n    return a + b\n\ndef sub(a", "one two three one two three one two"])
    ]
    encode = lambda p: tiny_engine.tokenizer(p.prompt, return_tensors="pt").input_ids[0]  # noqa: E731

    def broken(p, text):
        if p.id == "t/1":
            raise ScoringError("sandbox could not start", {"sandbox": "none"})
        return True

    settings = grid([0.5], [2], [6], [0])
    runs = tmp_path / "fly.runs.jsonl"
    report = calibrate_fly(
        tiny_engine,
        problems,
        settings,
        max_new_tokens=16,
        encode=encode,
        scorer=broken,
        confirm=1,
        runs_file=runs,
        progress=False,
    )
    assert report["confirmed"][EXACT]["scored"] == 1 and report["confirmed"][EXACT]["score_errors"] == 1
    first = [json.loads(x) for x in runs.read_text().splitlines()]
    failed = [r for r in first if r["problem"] == "t/1"]
    assert failed and all(r["score"] is None and r["score_status"] == "error" for r in failed)
    assert failed[0]["score_detail"] == {"error": "sandbox could not start", "sandbox": "none"}
    report = calibrate_fly(
        tiny_engine,
        problems,
        settings,
        max_new_tokens=16,
        encode=encode,
        scorer=lambda p, text: True,
        confirm=1,
        runs_file=runs,
        progress=False,
    )
    added = [json.loads(x) for x in runs.read_text().splitlines()][len(first) :]
    assert len(added) == len(failed)  # one new verdict per failed record, no new run
    for old, new in zip(failed, added):
        assert new["score_status"] == "right" and new["wall_s"] == old["wall_s"] and new["text"] == old["text"]
    assert report["confirmed"][EXACT]["scored"] == 2 and report["confirmed"][EXACT]["score_errors"] == 0


def test_calibrated_preset_is_what_the_committed_calibration_chose():
    """config.FLY_PRESETS["calibrated"] equals the choice in results/calibration/fly.json (make calibrate-fly)."""
    path = ROOT / "results/calibration/fly.json"
    if not path.exists():
        pytest.skip("no committed FLy calibration yet")
    report = json.loads(path.read_text())
    chosen = report["chosen"]
    assert chosen is not None, "the committed calibration chose no setting"
    preset = FLY_PRESETS["calibrated"]
    assert (
        preset["fly_entropy_threshold"],
        preset["fly_window_size"],
        preset["num_draft_tokens"],
        preset["fly_copy_guard"],
        preset["fly_boundary"],
    ) == (chosen["theta"], chosen["window"], chosen["k"], chosen["copy_guard"], chosen["boundary"])
    assert report["target"] == "qwen2.5-coder-1.5b-instruct" and set(report["datasets"]) >= {"gsm8k-train"}


def test_calibrate_fly_cli_refuses_bad_input():
    from conftest import run_cli

    r = run_cli("calibrate", "--method", "fly", "--window", "20", "--k", "15")
    assert r.returncode == 2 and "grid is empty" in r.stderr
    r = run_cli("calibrate", "--method", "fly", "--theta", "0.005")
    assert r.returncode == 2 and "ambiguous" in r.stderr
    r = run_cli("calibrate", "--method", "fly", "--theta", "x")
    assert r.returncode == 2 and "comma-separated numbers" in r.stderr
    r = run_cli("calibrate", "--method", "fly", "--sg-candidates", "2")
    assert r.returncode == 2 and "does not use --sg-candidates" in r.stderr
