"""The bench harness: summary arithmetic on hand-made results, results-file recovery, config
checks, and (tiny offline models) resume after a finished run, a torn line and a kill -9."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest
from conftest import run_cli as cli

from loosespec.errors import LoosespecError
from loosespec.eval import bench_methods as M
from loosespec.eval import harness as H
from loosespec.eval import report as RP
from loosespec.eval import results as R
from loosespec.eval import stats as S


def row(qid, method, wall, ids, score=None, rounds=None, cat="c", drafted=None, accepted=None, lengths=None):
    return {
        "question_id": qid,
        "category": cat,
        "method": method,
        "lossy": M.is_lossy(method),
        "wall_time": wall,
        "token_ids": ids,
        "new_tokens": len(ids),
        "rounds": rounds if rounds is not None else len(ids),
        "accept_lengths": lengths or [],
        "score": score,
        "drafted_tokens": drafted,
        "accepted_tokens": accepted,
        "stats": {},
    }


HAND = [
    row("q1", "ar", 10.0, [1, 2, 3, 4], True, cat="a"),
    row("q2", "ar", 30.0, [5, 6, 7, 8, 9, 10], False, cat="b"),
    row("q3", "ar", 20.0, [1, 1], True, cat="b"),
    row("q1", "fly-ngram", 5.0, [1, 2, 3, 4], True, rounds=2, cat="a", drafted=6, accepted=2, lengths=[3, 1]),
    row("q2", "fly-ngram", 10.0, [5, 6, 0, 8, 9, 10], True, rounds=3, cat="b", drafted=9, accepted=3),
    row("q3", "fly-ngram", 5.0, [1, 2], False, rounds=1, cat="b", drafted=3, accepted=1),
]


def test_summary_arithmetic_on_hand_made_results():
    s = S.summarize(HAND)
    ar, fly = s["methods"]["ar"], s["methods"]["fly-ngram"]
    assert ar["speedup"] == 1.0 and ar["mean_accepted_length"] == 1.0 and ar["identical_to_ar"] == 1.0
    assert fly["speedup"] == pytest.approx(60 / 20)  # total ar wall / total method wall
    assert fly["tokens_per_s"] == pytest.approx(12 / 20)
    assert fly["mean_accepted_length"] == pytest.approx(12 / 6)  # tokens / rounds over all rounds
    assert fly["acceptance_rate"] == pytest.approx(6 / 18, abs=1e-4)
    assert fly["accuracy"] == pytest.approx(2 / 3, abs=1e-4) and ar["accuracy"] == pytest.approx(2 / 3, abs=1e-4)
    assert fly["recovery"] == pytest.approx(1.0)
    assert fly["ar_right_method_wrong"] == 1 and fly["ar_wrong_method_right"] == 1
    assert fly["identical_to_ar"] == pytest.approx(1 / 3, abs=1e-4)
    assert fly["lossy"] is True and ar["lossy"] is False
    lo, hi = fly["accuracy_ci95"]
    assert lo < 2 / 3 < hi
    lo, hi = fly["speedup_ci95"]
    assert lo <= 3.0 <= hi
    # per category: b has q2 and q3
    b = s["categories"]["b"]["fly-ngram"]
    assert b["speedup"] == pytest.approx(50 / 15, abs=1e-4) and b["prompts"] == 2
    assert s["categories"]["a"]["fly-ngram"]["speedup"] == pytest.approx(2.0)


def test_summary_counts_only_prompts_shared_with_ar():
    rows = HAND[:1] + [HAND[3], row("q9", "fly-ngram", 1.0, [1], True)]  # q9 has no ar row
    fly = S.summarize(rows)["methods"]["fly-ngram"]
    assert fly["prompts"] == 1 and fly["speedup"] == pytest.approx(2.0)


def test_summary_sums_the_fly_counters_and_the_copy_guards_only_where_it_ran():
    def with_stats(r, **stats):
        return {**r, "stats": stats}

    plain = [with_stats(HAND[3], fly_prefix_mismatches=3, fly_deferred=1), with_stats(HAND[4], fly_prefix_mismatches=2)]
    guarded = [
        {**with_stats(r, fly_prefix_mismatches=2, fly_deferred=0, fly_copy_rejects=1), "method": name}
        for r, name in ((HAND[3], "fly-ngram@fly_copy_guard=4"), (HAND[4], "fly-ngram@fly_copy_guard=4"))
    ]
    s = S.summarize(HAND[:3] + plain + guarded)["methods"]
    assert s["fly-ngram"]["fly_prefix_mismatches"] == 5 and s["fly-ngram"]["fly_deferred"] == 1
    assert "fly_copy_rejects" not in s["fly-ngram"]
    assert s["fly-ngram@fly_copy_guard=4"]["fly_copy_rejects"] == 2


INTEL = {"device": "cpu", "cpu": "Intel(R) Xeon(R) Processor", "cpu_flags": ["avx2", "avx512_vnni"], "threads": 2}
EPYC = {"device": "cpu", "cpu": "AMD EPYC", "cpu_flags": ["avx2"], "threads": 2}


def test_speedup_pairs_rows_timed_on_the_same_machine_only():
    # q1-q2 ran on one machine, q3 on another; then fly-ngram's q2 row was measured again on the second one
    on = {"q1": INTEL, "q2": INTEL, "q3": EPYC}
    rows = [{**r, "hardware": on[r["question_id"]]} for r in HAND]
    rows[4] = {**rows[4], "hardware": EPYC}
    s = S.summarize(rows)
    fly = s["methods"]["fly-ngram"]
    assert fly["prompts"] == 3 and fly["timed_prompts"] == 2  # q2: ar on INTEL, fly-ngram on EPYC
    assert fly["speedup"] == pytest.approx((10 + 20) / (5 + 5))  # not q2's 30 s / 10 s across machines
    assert fly["tokens_per_s"] == pytest.approx((4 + 2) / 10)
    assert fly["accuracy"] == pytest.approx(2 / 3, abs=1e-4)  # accuracy is over all three prompts
    assert "timed_prompts" not in s["methods"]["ar"]
    intel, epyc = (s["machines"][S.machine_label(hw)] for hw in (INTEL, EPYC))
    assert intel["rows"] == 3 and epyc["rows"] == 3
    assert intel["methods"]["fly-ngram"]["prompts"] == 1 and intel["methods"]["fly-ngram"]["speedup"] == 2.0
    assert epyc["methods"]["fly-ngram"]["speedup"] == pytest.approx(4.0)  # q3: 20 s / 5 s
    table = RP.format_table(s)
    assert "3.00x (" in table and ", 2 timed |" in table
    by_machine = RP.format_machine_table(s)
    assert "| AMD EPYC (avx2; 2 threads) | fly-ngram | 1 | 4.00x |" in by_machine


def in_run(rows, run_id, hw=INTEL):
    return [{**r, "run_id": run_id, "hardware": hw} for r in rows]


def test_speedup_pairs_rows_timed_in_the_same_sitting_only():
    # ar ran on all three prompts in sitting A; fly-ngram's q1 in A, its q2 and q3 in sitting B on the same machine
    rows = in_run(HAND[:4], "A") + in_run(HAND[4:], "B")
    s = S.summarize(rows)
    fly = s["methods"]["fly-ngram"]
    assert fly["prompts"] == 3 and fly["timed_prompts"] == 1
    assert fly["refused_speed_pairs"] == {"other sitting": 2}
    assert fly["speedup"] == pytest.approx(10 / 5)  # q1 alone: never q2's or q3's ar timed hours earlier
    assert fly["accuracy"] == pytest.approx(2 / 3, abs=1e-4)  # accuracy pairs all three
    assert "sitting_unrecorded" not in fly and "ar_reproduced" not in s
    notes = " ".join(RP.summary_notes(s))
    assert "Speed pairs refused" in notes and "fly-ngram 2 other sitting" in notes
    # ar rerun in sitting B on q2 (reproducing its tokens) and q3 (not): q2 and q3 pair with the reruns
    reruns = in_run([{**HAND[1], "wall_time": 40.0}, {**HAND[2], "wall_time": 15.0, "token_ids": [1, 9]}], "B")
    s = S.summarize(rows, reruns=reruns)
    fly = s["methods"]["fly-ngram"]
    assert "timed_prompts" not in fly and "refused_speed_pairs" not in fly
    assert fly["speedup"] == pytest.approx((10 + 40 + 15) / (5 + 10 + 5))
    assert s["methods"]["ar"]["speedup"] == 1.0  # ar against its own first rows
    assert s["ar_reproduced"] == {"problems": 2, "identical": 1, "differ": ["q3"]}
    assert "ar rerun in a later sitting on 2 problem(s): 1 reproduced their tokens; differ: q3." in RP.summary_notes(s)
    # a rerun in the ar row's own sitting checks nothing
    assert "ar_reproduced" not in S.summarize(rows, reruns=in_run(HAND[1:2], "A"))


def test_rows_that_name_no_run_pair_by_machine_and_say_so():
    rows = [{**r, "hardware": INTEL} for r in HAND]
    fly = S.summarize(rows)["methods"]["fly-ngram"]
    assert fly["sitting_unrecorded"] == 3 and "refused_speed_pairs" not in fly
    assert any("same machine only, not the same sitting" in n for n in RP.summary_notes(S.summarize(rows)))
    # a row naming its run never pairs with one that names none
    mixed = rows[:3] + in_run(rows[3:], "B")
    fly = S.summarize(mixed)["methods"]["fly-ngram"]
    assert fly["speedup"] is None and fly["refused_speed_pairs"] == {"other sitting": 3}
    assert "| fly-ngram (lossy) | 3 | -, 0 timed |" in RP.format_table(S.summarize(mixed))


def test_ar_reruns_retime_problems_whose_methods_run_in_a_later_sitting():
    class P:
        def __init__(self, i):
            self.id = i

    ps = [P("a"), P("b"), P("c"), P("d")]
    rows = in_run([row(q, "ar", 1.0, [1]) for q in ("a", "b", "c")], "A") + in_run(
        [row("a", "exact-ngram", 1, [1])], "A"
    )
    todo = H.pending_pairs(ps, ["ar", "exact-ngram"], {(r["question_id"], r["method"]) for r in rows})
    # b and c: exact-ngram still to run, ar from sitting A; d: ar runs now anyway
    assert H.ar_reruns(ps, todo, rows, []) == ["b", "c"]
    assert H.ar_reruns(ps, [], rows, []) == []
    # --reproduce-ar 2: the first two problems with an ar row not yet checked by a rerun from another sitting
    assert H.ar_reruns(ps, [], rows, [], reproduce=2) == ["a", "b"]
    assert H.ar_reruns(ps, [], rows, in_run([row("a", "ar", 1.0, [1])], "B"), reproduce=2) == ["b"]
    assert H.ar_reruns(ps, [], rows, in_run([row("a", "ar", 1.0, [1])], "A"), reproduce=1) == ["a"]


def test_one_machine_adds_no_machine_table():
    rows = [{**r, "hardware": INTEL} for r in HAND]
    s = S.summarize(rows)
    assert "machines" not in s and "timed_prompts" not in s["methods"]["fly-ngram"]
    assert S.machine_label(None) == "unrecorded"
    assert S.machine_label({**INTEL, "gpu": "NVIDIA H200"}).endswith("2 threads), GPU NVIDIA H200")


def test_wilson_and_bootstrap():
    assert S.wilson(0, 0) is None
    lo, hi = S.wilson(8, 10)
    assert 0.44 < lo < 0.5 and 0.94 < hi < 0.97  # textbook values 0.490, 0.943
    assert S.bootstrap_ratio([1.0], [1.0]) is None
    lo, hi = S.bootstrap_ratio([2.0] * 5, [1.0] * 5)
    assert lo == hi == 2.0


def test_table_marks_lossy_methods(tmp_path):
    s = S.summarize(HAND)
    table = RP.format_table(s)
    assert "fly-ngram (lossy)" in table and "| ar |" in table
    assert "3.00x" in table
    assert "throughput" not in table  # only runs under concurrent load (vLLM) have that column


def test_report_writes_summary_and_plots(tmp_path):
    (tmp_path / R.RESULTS).write_text("".join(json.dumps(r) + "\n" for r in HAND))
    summary, table = RP.report(tmp_path)
    assert json.loads((tmp_path / R.SUMMARY).read_text())["methods"]["fly-ngram"]["speedup"] == pytest.approx(3.0)
    for png in ("speedup_by_category.png", "recovery_vs_speedup.png", "accepted_lengths.png"):
        assert (tmp_path / png).stat().st_size > 1000


def test_report_errors(tmp_path):
    with pytest.raises(LoosespecError, match="no results.jsonl"):
        RP.report(tmp_path)
    (tmp_path / R.RESULTS).write_text(json.dumps(HAND[3]) + "\n")
    with pytest.raises(LoosespecError, match="no ar results"):
        RP.report(tmp_path)


def test_torn_last_line_is_dropped_and_kept_aside(tmp_path):
    path = tmp_path / R.RESULTS
    path.write_text(json.dumps(HAND[0]) + "\n" + json.dumps(HAND[1]) + "\n" + json.dumps(HAND[2])[:40])
    with pytest.warns(UserWarning, match="skipped a torn last line 3"):  # a reader changes nothing
        assert [r["question_id"] for r in R.ResultsFile(path).read()] == ["q1", "q2"]
    assert path.read_text().count("\n") == 2 and not path.read_text().endswith("\n")
    with pytest.warns(UserWarning, match="dropped a torn last line 3"):  # the writer, under the folder's lock
        rows = R.ResultsFile(path).repair()
    assert [r["question_id"] for r in rows] == ["q1", "q2"]
    assert path.read_text().count("\n") == 2 and path.read_text().endswith("\n")
    assert (tmp_path / (R.RESULTS + ".corrupt")).read_text().startswith(json.dumps(HAND[2])[:40])
    R.ResultsFile(path).append(HAND[2])
    assert [r["question_id"] for r in R.ResultsFile(path).read()] == ["q1", "q2", "q3"]


def test_complete_json_without_newline_counts_as_torn(tmp_path):
    path = tmp_path / R.RESULTS
    path.write_text(json.dumps(HAND[0]) + "\n" + json.dumps(HAND[1]))
    with pytest.warns(UserWarning):
        assert len(R.ResultsFile(path).read()) == 1


def test_damaged_middle_line_is_an_error(tmp_path):
    path = tmp_path / R.RESULTS
    path.write_text(json.dumps(HAND[0]) + "\n{broken\n" + json.dumps(HAND[1]) + "\n")
    with pytest.raises(LoosespecError, match="line 2 is damaged"):
        R.ResultsFile(path).read()
    assert path.read_text().count("\n") == 3  # nothing removed


def test_config_mismatch_is_an_error(tmp_path):
    R.check_config(tmp_path, {"dataset": "gsm8k", "max_new_tokens": 64})
    R.check_config(tmp_path, {"dataset": "gsm8k", "max_new_tokens": 64})  # same: fine
    with pytest.raises(LoosespecError, match="max_new_tokens: 64 there, 128 now"):
        R.check_config(tmp_path, {"dataset": "gsm8k", "max_new_tokens": 128})


def test_a_directory_from_before_the_drafts_own_precision_resumes_only_with_the_draft_in_the_targets(tmp_path):
    """config.json written before draft_dtype existed: its draft ran in the target's precision."""
    old = {"dataset": "gsm8k", "dtype": "int8", "draft": "d"}
    (tmp_path / R.CONFIG).write_text(json.dumps(old))
    R.check_config(tmp_path, {**old, "draft_dtype": "int8"})
    with pytest.raises(LoosespecError, match="draft_dtype: 'int8' there, 'int4' now"):
        R.check_config(tmp_path, {**old, "draft_dtype": "int4"})
    cfg = R.run_config(
        target="t",
        draft=None,
        dtype="int8",
        device="cpu",
        dataset="gsm8k",
        options={},
        max_new_tokens=8,
        temperature=0.0,
        top_p=1.0,
        top_k=0,
        seed=0,
        sg_tau=None,
        scorer="none",
        draft_dtype="int4",
    )
    assert cfg["draft_dtype"] is None  # no draft, no draft precision
    cfg = R.run_config(
        target="t",
        draft="d",
        dtype="int8",
        device="cpu",
        dataset="gsm8k",
        options={},
        max_new_tokens=8,
        temperature=0.0,
        top_p=1.0,
        top_k=0,
        seed=0,
        sg_tau=None,
        scorer="none",
    )
    assert cfg["draft_dtype"] == "int8"


