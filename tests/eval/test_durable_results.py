"""Issue 43, items 5-9: scoring failures are no answers (stored, counted, scored again on resume), one run per
results folder (its lock; repeated pairs counted once), readers that change nothing, files replaced whole, and
each run's provenance in config.json. No models: generation is a stub, the scorers are plain functions."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from loosespec.errors import LoosespecError
from loosespec.eval import bench_methods as M
from loosespec.eval import datafiles
from loosespec.eval import datasets as D
from loosespec.eval import harness as H
from loosespec.eval import provenance as P
from loosespec.eval import report as RP
from loosespec.eval import results as R
from loosespec.eval import run as RN
from loosespec.eval import stats as S
from loosespec.eval.datafiles import Problem
from loosespec.eval.scoring import ScoringError, Verdict

PROBLEMS = [Problem(f"toy/{i}", "toy", f"question {i}", str(i)) for i in range(3)]
CONFIG = {"dataset": "gsm8k", "max_new_tokens": 8, "target": None, "draft": None}


def row(qid, method, score, status=None, ids=(1, 2)):
    r = {
        "question_id": qid,
        "category": "c",
        "method": method,
        "lossy": M.is_lossy(method),
        "wall_time": 1.0,
        "token_ids": list(ids),
        "new_tokens": len(ids),
        "rounds": len(ids),
        "accept_lengths": [],
        "score": score,
        "drafted_tokens": None,
        "accepted_tokens": None,
        "stats": {},
    }
    if status is not None:
        r["score_status"] = status
    return r


@pytest.fixture
def stub_generation(monkeypatch):
    """run_method without an engine: the output names the problem's prompt and the method; counts the calls."""
    calls = []

    def run_method(engine, method, ids, settings):
        calls.append(method)
        return RN.Outcome(f"answer to {ids} by {method}", [1, 2, 3], 0.5, [1, 2], {"new_tokens": 3}, {"method": method})

    monkeypatch.setattr(H, "run_method", run_method)
    return calls


def bench(out, scorer, methods=("ar", "exact-ngram")):
    return H.run_bench(
        None,
        PROBLEMS,
        list(methods),
        out,
        dataset="toy",
        settings={"max_new_tokens": 8},
        encode=lambda p: p.prompt,
        scorer=scorer,
        model_id="m",
        progress=False,
    )


def lines(out: Path) -> list[str]:
    return (out / R.RESULTS).read_text().splitlines()


# --- 5. a scoring failure is no answer ------------------------------------------------------------------


def failing_sandbox(p, text):
    """toy/1 cannot be scored (the sandbox did not start); toy/2's program timed out (a wrong answer)."""
    if p.id == "toy/1":
        raise ScoringError("sandbox could not start: unshare failed", {"sandbox": "full"})
    if p.id == "toy/2":
        return Verdict("wrong", {"sandbox": "full", "program": "timeout"})
    return Verdict("right", {"sandbox": "full"})


def test_a_scoring_failure_is_stored_as_no_answer_and_a_timeout_stays_wrong(tmp_path, stub_generation):
    rows = bench(tmp_path, failing_sandbox)
    by = {(r["question_id"], r["method"]): r for r in R.ResultsFile(tmp_path / R.RESULTS).read()}
    assert len(by) == 6 == len(rows)
    err = by["toy/1", "ar"]
    assert err["score"] is None and err["score_status"] == "error"
    assert err["score_detail"] == {"error": "sandbox could not start: unshare failed", "sandbox": "full"}
    assert by["toy/2", "ar"]["score"] is False and by["toy/2", "ar"]["score_status"] == "wrong"
    assert by["toy/2", "ar"]["score_detail"] == {"sandbox": "full", "program": "timeout"}
    assert by["toy/0", "ar"]["score"] is True and by["toy/0", "ar"]["score_detail"] == {"sandbox": "full"}
    # a scorer's own bug is the harness's failure too; a plain bool scorer still works
    bug = tmp_path / "bug"
    bench(bug, lambda p, t: 1 / 0 if p.id == "toy/0" else p.id == "toy/2")
    got = {(r["question_id"], r["method"]): r for r in R.ResultsFile(bug / R.RESULTS).read()}
    assert got["toy/0", "ar"]["score_status"] == "error"
    assert "ZeroDivisionError" in got["toy/0", "ar"]["score_detail"]["error"]
    assert got["toy/2", "ar"]["score_status"] == "right" and got["toy/1", "ar"]["score_status"] == "wrong"


