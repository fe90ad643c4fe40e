"""Running model-written code (HumanEval, MBPP scoring): only when asked for, in a sandbox whose mode is said,
with a verdict the code under test cannot forge, and failures of the scoring kept apart from wrong answers."""

from __future__ import annotations

import textwrap

import pytest

from loosespec.errors import LoosespecError
from loosespec.eval import datasets as D
from loosespec.eval import sandbox, sandbox_probe, scoring
from loosespec.eval.datafiles import Problem

OPT_IN = {"allow_code_execution": True}


@pytest.fixture(scope="module")
def he():
    return D.load_dataset("humaneval", 3)


@pytest.fixture(params=["auto", "none"])
def mode(request, monkeypatch):
    monkeypatch.setenv("LOOSESPEC_SANDBOX", request.param)
    return sandbox_probe.resolve_mode()


def reply(code: str) -> str:
    return "```python\n" + textwrap.dedent(code) + "```"


# ------------------------------------------------------------------------------------ opt-in (item 1)


def test_running_model_code_must_be_asked_for(he, monkeypatch):
    monkeypatch.delenv(scoring.CODE_EXECUTION_ENV, raising=False)
    with pytest.raises(LoosespecError, match="--allow-code-execution"):
        D.judge("humaneval", he[0], reply(he[0].meta["prompt"] + he[0].answer))
    with pytest.raises(LoosespecError, match="LOOSESPEC_ALLOW_CODE_EXECUTION"):
        D.check_code_execution(["gsm8k", "mbpp-train"])
    assert D.check_code_execution(["gsm8k", "math500"]) is None  # nothing runs code: nothing to allow
    assert D.judge("humaneval", he[0], reply(he[0].meta["prompt"] + he[0].answer), **OPT_IN).status == "right"
    monkeypatch.setenv(scoring.CODE_EXECUTION_ENV, "1")
    assert D.judge("humaneval", he[0], reply(he[0].meta["prompt"] + he[0].answer)).status == "right"
    assert D.check_code_execution(["humaneval"]) == sandbox_probe.resolve_mode()


def test_the_mode_is_in_every_verdict(he, mode):
    v = D.judge("humaneval", he[1], reply(he[1].meta["prompt"] + he[1].answer), **OPT_IN)
    assert v.status == "right" and v.detail["sandbox"] == mode and v.detail["program"] == "passed"


# ----------------------------------------------------------------------------- forged verdicts (item 4)

FORGERIES = {
    # the confirmed forgery: read the pass marker out of the program file, print it, leave with status 0
    "marker from __file__": """
        import os, re
        src = open(__file__).read()
        print(re.search(r'LOOSESPEC-PASSED-[0-9a-f]{16}', src)[0], flush=True)
        os._exit(0)
    """,
    "verdict line": """
        import os
        print('\\nLOOSESPEC-VERDICT {"passed": true}', flush=True)
        os._exit(0)
    """,
    "exit early": """
        import sys
        sys.exit(0)
    """,
    # an object equal to everything passed every `assert candidate(x) == y` when the tests ran in-process
    "equal to everything": """
        class Anything:
            def __eq__(self, other):
                return True
            def __ne__(self, other):
                return False
            def __abs__(self):
                return 0
            def __sub__(self, other):
                return self
            def __lt__(self, other):
                return True
        def {entry}(*args, **kwargs):
            return Anything()
    """,
    # rewrite the test harness from inside: patch builtins the checks use, leave a hook at exit
    "patched builtins": """
        import builtins, atexit, os
        builtins.AssertionError = type("AssertionError", (Exception,), {{}})
        builtins.abs = lambda x: 0
        atexit.register(lambda: (print('LOOSESPEC-VERDICT {{"passed": true}}'), os._exit(0)))
        def {entry}(*args, **kwargs):
            return None
    """,
}


