"""The evaluation sets' loaders: counts, ids, categories, prompts and gold answers, from the files shipped in
loosespec/eval/data; no models are loaded. NIAH's loader: test_niah.py."""

from __future__ import annotations

import json
from collections import Counter

import pytest
from fakes.fake_essays import only_repository_data

from loosespec.eval.datafiles import SHIPPED
from loosespec.eval.datasets import DATASETS, load_dataset

DATA = SHIPPED


@pytest.fixture(autouse=True)
def _only_repository_data(tmp_path_factory, monkeypatch):
    only_repository_data(tmp_path_factory, monkeypatch)


def _rows(name):
    return [json.loads(line) for line in (DATA / name).read_text(encoding="utf-8").splitlines() if line.strip()]


def _unique_ids(problems):
    ids = [p.id for p in problems]
    return len(ids) == len(set(ids))


def test_gsm8k_and_backward_compatible_registry_call():
    probs = load_dataset("gsm8k")
    assert len(probs) == 1319 and _unique_ids(probs) and {p.category for p in probs} == {"gsm8k"}
    assert probs[0].id == "gsm8k/0" and probs[0].answer == "18" and "Janet" in probs[0].prompt
    assert DATASETS["gsm8k"](3, None) == probs[:3]  # the old DATASETS[name](limit, directory) call still works


def test_mgsm_languages_limits_and_gold():
    en = load_dataset("mgsm")
    assert len(en) == 250 and _unique_ids(en) and {p.category for p in en} == {"mgsm-en"}
    assert en[0].id == "mgsm/en/0" and en[0].answer == "18" and "Janet" in en[0].prompt
    assert "The answer is N." in en[0].prompt  # English instruction ...
    both = load_dataset("mgsm", limit=5, lang="de,zh")
    assert len(both) == 10 and _unique_ids(both)
    assert [p.category for p in both] == ["mgsm-de"] * 5 + ["mgsm-zh"] * 5
    rows = {(r["lang"], r["id"]): r for r in _rows("mgsm.jsonl")}
    for p in both:  # ... and the question in its own language
        assert rows[p.meta["lang"], p.meta["index"]]["question"] in p.prompt
        assert p.prompt.startswith("Solve the following math problem")
    de, zh = both[:5], both[5:]
    assert [p.answer for p in de] == [p.answer for p in zh]  # same id, same gold across languages
    assert [p.id.split("/")[-1] for p in de] == [p.id.split("/")[-1] for p in zh]
    assert len(load_dataset("mgsm", lang=["sw", "bn"], limit=2)) == 4
    every = load_dataset("mgsm", lang="all", limit=1)
    assert [p.category for p in every] == [f"mgsm-{c}" for c in "en de fr zh ja es ru th sw bn te".split()]
    assert len({p.answer for p in every}) == 1
    thousands = [p for p in load_dataset("mgsm", lang="fr") if "," in p.meta["answer_text"]]
    assert thousands and all("," not in p.answer for p in thousands)


def test_math500_loader():
    probs = load_dataset("math500")
    assert len(probs) == 500 and _unique_ids(probs)
    assert Counter(p.category for p in probs) == {
        "Algebra": 124,
        "Intermediate Algebra": 97,
        "Prealgebra": 82,
        "Number Theory": 62,
        "Precalculus": 56,
        "Geometry": 41,
        "Counting & Probability": 38,
    }
    first = probs[0]
    assert first.id == "math500/test/precalculus/807.json" and first.answer == r"\left( 3, \frac{\pi}{2} \right)"
    assert "\\boxed{}" in first.prompt and _rows("math500_test.jsonl")[0]["problem"] in first.prompt
    assert len(load_dataset("math500", limit=7)) == 7


def test_humaneval_loader_keeps_the_speed_benchmark_prompt():
    probs = load_dataset("humaneval", limit=3)
    rows = _rows("humaneval.jsonl")
    assert len(load_dataset("humaneval")) == 164 and [p.id for p in probs] == [
        "HumanEval/0",
        "HumanEval/1",
        "HumanEval/2",
    ]
    for p, r in zip(probs, rows):
        assert p.prompt == "Complete the following Python function.\n\n```python\n" + r["prompt"] + "```"
        assert p.category == "humaneval" and p.answer == r["canonical_solution"]
        assert p.meta["test"] == r["test"] and p.meta["entry_point"] == r["entry_point"]
        assert p.meta["prompt"] == r["prompt"] and p.meta["task_id"] == r["task_id"]


def test_specbench_loader():
    probs = load_dataset("specbench")
    assert len(probs) == 480 and _unique_ids(probs)
    assert Counter(p.meta["task"] for p in probs) == {
        t: 80 for t in ("mt_bench", "translation", "summarization", "qa", "math_reasoning", "rag")
    }
    assert all(p.category == p.meta["task"] for p in probs)  # grouped by task type, as Spec-Bench reports
    cats = Counter(p.meta["category"] for p in probs)
    assert cats["writing"] == 10 and cats["humanities"] == 10 and cats["translation"] == 80
    rows = {r["question_id"]: r for r in _rows("spec_bench_question.jsonl")}
    assert all(p.prompt == rows[int(p.id.split("/")[1])]["turns"][0] and p.answer is None for p in probs)
    mt = load_dataset("specbench", category="mt_bench")
    assert len(mt) == 80 and {p.id for p in mt} == {f"specbench/{i}" for i in range(81, 161)}
    limited = load_dataset("specbench", limit=3)  # limit per task type
    assert len(limited) == 18 and Counter(p.meta["task"] for p in limited) == {
        t: 3 for t in ("mt_bench", "translation", "summarization", "qa", "math_reasoning", "rag")
    }
    # mt_bench round-robin over its categories, the other task types in file order
    assert [p.meta["category"] for p in limited[:3]] == ["writing", "roleplay", "reasoning"]
    assert [p.id for p in limited[3:6]] == ["specbench/161", "specbench/162", "specbench/163"]
    assert len(load_dataset("specbench", limit=8, category="mt_bench")) == 8
    assert {p.meta["category"] for p in load_dataset("specbench", limit=8, category="mt_bench")} == set(
        ("writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities")
    )
    two = load_dataset("specbench", limit=2, category="qa,coding")
    assert [p.category for p in two] == ["qa", "qa", "mt_bench", "mt_bench"]
    assert [p.meta["category"] for p in two] == ["qa", "qa", "coding", "coding"]


def test_mtbench_loader():
    probs = load_dataset("mtbench")
    assert len(probs) == 80 and _unique_ids(probs) and probs[0].id == "mtbench/81"
    assert Counter(p.category for p in probs) == {
        c: 10 for c in ("writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities")
    }
    assert "Hawaii" in probs[0].prompt and "letter A" in probs[0].meta["second_turn"] and probs[0].answer is None
    assert [p.id for p in load_dataset("mtbench", limit=2)] == ["mtbench/81", "mtbench/82"]
    spec = {p.id.split("/")[1]: p.prompt for p in load_dataset("specbench", category="mt_bench")}
    assert all(spec[p.id.split("/")[1]] == p.prompt for p in probs)  # the same first turns
