"""The Spec-Bench export (:func:`loosespec.eval.results.export_spec_bench`) read as Spec-Bench's own
``evaluation/speed.py`` reads it: every exported row is found by one of its task lines."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from loosespec.errors import LoosespecError
from loosespec.eval import results as R
from loosespec.eval.loaders import specbench

EVIDENCE = Path(__file__).resolve().parents[2] / "results" / "bench" / "evidence" / "specbench"

# Spec-Bench's selection rule, reimplemented from evaluation/speed.py of github.com/hemingkx/Spec-Bench at commit
# fd2c1cd7d2201ef71db4c5f4e455008f017967bf: speed(task=...) keeps every row for "overall", for "mt_bench" the rows
# whose "category" is one of MT-Bench's eight categories, and for any other task the rows whose "category" equals
# the task's name; its reports run the tasks below (then "overall").
SPEED_PY_TASKS = ("mt_bench", "translation", "summarization", "qa", "math_reasoning", "rag")
SPEED_PY_MT_BENCH = ("writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities")


def speed_py_selects(task: str, item: dict) -> bool:
    if task == "overall":
        return True
    if task == "mt_bench":
        return item["category"] in SPEED_PY_MT_BENCH
    return item["category"] == task


def answer_row(problem, method: str) -> dict:
    return {
        "question_id": problem.id,
        "category": problem.category,
        "dataset": "specbench",
        "method": method,
        "model_id": f"m/{method}",
        "tstamp": 1.0,
        "choices": [
            {
                "index": 0,
                "turns": ["t"],
                "decoding_steps": [2],
                "new_tokens": [4],
                "wall_time": [1.0],
                "accept_lengths": [2, 2],
            }
        ],
    }


def tasks_found(path: Path) -> Counter:
    """How many of the file's rows each of speed.py's task lines selects; a row no task line selects counts
    under None."""
    found: Counter = Counter()
    for line in path.read_text(encoding="utf-8").splitlines():
        item = json.loads(line)
        tasks = [t for t in SPEED_PY_TASKS if speed_py_selects(t, item)]
        assert len(tasks) <= 1, (item["question_id"], tasks)
        found[tasks[0] if tasks else None] += 1
    return found


def test_every_spec_bench_task_line_finds_the_rows_of_its_task(tmp_path):
    problems = specbench()  # all of Spec-Bench: 80 questions per task type
    rows = [answer_row(p, m) for m in ("ar", "fly-ngram") for p in problems]
    paths = R.export_spec_bench(rows, tmp_path / "sb")
    assert sorted(p.name for p in paths) == ["ar.jsonl", "fly-ngram.jsonl"]
    for path in paths:
        assert tasks_found(path) == {t: 80 for t in SPEED_PY_TASKS}
    fly = {x["question_id"]: x for x in map(json.loads, (tmp_path / "sb" / "fly-ngram.jsonl").read_text().splitlines())}
    # MT-Bench's questions carry their own category (Spec-Bench's question file), the others their task type
    assert fly["specbench/81"]["category"] == "writing" and fly["specbench/160"]["category"] == "humanities"
    assert {fly[p.id]["category"] for p in problems if p.category == "mt_bench"} == set(SPEED_PY_MT_BENCH)
    assert all(fly[p.id]["category"] == p.category for p in problems if p.category != "mt_bench")
    assert set(fly["specbench/81"]) == set(R.SPEC_BENCH_KEYS)


def test_the_committed_specbench_run_exports_to_categories_speed_py_finds(tmp_path):
    rows = R.ResultsFile(EVIDENCE / R.RESULTS).read()
    per_task = Counter(r["category"] for r in rows if r["method"] == "ar")
    for path in R.export_spec_bench(rows, tmp_path / "sb"):
        found = tasks_found(path)
        assert None not in found, f"{path.name}: {found[None]} row(s) no task line of speed.py selects"
        assert found == per_task


def test_an_mt_bench_row_spec_bench_does_not_know_is_refused(tmp_path):
    problem = specbench(limit=1, category="mt_bench")[0]
    unknown = {**answer_row(problem, "ar"), "question_id": "specbench/999"}
    with pytest.raises(LoosespecError, match="specbench/999.*MT-Bench category is unknown"):
        R.export_spec_bench([unknown], tmp_path / "sb")