@pytest.mark.parametrize("name", list(FORGERIES))
def test_a_program_cannot_forge_its_verdict(he, mode, name):
    p = he[0]
    code = FORGERIES[name].replace("{entry}", p.meta["entry_point"]).replace("{{", "{").replace("}}", "}")
    v = D.judge("humaneval", p, reply(code), **OPT_IN)
    assert v.status == "wrong", (name, v)
    # negative control: the right answer in the same mode passes
    assert D.judge("humaneval", p, reply(p.meta["prompt"] + p.answer), **OPT_IN).status == "right"


def test_the_tests_never_run_in_the_programs_process(he):
    """The program cannot see the tests: the driver holds them; the program only answers calls."""
    p = he[0]
    spy = reply(f"""
        import sys
        def {p.meta["entry_point"]}(*args, **kwargs):
            frames, f = [], sys._getframe()
            while f is not None:
                frames.append(f.f_code.co_name)
                f = f.f_back
            raise RuntimeError("|".join(frames))
    """)
    v = D.judge("humaneval", p, spy, **OPT_IN)
    assert v.status == "wrong" and "RuntimeError" in v.detail["reason"]
    assert "check" not in v.detail["reason"].split("|")


def test_objects_of_the_programs_own_classes_cross_as_handles():
    """MBPP 601/927 build the solution's own classes in their asserts: the driver builds them in the program and
    holds handles, so the references pass; a class whose __eq__ lies still cannot pass a comparison."""
    by_id = {p.id: p for p in D.load_dataset("mbpp-train")}
    for task in ("mbpp-train/601", "mbpp-train/927"):
        p = by_id[task]
        assert D.judge("mbpp-train", p, reply(p.answer.replace("\r\n", "\n")), **OPT_IN).status == "right", task
    p = by_id["mbpp-train/927"]
    liar = reply("""
        class Node:
            def __init__(self, data):
                self.data, self.left, self.right = data, None, None
        class Height:
            def __eq__(self, other):
                return True
        def max_height(node):
            return Height()
    """)
    v = D.judge("mbpp-train", p, liar, **OPT_IN)
    assert v.status == "wrong", v


# ---------------------------------------------------------------------- harness failures (item 5)


def test_a_sandbox_that_cannot_start_is_an_error_not_a_wrong_answer(he, monkeypatch):
    monkeypatch.setattr(sandbox.sys, "executable", "/nonexistent/python3")
    v = D.judge("humaneval", he[0], reply(he[0].meta["prompt"] + he[0].answer), **OPT_IN)
    assert v.status == "error" and v.score is None and "no usable Python" in v.detail["error"], v
    with pytest.raises(scoring.ScoringError):
        D.score("humaneval", he[0], reply(he[0].meta["prompt"] + he[0].answer), **OPT_IN)


def test_a_program_that_times_out_is_wrong_not_an_error(he):
    v = D.judge("humaneval", he[0], reply("    while True:\n        pass\n"), timeout_s=2, **OPT_IN)
    assert v.status == "wrong" and v.detail["program"] == "timeout", v
    v = D.judge("humaneval", he[0], reply("    return bytearray(10**10)\n"), memory_mb=256, **OPT_IN)
    assert v.status == "wrong", v


def test_a_scorer_bug_is_an_error(monkeypatch):
    p = Problem("math500/x", "math500", "q", "4")
    assert D.judge("math500", p, "so \\boxed{4}").status == "right"
    assert D.judge("math500", p, "no idea").status == "wrong"

    def broken(*a, **k):
        raise ImportError("math_verify is broken")

    import math_verify

    monkeypatch.setattr(math_verify, "verify", broken)
    v = D.judge("math500", p, "so \\boxed{4}")
    assert v.status == "error" and "math_verify is broken" in v.detail["error"], v


def test_verdicts_from_plain_values():
    assert scoring.as_verdict(True).score is True and scoring.as_verdict(False).status == "wrong"
    assert scoring.as_verdict(None).status == "unscored" and scoring.as_verdict(None).score is None
    with pytest.raises(ValueError):
        scoring.Verdict("maybe")
