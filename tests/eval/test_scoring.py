"""Scoring: numbers (GSM8K, MGSM), MATH-500 with math_verify, HumanEval programs and the sandboxed scorer."""

from __future__ import annotations

import threading

import pytest

from loosespec.eval.datafiles import Problem
from loosespec.eval.datasets import load_dataset, score
from loosespec.eval.scoring import extract_number, humaneval_code, humaneval_program, is_correct

# ----------------------------------------------------------------------------------------------- numbers


@pytest.mark.parametrize(
    "text, expected",
    [
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
    ],
)
def test_extract_number_tricky_formats(text, expected):
    assert extract_number(text) == expected


@pytest.mark.parametrize(
    "output, gold, right",
    [
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
    ],
)
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


@pytest.mark.parametrize(
    "gold, output, right",
    [
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
    ],
)
def test_math500_scorer_equivalences(gold, output, right):
    assert score("math500", _math_problem(gold), output) is right


def test_math500_scorer_on_real_rows():
    probs = {p.id: p for p in load_dataset("math500")}
    for uid in (
        "test/precalculus/807.json",
        "test/precalculus/819.json",
        "test/algebra/1349.json",
        "test/intermediate_algebra/515.json",
        "test/algebra/2486.json",
    ):
        p = probs["math500/" + uid]
        assert score("math500", p, "Therefore the answer is $\\boxed{" + p.answer + "}$.") is True, uid
    assert score("math500", probs["math500/test/precalculus/819.json"], "$\\boxed{\\text{(A)}}$") is False
    assert score("math500", probs["math500/test/algebra/1349.json"], "$\\boxed{\\text{Navin}}$") is False


def test_math500_scorer_works_off_the_main_thread():
    result = {}
    t = threading.Thread(
        target=lambda: result.update(ok=score("math500", _math_problem(r"\frac{1}{2}"), r"$\boxed{\frac{2}{4}}$"))
    )
    t.start()
    t.join(60)
    assert result == {"ok": True}


# ----------------------------------------------------------------------------------------------- HumanEval

HE_PROMPT = (
    'from typing import List\n\n\ndef add(xs: List[int]) -> int:\n    """Sum of xs.\n    >>> add([1, 2])\n'
    '    3\n    """\n'
)
HE_TEST = "def check(candidate):\n    assert candidate([1, 2]) == 3\n    assert candidate([]) == 0\n"


def _he_problem(prompt=HE_PROMPT, test=HE_TEST, entry="add"):
    return Problem("HumanEval/x", "humaneval", "p", None, {"prompt": prompt, "test": test, "entry_point": entry})


def test_humaneval_program_full_function():
    out = (
        "Here is the solution:\n\n```python\ndef add(xs):\n    total = 0\n    for x in xs:\n        total += x\n"
        "    return total\n```\n\nIt loops over the list."
    )
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
    out = (
        "```bash\npip install nothing\n```\n```python\nprint(add([1]))\n```\n"
        "```python\ndef add(xs):\n    return sum(xs)\n```"
    )
    assert humaneval_code(out, "add") == "def add(xs):\n    return sum(xs)\n"
    assert humaneval_code("```python\nx = 1\n```\n```python\ny = 22222\n```") == "y = 22222\n"  # longest
    assert humaneval_code("no fence at all") == "no fence at all"


def test_humaneval_scorer_in_the_sandbox():
    pytest.importorskip("loosespec.eval.sandbox")
    probs = load_dataset("humaneval", limit=3)
    for p in probs:
        assert score("humaneval", p, "```python\n" + p.answer + "```", allow_code_execution=True) is True, p.id
        assert (
            score("humaneval", p, "```python\n" + p.meta["prompt"] + p.answer + "```", allow_code_execution=True)
            is True
        ), p.id  # full function
        assert score("humaneval", p, "```python\n    return None\n```", allow_code_execution=True) is False, p.id
    # leaving early with status 0 is not a pass: the verdict is the test driver's, not the program's
    assert (
        score("humaneval", probs[0], "```python\n    import sys\n    sys.exit(0)\n```", allow_code_execution=True)
        is False
    )
    assert score("humaneval", probs[0], "```python\nimport os\nos._exit(0)\n```", allow_code_execution=True) is False
    assert (
        score(
            "humaneval",
            probs[0],
            "```python\ndef has_close_elements(numbers, threshold):\n    return False\n```",
            allow_code_execution=True,
        )
        is False
    )
