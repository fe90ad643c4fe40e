"""The evaluation sets' loaders, one per set (``niah``'s is in :mod:`loosespec.eval.niah`): each reads its file
(:mod:`loosespec.eval.datafiles`) and returns its problems with their prompts. What each set holds, its ids,
categories and options: :mod:`loosespec.eval.datasets`."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Sequence

from loosespec.errors import LoosespecError
from loosespec.eval import datafiles
from loosespec.eval.datafiles import Problem
from loosespec.eval.scoring import defines

GSM8K_PROMPT = (
    "Solve the following math problem step by step. Write each step as its own short paragraph, "
    'separated by a blank line. End with a line of the form "The answer is N."\n\n{question}'
)
MGSM_PROMPT = GSM8K_PROMPT  # the instruction stays in English for every language (see loosespec.eval.datasets)
MATH500_PROMPT = (
    "Solve the following math problem. Reason step by step, and put your final answer within \\boxed{{}}.\n\n{problem}"
)
HUMANEVAL_PROMPT = "Complete the following Python function.\n\n```python\n{prompt}```"

MGSM_LANGS = ("en", "de", "fr", "zh", "ja", "es", "ru", "th", "sw", "bn", "te")
SPECBENCH_TASKS = ("mt_bench", "translation", "summarization", "qa", "math_reasoning", "rag")
MTBENCH_CATEGORIES = ("writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities")


def _names(value: Any, valid: Sequence[str], option: str, dataset: str) -> list[str]:
    """A name, a comma list or a sequence of names, each checked against ``valid``; order kept, no repeats."""
    if isinstance(value, str):
        items = [v.strip() for v in value.split(",") if v.strip()]
    elif isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
        items = [v.strip() for v in value]
    else:
        raise LoosespecError(
            f"{dataset}: {option} must be a name or a comma list of names, got {value!r}; "
            f"choose from: {', '.join(valid)}"
        )
    bad = [v for v in items if v not in valid]
    if bad or not items:
        raise LoosespecError(
            f"{dataset}: unknown {option} {', '.join(map(repr, bad)) or repr(value)}; choose from: {', '.join(valid)}"
        )
    return list(dict.fromkeys(items))


# --------------------------------------------------------------------------------------------- loaders


def gsm8k(limit: int | None = None, directory: str | Path | None = None) -> list[Problem]:
    """The first ``limit`` GSM8K test problems, in file order."""
    rows = datafiles.load_rows("gsm8k_test.jsonl", directory)[:limit]
    return [
        Problem(
            f"gsm8k/{i}", "gsm8k", GSM8K_PROMPT.format(question=r["question"]), r["answer"].split("####")[-1].strip()
        )
        for i, r in enumerate(rows)
    ]


def gsm8k_train(limit: int | None = None, directory: str | Path | None = None) -> list[Problem]:
    """The first ``limit`` GSM8K *train* problems, in file order: for calibration, which must not see the
    test problems the benchmarks score. id ``gsm8k-train/<row>``; category ``gsm8k-train``."""
    rows = datafiles.load_rows("gsm8k_train.jsonl", directory)[:limit]
    return [
        Problem(
            f"gsm8k-train/{i}",
            "gsm8k-train",
            GSM8K_PROMPT.format(question=r["question"]),
            r["answer"].split("####")[-1].strip(),
        )
        for i, r in enumerate(rows)
    ]


def mgsm(limit: int | None = None, directory: str | Path | None = None, lang: Any = "en") -> list[Problem]:
    """MGSM problems of ``lang`` (a language, a comma list, a list or "all"), grouped by language in the
    order given, the first ``limit`` of each language."""
    langs = list(MGSM_LANGS) if lang == "all" else _names(lang, MGSM_LANGS + ("all",), "lang", "mgsm")
    if "all" in langs:
        langs = list(MGSM_LANGS)
    rows = datafiles.load_rows("mgsm.jsonl", directory)
    out = []
    for code in langs:
        for r in [r for r in rows if r["lang"] == code][:limit]:
            out.append(
                Problem(
                    f"mgsm/{code}/{r['id']}",
                    f"mgsm-{code}",
                    MGSM_PROMPT.format(question=r["question"]),
                    str(r["answer_number"]),
                    {"lang": code, "index": r["id"], "answer_text": r["answer_text"]},
                )
            )
    return out


def math500(limit: int | None = None, directory: str | Path | None = None) -> list[Problem]:
    """The first ``limit`` MATH-500 problems, in file order."""
    rows = datafiles.load_rows("math500_test.jsonl", directory)[:limit]
    return [
        Problem(
            f"math500/{r['unique_id']}",
            r["subject"],
            MATH500_PROMPT.format(problem=r["problem"]),
            r["answer"],
            {"level": r["level"], "subject": r["subject"], "unique_id": r["unique_id"]},
        )
        for r in rows
    ]


def humaneval(limit: int | None = None, directory: str | Path | None = None) -> list[Problem]:
    """The first ``limit`` HumanEval tasks; ``answer`` is the canonical solution (a function body)."""
    rows = datafiles.load_rows("humaneval.jsonl", directory)[:limit]
    return [
        Problem(
            r["task_id"],
            "humaneval",
            HUMANEVAL_PROMPT.format(prompt=r["prompt"]),
            r["canonical_solution"],
            {"task_id": r["task_id"], "prompt": r["prompt"], "test": r["test"], "entry_point": r["entry_point"]},
        )
        for r in rows
    ]


MBPP_TRAIN_IDS = (601, 974)  # MBPP's train split (1-10 few-shot, 11-510 test, 511-600 validation)


def _mbpp_entry_point(row: dict) -> str:
    """The function an MBPP row is about: the name its first assert calls (``assert <name>(``) if the
    reference code defines it, else the reference's last top-level ``def``."""
    tests, code = row.get("test_list") or [], row["code"]
    m = re.match(r"\s*assert\s+([A-Za-z_]\w*)\s*\(", tests[0]) if tests else None
    if m and defines(code, m[1]):
        return m[1]
    defs = re.findall(r"^def\s+([A-Za-z_]\w*)\s*\(", code, re.M)
    if defs:
        return defs[-1]
    raise LoosespecError(
        f"mbpp task {row.get('task_id')}: cannot tell which function it asks for (its first assert "
        f"calls no function the reference code defines, and the code has no top-level def)"
    )


def _mbpp_signature(code: str, entry: str) -> str:
    """The reference's ``def <entry>(...):`` line(s) as written: trailing whitespace dropped, tabs as spaces."""
    lines = code.replace("\r\n", "\n").replace("\r", "\n").split("\n")
    start = next(i for i, ln in enumerate(lines) if re.match(rf"\s*(?:async\s+)?def\s+{re.escape(entry)}\s*\(", ln))
    sig, depth = [], 0
    for ln in lines[start:]:  # a signature may continue over lines until its parentheses close
        sig.append(ln.rstrip().replace("\t", "    "))
        depth += ln.count("(") - ln.count(")")
        if depth <= 0:
            break
    return "\n".join(sig).lstrip()


def _mbpp_stub(row: dict, entry: str) -> str:
    """A HumanEval-style prompt for an MBPP row: the reference's imports, its signature and a docstring
    with the task text and the asserts (backslashes and triple quotes escaped, so it is valid Python)."""
    code = row["code"].replace("\r\n", "\n").replace("\r", "\n")
    imports = [ln.rstrip() for ln in code.split("\n") if ln.startswith(("import ", "from "))]
    doc = [row["text"].strip(), "", "Your code should pass these tests:"] + [t.strip() for t in row["test_list"]]
    body = "\n".join(("    " + ln if ln else "") for part in doc for ln in part.split("\n"))
    body = body.replace("\\", "\\\\").replace('"""', '\\"\\"\\"')
    head = "\n".join(imports) + "\n\n" if imports else ""
    return f'{head}{_mbpp_signature(code, entry)}\n    """{body.lstrip()}\n    """\n'


def _mbpp_test(row: dict, entry: str) -> str:
    """MBPP's setup code and asserts as a HumanEval-style ``check(candidate)`` (the asserts call the
    function by name). A task whose function is itself called ``check`` (899, 967) would have it replaced
    by the checker: there the function is kept as ``_mbpp_candidate`` first and the asserts call that."""
    setup = (row.get("test_setup_code") or "").replace("\r\n", "\n").replace("\r", "\n")
    asserts = "".join("    " + ln + "\n" for t in row["test_list"] for ln in t.strip().split("\n"))
    if entry == "check":
        setup += "\n\n_mbpp_candidate = check"
        asserts = re.sub(r"\bcheck(\s*\()", r"_mbpp_candidate\1", asserts)
    return setup + "\n\ndef check(candidate):\n" + asserts


def mbpp_train(limit: int | None = None, directory: str | Path | None = None) -> list[Problem]:
    """The first ``limit`` problems of MBPP's *train* split (task_id 601..974), in file order, as
    HumanEval-style prompts: for calibration only, so that no benchmark problem is calibrated on.
    ``answer`` is the reference code; meta has task_id, prompt (the stub), test, entry_point, as HumanEval's."""
    lo, hi = MBPP_TRAIN_IDS
    rows = [r for r in datafiles.load_rows("mbpp.jsonl", directory) if lo <= r["task_id"] <= hi][:limit]
    out = []
    for r in rows:
        entry = _mbpp_entry_point(r)
        stub = _mbpp_stub(r, entry)
        out.append(
            Problem(
                f"mbpp-train/{r['task_id']}",
                "mbpp-train",
                HUMANEVAL_PROMPT.format(prompt=stub),
                r["code"],
                {"task_id": r["task_id"], "prompt": stub, "test": _mbpp_test(r, entry), "entry_point": entry},
            )
        )
    return out


def _specbench_task(row: dict) -> str:
    return "mt_bench" if row["category"] in MTBENCH_CATEGORIES else row["category"]


def specbench(limit: int | None = None, directory: str | Path | None = None, category: Any = None) -> list[Problem]:
    """Spec-Bench first turns, grouped (``Problem.category``) by Spec-Bench's six task types as its
    own reports are. ``category``: None (all six task types), a task type, an MT-Bench category, or a
    comma list; ``limit`` applies to each selected task type / category; ``mt_bench`` takes its 8
    categories round-robin (writing, roleplay, ..., then the second of each), so a small limit
    still covers them."""
    rows = datafiles.load_rows("spec_bench_question.jsonl", directory)
    groups = (
        list(SPECBENCH_TASKS)
        if category is None
        else _names(category, SPECBENCH_TASKS + MTBENCH_CATEGORIES, "category", "specbench")
    )
    out, seen = [], set()
    for g in groups:
        picked = [r for r in rows if (_specbench_task(r) if g in SPECBENCH_TASKS else r["category"]) == g]
        if g == "mt_bench":  # round-robin over its 8 categories, so a small limit still covers them
            by_cat = [[r for r in picked if r["category"] == c] for c in MTBENCH_CATEGORIES]
            picked = [r for i in range(max(map(len, by_cat))) for rs in by_cat if i < len(rs) for r in [rs[i]]]
        picked = picked[:limit]
        for r in picked:
            if r["question_id"] in seen:  # e.g. category="mt_bench,writing"
                continue
            seen.add(r["question_id"])
            meta = {
                "question_id": r["question_id"],
                "task": _specbench_task(r),
                "category": r["category"],
                "turns": len(r["turns"]),
            }
            if r.get("reference"):
                meta["reference"] = r["reference"]
            out.append(Problem(f"specbench/{r['question_id']}", meta["task"], r["turns"][0], None, meta))
    return out


def mtbench(limit: int | None = None, directory: str | Path | None = None) -> list[Problem]:
    """The first ``limit`` MT-Bench questions (file order), first turn only."""
    rows = datafiles.load_rows("mt_bench_question.jsonl", directory)[:limit]
    out = []
    for r in rows:
        meta = {"question_id": r["question_id"], "second_turn": r["turns"][1] if len(r["turns"]) > 1 else None}
        if r.get("reference"):
            meta["reference"] = r["reference"]
        out.append(Problem(f"mtbench/{r['question_id']}", r["category"], r["turns"][0], None, meta))
    return out
