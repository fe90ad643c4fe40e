"""Benchmark datasets: loaders (counts, ids, categories, prompts), scorers, NIAH construction.

Uses the real files in shared/data (skipped where they are absent); no models are loaded.
"""

from __future__ import annotations

import json
import threading
from collections import Counter

import pytest

from loosespec.eval.datasets import (DATASETS, SCORERS_DOC, Problem, extract_number, humaneval_code, humaneval_program,
                                is_correct, load_dataset, niah_code, score)
from loosespec.errors import LoosespecError

try:
    from loosespec.eval.datasets import data_dir
    DATA = data_dir()
except LoosespecError:  # pragma: no cover - no shared/data checkout
    DATA = None

needs_data = pytest.mark.skipif(DATA is None, reason="shared/data not found")


def _rows(name):
    return [json.loads(line) for line in (DATA / name).read_text(encoding="utf-8").splitlines() if line.strip()]


def _unique_ids(problems):
    ids = [p.id for p in problems]
    return len(ids) == len(set(ids))


# ----------------------------------------------------------------------------------------------- registry

def test_registry_and_docs():
    assert set(DATASETS) == {"gsm8k", "mgsm", "math500", "humaneval", "specbench", "mtbench", "niah"}
    assert set(SCORERS_DOC) == set(DATASETS) and all(SCORERS_DOC.values())
    p = Problem("x/0", "x", "q", None)
    assert p.meta == {} and hash(p) == hash(Problem("x/0", "x", "q", None, {"a": 1}))  # meta: not hashed/compared
    assert score("specbench", p, "anything") is None and score("mtbench", p, "anything") is None


@needs_data
@pytest.mark.parametrize("call, match", [
    (lambda: load_dataset("gsm9k"), "unknown dataset 'gsm9k'.*gsm8k, mgsm, math500"),
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
])
def test_bad_names_and_options(call, match):
    with pytest.raises(LoosespecError, match=match):
        call()


# ----------------------------------------------------------------------------------------------- loaders

@needs_data
def test_gsm8k_and_backward_compatible_registry_call():
    probs = load_dataset("gsm8k")
    assert len(probs) == 1319 and _unique_ids(probs) and {p.category for p in probs} == {"gsm8k"}
    assert probs[0].id == "gsm8k/0" and probs[0].answer == "18" and "Janet" in probs[0].prompt
    assert DATASETS["gsm8k"](3, None) == probs[:3]  # the old DATASETS[name](limit, directory) call still works


@needs_data
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


@needs_data
def test_math500_loader():
    probs = load_dataset("math500")
    assert len(probs) == 500 and _unique_ids(probs)
    assert Counter(p.category for p in probs) == {"Algebra": 124, "Intermediate Algebra": 97, "Prealgebra": 82,
                                                  "Number Theory": 62, "Precalculus": 56, "Geometry": 41,
                                                  "Counting & Probability": 38}
    first = probs[0]
    assert first.id == "math500/test/precalculus/807.json" and first.answer == r"\left( 3, \frac{\pi}{2} \right)"
    assert "\\boxed{}" in first.prompt and _rows("math500_test.jsonl")[0]["problem"] in first.prompt
    assert len(load_dataset("math500", limit=7)) == 7


@needs_data
def test_humaneval_loader_keeps_the_speed_benchmark_prompt():
    probs = load_dataset("humaneval", limit=3)
    rows = _rows("humaneval.jsonl")
    assert len(load_dataset("humaneval")) == 164 and [p.id for p in probs] == ["HumanEval/0", "HumanEval/1",
                                                                              "HumanEval/2"]
    for p, r in zip(probs, rows):
        assert p.prompt == "Complete the following Python function.\n\n```python\n" + r["prompt"] + "```"
        assert p.category == "humaneval" and p.answer == r["canonical_solution"]
        assert p.meta["test"] == r["test"] and p.meta["entry_point"] == r["entry_point"]
        assert p.meta["prompt"] == r["prompt"] and p.meta["task_id"] == r["task_id"]


