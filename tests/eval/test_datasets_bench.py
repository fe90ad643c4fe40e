"""Benchmark datasets: loaders (counts, ids, categories, prompts), scorers, NIAH construction.

Uses the files shipped in loosespec/eval/data (never anything outside the repository; checked against
their README's sha256 and row counts) and, for NIAH, a generated stand-in for the essays that are not
shipped; no models are loaded.
"""

from __future__ import annotations

import hashlib
import json
import random
import re
import threading
from collections import Counter
from pathlib import Path

import pytest

from loosespec.eval import datasets
from loosespec.eval.datasets import (DATASETS, SCORERS_DOC, Problem, extract_number, humaneval_code, humaneval_program,
                                is_correct, load_dataset, niah_code, score)
from loosespec.errors import LoosespecError

DATA = datasets.SHIPPED
ESSAYS_START = "March 2011Every haystack here is made up"  # the first stand-in essay begins like the real ones


def _stand_in_essays(folder: Path) -> Path:
    """A ``paul_graham_essays.jsonl`` of generated prose (49 rows, ``rss`` a stub, about the real 640 KB)."""
    rng = random.Random(0)
    words = ("the startup founders users program language idea work people time money problem city school "
             "essay question reason growth investors market hard good simple write think build learn").split()
    rows = []
    for i in range(49):
        title = "rss" if i == 40 else f"essay{i:02d}"
        sentences = [" ".join(rng.choice(words) for _ in range(rng.randrange(6, 24))).capitalize() + "."
                     for _ in range(3 if title == "rss" else 140)]
        text = ("\n\n".join(" ".join(sentences[j:j + 5]) for j in range(0, len(sentences), 5)))
        rows.append({"title": title, "file": f"{title}.txt",
                     "text": (ESSAYS_START + ". " if i == 0 else "May 2009") + text})
    folder.mkdir(parents=True, exist_ok=True)
    (folder / datasets.ESSAYS).write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return folder


@pytest.fixture(autouse=True)
def _only_repository_data(tmp_path_factory, monkeypatch):
    """LOOSESPEC_DATA: a folder with only the stand-in essays; every other set comes from the shipped copy."""
    folder = tmp_path_factory.getbasetemp() / "stand-in-essays"
    if not (folder / datasets.ESSAYS).is_file():
        _stand_in_essays(folder)
    monkeypatch.setenv("LOOSESPEC_DATA", str(folder))


def _rows(name):
    return [json.loads(line) for line in (DATA / name).read_text(encoding="utf-8").splitlines() if line.strip()]


def _unique_ids(problems):
    ids = [p.id for p in problems]
    return len(ids) == len(set(ids))


# ----------------------------------------------------------------------------------------------- registry

def test_registry_and_docs():
    assert set(DATASETS) == {"gsm8k", "gsm8k-train", "mgsm", "math500", "humaneval", "mbpp-train", "specbench",
                             "mtbench", "niah"}
    assert set(SCORERS_DOC) == set(DATASETS) and all(SCORERS_DOC.values())
    p = Problem("x/0", "x", "q", None)
    assert p.meta == {} and hash(p) == hash(Problem("x/0", "x", "q", None, {"a": 1}))  # meta: not hashed/compared
    assert score("specbench", p, "anything") is None and score("mtbench", p, "anything") is None


@pytest.mark.parametrize("call, match", [
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
])
def test_bad_names_and_options(call, match):
    with pytest.raises(LoosespecError, match=match):
        call()


# ----------------------------------------------------------------------------------------------- loaders

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
    assert Counter(p.category for p in probs) == {"Algebra": 124, "Intermediate Algebra": 97, "Prealgebra": 82,
                                                  "Number Theory": 62, "Precalculus": 56, "Geometry": 41,
                                                  "Counting & Probability": 38}
    first = probs[0]
    assert first.id == "math500/test/precalculus/807.json" and first.answer == r"\left( 3, \frac{\pi}{2} \right)"
    assert "\\boxed{}" in first.prompt and _rows("math500_test.jsonl")[0]["problem"] in first.prompt
    assert len(load_dataset("math500", limit=7)) == 7


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


