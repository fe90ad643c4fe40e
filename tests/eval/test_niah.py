"""NIAH: prompts built from a haystack (a generated stand-in for the essays, tests/fakes/fake_essays.py) with the
needle at its depth, sized by a token counter; options, limit, determinism; the scorer."""

from __future__ import annotations

from collections import Counter

import pytest
from fakes.fake_essays import ESSAYS_START, only_repository_data

from loosespec.eval.datafiles import Problem
from loosespec.eval.datasets import load_dataset, score
from loosespec.eval.niah import approx_tokens, niah_code


@pytest.fixture(autouse=True)
def _only_repository_data(tmp_path_factory, monkeypatch):
    only_repository_data(tmp_path_factory, monkeypatch)


def _unique_ids(problems):
    ids = [p.id for p in problems]
    return len(ids) == len(set(ids))


def _quarter(text):
    return len(text) // 4


def _words(text):  # a non-linear counter, roughly like a real tokenizer
    return len(text.split()) * 4 // 3 + text.count("\n")


@pytest.mark.parametrize("counter", [_quarter, _words, None])
def test_niah_construction(counter):
    calls = []

    def counting(text):
        calls.append(len(text))
        return (counter or (lambda t: 0))(text)

    kwargs = {} if counter is None else {"count_tokens": counting}
    probs = load_dataset("niah", **kwargs)
    assert len(probs) == 15 and _unique_ids(probs)
    assert [p.id for p in probs[:6]] == [
        "niah/1024/0.0",
        "niah/1024/0.25",
        "niah/1024/0.5",
        "niah/1024/0.75",
        "niah/1024/1.0",
        "niah/2048/0.0",
    ]
    assert Counter(p.category for p in probs) == {"niah-1024": 5, "niah-2048": 5, "niah-4096": 5}
    assert len({p.answer for p in probs}) == 15  # codes differ across (length, depth)
    count = counter or approx_tokens
    for p in probs:
        L, depth = p.meta["context_length"], p.meta["depth"]
        assert p.prompt.endswith(
            "\n\nWhat is the secret access code for the Dolores Park sandwich shop? Answer with the code only."
        )
        needle = f"The secret access code for the Dolores Park sandwich shop is {p.answer}."
        assert p.prompt.count(needle) == 1
        haystack = p.prompt[: p.prompt.rindex("\n\nWhat is the secret")]
        assert abs(haystack.index(needle) / len(haystack) - depth) <= 0.10, (p.id, haystack.index(needle))
        assert 0.9 * L <= count(p.prompt) <= L, p.id  # fits, and is not much shorter
        assert p.prompt.startswith(ESSAYS_START) or depth == 0.0
    if counter is not None:  # fast: a few counts per length, never the whole 650 KB haystack
        assert len(calls) < 80 and max(calls) < 100_000


def test_niah_options_limit_and_determinism():
    a = load_dataset("niah", context_lengths=(512, 8192), depths=(0.1, 0.9), count_tokens=_quarter, seed=3)
    assert [p.id for p in a] == ["niah/512/0.1", "niah/512/0.9", "niah/8192/0.1", "niah/8192/0.9"]
    assert a == load_dataset("niah", context_lengths=(512, 8192), depths=(0.1, 0.9), count_tokens=_quarter, seed=3)
    assert (
        load_dataset("niah", limit=3, context_lengths=(512, 8192), depths=(0.1, 0.9), count_tokens=_quarter, seed=3)
        == a[:3]
    )
    other_seed = load_dataset("niah", context_lengths=(512, 8192), depths=(0.1, 0.9), count_tokens=_quarter, seed=4)
    assert [p.answer for p in a] != [p.answer for p in other_seed]
    assert a[0].answer == niah_code(512, 0.1, 3)
    assert len(load_dataset("niah", limit=4)) == 4
    big = load_dataset("niah", context_lengths=[200_000], depths=[0.5], count_tokens=_quarter)[0]  # > haystack
    assert 0.9 * 200_000 <= _quarter(big.prompt) <= 200_000 and big.meta["code"] in big.prompt


def test_niah_scorer():
    p = Problem("niah/4096/0.25", "niah-4096", "...", "7319-BRAVO")
    for good in ("The code is 7319-bravo.", "7319-BRAVO", "**7319 BRAVO**", "Code: 7319–Bravo", " 7319-BRAVO\n"):
        assert score("niah", p, good) is True, good
    for bad in ("The code is 7318-BRAVO.", "7319-CHARLIE", "17319-BRAVO", "7319-BRAVOS", "", "BRAVO 7319"):
        assert score("niah", p, bad) is False, bad