def test_parse_methods():
    assert M.parse_methods("exact-ngram,fly-mla") == ["ar", "exact-ngram", "fly-mla"]
    assert M.parse_methods("hf-pld,ar") == ["ar", "hf-pld"]
    with pytest.raises(LoosespecError, match="unknown method"):
        M.parse_methods("ar,fly")
    with pytest.raises(LoosespecError, match="twice"):
        M.parse_methods("fly-mla,fly-mla")
    assert M.needs_draft_model("fly-mla") and M.needs_draft_model("hf-assist") and M.needs_draft_model("specguard")
    assert not M.needs_draft_model("exact-ngram") and not M.needs_draft_model("hf-pld")


def test_pending_pairs_interleave_methods_per_prompt():
    class P:
        def __init__(self, i):
            self.id = i

    ps = [P("a"), P("b")]
    todo = H.pending_pairs(ps, ["ar", "x"], {("a", "ar")})
    assert [(p.id, m) for p, m in todo] == [("a", "x"), ("b", "ar"), ("b", "x")]


# --- end to end with the tiny offline models ------------------------------------------------

CLI = [sys.executable, "-m", "loosespec.cli"]  # a real process, for the kill -9 test; the others run in-process


@pytest.fixture(autouse=True)
def _shipped_data_only(monkeypatch):
    """The evaluation sets come from the copy inside the repository, whatever the environment says."""
    monkeypatch.delenv("LOOSESPEC_DATA", raising=False)