def test_the_summary_leaves_error_rows_out_of_accuracy_and_counts_them(tmp_path):
    rows = [
        row("q1", "ar", True, "right"),
        row("q2", "ar", True, "right"),
        row("q3", "ar", False, "wrong"),
        row("q4", "ar", True),  # written before score_status: read from score
        row("q1", "fly-ngram", None, "error"),
        row("q2", "fly-ngram", True, "right"),
        row("q3", "fly-ngram", True, "right"),
        row("q4", "fly-ngram", False),
    ]
    fly = S.summarize(rows)["methods"]["fly-ngram"]
    assert fly["prompts"] == 4  # speed still counts the row
    assert fly["scored"] == 3 and fly["score_errors"] == 1
    assert fly["accuracy"] == pytest.approx(2 / 3, abs=1e-4) and fly["ar_accuracy"] == pytest.approx(2 / 3, abs=1e-4)
    assert fly["ar_right_method_wrong"] == 1 and fly["ar_wrong_method_right"] == 1  # q1 is not a loss
    assert "score_errors" not in S.summarize(rows)["methods"]["ar"]
    (tmp_path / R.RESULTS).write_text("".join(json.dumps(r) + "\n" for r in rows))
    _, text = RP.report(tmp_path, draw=False)
    assert "Scoring failed for 1 row(s) (fly-ngram 1)" in text
    assert R.score_status(row("q", "ar", None)) == "unscored" and R.score_status(row("q", "ar", False)) == "wrong"


def test_a_resumed_run_scores_failed_rows_again_from_their_outputs(tmp_path, stub_generation):
    bench(tmp_path, failing_sandbox)
    before = lines(tmp_path)
    generated = len(stub_generation)
    seen = []

    def working(p, text):
        seen.append((p.id, text))
        return Verdict("right" if p.id != "toy/2" else "wrong", {"sandbox": "full"})

    rows = bench(tmp_path, working)
    assert len(stub_generation) == generated  # nothing generated again
    assert sorted(seen) == [("toy/1", "answer to question 1 by ar"), ("toy/1", "answer to question 1 by exact-ngram")]
    after = lines(tmp_path)
    assert len(after) == len(before) == 6  # replaced in place: no row lost, none added
    for old, new in zip(before, after):
        if json.loads(old)["question_id"] != "toy/1":
            assert new == old  # every other line byte for byte
    redone = [json.loads(x) for x in after if json.loads(x)["question_id"] == "toy/1"]
    for r in redone:
        assert r["score"] is True and r["score_status"] == "right" and r["score_detail"] == {"sandbox": "full"}
        assert r["score_history"][0]["status"] == "error" and "unshare" in r["score_history"][0]["detail"]["error"]
        assert r["output"].startswith("answer to question 1")
    assert [r["score_status"] for r in rows if r["question_id"] == "toy/1"] == ["right", "right"]
    assert not list(tmp_path.glob(".results.jsonl.*"))  # no temporary file left behind
    # a scorer that still fails keeps the row an error, with both failures in its history
    bench(tmp_path / "again", failing_sandbox)
    bench(tmp_path / "again", failing_sandbox)
    still = [json.loads(x) for x in lines(tmp_path / "again") if json.loads(x)["question_id"] == "toy/1"]
    assert all(r["score_status"] == "error" and len(r["score_history"]) == 1 for r in still)


# --- 6. one run per folder; a repeated pair counts once ----------------------------------------------


HOLDER = (
    "import sys, time; from loosespec.eval import results as R; lock = R.RunLock(sys.argv[1]).acquire(); "
    "print('locked', flush=True); time.sleep(120)"
)


@pytest.fixture
def held(tmp_path):
    """Another process holding tmp_path/run's lock."""
    out = tmp_path / "run"
    out.mkdir()
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(out)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    line = proc.stdout.readline()
    assert line.strip() == "locked", proc.stderr.read()
    yield out, proc
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGKILL)
    proc.communicate()