@needs_data
def test_specbench_loader():
    probs = load_dataset("specbench")
    assert len(probs) == 480 and _unique_ids(probs)
    assert Counter(p.meta["task"] for p in probs) == {t: 80 for t in ("mt_bench", "translation", "summarization",
                                                                       "qa", "math_reasoning", "rag")}
    assert all(p.category == p.meta["task"] for p in probs)  # grouped by task type, as Spec-Bench reports
    cats = Counter(p.meta["category"] for p in probs)
    assert cats["writing"] == 10 and cats["humanities"] == 10 and cats["translation"] == 80
    rows = {r["question_id"]: r for r in _rows("spec_bench_question.jsonl")}
    assert all(p.prompt == rows[int(p.id.split("/")[1])]["turns"][0] and p.answer is None for p in probs)
    mt = load_dataset("specbench", category="mt_bench")
    assert len(mt) == 80 and {p.id for p in mt} == {f"specbench/{i}" for i in range(81, 161)}
    limited = load_dataset("specbench", limit=3)  # limit per task type
    assert len(limited) == 18 and Counter(p.meta["task"] for p in limited) == {t: 3 for t in (
        "mt_bench", "translation", "summarization", "qa", "math_reasoning", "rag")}
    # mt_bench round-robin over its categories, the other task types in file order
    assert [p.meta["category"] for p in limited[:3]] == ["writing", "roleplay", "reasoning"]
    assert [p.id for p in limited[3:6]] == ["specbench/161", "specbench/162", "specbench/163"]
    assert len(load_dataset("specbench", limit=8, category="mt_bench")) == 8
    assert {p.meta["category"] for p in load_dataset("specbench", limit=8, category="mt_bench")} == set(
        ("writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities"))
    two = load_dataset("specbench", limit=2, category="qa,coding")
    assert [p.category for p in two] == ["qa", "qa", "mt_bench", "mt_bench"]
    assert [p.meta["category"] for p in two] == ["qa", "qa", "coding", "coding"]


@needs_data
def test_mtbench_loader():
    probs = load_dataset("mtbench")
    assert len(probs) == 80 and _unique_ids(probs) and probs[0].id == "mtbench/81"
    assert Counter(p.category for p in probs) == {c: 10 for c in ("writing", "roleplay", "reasoning", "math",
                                                                   "coding", "extraction", "stem", "humanities")}
    assert "Hawaii" in probs[0].prompt and "letter A" in probs[0].meta["second_turn"] and probs[0].answer is None
    assert [p.id for p in load_dataset("mtbench", limit=2)] == ["mtbench/81", "mtbench/82"]
    spec = {p.id.split("/")[1]: p.prompt for p in load_dataset("specbench", category="mt_bench")}
    assert all(spec[p.id.split("/")[1]] == p.prompt for p in probs)  # the same first turns


# ----------------------------------------------------------------------------------------------- numbers

@pytest.mark.parametrize("text, expected", [
    ("The answer is 1,000.", "1000"),
    ("It costs $1,234.50 in total", "1234.50"),
    ("The answer is -7.", "-7"),
    ("The answer is $-7.", "-7"),
    ("The answer is \u22127.", "-7"),
    ("The answer is 18.00", "18.00"),
    ("so the answer is 42.", "42"),
    ("we get \\boxed{1,000} apples", "1000"),
    ("Final: $\\boxed{\\$18}$", "18"),
    ("Step 1: 3 + 4 = 7.\n\nThe answer is 7.", "7"),
    ("The answer is $1,250.00.", "1250.00"),
    ("so the answer is: -3", "-3"),
    ("16 - 3 - 4 = 9 eggs, 9 * 2 = 18\n#### 18", "18"),
    ("The total is \\boxed{42} dollars, not 40", "42"),
    ("First 5 apples, then 12 pears", "12"),
    ("The answer is 5. Later I said 6 but the answer is 7.", "7"),  # the last "answer is" wins
    ("no digits here", None),
    ("The answer is: 42", "42"),
    ("**The answer is 42**", "42"),
    ("The answer is **$18**.", "18"),
    ("The answer is $18.", "18"),
    ("The answer is 25%.", "25"),
    ("The answer is 18 dollars", "18"),
    ("Answer: 12", "12"),
    ("The final answer is $\\boxed{7}$.", "7"),
    ("The answer is 1,000,000 people.", "1000000"),
    ("She is 3-4 years old", "4"),  # a hyphen, not a minus sign
    ("x = -4", "-4"),
    ("18, 20, 22", "22"),  # not one number "18,20,22"
    ("答案是18。", "18"),
    ("উত্তর হল ১৮।", "18"),  # Bengali digits
    ("The answer is 1\u202f000.", "1000"),  # narrow no-break space as a thousands separator
    ("", None),
])
def test_extract_number_tricky_formats(text, expected):
    assert extract_number(text) == expected


@pytest.mark.parametrize("output, gold, right", [
    ("The answer is 18.", "18", True),
    ("The answer is 18.00.", "18", True),
    ("The answer is $1,000.", "1000", True),
    ("The answer is 1000", "1,000", True),
    ("**The answer is 18**", "18", True),
    ("The answer is 18 dollars.", "18", True),
    ("The answer is 17.", "18", False),
    ("The answer is 180.", "18", False),
    ("The answer is 1.8", "18", False),
    ("", "18", False),
    ("I do not know.", "18", False),
    ("The answer is -18.", "18", False),
    ("So 18 eggs... wait, the answer is 16.", "18", False),  # the answer line wins over an earlier number
])
def test_is_correct(output, gold, right):
    assert is_correct(output, gold) is right