def bench_args(tiny_dir, out, limit=2, tokens=24, methods="ar,exact-ngram,fly-ngram,exact-model,hf-pld"):
    """``loosespec bench`` arguments for the tiny pair (CLI + these for a real process)."""
    return [
        "bench",
        "--dataset",
        "gsm8k",
        "--limit",
        str(limit),
        "--methods",
        methods,
        "--target",
        str(tiny_dir / "target"),
        "--draft",
        str(tiny_dir / "draft"),
        "--dtype",
        "float32",
        "--device",
        "cpu",
        "--max-new-tokens",
        str(tokens),
        "--out",
        str(out),
        "--no-plots",
    ]


def pairs(out: Path) -> list[tuple[str, str]]:
    return [(r["question_id"], r["method"]) for r in map(json.loads, (out / R.RESULTS).read_text().splitlines())]


def env():
    return {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONWARNINGS": "ignore::FutureWarning"}


def test_bench_runs_then_rerun_does_no_work(tiny_dir, tmp_path):
    out = tmp_path / "run"
    first = cli(*bench_args(tiny_dir, out))
    assert first.returncode == 0, first.stderr[-2000:]
    got = pairs(out)
    assert sorted(got) == sorted(
        (f"gsm8k/{i}", m) for i in range(2) for m in ("ar", "exact-ngram", "fly-ngram", "exact-model", "hf-pld")
    )
    assert "fly-ngram (lossy)" in first.stdout
    summary = json.loads((out / R.SUMMARY).read_text())
    assert summary["methods"]["exact-ngram"]["identical_to_ar"] == 1.0  # lossless, float32
    assert summary["config"]["dataset"] == "gsm8k"
    rows = [json.loads(x) for x in (out / R.RESULTS).read_text().splitlines()]
    assert all(r["score_status"] in ("right", "wrong") and r["score"] == (r["score_status"] == "right") for r in rows)
    runs = json.loads((out / R.CONFIG).read_text())["runs"]  # the run's provenance
    assert len(runs) == 1 and {r["run_id"] for r in rows} == {runs[0]["id"]}
    assert runs[0]["argv"][1:3] == ["bench", "--dataset"] and runs[0]["models"]["target"]["kind"] == "local"
    assert set(runs[0]["data_files"]) == {"gsm8k_test.jsonl"}
    rep = cli("report", out, "--spec-bench", tmp_path / "sb")
    assert rep.returncode == 0 and "| exact-ngram | 2 |" in rep.stdout, rep.stderr[-2000:]
    assert (out / "accepted_lengths.png").exists() and (tmp_path / "sb" / "ar.jsonl").exists()
    before = (out / R.RESULTS).read_bytes()
    again = cli(*bench_args(tiny_dir, out))
    assert again.returncode == 0, again.stderr[-2000:]
    assert "nothing to do" in again.stderr
    assert (out / R.RESULTS).read_bytes() == before
    # a larger limit only runs the new problem; a different token budget is refused
    more = cli(*bench_args(tiny_dir, out, limit=3))
    assert more.returncode == 0, more.stderr[-2000:]
    assert len(pairs(out)) == 15 and len(set(pairs(out))) == 15
    assert (out / R.RESULTS).read_bytes().startswith(before)
    bad = cli(*bench_args(tiny_dir, out, tokens=25))
    assert bad.returncode == 2 and "different configuration" in bad.stderr and "Traceback" not in bad.stderr
    assert len(json.loads((out / R.CONFIG).read_text())["runs"]) == 3  # each resume recorded, the refused one not


def test_a_method_added_in_a_later_sitting_gets_ar_timed_again_beside_it(tiny_dir, tmp_path):
    out = tmp_path / "run"
    assert cli(*bench_args(tiny_dir, out, methods="ar")).returncode == 0
    later = cli(*bench_args(tiny_dir, out, methods="ar,exact-ngram"))
    assert later.returncode == 0, later.stderr[-2000:]
    assert "ar again on 2" in later.stderr
    runs = [r["id"] for r in json.loads((out / R.CONFIG).read_text())["runs"]]
    rows = [json.loads(x) for x in (out / R.RESULTS).read_text().splitlines()]
    reruns = [json.loads(x) for x in (out / R.RERUNS).read_text().splitlines()]
    assert {r["run_id"] for r in rows if r["method"] == "ar"} == {runs[0]}
    assert [(r["question_id"], r["method"], r["run_id"]) for r in reruns] == [
        (f"gsm8k/{i}", "ar", runs[1]) for i in range(2)
    ]
    summary = json.loads((out / R.SUMMARY).read_text())
    assert "timed_prompts" not in summary["methods"]["exact-ngram"]  # both pairs timed in the second sitting
    assert summary["ar_reproduced"] == {"problems": 2, "identical": 2, "differ": []}  # float32, greedy
    # --reproduce-ar 3 on three problems: gsm8k/2's ar runs now (in results.jsonl), so only 2 are checked already
    more = cli(*bench_args(tiny_dir, out, limit=3, methods="ar,exact-ngram"), "--reproduce-ar", "3")
    assert more.returncode == 0, more.stderr[-2000:]
    assert len((out / R.RERUNS).read_text().splitlines()) == 2
    bad = cli(*bench_args(tiny_dir, out, methods="ar"), "--reproduce-ar", "-1")
    assert bad.returncode == 2 and "--reproduce-ar" in bad.stderr and "Traceback" not in bad.stderr


def test_humaneval_bench_records_its_sandbox(tiny_dir, tmp_path, monkeypatch):
    """With --allow-code-execution the run says, in config.json's run entry and in every row's score_detail,
    which sandbox mode scored the code; --sandbox none is recorded as such."""
    monkeypatch.delenv("LOOSESPEC_ALLOW_CODE_EXECUTION", raising=False)
    monkeypatch.delenv("LOOSESPEC_SANDBOX", raising=False)
    out = tmp_path / "he"
    args = [a if a != "gsm8k" else "humaneval" for a in bench_args(tiny_dir, out, limit=1, tokens=8, methods="ar")]
    from loosespec.eval.sandbox_probe import resolve_mode

    for flags, mode in (
        (["--allow-code-execution"], resolve_mode()),
        (["--allow-code-execution", "--sandbox", "none"], "none"),
    ):
        run = cli(*args, *flags)
        assert run.returncode == 0, run.stderr[-2000:]
        assert f"mode {mode}" in run.stderr
        assert json.loads((out / R.CONFIG).read_text())["runs"][-1]["sandbox"] == mode
    row = json.loads((out / R.RESULTS).read_text().splitlines()[0])
    assert row["score_status"] == "wrong" and row["score_detail"]["sandbox"] == resolve_mode(), row["score_detail"]


def test_methods_needing_the_draft_can_join_a_run_that_did_not_load_it(tiny_dir, tmp_path):
    out = tmp_path / "grow"
    first = cli(*bench_args(tiny_dir, out, limit=1, methods="ar,exact-ngram"))
    assert first.returncode == 0, first.stderr[-2000:]
    more = cli(*bench_args(tiny_dir, out, limit=1, methods="ar,exact-ngram,exact-model"))
    assert more.returncode == 0, more.stderr[-2000:]
    assert pairs(out) == [("gsm8k/0", "ar"), ("gsm8k/0", "exact-ngram"), ("gsm8k/0", "exact-model")]


def test_kill_9_mid_run_then_resume_runs_every_pair_once(tiny_dir, tmp_path):
    out = tmp_path / "killed"
    cmd = CLI + bench_args(tiny_dir, out, limit=6, tokens=64)
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env())
    deadline = time.time() + 300
    results = out / R.RESULTS
    while time.time() < deadline and proc.poll() is None:
        if results.exists() and results.read_text().count("\n") >= 3:
            break
        time.sleep(0.05)
    assert proc.poll() is None, "the run finished before it could be killed"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    written = len(pairs(out)) if results.read_text().endswith("\n") else None
    assert written is None or 3 <= written < 30
    done = cli(*cmd[len(CLI) :])  # the resume need not be a new process
    assert done.returncode == 0, done.stderr[-2000:]
    got = pairs(out)
    assert len(got) == 30 and len(set(got)) == 30