def test_a_second_run_on_a_locked_folder_fails_at_once_naming_it_and_the_holder(held, stub_generation):
    out, proc = held
    t = time.monotonic()
    with pytest.raises(LoosespecError) as e:
        R.open_run(out, CONFIG)
    msg = str(e.value)
    assert time.monotonic() - t < 5 and "\n" not in msg
    assert str(out) in msg and f"pid {proc.pid}" in msg and "another run" in msg
    with pytest.raises(LoosespecError, match=f"pid {proc.pid}"):
        bench(out, lambda p, t: True)  # the library entry too
    assert not (out / R.RESULTS).exists() and not (out / R.CONFIG).exists() and not stub_generation
    os.kill(proc.pid, signal.SIGKILL)  # a killed holder's lock goes with it
    proc.communicate()
    run = R.open_run(out, CONFIG)
    assert json.loads((out / R.LOCK).read_text())["pid"] == os.getpid()
    run.release()
    assert (out / R.LOCK).read_text() == ""  # released: names no holder


def test_the_lock_is_held_for_the_whole_run_and_released_after(tmp_path, stub_generation):
    out = tmp_path / "run"
    with R.open_run(out, CONFIG) as run:
        probe = subprocess.run(
            [
                sys.executable,
                "-c",
                "import sys; from loosespec.eval import results as R; print(R.RunLock(sys.argv[1]).try_acquire())",
                str(out),
            ],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert probe.stdout.strip() == "False", probe.stderr[-2000:]
        bench(out, lambda p, t: True)  # uses the lock this process holds
        assert run.held
    assert R.RunLock(out).try_acquire()


def test_the_summary_counts_a_repeated_pair_once_and_says_how_many(tmp_path):
    rows = [
        row("q1", "ar", True, "right"),
        row("q2", "ar", False, "wrong"),
        row("q1", "fly-ngram", True, "right"),
        row("q2", "fly-ngram", False, "wrong"),
    ]
    twice = rows + [row("q1", "fly-ngram", False, "wrong"), row("q2", "ar", True, "right")]  # a second run's rows
    with pytest.warns(UserWarning, match="2 repeated"):
        s = S.summarize(twice)
    assert s["repeated_pairs"] == 2
    for m in ("ar", "fly-ngram"):
        once = S.summarize(rows)["methods"][m]
        assert s["methods"][m]["prompts"] == 2
        for k in ("scored", "accuracy", "ar_right_method_wrong", "ar_wrong_method_right", "mcnemar_p"):
            assert s["methods"][m][k] == once[k], k
    # a verdict wins over a failed scoring of the same pair
    errs = [row("q1", "ar", None, "error"), row("q1", "ar", True, "right")]
    with pytest.warns(UserWarning):
        assert S.summarize(errs)["methods"]["ar"]["scored"] == 1
    (tmp_path / R.RESULTS).write_text("".join(json.dumps(r) + "\n" for r in twice))
    with pytest.warns(UserWarning, match="repeated"):
        _, text = RP.report(tmp_path, draw=False)
    assert "repeats 2 (question, method) pair row(s)" in text


# --- 7. readers change nothing ------------------------------------------------------------------------


def torn_folder(out: Path) -> bytes:
    out.mkdir(parents=True, exist_ok=True)
    rows = [row("q1", "ar", True, "right"), row("q1", "exact-ngram", True, "right")]
    data = ("".join(json.dumps(r) + "\n" for r in rows) + json.dumps(row("q2", "ar", True))[:50]).encode()
    (out / R.RESULTS).write_bytes(data)
    return data


def test_report_skips_a_torn_last_line_and_changes_nothing(tmp_path):
    data = torn_folder(tmp_path)
    with pytest.warns(UserWarning, match="skipped a torn last line 3"):
        summary, _ = RP.report(tmp_path, draw=False, write=False)
    assert summary["rows"] == 2
    assert (tmp_path / R.RESULTS).read_bytes() == data  # a running writer's line is left alone
    assert not (tmp_path / (R.RESULTS + ".corrupt")).exists() and not (tmp_path / R.LOCK).exists()
    from loosespec.eval.failures import failures

    (tmp_path / R.CONFIG).write_text(json.dumps({"max_new_tokens": 8, "dataset": "toy"}))
    with pytest.warns(UserWarning, match="torn"):
        assert failures(tmp_path) == []
    assert (tmp_path / R.RESULTS).read_bytes() == data


def test_only_the_run_holding_the_lock_repairs_a_torn_last_line(tmp_path, held):
    out, proc = held
    data = torn_folder(out)
    with pytest.raises(LoosespecError, match="another run"):
        R.ResultsFile(out / R.RESULTS).repair()
    assert (out / R.RESULTS).read_bytes() == data
    os.kill(proc.pid, signal.SIGKILL)
    proc.communicate()
    with pytest.warns(UserWarning, match="dropped a torn last line 3"):
        run = R.open_run(out, CONFIG)
    assert [r["question_id"] for r in run.rows] == ["q1", "q1"]
    assert (out / R.RESULTS).read_bytes() == data[: data.rindex(b"\n") + 1]
    assert (out / (R.RESULTS + ".corrupt")).read_bytes() == data[data.rindex(b"\n") + 1 :] + b"\n"
    run.release()


def test_report_leaves_summary_and_plots_to_the_run_writing_the_folder(held):
    out, proc = held
    (out / R.RESULTS).write_text("".join(json.dumps(r) + "\n" for r in (row("q1", "ar", True, "right"),)))
    with pytest.warns(UserWarning, match=f"pid {proc.pid}"):
        summary, table = RP.report(out)
    assert summary["methods"]["ar"]["prompts"] == 1 and "| ar |" in table
    assert sorted(p.name for p in out.iterdir()) == sorted([R.LOCK, R.RESULTS])


# --- 8. files replaced whole; a damaged config.json is one clear line ---------------------------------


def test_a_torn_config_json_is_a_clear_error_naming_it(tmp_path):
    (tmp_path / R.CONFIG).write_text('{"dataset": "gsm8k", "max_new_tok')
    (tmp_path / R.RESULTS).write_text(json.dumps(row("q1", "ar", True)) + "\n")
    for call in (
        lambda: R.check_config(tmp_path, CONFIG),
        lambda: RP.report(tmp_path, draw=False),
        lambda: R.open_run(tmp_path, CONFIG),
    ):
        with pytest.raises(LoosespecError) as e:
            call()
        assert str(tmp_path / R.CONFIG) in str(e.value) and "damaged" in str(e.value) and "\n" not in str(e.value)
    from loosespec.eval.failures import failures

    with pytest.raises(LoosespecError, match="config.json is damaged"):
        failures(tmp_path)
    assert R.RunLock(tmp_path).try_acquire()  # the failed open_run let go of the lock


def test_replaced_files_are_renamed_into_place_whole(tmp_path, stub_generation):
    """A file written in place keeps its inode and is empty or half-written while it is written; a file replaced by
    a rename is a new inode, and a reader holding the old one still reads it whole."""
    out = tmp_path / "run"
    out.mkdir()
    bench(out, lambda p, t: True)
    R.check_config(out, CONFIG)

    def write_all():
        RP.report(out)
        R.export_spec_bench(R.ResultsFile(out / R.RESULTS).read(), tmp_path / "sb")

    write_all()
    names = [out / R.SUMMARY, out / "accepted_lengths.png", tmp_path / "sb" / "ar.jsonl"]
    before = {p: (os.stat(p).st_ino, p.read_bytes()) for p in names}
    readers = {p: open(p, "rb") for p in names}
    try:
        write_all()
        for p in names:
            assert os.stat(p).st_ino != before[p][0], p
            assert readers[p].read() == before[p][1], p  # what a reader had open is still whole
    finally:
        for f in readers.values():
            f.close()
    config = out / R.CONFIG
    ino, text = os.stat(config).st_ino, config.read_bytes()
    with open(config, "rb") as reader:
        R.open_run(out, CONFIG).release()  # a resume adds its provenance to config.json
        assert os.stat(config).st_ino != ino and reader.read() == text
    assert not [p for p in out.iterdir() if p.name.endswith(".tmp")]


# --- 9. provenance ------------------------------------------------------------------------------------


def test_each_run_records_its_provenance_and_a_resume_still_matches(tmp_path, monkeypatch, stub_generation):
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    (model / "model.safetensors").write_bytes(b"weights")
    out = tmp_path / "run"
    config = {**CONFIG, "target": str(model), "draft": "someone/some-model"}
    monkeypatch.setattr(sys, "argv", ["loosespec", "bench", "--limit", "2"])
    with R.open_run(out, config) as first:
        bench(out, lambda p, t: True)
    monkeypatch.setattr(sys, "argv", ["loosespec", "bench", "--limit", "3"])  # another command line, later
    with R.open_run(out, config) as second:
        pass
    stored = json.loads((out / R.CONFIG).read_text())
    assert {k: v for k, v in stored.items() if k != "runs"} == config  # what is compared is unchanged
    runs = stored["runs"]
    assert [r["id"] for r in runs] == [first.run_id, second.run_id] and first.run_id != second.run_id
    assert [r["argv"][-1] for r in runs] == ["2", "3"]
    one = runs[0]
    from loosespec import __version__

    assert one["loosespec"] == __version__ and one["date"].endswith("+00:00")
    assert one["git_commit"] is None or len(one["git_commit"]) == 40
    assert one["git_dirty"] in (None, True, False)
    target = one["models"]["target"]
    assert target["kind"] == "local"
    assert target["files"]["model.safetensors"] == hashlib.sha256(b"weights").hexdigest()
    assert one["models"]["draft"] == {
        "spec": "someone/some-model",
        "kind": "hub",
        "revision": None,
        "requested_revision": None,
    }
    shipped = datafiles.data_file("gsm8k_test.jsonl")
    assert one["data_files"] == {
        "gsm8k_test.jsonl": {
            "path": str(Path(shipped).resolve()),
            "sha256": hashlib.sha256(Path(shipped).read_bytes()).hexdigest(),
        }
    }
    assert {r["run_id"] for r in R.ResultsFile(out / R.RESULTS).read()} == {first.run_id}  # each row names its run
    with pytest.raises(LoosespecError, match="max_new_tokens: 8 there, 9 now"):  # the settings still are compared
        R.open_run(out, {**config, "max_new_tokens": 9})


def test_provenance_is_never_an_error(tmp_path, monkeypatch):
    import loosespec

    real = subprocess.run

    def no_git(cmd, *a, **k):
        if cmd[0] == "git":
            raise FileNotFoundError("git")
        return real(cmd, *a, **k)

    monkeypatch.setattr(P.subprocess, "run", no_git)
    p = P.run_provenance({"target": "/no/such/model.gguf", "draft": None, "dataset": "toy"})
    assert p["git_commit"] is None and p["git_dirty"] is None and p["data_files"] == {}
    assert p["models"]["draft"] is None and p["models"]["target"]["spec"] == "/no/such/model.gguf"
    monkeypatch.setattr(P.subprocess, "run", real)
    # run from an installed copy inside some other repository: no commit is claimed
    monkeypatch.setattr(P, "_git", lambda args, cwd: str(tmp_path) if args[0] == "rev-parse" else "")
    assert P.source_checkout() == {"git_commit": None, "git_dirty": None}
    checkout = Path(loosespec.__file__).resolve().parent.parent
    answers = {"--show-toplevel": str(checkout), "HEAD": "a" * 40}
    monkeypatch.setattr(P, "_git", lambda args, cwd: answers.get(args[-1], " M loosespec/cli.py"))
    assert P.source_checkout() == {"git_commit": "a" * 40, "git_dirty": True}
    # niah's haystack is not shipped: recorded as missing, not raised
    monkeypatch.delenv("LOOSESPEC_DATA", raising=False)
    assert "error" in P.data_provenance("niah", tmp_path)["paul_graham_essays.jsonl"]


def test_the_provenance_names_the_files_each_loader_reads(monkeypatch):
    class Read(Exception):
        pass

    read = []

    def record(name, directory):
        read.append(name)
        raise Read

    monkeypatch.setattr(datafiles, "load_rows", record)
    assert set(P.DATASET_FILES) == set(D.DATASETS)
    for name in D.DATASETS:
        read.clear()
        with pytest.raises(Read):
            D.load_dataset(name, 1)
        assert tuple(read) == P.DATASET_FILES[name], name
