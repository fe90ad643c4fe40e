"""Reading lost answers (loosespec.eval.failures): loops, truncation, deferred mismatches, accepted steps,
the retention verdict and its interval, and the tables BENCHMARKS.md and `loosespec report --failures` print."""

from __future__ import annotations

import json

import pytest

from loosespec.eval import bench_methods as M
from loosespec.eval import failures as F
from loosespec.eval import report as RP
from loosespec.eval import results as R
from loosespec.eval import stats as S


def row(qid, method, ids, score, output=None, stats=None, answer="18"):
    return {
        "question_id": qid,
        "category": "gsm8k",
        "method": method,
        "lossy": M.is_lossy(method),
        "wall_time": 1.0,
        "token_ids": ids,
        "new_tokens": len(ids),
        "rounds": len(ids),
        "accept_lengths": [],
        "score": score,
        "drafted_tokens": None,
        "accepted_tokens": None,
        "stats": stats or {},
        "output": output if output is not None else " ".join(map(str, ids)),
        "answer": answer,
    }


def write(tmp_path, rows, budget=40, dataset="gsm8k"):
    (tmp_path / R.CONFIG).write_text(json.dumps({"max_new_tokens": budget, "dataset": dataset}))
    with open(tmp_path / R.RESULTS, "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    return tmp_path


def test_first_divergence():
    assert F.first_divergence([1, 2, 3], [1, 2, 3]) is None
    assert F.first_divergence([1, 2, 3], [1, 9, 3]) == 1
    assert F.first_divergence([1, 2], [1, 2, 3]) == 2
    assert F.first_divergence("abc", "abd") == 2


def test_repetition_loop_finds_a_repeated_tail_and_nothing_else():
    head = list(range(100, 130))
    assert F.repetition_loop(head + [7, 8, 9] * 10) == (3, 30)
    assert F.repetition_loop(head + [5] * 30) == (1, 30)
    assert F.repetition_loop(head) is None
    assert F.repetition_loop(head + [7, 8, 9] * 2) is None  # twice is not a loop
    assert F.repetition_loop(head + [5] * 10) is None  # a short run of one token is not a loop
    period = list(range(200, 250))  # 50 tokens, three times
    assert F.repetition_loop(head + period * 3) == (50, 150)


def test_classify_puts_each_lost_answer_in_the_first_class_that_fits():
    ar = row("q", "ar", list(range(20)), True, output="Janet eats 3. The answer is 18.")
    loop = row("q", "fly-ngram", list(range(10)) + [1, 2] * 15, False, stats={"fly_deferred": 2})
    assert F.classify(ar, loop, 40)["class"] == "repetition loop"
    assert F.classify(ar, loop, 40)["loop_period"] == 2
    long = row("q", "fly-mla", list(range(100, 140)), False, stats={"fly_deferred": 1})
    assert F.classify(ar, long, 40)["class"] == "truncated at the budget"
    deferred = row(
        "q",
        "fly-mla",
        list(range(5)) + [99] * 3,
        False,
        output="Janet eats 4. The answer is 12.",
        stats={"fly_deferred": 1},
    )
    c = F.classify(ar, deferred, 40, "gsm8k")
    assert c["class"] == "deferred mismatch" and c["diverged_at_token"] == 5
    assert (c["gold"], c["ar_answer"], c["method_answer"]) == ("18", "18", "12")
    assert c["ar_text"].endswith("»3. The answer is 18.") and c["text"].endswith("»4. The answer is 12.")
    # a test-scored set's reference is a whole solution: no gold cell, and nothing that breaks a table row
    code = F.classify(ar, {**deferred, "answer": "    return n**2\n"}, 40, "humaneval")
    assert (code["gold"], code["method_answer"]) == ("-", "wrong")
    assert F.classify(ar, {**deferred, "answer": "a|b\nc"}, 40, "math500")["gold"] == "a\\|b⏎c"
    step = row("q", "specguard", [0, 1, 7], False, stats={"accepted_steps": 1, "steps": 2})
    assert F.classify(ar, step, 40)["class"] == "accepted draft step"
    assert F.classify(ar, row("q", "fly-mla", [0, 1, 7], False), 40)["class"] == "other"


def test_failures_lists_only_answers_ar_had_right_and_a_lossy_method_wrong(tmp_path):
    d = write(
        tmp_path,
        [
            row("a", "ar", [1, 2, 3], True),
            row("a", "fly-mla", [1, 2, 4], False, stats={"fly_deferred": 1}),
            row("a", "exact-mla", [1, 2, 3], True),
            row("b", "ar", [1, 2, 3], False),
            row("b", "fly-mla", [1, 2, 5], False, stats={"fly_deferred": 1}),
            row("c", "ar", [4, 5], True),
            row("c", "fly-mla", [4, 5], True),
        ],
    )
    lost = F.failures(d)
    assert [(f["question_id"], f["method"], f["class"]) for f in lost] == [("a", "fly-mla", "deferred mismatch")]
    d2 = tmp_path / "order"
    d2.mkdir()
    order = write(d2, [r for q in ("p/10", "p/9") for r in (row(q, "ar", [1], True), row(q, "fly-mla", [2], False))])
    assert [f["question_id"] for f in F.failures(order)] == ["p/9", "p/10"]
    table = F.failure_table([d], tmp_path.parent)
    assert f"| {tmp_path.name} | fly-mla | 1 | 0 | 0 | 1 | 0 | 0 |" in table
    assert "| a | fly-mla | deferred mismatch | - | 2 |" in table  # "-": no gsm8k problem is called "a"
    assert "opens by restating" not in table  # nor is there an openings table without a prompt to compare with


def test_openings_count_the_answers_that_restate_the_question(tmp_path):
    from loosespec.eval.datasets import load_dataset

    problems = load_dataset("gsm8k", 2)
    question = [p.prompt.split("\n\n")[-1] for p in problems]
    rows = [
        row("gsm8k/0", "ar", [1], True, output="16 - 3 - 4 = 9 eggs, 9 * 2 = 18. The answer is 18."),
        row(
            "gsm8k/0",
            "fly-mla",
            [2],
            False,
            output=question[0][:60] + " So 9 * 2 = 12. The answer is 12.",
            stats={"fly_deferred": 1},
        ),
        row("gsm8k/1", "ar", [1], True, output="2 + 1 = 3. The answer is 3.", answer="3"),
        row("gsm8k/1", "fly-mla", [1], True, output=question[1][:40] + " 2 + 1 = 3. The answer is 3.", answer="3"),
    ]
    d = write(tmp_path, rows)
    assert F.openings(d) == {
        "ar": {"scored": 2, "restates": 0, "accuracy_restating": None, "accuracy_other": 1.0},
        "fly-mla": {"scored": 2, "restates": 2, "accuracy_restating": 0.5, "accuracy_other": None},
    }
    n = F.RESTATE_CHARS
    assert F.restates_question("Step 1: " + question[0][:n], problems[0].prompt)
    assert not F.restates_question("Step 1: " + question[0][: n - 1], problems[0].prompt)
    assert not F.restates_question("y" * F.OPENING_CHARS + question[0], problems[0].prompt)  # past the opening
    table = F.failure_table([d], tmp_path.parent)
    assert "| gsm8k/0 | fly-mla | deferred mismatch | no / yes | 0 |" in table
    assert f"| {tmp_path.name} | fly-mla | 2 | 2 (1.00) | 0.50 | - |" in table


def test_failure_table_says_when_nothing_was_lost(tmp_path):
    d = write(tmp_path, [row("a", "ar", [1], True), row("a", "fly-mla", [1], True)])
    assert "(none lost)" in F.failure_table([d])


def test_recovery_interval_narrows_with_n_and_tracks_the_losses():
    small = F.recovery_interval(5, 0, 0, 5)
    large = F.recovery_interval(1000, 0, 0, 1000)
    assert small[0] < 0.8 < 1.25 < small[1]  # ten identical answers decide nothing
    assert 0.99 < large[0] <= 1.0 <= large[1] < 1.01
    lossy = F.recovery_interval(50, 50, 0, 100)  # half of ar's right answers lost
    assert lossy[1] < 0.7 and lossy[0] > 0.35


def test_retention_verdicts(tmp_path):
    def table(d, both, ar_only, method_only, neither):
        rows, i = [], 0
        for n, (a, m) in (
            (both, (True, True)),
            (ar_only, (True, False)),
            (method_only, (False, True)),
            (neither, (False, False)),
        ):
            for _ in range(n):
                rows += [row(f"q{i}", "ar", [1], a), row(f"q{i}", "fly-mla", [1] if a == m else [2], m)]
                i += 1
        d.mkdir()
        return write(d, rows)

    kept = F.retention(table(tmp_path / "kept", 1000, 0, 0, 1000))["fly-mla"]
    assert kept["verdict"] == "kept" and kept["mcnemar_p"] == 1.0
    lost = F.retention(table(tmp_path / "lost", 50, 50, 0, 100))["fly-mla"]
    assert lost["verdict"] == "lost" and lost["mcnemar_p"] < 1e-10
    small = F.retention(table(tmp_path / "small", 5, 1, 1, 3))["fly-mla"]
    assert small["verdict"] == "not decided at n = 10"
    assert small["ar_right_method_wrong"] == 1 and small["ar_wrong_method_right"] == 1
    text = F.retention_table([tmp_path / "small"], tmp_path)
    assert "| small | fly-mla | 10 | 0.60 | 0.60 (" in text and "| 1 / 1 | 1 |" in text
    assert text.rstrip().endswith("not decided at n = 10 |")


def test_mcnemar_in_the_summary_and_its_table():
    rows = [row(f"q{i}", "ar", [1], True) for i in range(5)] + [row(f"q{i}", "fly-mla", [2], False) for i in range(5)]
    s = S.summarize(rows)["methods"]["fly-mla"]
    assert s["mcnemar_p"] == pytest.approx(2 / 32)
    assert "| McNemar p |" in RP.format_table(S.summarize(rows)) and "| 0.0625 |" in RP.format_table(S.summarize(rows))


def test_report_failures_on_the_command_line(tmp_path):
    from conftest import run_cli

    d = write(
        tmp_path,
        [
            row("a", "ar", [1, 2, 3], True, output="so 3. The answer is 18."),
            row("a", "fly-mla", [1, 2, 4], False, output="so 4. The answer is 19.", stats={"fly_deferred": 1}),
        ],
    )
    p = run_cli("report", d, "--no-plots", "--failures")
    assert p.returncode == 0, p.stderr
    assert "keeps >= 99% of ar?" in p.stdout and "not decided at n = 1" in p.stdout
    assert "| a | fly-mla | deferred mismatch | - | 2 | 3 / 3 | 18 / 18 / 19 |" in p.stdout


def _seed_run(d, seed, outcomes, temperature=0.7):
    """A results directory of one seed: per problem, (ar right, fly-mla right)."""
    d.mkdir()
    rows = [
        r for i, (a, m) in enumerate(outcomes) for r in (row(f"q{i}", "ar", [1], a), row(f"q{i}", "fly-mla", [2], m))
    ]
    write(d, rows)
    cfg = json.loads((d / R.CONFIG).read_text())
    (d / R.CONFIG).write_text(json.dumps({**cfg, "seed": seed, "temperature": temperature}))
    return d


def test_pooled_seeds_pair_each_problem_within_its_seed(tmp_path):
    # seed 0: the method loses q0; seed 1: it gains q0 and loses nothing. Pairing across seeds would be wrong.
    s0 = _seed_run(tmp_path / "s0", 0, [(True, False), (True, True), (False, False)])
    s1 = _seed_run(tmp_path / "s1", 1, [(False, True), (True, True), (False, False)])
    rows, cfg = F.pooled([s0, s1])
    assert len(rows) == 12 and cfg["seed"] == [0, 1]
    assert {r["question_id"] for r in rows} == {f"s{s}:q{i}" for s in (0, 1) for i in range(3)}
    v = F.retention([s0, s1])["fly-mla"]
    assert v["scored"] == 6 and (v["ar_right_method_wrong"], v["ar_wrong_method_right"]) == (1, 1)
    assert v["ar_accuracy"] == pytest.approx(0.5) and v["verdict"] == "not decided at n = 6"
    assert v["recovery_ci95"] == F.recovery_interval(2, 1, 1, 2)  # the pooled 2x2 table, under the same prior
    text = F.retention_table([s0, [s0, s1]], tmp_path)
    assert "| s0 | fly-mla | 3 |" in text and "| s0 + s1 | fly-mla | 6 | 0.50 |" in text


def test_pooling_refuses_runs_that_differ_in_more_than_the_seed(tmp_path):
    from loosespec.errors import LoosespecError

    s0 = _seed_run(tmp_path / "s0", 0, [(True, True)])
    hot = _seed_run(tmp_path / "hot", 1, [(True, True)], temperature=1.0)
    again = _seed_run(tmp_path / "again", 0, [(True, True)])
    with pytest.raises(LoosespecError, match="differ in temperature"):
        F.pooled([s0, hot])
    with pytest.raises(LoosespecError, match="repeat a seed"):
        F.pooled([s0, again])
    with pytest.raises(LoosespecError, match="not found"):
        F.pooled([s0, tmp_path / "nowhere"])


def test_report_pools_seeds_on_the_command_line(tmp_path):
    from conftest import run_cli

    s0 = _seed_run(tmp_path / "s0", 0, [(True, False), (True, True)])
    s1 = _seed_run(tmp_path / "s1", 1, [(True, True), (False, True)])
    p = run_cli("report", s0, "--no-plots", "--failures", "--pool", s1)
    assert p.returncode == 0, p.stderr
    assert f"| {s0} + {s1} | fly-mla | 4 | 0.75 |" in p.stdout
    assert f"| {s0} + {s1} | fly-mla | 1 | 0 | 0 | 0 | 0 | 1 |" in p.stdout  # the lost answers, read across seeds
    assert f"| {s0} | fly-mla | 1 |" not in p.stdout  # ... once, not again for seed 0 alone
    bad = run_cli("report", s0, "--no-plots", "--failures", "--pool", tmp_path / "nowhere")
    assert bad.returncode != 0 and "not found" in bad.stderr and "Traceback" not in bad.stderr
    assert bad.stdout == ""  # refused before any table was printed
    alone = run_cli("report", s0, "--no-plots", "--pool", s1)
    assert alone.returncode != 0 and "--failures" in alone.stderr


def test_endings_count_budget_stops_and_loops_per_method(tmp_path):
    head = list(range(100, 110))
    d = write(
        tmp_path,
        [
            row("a", "ar", head, True),
            row("a", "fly-mla", head + [7, 8, 9] * 10, False, stats={"fly_deferred": 1}),
            row("b", "ar", head * 4, True),
            row("b", "fly-mla", list(range(200, 240)), True),  # 40 = the budget
            row("c", "ar", head, None),
            row("c", "fly-mla", head * 4, None),  # unscored: not counted
        ],
        budget=40,
    )
    assert F.endings(d) == {
        "ar": {"scored": 2, "at_budget": 1, "loops": 1, "right_at_budget": 1},
        "fly-mla": {"scored": 2, "at_budget": 2, "loops": 1, "right_at_budget": 1},
    }
    table = F.failure_table([d], tmp_path.parent)
    assert f"| {tmp_path.name} | fly-mla | 2 | 2 (1.00) | 1 | 1 |" in table
    assert f"| {tmp_path.name} | fly-mla | 1 | 1 | 0 | 0 | 0 | 0 |" in table  # the lost answer: a loop


def test_failure_table_reads_pooled_seeds(tmp_path):
    s0 = _seed_run(tmp_path / "s0", 0, [(True, False), (True, True)])
    s1 = _seed_run(tmp_path / "s1", 1, [(True, False), (False, True)])
    lost = F.failures([s0, s1])
    assert [(f["question_id"], f["method"]) for f in lost] == [("s0:q0", "fly-mla"), ("s1:q0", "fly-mla")]
    table = F.failure_table([[s0, s1]], tmp_path)
    assert "| s0 + s1 | fly-mla | 2 | 0 | 0 | 0 | 0 | 2 |" in table  # never deferred: "other"
    assert "| s0 + s1 | ar | 4 | 0 (0.00) | 0 | 0 |" in table