def test_a_second_bench_on_a_folder_being_written_fails_at_once(tiny_dir, tmp_path):
    """Two `bench --out D` at once: the second stops with one line naming D and the first's pid, and appends
    nothing (before issue 43 both appended the same pairs and the summary counted them twice)."""
    out = tmp_path / "busy"
    cmd = CLI + bench_args(tiny_dir, out, limit=6, tokens=64)
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env())
    try:
        deadline = time.time() + 300
        results = out / R.RESULTS
        while time.time() < deadline and proc.poll() is None:
            if results.exists() and results.read_text().count("\n") >= 1:
                break
            time.sleep(0.05)
        assert proc.poll() is None, "the first run finished before the second could start"
        t = time.monotonic()
        second = cli(*cmd[len(CLI) :])
        assert second.returncode == 2 and time.monotonic() - t < 60, second.stderr[-2000:]
        errors = [line for line in second.stderr.splitlines() if "error" in line]
        assert len(errors) == 1 and str(out) in errors[0] and f"pid {proc.pid}" in errors[0], second.stderr[-2000:]
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    with warnings.catch_warnings():  # the killed run may have left a torn last line
        warnings.simplefilter("ignore")
        got = [(r["question_id"], r["method"]) for r in R.ResultsFile(out / R.RESULTS).read()]
    assert got and len(got) == len(set(got))
    assert len(json.loads((out / R.CONFIG).read_text())["runs"]) == 1  # the refused run recorded nothing