def test_humaneval_scorer_in_the_sandbox():
    pytest.importorskip("loosespec.eval.sandbox")
    probs = load_dataset("humaneval", limit=3)
    for p in probs:
        assert score("humaneval", p, "```python\n" + p.answer + "```", allow_code_execution=True) is True, p.id
        assert score("humaneval", p, "```python\n" + p.meta["prompt"] + p.answer + "```", allow_code_execution=True) is True, p.id  # full function
        assert score("humaneval", p, "```python\n    return None\n```", allow_code_execution=True) is False, p.id
    # leaving early with status 0 is not a pass: the verdict is the test driver's, not the program's
    assert score("humaneval", probs[0], "```python\n    import sys\n    sys.exit(0)\n```", allow_code_execution=True) is False
    assert score("humaneval", probs[0], "```python\nimport os\nos._exit(0)\n```", allow_code_execution=True) is False
    assert score("humaneval", probs[0], "```python\ndef has_close_elements(numbers, threshold):\n"
                                        "    return False\n```", allow_code_execution=True) is False


# ----------------------------------------------------------------------------------------------- NIAH

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
        assert p.prompt.startswith(ESSAYS_START) or depth == 0.0
    if counter is not None:  # fast: a few counts per length, never the whole 650 KB haystack
        assert len(calls) < 80 and max(calls) < 100_000


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


def _readme_table() -> dict[str, tuple[int, int, str]]:
    """file -> (rows, bytes, sha256) from the shipped data's README table."""
    out = {}
    for line in (DATA / "README.md").read_text(encoding="utf-8").splitlines():
        m = re.match(r"\| `([\w.]+\.jsonl)` \| (\d+) \| (\d+) \| `([0-9a-f]{64})` \|", line)
        if m:
            out[m[1]] = (int(m[2]), int(m[3]), m[4])
    return out


def test_shipped_files_match_their_readme():
    """Every shipped file is in the README's provenance table with its rows, size and sha256, and the reverse."""
    table = _readme_table()
    assert set(table) == {p.name for p in DATA.glob("*.jsonl")} >= {
        "gsm8k_test.jsonl", "gsm8k_train.jsonl", "mgsm.jsonl", "humaneval.jsonl", "spec_bench_question.jsonl",
        "math500_test.jsonl", "mt_bench_question.jsonl", "mbpp.jsonl"}
    for name, (rows, size, sha) in table.items():
        data = (DATA / name).read_bytes()
        assert (data.count(b"\n"), len(data), hashlib.sha256(data).hexdigest()) == (rows, size, sha), name


def test_the_shipped_files_are_package_data():
    """pyproject.toml's package-data takes every shipped file, so a pip-installed loosespec has them too."""
    import fnmatch
    import tomllib

    root = Path(datasets.__file__).resolve().parents[2]
    config = tomllib.loads((root / "pyproject.toml").read_text(encoding="utf-8"))
    patterns = config["tool"]["setuptools"]["package-data"]["loosespec.eval"]
    files = sorted(f"data/{p.name}" for p in DATA.iterdir())
    assert "data/README.md" in files and len(files) == 9
    assert [f for f in files if not any(fnmatch.fnmatch(f, pat) for pat in patterns)] == []


