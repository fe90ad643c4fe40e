"""MBPP's train split as the calibration set ``mbpp-train``: HumanEval-style stubs, tests, scoring.

Uses only the shipped ``loosespec/eval/data/mbpp.jsonl``; no models are loaded."""

from __future__ import annotations

import ast
import json

import pytest

from loosespec.errors import LoosespecError
from loosespec.eval.datafiles import SHIPPED
from loosespec.eval.datasets import DATASETS, load_dataset, score
from loosespec.eval.loaders import HUMANEVAL_PROMPT
from loosespec.eval.scoring import defines, humaneval_program


@pytest.fixture(autouse=True)
def _shipped_data_only(monkeypatch):
    monkeypatch.delenv("LOOSESPEC_DATA", raising=False)


@pytest.fixture(scope="module")
def problems():
    return load_dataset("mbpp-train")


def _rows():
    path = SHIPPED / "mbpp.jsonl"
    return {r["task_id"]: r for r in map(json.loads, path.read_text(encoding="utf-8").splitlines())}


def test_the_train_split_only_in_file_order(problems):
    assert len(problems) == 374
    assert [p.id for p in problems] == [f"mbpp-train/{i}" for i in range(601, 975)]
    assert problems[0].id == "mbpp-train/601" and {p.category for p in problems} == {"mbpp-train"}
    rows = _rows()
    assert len(rows) == 974 and sorted(rows) == list(range(1, 975))
    for p in problems:
        row = rows[p.meta["task_id"]]
        assert p.answer == row["code"]
        assert p.prompt == HUMANEVAL_PROMPT.format(prompt=p.meta["prompt"])
        assert set(p.meta) == {"task_id", "prompt", "test", "entry_point"}
    spec = DATASETS["mbpp-train"]
    assert spec.scorer is DATASETS["humaneval"].scorer and not spec.short_answer
    assert dict(spec.score_options) == {
        "timeout_s": 10.0,
        "memory_mb": 1024,
        "allow_code_execution": False,
        "sandbox": None,
    }


def test_limit_is_the_first_problems():
    three = load_dataset("mbpp-train", 3)
    assert [p.id for p in three] == ["mbpp-train/601", "mbpp-train/602", "mbpp-train/603"]
    assert three == load_dataset("mbpp-train")[:3]
    with pytest.raises(LoosespecError, match="limit must be a positive integer"):
        load_dataset("mbpp-train", 0)


def test_every_stub_is_valid_python_with_the_signature_and_the_asserts(problems):
    rows = _rows()
    for p in problems:
        stub, entry = p.meta["prompt"], p.meta["entry_point"]
        tree = ast.parse(stub + "    pass\n")
        funcs = [n for n in tree.body if isinstance(n, ast.FunctionDef)]
        assert [f.name for f in funcs] == [entry], p.id
        doc = ast.get_docstring(funcs[0], clean=False)
        row = rows[p.meta["task_id"]]
        assert row["text"].strip() in doc and "Your code should pass these tests:" in doc, p.id
        for t in row["test_list"]:
            assert "    " + t.strip() in doc, p.id  # each assert on its own line, as written
        assert stub.endswith('    """\n') and "\t" not in stub.split('"""')[0], p.id


def test_every_entry_point_is_defined_by_the_reference(problems):
    for p in problems:
        assert defines(p.answer, p.meta["entry_point"]), p.id
    by_id = {p.id: p.meta["entry_point"] for p in problems}
    assert by_id["mbpp-train/601"] == "max_chain_length"
    assert by_id["mbpp-train/912"] == "lobb_num"  # first assert calls int(...): the reference's last def
    assert by_id["mbpp-train/927"] == "max_height"  # assert (max_height(root)) == 3


def test_stub_and_test_shapes():
    p = load_dataset("mbpp-train", 1)[0]
    assert p.meta["prompt"] == (
        "def max_chain_length(arr, n):\n"
        '    """Write a function to find the longest chain which can be formed from the given set of pairs.\n'
        "\n"
        "    Your code should pass these tests:\n"
        "    assert max_chain_length([Pair(5, 24), Pair(15, 25),Pair(27, 40), Pair(50, 60)], 4) == 3\n"
        "    assert max_chain_length([Pair(1, 2), Pair(3, 4),Pair(5, 6), Pair(7, 8)], 4) == 4\n"
        "    assert max_chain_length([Pair(19, 10), Pair(11, 12),Pair(13, 14), Pair(15, 16), Pair(31, 54)], 5) == 5\n"
        '    """\n'
    )
    assert p.meta["test"].startswith("\n\ndef check(candidate):\n    assert max_chain_length(")
    imports = {q.meta["task_id"]: q.meta["prompt"] for q in load_dataset("mbpp-train", 10)}
    assert imports[607].startswith("import re\n\ndef find_literals(text, pattern):\n")


def test_setup_code_and_a_function_named_check():
    by_id = {p.id: p for p in load_dataset("mbpp-train")}
    assert by_id["mbpp-train/927"].meta["test"].startswith("root = Node(1)")  # test_setup_code first
    for task in ("mbpp-train/899", "mbpp-train/967"):  # the reference is itself called check()
        p = by_id[task]
        assert p.meta["entry_point"] == "check"
        program = humaneval_program(p, "```python\n" + p.answer + "\n```")
        namespace = {}
        exec(program, namespace)  # the dataset's own reference code and asserts
        assert namespace["_mbpp_candidate"] is not namespace["check"]


def test_references_pass_and_wrong_code_fails_in_the_sandbox():
    pytest.importorskip("loosespec.eval.sandbox")
    probs = load_dataset("mbpp-train", 10)
    for p in probs:
        assert score("mbpp-train", p, "```python\n" + p.answer + "\n```", allow_code_execution=True) is True, p.id
        assert score("mbpp-train", p, "```python\n    return None\n```", allow_code_execution=True) is False, p.id
    p = probs[1]  # first_repeated_char: a whole wrong function fails too
    assert (
        score(
            "mbpp-train", p, "```python\ndef first_repeated_char(str1):\n    return 'x'\n```", allow_code_execution=True
        )
        is False
    )