def test_bench_bad_input_is_a_clear_error(tiny_dir, tmp_path):
    for args, msg in (
        (["--methods", "ar,nope"], "unknown method"),
        (["--limit", "0"], "positive"),
        (["--dataset", "nosuch"], "unknown dataset"),
    ):
        cmd = bench_args(tiny_dir, tmp_path / "x")
        for i in range(0, len(args), 2):
            cmd[cmd.index(args[i]) + 1] = args[i + 1]
        r = cli(*cmd)
        assert r.returncode == 2 and msg in r.stderr and "Traceback" not in r.stderr, r.stderr[-1000:]
    r = cli("report", tmp_path / "empty")
    assert r.returncode == 2 and "no results.jsonl" in r.stderr


def test_spec_bench_export_layout(tmp_path):
    rows = []
    for r in HAND[:2] + HAND[3:5]:
        rows.append(
            {
                **r,
                "model_id": "m/" + r["method"],
                "tstamp": 1.0,
                "choices": [
                    {
                        "index": 0,
                        "turns": ["t"],
                        "decoding_steps": [r["rounds"]],
                        "new_tokens": [r["new_tokens"]],
                        "wall_time": [r["wall_time"]],
                        "accept_lengths": r["accept_lengths"],
                    }
                ],
            }
        )
    paths = R.export_spec_bench(rows, tmp_path / "sb")
    assert sorted(p.name for p in paths) == ["ar.jsonl", "fly-ngram.jsonl"]
    fly = [json.loads(x) for x in (tmp_path / "sb" / "fly-ngram.jsonl").read_text().splitlines()]
    assert [x["question_id"] for x in fly] == ["q1", "q2"]
    assert set(fly[0]) == set(R.SPEC_BENCH_KEYS)
    # what Spec-Bench's speed script computes: tokens / time per answer
    assert sum(fly[0]["choices"][0]["new_tokens"]) / sum(fly[0]["choices"][0]["wall_time"]) == pytest.approx(4 / 5)


