"""The frontier of scored results directories (loosespec.eval.frontier) on hand-made rows: the points, the verdicts,
the fastest method that keeps ar's accuracy, and the tables README.md and BENCHMARKS.md show."""

from __future__ import annotations

import json

from loosespec.eval import frontier as F
from loosespec.eval import results as R


def row(qid, method, wall, ids, right, run="A", **stats):
    return {
        "question_id": qid,
        "category": "c",
        "method": method,
        "lossy": method.startswith("fly"),
        "wall_time": wall,
        "token_ids": ids,
        "new_tokens": len(ids),
        "rounds": len(ids),
        "accept_lengths": [],
        "score": right,
        "score_status": "right" if right else "wrong",
        "drafted_tokens": None,
        "accepted_tokens": None,
        "stats": stats,
        "config": {"method": method.split("-")[0]},
        "run_id": run,
        "hardware": {"cpu": "x", "cpu_flags": [], "threads": 2},
    }


def write(d, rows, reruns=(), **config):
    d.mkdir(parents=True)
    (d / R.CONFIG).write_text(json.dumps({"dataset": "gsm8k", **config}))
    (d / R.RESULTS).write_text("".join(json.dumps(r) + "\n" for r in rows))
    if reruns:
        (d / R.RERUNS).write_text("".join(json.dumps(r) + "\n" for r in reruns))
    return d


def a_set(n=40, fly_wrong=0):
    """n problems, ar right on all: exact-mla ar's outputs at 2x; fly-mla 3x, wrong on the first ``fly_wrong``."""
    rows = []
    for i in range(n):
        q = f"gsm8k/{i}"
        rows += [
            row(q, "ar", 6.0, [i, 1], True),
            row(q, "exact-mla", 3.0, [i, 1], True),
            row(
                q,
                "fly-mla",
                2.0,
                [i, 2 if i < fly_wrong else 1],
                i >= fly_wrong,
                fly_deferred=2,
                fly_deferrable_rounds=5,
            ),
        ]
    return rows


def test_points_verdicts_and_the_fastest_that_keeps(tmp_path):
    d = write(tmp_path / "a", a_set(fly_wrong=10))
    pts = F.points(d)
    assert pts["n"] == 40 and pts["ar_accuracy"] == 1.0 and pts["ar_reproduced"] is None
    exact, fly = pts["methods"]["exact-mla"], pts["methods"]["fly-mla"]
    assert exact["verdict"] == F.LOSSLESS and exact["speedup"] == 2.0
    assert fly["verdict"] == "lost" and fly["lost"] == 10 and fly["fly_deferred"] == 80
    assert fly["fly_deferrable_rounds"] == 200 and fly["speedup"] == 3.0
    assert F.fastest_kept(pts["methods"]) == "exact-mla"  # fly-mla is faster but lost answers
    table = F.frontier_table([d])
    assert "| GSM8K | 40 | `exact-mla` **fastest that keeps** | 2.00x" in table
    assert "| 10 / 0 | 0.75 | 80 in 200 | - | - | lost |" in table
    head = F.headline_table([d])
    assert "| GSM8K | 40 | 1.00 | `exact-mla` | 2.00x" in head and "every output `ar`'s | not checked |" in head


def test_a_lossy_method_with_ars_answers_is_not_decided_at_a_small_n_and_none_decided_without_lossless(tmp_path):
    rows = [r for r in a_set(n=20) if r["method"] != "exact-mla"]
    d = write(tmp_path / "a", rows)
    fly = F.points(d)["methods"]["fly-mla"]
    # no answer lost in 20: the recovery's interval still reaches below 0.99, so nothing is decided
    assert fly["recovery"] == 1.0 and fly["verdict"] == "not decided at n = 20"
    assert F.fastest_kept(F.points(d)["methods"]) is None
    assert "| GSM8K | 20 | 1.00 | none decided | - | - | - | not checked |" in F.headline_table([d])


def test_speed_pairs_across_sittings_are_refused_and_reruns_restore_them(tmp_path):
    # fly-mla's problems 20-39 ran in sitting B, ar's in A: refused until ar is rerun in B
    rows = [
        {**r, "run_id": "B"} if r["method"] == "fly-mla" and int(r["question_id"][6:]) >= 20 else r for r in a_set()
    ]
    d = write(tmp_path / "a", rows)
    fly = F.points(d)["methods"]["fly-mla"]
    assert fly["timed_prompts"] == 20 and fly["refused_speed_pairs"] == {"other sitting": 20}
    assert "3.00x (3.00-3.00), 20 timed" in F.frontier_table([d])
    reruns = [row(f"gsm8k/{i}", "ar", 8.0, [i, 1], True, run="B") for i in range(20, 40)]
    d2 = write(tmp_path / "b", rows, reruns)
    pts = F.points(d2)
    assert pts["methods"]["fly-mla"]["timed_prompts"] == 40
    assert pts["methods"]["fly-mla"]["speedup"] == (20 * 6.0 + 20 * 8.0) / (40 * 2.0)
    assert pts["ar_reproduced"] == {"problems": 20, "identical": 20, "differ": []}
    assert "| 20 of 20 |" in F.headline_table([d2])


def test_set_labels_name_mgsms_languages(tmp_path):
    d = write(tmp_path / "m", a_set(n=2), dataset="mgsm", dataset_options={"lang": "zh,ja"})
    assert F.set_label(d) == "MGSM zh + ja"
    assert F.set_label(write(tmp_path / "h", a_set(n=2), dataset="humaneval")) == "HumanEval"


def test_a_set_not_run_yet_has_a_row_saying_so(tmp_path):
    d = write(tmp_path / "gsm8k", a_set(n=2))
    tables = F.frontier_table([d, tmp_path / "humaneval"]), F.headline_table([d, tmp_path / "humaneval"])
    for table in tables:
        header, rule, *rows = table.splitlines()
        assert all(r.count("|") == header.count("|") for r in rows)  # every row fills the columns
        assert rows[-1].startswith("| HumanEval | 0 |") and "not run yet" in rows[-1]
        assert not any("not run yet" in r for r in rows[:-1])


def test_a_recovery_bound_that_two_decimals_would_round_onto_099_gets_a_third():
    lost = {"recovery": 0.9386, "recovery_ci95": (0.8812, 0.9869)}  # HumanEval's fly-mla, 164 problems: lost
    open_ = {"recovery": 0.9035, "recovery_ci95": (0.8161, 0.994)}  # its paper preset: not decided
    assert F._recovery(lost) == "0.939 (0.881-0.987)" and F._recovery(open_) == "0.903 (0.816-0.994)"
    assert F._recovery({"recovery": 0.95, "recovery_ci95": (0.89, 1.0)}) == "0.95 (0.89-1.00)"
    assert F._recovery({"recovery": 1.0, "recovery_ci95": (0.99, 1.01)}) == "1.00 (0.99-1.01)"  # exactly KEEP
    assert F._recovery({"recovery": None, "recovery_ci95": None}) == "-"