@needs_data
def test_gsm8k_and_mgsm_scorers():
    g = load_dataset("gsm8k", limit=1)[0]
    assert score("gsm8k", g, "16 - 3 - 4 = 9\n\n9 * 2 = 18\n\nThe answer is 18.") is True
    assert score("gsm8k", g, "The answer is 17.") is False
    zh = load_dataset("mgsm", lang="zh", limit=1)[0]
    assert score("mgsm", zh, "16 - 3 - 4 = 9，9 × 2 = 18。\n\nThe answer is 18.") is True
    assert score("mgsm", zh, "她每天赚 18 美元。") is True  # no answer line: the last number
    assert score("mgsm", zh, "她每天赚 16 美元。") is False


# ----------------------------------------------------------------------------------------------- MATH-500

def _math_problem(answer):
    return Problem("math500/x", "Algebra", "p", answer)


@pytest.mark.parametrize("gold, output, right", [
    (r"\frac{1}{2}", r"So the answer is $\boxed{0.5}$.", True),
    (r"\frac{1}{2}", r"So the answer is $\boxed{\frac{1}{3}}$.", False),
    (r"\left( 3, \frac{\pi}{2} \right)", r"The point is $\boxed{(3, \frac{\pi}{2})}$", True),
    (r"\left( 3, \frac{\pi}{2} \right)", r"The point is $\boxed{(3, \frac{\pi}{3})}$", False),
    (r"\text{(C)}", r"The correct option is $\boxed{\text{(C)}}$.", True),
    (r"\text{(C)}", r"The correct option is $\boxed{(C)}$.", True),
    (r"\text{(C)}", r"The correct option is $\boxed{\text{(B)}}$.", False),
    (r"\frac{1}{2}", r"First $\boxed{2}$ halves, so each is $\boxed{\frac{1}{2}}$.", True),  # the last box counts
    (r"\frac{1}{2}", r"First $\boxed{\frac{1}{2}}$, then $\boxed{2}$.", False),
    (r"\frac{1}{2}", "", False),
    (r"\frac{1}{2}", "I cannot solve this.", False),
])
def test_math500_scorer_equivalences(gold, output, right):
    assert score("math500", _math_problem(gold), output) is right


@needs_data
def test_math500_scorer_on_real_rows():
    probs = {p.id: p for p in load_dataset("math500")}
    for uid in ("test/precalculus/807.json", "test/precalculus/819.json", "test/algebra/1349.json",
                "test/intermediate_algebra/515.json", "test/algebra/2486.json"):
        p = probs["math500/" + uid]
        assert score("math500", p, "Therefore the answer is $\\boxed{" + p.answer + "}$.") is True, uid
    assert score("math500", probs["math500/test/precalculus/819.json"], "$\\boxed{\\text{(A)}}$") is False
    assert score("math500", probs["math500/test/algebra/1349.json"], "$\\boxed{\\text{Navin}}$") is False


def test_math500_scorer_works_off_the_main_thread():
    result = {}
    t = threading.Thread(target=lambda: result.update(ok=score("math500", _math_problem(r"\frac{1}{2}"),
                                                                 r"$\boxed{\frac{2}{4}}$")))
    t.start()
    t.join(60)
    assert result == {"ok": True}


# ----------------------------------------------------------------------------------------------- HumanEval

HE_PROMPT = ('from typing import List\n\n\ndef add(xs: List[int]) -> int:\n    """Sum of xs.\n    >>> add([1, 2])\n'
             '    3\n    """\n')
HE_TEST = "def check(candidate):\n    assert candidate([1, 2]) == 3\n    assert candidate([]) == 0\n"


def _he_problem(prompt=HE_PROMPT, test=HE_TEST, entry="add"):
    return Problem("HumanEval/x", "humaneval", "p", None, {"prompt": prompt, "test": test, "entry_point": entry})


def test_humaneval_program_full_function():
    out = ("Here is the solution:\n\n```python\ndef add(xs):\n    total = 0\n    for x in xs:\n        total += x\n"
           "    return total\n```\n\nIt loops over the list.")
    program = humaneval_program(_he_problem(), out)
    assert program.startswith(HE_PROMPT + "\ndef add(xs):\n    total = 0")
    assert program.endswith(HE_TEST + "\ncheck(add)\n") and "It loops" not in program
    namespace = {}
    exec(program, namespace)  # our own trusted snippet: the stub is valid and gets redefined
    assert namespace["add"]([4, 5]) == 9


def test_humaneval_program_body_only():
    body = "    return sum(xs)\n"
    for out in (body, "```python\n" + body + "```", "```\n" + body + "```", "```python\n" + body):  # unclosed
        program = humaneval_program(_he_problem(), out, with_tests=False)
        assert program == HE_PROMPT + body, out
    dedented = humaneval_program(_he_problem(), "```python\nreturn sum(xs)\n```", with_tests=False)
    assert dedented == HE_PROMPT + "    return sum(xs)\n"
    namespace = {}
    exec(humaneval_program(_he_problem(), body), namespace)