def test_category_table_has_accuracy_per_category():
    table = RP.format_category_table(S.summarize(HAND))
    assert "| b | fly-ngram (lossy) | 2 | 3.33x | 2.00 | 0.50 | 1.00 | 0.00 |" in table
    assert "| a | ar | 1 | 1.00x | 1.00 | 1.00 | 1.00 | 1.00 |" in table


def test_acceptance_by_position_pools_counts_over_prompts():
    a = row("q1", "exact-ngram", 1.0, [1])
    a["stats"] = {"num_drafted_per_pos": [4, 2], "num_accepted_tokens_per_pos": [2, 1]}
    b = row("q2", "exact-ngram", 1.0, [1])
    b["stats"] = {"num_drafted_per_pos": [4, 2, 2], "num_accepted_tokens_per_pos": [4, 2, 0]}
    old = row("q3", "exact-ngram", 1.0, [1])  # written before the counts existed: left out, not read as zeros
    assert S.acceptance_by_position([a, b, old]) == {"exact-ngram": [6 / 8, 3 / 4, 0 / 2]}


def test_speedup_plot_draws_no_zero_bar_for_a_missing_value(tmp_path, monkeypatch):
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.axes import Axes

    heights = []
    real_bar = Axes.bar
    monkeypatch.setattr(
        Axes, "bar", lambda self, x, h, *a, **k: heights.append(list(h)) or real_bar(self, x, h, *a, **k)
    )
    summary = {
        "methods": {"ar": {}, "exact-ngram": {}},
        "categories": {"a": {"exact-ngram": {"speedup": 1.5}}, "b": {}},
    }  # exact-ngram did not run in b
    RP.plot([], summary, tmp_path)
    assert heights[0][0] == 1.5 and math.isnan(heights[0][1])