def test_every_set_loads_from_the_repository_alone(monkeypatch):
    """No --data-dir, no LOOSESPEC_DATA: each set's file comes from the copy inside the package (a clone
    without a shared/ folder beside it works), and only niah asks for its essays."""
    monkeypatch.delenv("LOOSESPEC_DATA")
    package = Path(datasets.__file__).resolve().parent
    for name in ("gsm8k_test.jsonl", "gsm8k_train.jsonl", "mgsm.jsonl", "math500_test.jsonl", "humaneval.jsonl",
                 "spec_bench_question.jsonl", "mt_bench_question.jsonl", "mbpp.jsonl"):
        assert datasets.data_file(name) == package / "data" / name
    assert datasets.data_dir() == package / "data"
    counts = {name: len(load_dataset(name, **({"lang": "all"} if name == "mgsm" else {})))
              for name in DATASETS if name != "niah"}
    assert counts == {"gsm8k": 1319, "gsm8k-train": 7473, "mgsm": 2750, "math500": 500, "humaneval": 164,
                      "mbpp-train": 374, "specbench": 480, "mtbench": 80}
    with pytest.raises(LoosespecError, match="paul_graham_essays.jsonl .* not shipped.*--data-dir"):
        load_dataset("niah")


def test_data_dir_and_environment_override_file_by_file(tmp_path, monkeypatch):
    """--data-dir beats LOOSESPEC_DATA beats the shipped copy, for each file; a mistyped folder is an error."""
    def gsm8k_dir(folder, question):
        folder.mkdir()
        (folder / "gsm8k_test.jsonl").write_text(json.dumps({"question": question, "answer": "#### 7"}) + "\n")
        return folder

    env, explicit = gsm8k_dir(tmp_path / "env", "From the environment?"), gsm8k_dir(tmp_path / "cli", "From the CLI?")
    monkeypatch.setenv("LOOSESPEC_DATA", str(env))
    assert "From the environment?" in load_dataset("gsm8k")[0].prompt
    assert "From the CLI?" in load_dataset("gsm8k", directory=explicit)[0].prompt
    assert len(load_dataset("humaneval", directory=explicit)) == 164  # not in either folder: the shipped copy
    for bad in (tmp_path / "nowhere", explicit / "gsm8k_test.jsonl"):
        with pytest.raises(LoosespecError, match="is not a folder"):
            load_dataset("gsm8k", directory=bad)
    monkeypatch.setenv("LOOSESPEC_DATA", str(tmp_path / "nowhere"))
    with pytest.raises(LoosespecError, match="LOOSESPEC_DATA .* is not a folder"):
        load_dataset("gsm8k")


def test_hub_alternative(monkeypatch):
    """--data-dir hub: the standard Hub datasets through `datasets` (faked here: the Hub is not needed),
    the same rows as the shipped files; a clear error without the package or without a Hub source."""
    import sys
    import types

    shipped = {n: [json.loads(line) for line in (DATA / n).read_text(encoding="utf-8").splitlines()]
               for n in datasets.HUB_SOURCES}
    by_source = {src: shipped[n] for n, src in datasets.HUB_SOURCES.items()}
    calls = []

    def fake_load_dataset(repo, config=None, split=None):
        calls.append((repo, config, split))
        return [dict(row, extra_column=1) for row in by_source[repo, config, split]]

    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=fake_load_dataset))
    monkeypatch.delenv("LOOSESPEC_DATA")
    for name in ("gsm8k", "humaneval", "math500"):
        assert load_dataset(name, directory="hub") == load_dataset(name), name
    assert calls == [("openai/gsm8k", "main", "test"), ("openai/openai_humaneval", None, "test"),
                     ("HuggingFaceH4/MATH-500", None, "test")]
    assert datasets._hub_rows("gsm8k_train.jsonl") == shipped["gsm8k_train.jsonl"]
    monkeypatch.setenv("LOOSESPEC_DATA", "hub")  # the environment variable takes it too
    assert load_dataset("gsm8k", limit=2) == load_dataset("gsm8k", limit=2, directory=DATA)
    assert len(calls) == 5
    assert len(load_dataset("mtbench")) == 80 and len(calls) == 5  # no Hub source: the shipped copy
    monkeypatch.setitem(sys.modules, "datasets", None)  # not installed
    with pytest.raises(LoosespecError, match=r"needs the 'datasets' package: pip install 'loosespec\[hub\]'"):
        load_dataset("gsm8k")