def test_humaneval_code_picks_the_defining_block():
    out = ("```bash\npip install nothing\n```\n```python\nprint(add([1]))\n```\n"
           "```python\ndef add(xs):\n    return sum(xs)\n```")
    assert humaneval_code(out, "add") == "def add(xs):\n    return sum(xs)\n"
    assert humaneval_code("```python\nx = 1\n```\n```python\ny = 22222\n```") == "y = 22222\n"  # longest
    assert humaneval_code("no fence at all") == "no fence at all"


@needs_data
def test_humaneval_scorer_in_the_sandbox():
    pytest.importorskip("loosespec.eval.sandbox")
    probs = load_dataset("humaneval", limit=3)
    for p in probs:
        assert score("humaneval", p, "```python\n" + p.answer + "```") is True, p.id
        assert score("humaneval", p, "```python\n" + p.meta["prompt"] + p.answer + "```") is True, p.id  # full function
        assert score("humaneval", p, "```python\n    return None\n```") is False, p.id
    # leaving early with status 0 is not a pass: the scorer also wants a secret printed after check()
    assert score("humaneval", probs[0], "```python\n    import sys\n    sys.exit(0)\n```") is False
    assert score("humaneval", probs[0], "```python\nimport os\nos._exit(0)\n```") is False
    assert score("humaneval", probs[0], "```python\ndef has_close_elements(numbers, threshold):\n"
                                        "    return False\n```") is False


# ----------------------------------------------------------------------------------------------- NIAH

def _quarter(text):
    return len(text) // 4


def _words(text):  # a non-linear counter, roughly like a real tokenizer
    return len(text.split()) * 4 // 3 + text.count("\n")


@needs_data
@pytest.mark.parametrize("counter", [_quarter, _words, None])
def test_niah_construction(counter):
    calls = []

    def counting(text):
        calls.append(len(text))
        return (counter or (lambda t: 0))(text)

    kwargs = {} if counter is None else {"count_tokens": counting}
    probs = load_dataset("niah", **kwargs)
    assert len(probs) == 15 and _unique_ids(probs)
    assert [p.id for p in probs[:6]] == ["niah/1024/0.0", "niah/1024/0.25", "niah/1024/0.5", "niah/1024/0.75",
                                         "niah/1024/1.0", "niah/2048/0.0"]
    assert Counter(p.category for p in probs) == {"niah-1024": 5, "niah-2048": 5, "niah-4096": 5}
    assert len({p.answer for p in probs}) == 15  # codes differ across (length, depth)
    count = counter or __import__("loosespec.eval.datasets", fromlist=["approx_tokens"]).approx_tokens
    for p in probs:
        L, depth = p.meta["context_length"], p.meta["depth"]
        assert p.prompt.endswith("\n\nWhat is the secret access code for the Dolores Park sandwich shop? "
                                 "Answer with the code only.")
        needle = f"The secret access code for the Dolores Park sandwich shop is {p.answer}."
        assert p.prompt.count(needle) == 1
        haystack = p.prompt[:p.prompt.rindex("\n\nWhat is the secret")]
        assert abs(haystack.index(needle) / len(haystack) - depth) <= 0.10, (p.id, haystack.index(needle))
        assert 0.9 * L <= count(p.prompt) <= L, p.id  # fits, and is not much shorter
        assert p.prompt.startswith("July 2010What hard liquor") or depth == 0.0
    if counter is not None:  # fast: a few counts per length, never the whole 650 KB haystack
        assert len(calls) < 80 and max(calls) < 100_000


@needs_data
def test_niah_options_limit_and_determinism():
    a = load_dataset("niah", context_lengths=(512, 8192), depths=(0.1, 0.9), count_tokens=_quarter, seed=3)
    assert [p.id for p in a] == ["niah/512/0.1", "niah/512/0.9", "niah/8192/0.1", "niah/8192/0.9"]
    assert a == load_dataset("niah", context_lengths=(512, 8192), depths=(0.1, 0.9), count_tokens=_quarter, seed=3)
    assert load_dataset("niah", limit=3, context_lengths=(512, 8192), depths=(0.1, 0.9), count_tokens=_quarter,
                        seed=3) == a[:3]
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


def test_default_data_dir_is_beside_the_checkout():
    """A module move once pointed this one level too low, and every data test skipped without a word."""
    from pathlib import Path

    from loosespec.eval import datasets

    checkout = Path(__file__).resolve().parents[2]
    assert datasets.BESIDE_CHECKOUT == checkout.parent / "shared" / "data"