HOLD = """
import sys, time
from pathlib import Path
from loosespec.eval.results import RunLock
lock = RunLock(Path(sys.argv[1]), "loosespec bench --out other").acquire()
Path(sys.argv[2]).write_text("held")
time.sleep(float(sys.argv[3]))
"""
TRY = "import sys; from pathlib import Path; from loosespec.eval.results import RunLock; "
TRY += "sys.exit(0 if RunLock(Path(sys.argv[1])).try_acquire() else 3)"


def test_a_second_run_waits_for_the_first_ones_timing_on_this_machine(tmp_path, monkeypatch):
    """machine_timing: while one run times (any folder), another waits, naming it, and goes on when it ends; the
    lock is held while timing and given back after; LOOSESPEC_SHARED_TIMING=1 takes none."""
    monkeypatch.setenv("LOOSESPEC_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("LOOSESPEC_SHARED_TIMING", raising=False)
    timing, ready = tmp_path / "cache" / "timing", tmp_path / "ready"
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(timing), str(ready), "1.5"], env=env())
    deadline = time.time() + 60
    while not ready.exists() and time.time() < deadline:
        time.sleep(0.02)
    said: list[str] = []
    start = time.monotonic()
    with H.machine_timing(tmp_path / "run", said.append, poll_s=0.05):
        waited = time.monotonic() - start
        held = subprocess.run([sys.executable, "-c", TRY, str(timing)], env=env()).returncode
    holder.wait(60)
    assert holder.returncode == 0 and waited > 0.5  # it waited for the holder to end
    assert f"pid {holder.pid}, loosespec bench --out other" in said[0] and "ended" in said[1]
    assert held == 3  # taken while this run timed
    assert subprocess.run([sys.executable, "-c", TRY, str(timing)], env=env()).returncode == 0  # given back
    monkeypatch.setenv("LOOSESPEC_SHARED_TIMING", "1")
    with H.machine_timing(tmp_path / "run", said.append, poll_s=0.05):
        assert subprocess.run([sys.executable, "-c", TRY, str(timing)], env=env()).returncode == 0
    assert len(said) == 2
