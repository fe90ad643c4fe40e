"""How the evaluation sets' answers are scored: numbers, MATH-500 expressions, code run in the sandbox, NIAH's
needle; and the :class:`Verdict` a scoring gives. Which set uses which scorer:
:data:`loosespec.eval.datasets.DATASETS`.

GSM8K and MGSM answers are scored by :func:`extract_number`, whose rules are:

1. the first number within 50 characters after the last "answer is" / "answer:" / "answer ="
   (any case; the prompt asks for "The answer is N."), so "The answer is: 42", "**The answer
   is 42**", "The answer is **$18**." all give the number;
2. else the number after the last "####" (GSM8K's own format), or the first number inside the last
   ``\\boxed{...}`` (``\\boxed{1,000}``, ``\\boxed{\\$18}``);
3. else the last number in the text (MGSM outputs that answer in their own language land here).

A number starts with a digit: digits with optional ``,`` (or no-break/thin space) thousands
separators in groups of three, an optional ``.decimals`` part, an optional leading ``$`` and an
optional minus sign (ASCII ``-`` or U+2212 "−"; a ``-`` right after a letter, digit or closing
bracket is a hyphen or a subtraction, not a sign, so "ages 3-4" gives 4). Separators and ``$`` are
dropped, a trailing sentence period is not part of it ("is 42." -> 42), and units or ``%`` after it
are ignored ("18 dollars", "25%" -> 25; gold GSM8K answers are plain numbers). Non-ASCII decimal
digits (Bengali, Thai, full-width ...) become ASCII. Ambiguous European formats are read the English
way: "1.000" is one, "2,5" is 2 and 5. Two answers are equal when they are numerically equal
(``18`` == ``18.00``, ``1,000`` == ``1000``).

MATH-500 uses ``math_verify``: gold ``parse("$" + answer + "$")`` against ``parse(output)``
on the output from its last ``\\boxed`` on (math_verify reads several boxes as a set, so an output
that also boxes an intermediate result would otherwise score wrong); its signal-based timeouts are used only on the main thread
(elsewhere they are off, as ``signal.alarm`` cannot work there). HumanEval runs the extracted
program against the tests with :func:`loosespec.eval.sandbox.run_tests` (see :func:`humaneval_program`).
NIAH checks that the needle's code appears in the output (case-insensitive, any spacing or dash
between digits and word). Spec-Bench and MT-Bench have no scorer (``score`` returns ``None``).
"""

from __future__ import annotations

import math
import os
import re
import threading
import unicodedata
from dataclasses import dataclass, field
from typing import Mapping

from loosespec.errors import LoosespecError
from loosespec.eval.datafiles import Problem

# --------------------------------------------------------------------------------------------- numbers

_SEPARATORS = ",\u00a0\u202f\u2009"
_NUMBER = (
    r"(?:(?<![A-Za-z0-9)\]}])-)?\$?(?:(?<=\$)-)?"
    r"(?:\d{1,3}(?:[" + _SEPARATORS + r"]\d{3})+(?!\d)|\d+)(?:\.\d+)?"
)
_ANSWER_PATTERNS = (
    r"\banswer\s*(?:is|:|=)[^\d]{0,50}?(" + _NUMBER + ")",
    r"####[^\d]{0,10}?(" + _NUMBER + ")",
    r"\\boxed\{[^}\d]{0,20}?(" + _NUMBER + ")",
)


def _clean(number: str) -> str:
    out = []
    for ch in number:
        if ch in _SEPARATORS or ch == "$":
            continue
        if ch.isdigit() and not ch.isascii():
            ch = str(unicodedata.digit(ch, ch))
        out.append(ch)
    return "".join(out).rstrip(".")


def _to_float(text: str) -> float | None:
    try:
        return float(_clean(text))
    except ValueError:
        return None


def extract_number(text: str) -> str | None:
    """The final numeric answer in a model's output, by the rules in the module docstring.

    >>> extract_number("3 + 4 = 7 apples.\\n\\nThe answer is 1,007.")
    '1007'
    >>> extract_number("so 12 - 5 = 7")
    '7'
    """
    text = text.replace("\u2212", "-")
    for pattern in _ANSWER_PATTERNS:
        found = re.findall(pattern, text, flags=re.IGNORECASE)
        if found:
            return _clean(found[-1])
    numbers = re.findall(_NUMBER, text)
    return _clean(numbers[-1]) if numbers else None


