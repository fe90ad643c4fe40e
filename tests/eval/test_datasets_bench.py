"""Benchmark datasets: the registry (names, options, the scorers' docs) and its errors for bad names and options.
The loaders: test_loaders.py and test_niah.py; the scorers: test_scoring.py; where the files come from:
test_datafiles.py.

NIAH's options are checked against a generated stand-in for the essays that are not shipped
(tests/fakes/fake_essays.py); no models are loaded.
"""

from __future__ import annotations

import pytest
from fakes.fake_essays import only_repository_data

from loosespec.errors import LoosespecError
from loosespec.eval.datafiles import Problem
from loosespec.eval.datasets import DATASETS, SCORERS_DOC, load_dataset, score


@pytest.fixture(autouse=True)
def _only_repository_data(tmp_path_factory, monkeypatch):
    only_repository_data(tmp_path_factory, monkeypatch)


# ----------------------------------------------------------------------------------------------- registry


def test_registry_and_docs():
    assert set(DATASETS) == {
        "gsm8k",
        "gsm8k-train",
        "mgsm",
        "math500",
        "humaneval",
        "mbpp-train",
        "specbench",
        "mtbench",
        "niah",
    }
    assert set(SCORERS_DOC) == set(DATASETS) and all(SCORERS_DOC.values())
    p = Problem("x/0", "x", "q", None)
    assert p.meta == {} and hash(p) == hash(Problem("x/0", "x", "q", None, {"a": 1}))  # meta: not hashed/compared
    assert score("specbench", p, "anything") is None and score("mtbench", p, "anything") is None


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda: load_dataset("gsm9k"), "unknown dataset 'gsm9k'.*gsm8k, gsm8k-train, mgsm, math500"),
        (lambda: load_dataset("gsm8k", lang="de"), "unknown load option lang.*'gsm8k'; valid: none"),
        (lambda: load_dataset("mgsm", language="de"), "unknown load option language.*valid: lang"),
        (lambda: load_dataset("mgsm", lang="xx"), "unknown lang 'xx'.*en, de, fr, zh, ja, es, ru, th, sw, bn, te"),
        (lambda: load_dataset("mgsm", lang="de,xx"), "unknown lang 'xx'"),
        (lambda: load_dataset("specbench", category="poetry"), "unknown category 'poetry'.*mt_bench, translation"),
        (lambda: load_dataset("niah", context_lengths=(0,)), "positive integers"),
        (lambda: load_dataset("niah", context_lengths=(1024, 1024)), "repeated"),
        (lambda: load_dataset("niah", depths=(1.5,)), r"\[0, 1\]"),
        (lambda: load_dataset("niah", depths="a"), r"\[0, 1\]"),
        (lambda: load_dataset("niah", context_lengths=(20,)), "too short"),
        (lambda: load_dataset("niah", count_tokens=5), "count_tokens"),
        (lambda: load_dataset("gsm8k", limit=0), "limit must be a positive integer"),
        (lambda: score("nope", Problem("a", "b", "c", "1"), "1"), "unknown dataset 'nope'"),
        (lambda: score("gsm8k", Problem("a", "b", "c", "1"), "1", timeout_s=3), "unknown score option timeout_s"),
    ],
)
def test_bad_names_and_options(call, match):
    with pytest.raises(LoosespecError, match=match):
        call()