def is_correct(output: str, gold: str) -> bool:
    got = extract_number(output)
    got, want = (_to_float(got) if got is not None else None), _to_float(str(gold))
    return got is not None and want is not None and math.isclose(got, want, rel_tol=1e-9, abs_tol=1e-6)


# --------------------------------------------------------------------------------------------- scorers

VERDICT_STATUSES = ("right", "wrong", "error", "unscored")


class ScoringError(LoosespecError):
    """The scoring failed, not the answer (the sandbox could not start, a scorer's own bug): no verdict, so the
    harness stores no score, counts the row apart and scores it again on resume. ``detail`` goes in the row."""

    def __init__(self, message: str, detail: Mapping | None = None):
        super().__init__(message)
        self.detail = dict(detail or {})


@dataclass(frozen=True)
class Verdict:
    """What scoring one output found.

    ``status``: ``"right"``, ``"wrong"`` (a program under test that failed, timed out or ran out of memory
    included; ``detail["program"]`` says which), ``"error"`` (the harness failed: no answer, excluded from
    accuracy and retried) or ``"unscored"`` (the set has no scorer). ``detail``: JSON-able facts for the
    row, e.g. ``{"sandbox": "full", "program": "timeout"}``.
    """

    status: str
    detail: Mapping = field(default_factory=dict)

    def __post_init__(self):
        if self.status not in VERDICT_STATUSES:
            raise ValueError(f"verdict status {self.status!r} is not one of {VERDICT_STATUSES}")

    @property
    def score(self) -> bool | None:
        """True (right), False (wrong), None (no answer: an error, or a set with no scorer)."""
        return {"right": True, "wrong": False}.get(self.status)


def as_verdict(value) -> Verdict:
    """A scorer's return value as a :class:`Verdict`: a Verdict as it is, ``True``/``False`` as right/wrong,
    ``None`` as unscored (plain callables, e.g. tests' lambdas, may return bools)."""
    if isinstance(value, Verdict):
        return value
    if value is None:
        return Verdict("unscored")
    return Verdict("right" if value else "wrong")


def score_number(problem: Problem, output: str) -> bool:
    return is_correct(output, problem.answer)


def score_math500(problem: Problem, output: str) -> bool:
    from loosespec.extras import import_extra

    math_verify = import_extra("math_verify", "MATH-500's scoring")
    parse, verify = math_verify.parse, math_verify.verify

    # math_verify's timeouts use signal.alarm, which only works on the main thread
    main = threading.current_thread() is threading.main_thread()
    timeout = {"parsing_timeout": 5} if main else {"parsing_timeout": None}
    # math_verify turns an unparsable output or a timeout into an empty parse / False (its raise_on_error
    # is off): a wrong answer. Any exception that still gets out is a failure of the scoring (a bug, a missing
    # dependency): judge() records it as an error, not a wrong answer.
    gold = parse("$" + problem.answer + "$", **timeout)
    if not gold:
        raise ScoringError(f"math_verify could not parse {problem.id}'s gold answer {problem.answer!r}")
    # the last \boxed{} only: math_verify reads several boxes as a set, so an output that also
    # boxes an intermediate result would otherwise be scored wrong
    last = output.rfind("\\boxed")
    pred = parse(output[last:] if last >= 0 else output, **timeout)
    return bool(pred and verify(gold, pred, timeout_seconds=5 if main else None))


def defines(code: str, name: str) -> bool:
    """Whether ``code`` has a line ``def <name>(`` (or ``async def``), at any indentation."""
    return re.search(rf"^\s*(?:async\s+)?def\s+{re.escape(name)}\s*\(", code, re.M) is not None


_FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_+-]*)[^\n]*\n(.*?)(?:```|\Z)", re.DOTALL)


def humaneval_code(output: str, entry_point: str | None = None) -> str:
    """The code in a chat reply: the first fenced block (python-tagged or untagged ones first) that
    defines ``entry_point``, else the longest of them; an unclosed fence runs to the end; no fence ->
    the whole reply."""
    blocks = [(lang.lower(), body) for lang, body in _FENCE.findall(output)]
    if not blocks:
        return output
    preferred = [b for lang, b in blocks if lang in ("python", "py", "python3", "")] or [b for _, b in blocks]
    if entry_point:
        defining = [b for b in preferred if defines(b, entry_point)]
        if defining:
            return defining[0]
    return max(preferred, key=len)


def humaneval_program(problem: Problem, output: str, with_tests: bool = True) -> str:
    """The Python program that scores ``output`` for a HumanEval problem (pure; nothing runs).

    If the extracted code (:func:`humaneval_code`) defines ``def <entry_point>(`` it is a full
    solution: ``prompt + "\\n" + code`` (the prompt's stub, only a docstring, is valid Python and
    keeps the prompt's imports and helpers; the code redefines the function). Otherwise it is the
    body continuing the prompt: ``prompt + code``, indented by 4 spaces first if its first line is
    not indented. With ``with_tests`` the test suite and ``check(<entry_point>)`` follow.
    """
    prompt, entry = problem.meta["prompt"], problem.meta["entry_point"]
    code = humaneval_code(output, entry)
    if defines(code, entry):
        program = prompt + "\n" + code
    else:
        lines = code.split("\n")
        first = next((ln for ln in lines if ln.strip()), "")
        if first and not first[0].isspace():
            code = "\n".join(("    " + ln) if ln.strip() else ln for ln in lines)
        program = prompt + code
    if with_tests:
        program += "\n" + problem.meta["test"] + f"\ncheck({entry})\n"
    return program


CODE_EXECUTION_ENV = "LOOSESPEC_ALLOW_CODE_EXECUTION"
CODE_EXECUTION_REFUSAL = (
    "{name} is scored by running model-written code; pass --allow-code-execution (or set "
    "LOOSESPEC_ALLOW_CODE_EXECUTION=1) to run it in loosespec's sandbox (see docs/bench.md, "
    "'Evaluation')"
)


def code_execution_allowed(flag: bool = False) -> bool:
    """Whether running model-written code was asked for: ``flag`` (``--allow-code-execution``), or
    ``$LOOSESPEC_ALLOW_CODE_EXECUTION`` set to 1/true/yes (for CI)."""
    return bool(flag) or os.environ.get(CODE_EXECUTION_ENV, "").strip().lower() in ("1", "true", "yes")


def score_humaneval(
    problem: Problem,
    output: str,
    timeout_s: float = 10.0,
    memory_mb: int = 1024,
    allow_code_execution: bool = False,
    sandbox: str | None = None,
) -> Verdict:
    """pass@1 of one reply: the program (prompt + the reply's code) runs in the sandbox; the problem's tests run
    in a separate driver process that calls it (:func:`loosespec.eval.sandbox.run_tests`), so the code under
    test cannot forge its verdict. Needs ``allow_code_execution`` (or the environment variable)."""
    if not code_execution_allowed(allow_code_execution):
        raise LoosespecError(CODE_EXECUTION_REFUSAL.format(name=problem.category or "this set"))
    from loosespec.eval.sandbox import run_tests

    result = run_tests(
        humaneval_program(problem, output, with_tests=False),
        prompt=problem.meta["prompt"],
        test=problem.meta["test"],
        entry_point=problem.meta["entry_point"],
        timeout_s=timeout_s,
        memory_mb=memory_mb,
        mode=sandbox,
    )
    detail = {"sandbox": result.mode, "program": result.status}
    if result.detail:
        detail["reason"] = result.detail[-500:]
    if result.status == "error":
        raise ScoringError(f"the sandbox could not score {problem.id}: {result.detail or result.stderr[-300:]}", detail)
    return Verdict("right" if result.passed else "wrong", detail)


def score_niah(problem: Problem, output: str) -> bool:
    digits, _, word = problem.answer.partition("-")
    pattern = rf"(?<![A-Za-z0-9]){re.escape(digits)}[\s\-\u2010-\u2015_:]*{re.escape(word)}(?![A-Za-z0-9])"
    return re.search(pattern, output, flags=re.IGNORECASE) is not None
