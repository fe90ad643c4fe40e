"""Evaluation sets shipped with loosespec (``loosespec/eval/data``, see its README): prompts and answer scoring.

Where the data lives (:func:`data_file`): each file is taken from the first of ``--data-dir``
(``directory=``), ``$LOOSESPEC_DATA`` and the copy shipped in ``loosespec/eval/data`` that holds it,
so a folder with only some of the files overrides just those. A ``--data-dir`` that is not a folder
is an error, never skipped. ``hub`` instead of a folder (``--data-dir hub`` or ``LOOSESPEC_DATA=hub``)
loads the standard Hugging Face Hub copies through the optional ``datasets`` package
(``pip install 'loosespec[hub]'``) for the sets that have one (:data:`HUB_SOURCES`), with the same
rows as the shipped files. The Paul Graham essays of ``niah`` are not shipped (the essays are their
author's copyright): that set needs a folder holding ``paul_graham_essays.jsonl`` (see the README).

Datasets (``load_dataset(name, limit, directory, **options)``; ``DATASETS`` is the registry)
---------------------------------------------------------------------------------------------
``limit`` always means "the first ``limit`` problems in file order" of each group named below.

- ``gsm8k``: GSM8K test (1319). Prompt :data:`GSM8K_PROMPT`; id ``gsm8k/<row>``; category ``gsm8k``.
- ``gsm8k-train``: GSM8K train (7473), as ``gsm8k``; id ``gsm8k-train/<row>``. For calibration only
  (``loosespec calibrate``'s default), so that no benchmark problem is calibrated on.
- ``mgsm``: MGSM (250 per language). Option ``lang="en"``: one of the 11 languages, a comma list
  (``"de,zh"``) or a list, or ``"all"``. The prompt is :data:`MGSM_PROMPT`, the GSM8K instruction
  kept in English (so every language gets the same instruction and the same "The answer is N."
  line to score; only the question is in its language). Problems are grouped by language in the
  order given; ``limit`` applies per language. id ``mgsm/<lang>/<id>``; category ``mgsm-<lang>``.
- ``math500``: MATH-500 (500). Prompt :data:`MATH500_PROMPT` (final answer in ``\\boxed{}``);
  id ``math500/<unique_id>``; category = subject (e.g. ``Precalculus``); meta has level.
- ``humaneval``: HumanEval (164). Prompt :data:`HUMANEVAL_PROMPT` (the format of
  the earlier runs); id = task_id (``HumanEval/0``); category ``humaneval``; ``answer`` is the
  canonical solution (gold body); meta has task_id, prompt, test, entry_point.
- ``mbpp-train``: MBPP's train split (task_id 601..974, 374 problems), each as a HumanEval-style stub
  (the reference's imports and signature, a docstring with the task and its asserts) in
  :data:`HUMANEVAL_PROMPT`; id ``mbpp-train/<task_id>``; category ``mbpp-train``; ``answer`` is the
  reference code; meta as humaneval's, so it is scored like humaneval. For calibration only, so that
  no benchmark problem (HumanEval) is calibrated on.
- ``specbench``: Spec-Bench (480), first turn only. Option ``category=None``: one of the six task
  types ``mt_bench`` (the 80 MT-Bench rows, question_id 81..160), ``translation``,
  ``summarization``, ``qa``, ``math_reasoning``, ``rag``, or one of the eight MT-Bench categories
  (``writing`` ...), or a comma list of those; ``None`` = all six task types. ``limit`` applies per
  selected task type / category (``limit=5`` without ``category`` -> 30 problems; ``mt_bench``
  takes its eight categories round-robin, so 5 gives writing, roleplay, reasoning, math, coding).
  id ``specbench/<question_id>``; category = the task type, as Spec-Bench reports; meta ``task``
  (the task type) and ``category`` (the row's own, e.g. ``writing``). No scorer.
- ``mtbench``: MT-Bench (80), first turn only; ``limit`` = first rows of the file. id
  ``mtbench/<question_id>``; category = its category; meta has the second turn. No scorer.
- ``niah``: needle in a haystack over Paul Graham essays; see :func:`niah`. Options
  ``context_lengths=(1024, 2048, 4096)`` (tokens), ``depths=(0.0, 0.25, 0.5, 0.75, 1.0)``,
  ``count_tokens=None``, ``seed=0``. Problems ordered by (length, depth); ``limit`` = first of them.
  id ``niah/<length>/<depth>``; category ``niah-<length>``.

Scorers (``score(name, problem, output)``; one line each in :data:`SCORERS_DOC`)
-------------------------------------------------------------------------------
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
program and the tests in :func:`loosespec.eval.sandbox.run_python` (see :func:`humaneval_program`).
NIAH checks that the needle's code appears in the output (case-insensitive, any spacing or dash
between digits and word). Spec-Bench and MT-Bench have no scorer (``score`` returns ``None``).
"""

from __future__ import annotations

import json
import math
import os
import random
import re
import threading
import unicodedata
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from loosespec.errors import LoosespecError

GSM8K_PROMPT = ("Solve the following math problem step by step. Write each step as its own short paragraph, "
                "separated by a blank line. End with a line of the form \"The answer is N.\"\n\n{question}")
MGSM_PROMPT = GSM8K_PROMPT  # the instruction stays in English for every language (see the module docstring)
MATH500_PROMPT = ("Solve the following math problem. Reason step by step, and put your final answer within "
                  "\\boxed{{}}.\n\n{problem}")
HUMANEVAL_PROMPT = "Complete the following Python function.\n\n```python\n{prompt}```"

MGSM_LANGS = ("en", "de", "fr", "zh", "ja", "es", "ru", "th", "sw", "bn", "te")
SPECBENCH_TASKS = ("mt_bench", "translation", "summarization", "qa", "math_reasoning", "rag")
MTBENCH_CATEGORIES = ("writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities")

NIAH_NEEDLE = "The secret access code for the Dolores Park sandwich shop is {code}."
NIAH_QUESTION = "What is the secret access code for the Dolores Park sandwich shop? Answer with the code only."
NIAH_WORDS = ("ALPHA", "BRAVO", "CHARLIE", "DELTA", "ECHO", "FOXTROT", "GOLF", "HOTEL", "INDIA", "JULIET", "KILO",
              "LIMA", "MIKE", "NOVEMBER", "OSCAR", "PAPA", "QUEBEC", "ROMEO", "SIERRA", "TANGO", "UNIFORM",
              "VICTOR", "WHISKEY", "XRAY", "YANKEE", "ZULU")


@dataclass(frozen=True)
class Problem:
    id: str
    category: str
    prompt: str  # the user message; the caller applies the chat template
    answer: str | None  # gold answer, None when the set has no scorer
    meta: Mapping = field(default_factory=dict, hash=False, compare=False)


# the copies shipped inside the package (package data: an installed wheel has them too)
SHIPPED = Path(__file__).resolve().parent / "data"
HUB = "hub"  # --data-dir / LOOSESPEC_DATA value: the standard Hugging Face Hub datasets (HUB_SOURCES)
ESSAYS = "paul_graham_essays.jsonl"  # niah's haystack: not shipped (the essays are their author's copyright)

# file -> (Hub dataset, config, split): the Hub copies with the same rows and fields as the files
HUB_SOURCES: dict[str, tuple[str, str | None, str]] = {
    "gsm8k_test.jsonl": ("openai/gsm8k", "main", "test"),
    "gsm8k_train.jsonl": ("openai/gsm8k", "main", "train"),
    "humaneval.jsonl": ("openai/openai_humaneval", None, "test"),
    "math500_test.jsonl": ("HuggingFaceH4/MATH-500", None, "test"),
}


def _search_path(explicit: str | Path | None = None) -> list[Path | str]:
    """The folders (or :data:`HUB`) files are looked up in, best first."""
    out: list[Path | str] = []
    for where, value in (("--data-dir", explicit), ("LOOSESPEC_DATA", os.environ.get("LOOSESPEC_DATA"))):
        if value is None or str(value) == "":
            continue
        if str(value) == HUB:
            out.append(HUB)
        elif Path(value).is_dir():
            out.append(Path(value))
        else:
            raise LoosespecError(f"{where} {value} is not a folder: pass the folder holding the evaluation sets' "
                                 f".jsonl files (or '{HUB}' for the Hugging Face Hub copies)")
    out.append(SHIPPED)
    return out


def data_dir(explicit: str | Path | None = None) -> Path:
    """The first folder files are looked up in (``--data-dir``, ``$LOOSESPEC_DATA``, the shipped copy);
    pass it to the loaders as ``directory``: a file missing there still comes from the next folder."""
    first = next(p for p in _search_path(explicit) if p != HUB)
    return Path(first)


def data_file(name: str, explicit: str | Path | None = None) -> Path | str:
    """Where file ``name`` is read from: the first folder of ``--data-dir``, ``$LOOSESPEC_DATA`` and the
    shipped copy that holds it, or :data:`HUB` when that comes first and has a Hub source for it."""
    for place in _search_path(explicit):
        if place == HUB:
            if name in HUB_SOURCES:
                return HUB
        elif (Path(place) / name).is_file():
            return Path(place) / name
    if name == ESSAYS:
        raise LoosespecError(f"{ESSAYS} (niah's haystack) is not shipped with loosespec: put it in a folder and pass "
                             "--data-dir or set LOOSESPEC_DATA (where to get it: loosespec/eval/data/README.md)")
    raise LoosespecError(f"evaluation data {name} not found in --data-dir, $LOOSESPEC_DATA or {SHIPPED}")


def _hub_rows(name: str) -> list[dict]:
    """The rows of file ``name`` from its Hugging Face Hub source (:data:`HUB_SOURCES`), as the file has them."""
    try:
        import datasets as hf_datasets
    except ImportError:
        raise LoosespecError(f"loading {name} from the Hugging Face Hub needs the 'datasets' package: "
                             "pip install 'loosespec[hub]' (or use the copies shipped with loosespec)") from None
    repo, config, split = HUB_SOURCES[name]
    try:
        table = hf_datasets.load_dataset(repo, config, split=split)
    except Exception as e:  # offline, gated, renamed: one clear line
        raise LoosespecError(f"could not load {repo} ({split}) from the Hugging Face Hub: {e}") from e
    fields = {"gsm8k_test.jsonl": ("question", "answer"), "gsm8k_train.jsonl": ("question", "answer"),
              "humaneval.jsonl": ("task_id", "prompt", "canonical_solution", "test", "entry_point"),
              "math500_test.jsonl": ("problem", "solution", "answer", "subject", "level", "unique_id")}[name]
    rows = [{k: row[k] for k in fields} for row in table]
    if not rows:
        raise LoosespecError(f"{repo} ({split}) on the Hugging Face Hub has no rows")
    return rows


def _load(name: str, directory: str | Path | None) -> list[dict]:
    where = data_file(name, directory)
    return _hub_rows(name) if where == HUB else _rows(Path(where))


def _rows(path: Path) -> list[dict]:
    if not path.is_file():
        raise LoosespecError(f"missing data file {path}")
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def _names(value: Any, valid: Sequence[str], option: str, dataset: str) -> list[str]:
    """A name, a comma list or a sequence of names, each checked against ``valid``; order kept, no repeats."""
    if isinstance(value, str):
        items = [v.strip() for v in value.split(",") if v.strip()]
    elif isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
        items = [v.strip() for v in value]
    else:
        raise LoosespecError(f"{dataset}: {option} must be a name or a comma list of names, got {value!r}; "
                             f"choose from: {', '.join(valid)}")
    bad = [v for v in items if v not in valid]
    if bad or not items:
        raise LoosespecError(f"{dataset}: unknown {option} {', '.join(map(repr, bad)) or repr(value)}; "
                             f"choose from: {', '.join(valid)}")
    return list(dict.fromkeys(items))


# --------------------------------------------------------------------------------------------- loaders

def gsm8k(limit: int | None = None, directory: str | Path | None = None) -> list[Problem]:
    """The first ``limit`` GSM8K test problems, in file order."""
    rows = _load("gsm8k_test.jsonl", directory)[:limit]
    return [Problem(f"gsm8k/{i}", "gsm8k", GSM8K_PROMPT.format(question=r["question"]),
                    r["answer"].split("####")[-1].strip()) for i, r in enumerate(rows)]


def gsm8k_train(limit: int | None = None, directory: str | Path | None = None) -> list[Problem]:
    """The first ``limit`` GSM8K *train* problems, in file order: for calibration, which must not see the
    test problems the benchmarks score. id ``gsm8k-train/<row>``; category ``gsm8k-train``."""
    rows = _load("gsm8k_train.jsonl", directory)[:limit]
    return [Problem(f"gsm8k-train/{i}", "gsm8k-train", GSM8K_PROMPT.format(question=r["question"]),
                    r["answer"].split("####")[-1].strip()) for i, r in enumerate(rows)]


def mgsm(limit: int | None = None, directory: str | Path | None = None, lang: Any = "en") -> list[Problem]:
    """MGSM problems of ``lang`` (a language, a comma list, a list or "all"), grouped by language in the
    order given, the first ``limit`` of each language."""
    langs = list(MGSM_LANGS) if lang == "all" else _names(lang, MGSM_LANGS + ("all",), "lang", "mgsm")
    if "all" in langs:
        langs = list(MGSM_LANGS)
    rows = _load("mgsm.jsonl", directory)
    out = []
    for code in langs:
        for r in [r for r in rows if r["lang"] == code][:limit]:
            out.append(Problem(f"mgsm/{code}/{r['id']}", f"mgsm-{code}", MGSM_PROMPT.format(question=r["question"]),
                               str(r["answer_number"]),
                               {"lang": code, "index": r["id"], "answer_text": r["answer_text"]}))
    return out


def math500(limit: int | None = None, directory: str | Path | None = None) -> list[Problem]:
    """The first ``limit`` MATH-500 problems, in file order."""
    rows = _load("math500_test.jsonl", directory)[:limit]
    return [Problem(f"math500/{r['unique_id']}", r["subject"], MATH500_PROMPT.format(problem=r["problem"]),
                    r["answer"], {"level": r["level"], "subject": r["subject"], "unique_id": r["unique_id"]})
            for r in rows]


def humaneval(limit: int | None = None, directory: str | Path | None = None) -> list[Problem]:
    """The first ``limit`` HumanEval tasks; ``answer`` is the canonical solution (a function body)."""
    rows = _load("humaneval.jsonl", directory)[:limit]
    return [Problem(r["task_id"], "humaneval", HUMANEVAL_PROMPT.format(prompt=r["prompt"]), r["canonical_solution"],
                    {"task_id": r["task_id"], "prompt": r["prompt"], "test": r["test"],
                     "entry_point": r["entry_point"]})
            for r in rows]


MBPP_TRAIN_IDS = (601, 974)  # MBPP's train split (1-10 few-shot, 11-510 test, 511-600 validation)


def _mbpp_entry_point(row: dict) -> str:
    """The function an MBPP row is about: the name its first assert calls (``assert <name>(``) if the
    reference code defines it, else the reference's last top-level ``def``."""
    tests, code = row.get("test_list") or [], row["code"]
    m = re.match(r"\s*assert\s+([A-Za-z_]\w*)\s*\(", tests[0]) if tests else None
    if m and _defines(code, m[1]):
        return m[1]
    defs = re.findall(r"^def\s+([A-Za-z_]\w*)\s*\(", code, re.M)
    if defs:
        return defs[-1]
    raise LoosespecError(f"mbpp task {row.get('task_id')}: cannot tell which function it asks for (its first assert "
                         f"calls no function the reference code defines, and the code has no top-level def)")


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
    rows = [r for r in _load("mbpp.jsonl", directory) if lo <= r["task_id"] <= hi][:limit]
    out = []
    for r in rows:
        entry = _mbpp_entry_point(r)
        stub = _mbpp_stub(r, entry)
        out.append(Problem(f"mbpp-train/{r['task_id']}", "mbpp-train", HUMANEVAL_PROMPT.format(prompt=stub), r["code"],
                           {"task_id": r["task_id"], "prompt": stub, "test": _mbpp_test(r, entry), "entry_point": entry}))
    return out


def _specbench_task(row: dict) -> str:
    return "mt_bench" if row["category"] in MTBENCH_CATEGORIES else row["category"]


def specbench(limit: int | None = None, directory: str | Path | None = None, category: Any = None) -> list[Problem]:
    """Spec-Bench first turns, grouped (``Problem.category``) by Spec-Bench's six task types as its
    own reports are. ``category``: None (all six task types), a task type, an MT-Bench category, or a
    comma list; ``limit`` applies to each selected task type / category; ``mt_bench`` takes its 8
    categories round-robin (writing, roleplay, ..., then the second of each), so a small limit
    still covers them."""
    rows = _load("spec_bench_question.jsonl", directory)
    groups = (list(SPECBENCH_TASKS) if category is None
              else _names(category, SPECBENCH_TASKS + MTBENCH_CATEGORIES, "category", "specbench"))
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
            meta = {"question_id": r["question_id"], "task": _specbench_task(r), "category": r["category"],
                    "turns": len(r["turns"])}
            if r.get("reference"):
                meta["reference"] = r["reference"]
            out.append(Problem(f"specbench/{r['question_id']}", meta["task"], r["turns"][0], None, meta))
    return out


def mtbench(limit: int | None = None, directory: str | Path | None = None) -> list[Problem]:
    """The first ``limit`` MT-Bench questions (file order), first turn only."""
    rows = _load("mt_bench_question.jsonl", directory)[:limit]
    out = []
    for r in rows:
        meta = {"question_id": r["question_id"], "second_turn": r["turns"][1] if len(r["turns"]) > 1 else None}
        if r.get("reference"):
            meta["reference"] = r["reference"]
        out.append(Problem(f"mtbench/{r['question_id']}", r["category"], r["turns"][0], None, meta))
    return out


# --------------------------------------------------------------------------------------------- NIAH

def approx_tokens(text: str) -> int:
    """Token estimate without a tokenizer: the larger of characters/4 and words/0.75 (both err
    high for English prose with Llama-style tokenizers, ~4.3 characters per token)."""
    return max(math.ceil(len(text) / 4), math.ceil(len(text.split()) / 0.75))


_SENTENCE_END = re.compile(r"(?<=[.!?])[\"')\]]?\s+|\n\s*")


def _haystack(directory: str | Path | None) -> str:
    essays = _load("paul_graham_essays.jsonl", directory)
    return "\n\n".join(e["text"] for e in essays if e["title"] != "rss")


_SENTENCE_STOP = re.compile(r"[.!?][\"')\]]?(?=\s)")


def _cut(text: str, n: int) -> str:
    """``text[:n]`` moved back to the end of a sentence within 200 characters, else to the last
    whitespace, so no sentence (or at least no word) is split."""
    if n >= len(text):
        return text
    start = max(0, n - 200)
    stops = [m.end() for m in _SENTENCE_STOP.finditer(text, start, n)]
    if stops:
        return text[:stops[-1]]
    space = max(text.rfind(" ", 0, n), text.rfind("\n", 0, n))
    return text[:space if space > 0 else n].rstrip()


def _fit_prefix(text: str, budget: int, count: Callable[[str], int]) -> str:
    """About the longest whitespace-cut prefix of ``text`` with ``count(prefix) <= budget``, found with a
    characters-per-token estimate and a few ``count`` calls (never a tokenization of all of ``text``)."""
    sample = text[:4000]
    ratio = len(sample) / max(count(sample), 1)  # characters per token
    lo, hi = 0, len(text) + 1  # count(text[:lo]) fits; text[:hi] does not (or is past the end)
    n = min(len(text), int(budget * ratio))
    for _ in range(8):  # secant steps on the ratio
        c = count(_cut(text, n))
        if c <= budget:
            lo = max(lo, n)
            if c >= budget * 0.99 or n >= len(text):
                return _cut(text, lo)
            n = min(len(text), int(n * budget / max(c, 1)) + 1)
        else:
            hi = min(hi, n)
            n = int(n * budget / c * 0.995)
        if not lo < n < hi:
            break
    while hi - lo > max(16, lo // 200):  # bisection to within 0.5 %
        mid = (lo + hi) // 2
        if count(_cut(text, mid)) <= budget:
            lo = mid
        else:
            hi = mid
    return _cut(text, lo)


def _insert_needle(context: str, depth: float, needle: str) -> tuple[str, int]:
    """``context`` with ``needle`` at the sentence boundary nearest ``depth * len(context)``; also its position."""
    target = depth * len(context)
    bounds = [0, len(context)] + [m.end() for m in _SENTENCE_END.finditer(context)]
    b = min(bounds, key=lambda x: (abs(x - target), x))
    if b >= len(context):
        return context.rstrip() + " " + needle, len(context.rstrip()) + 1
    return context[:b] + needle + " " + context[b:], b


def niah_code(length: int, depth: float, seed: int = 0) -> str:  # the generator's seed (not a knob)
    """The needle's code for (length, depth): 4 digits and a word, e.g. ``7319-BRAVO``, seeded."""
    rng = random.Random(f"loosespec-niah/{seed}/{length}/{float(depth)}")
    return f"{rng.randrange(1000, 10000)}-{rng.choice(NIAH_WORDS)}"


def _positive_ints(value: Any, option: str) -> list[int]:
    if isinstance(value, (int, str)) and not isinstance(value, bool):
        value = [value] if isinstance(value, int) else [v for v in value.split(",") if v.strip()]
    try:
        out = [int(v) for v in value]
    except (TypeError, ValueError):
        raise LoosespecError(f"niah: {option} must be positive integers (tokens), got {value!r}") from None
    if not out or any(v < 1 for v in out) or any(isinstance(v, bool) for v in value):
        raise LoosespecError(f"niah: {option} must be positive integers (tokens), got {value!r}")
    if len(set(out)) != len(out):
        raise LoosespecError(f"niah: {option} has repeated values: {value!r}")
    return out


def _depths(value: Any) -> list[float]:
    if isinstance(value, (int, float, str)) and not isinstance(value, bool):
        value = [value] if not isinstance(value, str) else [v for v in value.split(",") if v.strip()]
    try:
        out = [float(v) for v in value]
    except (TypeError, ValueError):
        raise LoosespecError(f"niah: depths must be numbers in [0, 1], got {value!r}") from None
    if not out or any(not 0.0 <= d <= 1.0 for d in out):
        raise LoosespecError(f"niah: depths must be numbers in [0, 1], got {value!r}")
    if len(set(out)) != len(out):
        raise LoosespecError(f"niah: depths has repeated values: {value!r}")
    return out


def niah(limit: int | None = None, directory: str | Path | None = None,
         context_lengths: Any = (1024, 2048, 4096), depths: Any = (0.0, 0.25, 0.5, 0.75, 1.0),
         count_tokens: Callable[[str], int] | None = None,
         seed: int = 0) -> list[Problem]:  # the generator's seed (not a knob)
    """Needle-in-a-haystack prompts, one per (context length, depth), ordered by length then depth.

    The haystack is the Paul Graham essays (``rss`` dropped) joined by blank lines in file order,
    repeated if a length needs more. For each length L (tokens) the prompt is
    ``<haystack prefix with the needle>\\n\\n<question>`` with ``count_tokens(prompt) <= L``, the
    prefix as long as fits (within ~1 %) then cut back to a sentence end if one is within 200
    characters (so typically 95-100 % of L); the chat template the caller adds is not counted.
    Without ``count_tokens`` tokens are estimated by :func:`approx_tokens`. The needle
    (:data:`NIAH_NEEDLE`) goes in at the sentence boundary nearest ``depth * len(prefix)``
    characters; its code (:func:`niah_code`) is drawn per (L, depth) from ``seed`` and is the answer.
    ``limit`` keeps the first ``limit`` problems of that (length, depth) order.
    """
    lengths, ds = _positive_ints(context_lengths, "context_lengths"), _depths(depths)
    if count_tokens is not None and not callable(count_tokens):
        raise LoosespecError(f"niah: count_tokens must be a function str -> int or None, got {count_tokens!r}")
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise LoosespecError(f"niah: seed must be an integer, got {seed!r}")
    count = count_tokens or approx_tokens
    plan = [(L, d) for L in lengths for d in ds][:limit]
    if not plan:
        return []
    haystack = _haystack(directory)
    codes: dict[tuple[int, float], str] = {}
    used: set[str] = set()
    for L, d in [(L, d) for L in lengths for d in ds]:  # over the full grid, so limit does not change codes
        code, k = niah_code(L, d, seed), 0
        while code in used:
            k += 1
            code = niah_code(L, d, seed * 1000003 + k)
        used.add(code)
        codes[L, d] = code
    question = "\n\n" + NIAH_QUESTION
    out, prefixes = [], {}
    for L, d in plan:
        needle = NIAH_NEEDLE.format(code=codes[L, d])
        if L not in prefixes:
            reserve = count(needle + " ") + count(question) + 2
            if L - reserve < 16:
                raise LoosespecError(f"niah: context length {L} is too short for the needle and question "
                                     f"(about {reserve} tokens); use at least {reserve + 64}")
            text = haystack
            if count(haystack[-20000:]) * len(haystack) / 20000 < 1.5 * (L - reserve):  # may not fit: repeat
                while count(text) <= L - reserve:
                    text = text + "\n\n" + haystack
            prefixes[L] = _fit_prefix(text, L - reserve, count)
        context = prefixes[L]
        while True:
            body, pos = _insert_needle(context, d, needle)
            prompt = body + question
            tokens = count(prompt)
            if tokens <= L:
                break
            context = _cut(context, len(context) - max(8, 6 * (tokens - L)))  # rare: boundary tokens differ
        out.append(Problem(f"niah/{L}/{float(d)}", f"niah-{L}", prompt, codes[L, d],
                           {"context_length": L, "depth": float(d), "needle": needle, "code": codes[L, d],
                            "position": round(pos / max(len(body), 1), 4), "tokens": tokens,
                            "token_counter": "count_tokens" if count_tokens else "approx_tokens"}))
    return out


# --------------------------------------------------------------------------------------------- numbers

_SEPARATORS = ",\u00a0\u202f\u2009"
_NUMBER = (r"(?:(?<![A-Za-z0-9)\]}])-)?\$?(?:(?<=\$)-)?"
           r"(?:\d{1,3}(?:[" + _SEPARATORS + r"]\d{3})+(?!\d)|\d+)(?:\.\d+)?")
_ANSWER_PATTERNS = (r"\banswer\s*(?:is|:|=)[^\d]{0,50}?(" + _NUMBER + ")",
                    r"####[^\d]{0,10}?(" + _NUMBER + ")",
                    r"\\boxed\{[^}\d]{0,20}?(" + _NUMBER + ")")


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


def _score_number(problem: Problem, output: str) -> bool:
    return is_correct(output, problem.answer)


def _score_math500(problem: Problem, output: str) -> bool:
    from math_verify import parse, verify

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


def _defines(code: str, name: str) -> bool:
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
        defining = [b for b in preferred if _defines(b, entry_point)]
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
    if _defines(code, entry):
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
CODE_EXECUTION_REFUSAL = ("{name} is scored by running model-written code; pass --allow-code-execution (or set "
                          "LOOSESPEC_ALLOW_CODE_EXECUTION=1) to run it in loosespec's sandbox (see the README's "
                          "'Evaluation' section)")


def code_execution_allowed(flag: bool = False) -> bool:
    """Whether running model-written code was asked for: ``flag`` (``--allow-code-execution``), or
    ``$LOOSESPEC_ALLOW_CODE_EXECUTION`` set to 1/true/yes (for CI)."""
    return bool(flag) or os.environ.get(CODE_EXECUTION_ENV, "").strip().lower() in ("1", "true", "yes")


def executes_code(name: str) -> bool:
    """Whether scoring dataset ``name`` runs model-written code (HumanEval, MBPP)."""
    return _spec(name).scorer is _score_humaneval


def check_code_execution(names: Sequence[str], allow: bool = False, sandbox: str | None = None) -> str | None:
    """Before a run: refuse (one line) a set whose scoring runs model-written code unless it was allowed, and
    resolve the sandbox mode it will run in (None when no set runs code). Raises :class:`LoosespecError`."""
    code_sets = [n for n in dict.fromkeys(names) if executes_code(n)]
    if not code_sets:
        return None
    if not code_execution_allowed(allow):
        raise LoosespecError(CODE_EXECUTION_REFUSAL.format(name=" and ".join(code_sets)))
    from loosespec.eval.sandbox import resolve_mode

    return resolve_mode(sandbox)


def _score_humaneval(problem: Problem, output: str, timeout_s: float = 10.0, memory_mb: int = 1024,
                     allow_code_execution: bool = False, sandbox: str | None = None) -> Verdict:
    """pass@1 of one reply: the program (prompt + the reply's code) runs in the sandbox; the problem's tests run
    in a separate driver process that calls it (:func:`loosespec.eval.sandbox.run_tests`), so the code under
    test cannot forge its verdict. Needs ``allow_code_execution`` (or the environment variable)."""
    if not code_execution_allowed(allow_code_execution):
        raise LoosespecError(CODE_EXECUTION_REFUSAL.format(name=problem.category or "this set"))
    from loosespec.eval.sandbox import run_tests

    result = run_tests(humaneval_program(problem, output, with_tests=False), prompt=problem.meta["prompt"],
                       test=problem.meta["test"], entry_point=problem.meta["entry_point"], timeout_s=timeout_s,
                       memory_mb=memory_mb, mode=sandbox)
    detail = {"sandbox": result.mode, "program": result.status}
    if result.detail:
        detail["reason"] = result.detail[-500:]
    if result.status == "error":
        raise ScoringError(f"the sandbox could not score {problem.id}: {result.detail or result.stderr[-300:]}",
                           detail)
    return Verdict("right" if result.passed else "wrong", detail)


def _score_niah(problem: Problem, output: str) -> bool:
    digits, _, word = problem.answer.partition("-")
    pattern = rf"(?<![A-Za-z0-9]){re.escape(digits)}[\s\-\u2010-\u2015_:]*{re.escape(word)}(?![A-Za-z0-9])"
    return re.search(pattern, output, flags=re.IGNORECASE) is not None


# --------------------------------------------------------------------------------------------- registry

@dataclass(frozen=True)
class DatasetSpec:
    """One evaluation set: its loader, load options (name -> default), scorer and score options.

    ``short_answer``: a problem's ``answer`` is an answer to show beside an output (a number, an expression,
    a needle), not a reference solution that tests stand in for (HumanEval's canonical solution)."""
    name: str
    loader: Callable[..., list[Problem]]
    options: Mapping[str, Any]
    scorer: Callable[..., bool] | None
    score_options: Mapping[str, Any]
    scorer_doc: str
    short_answer: bool = True

    def __call__(self, limit: int | None = None, directory: str | Path | None = None, **options) -> list[Problem]:
        return self.loader(limit, directory, **options)  # DATASETS[name](limit, directory) as before


_CODE_SCORE_OPTIONS = {"timeout_s": 10.0, "memory_mb": 1024, "allow_code_execution": False, "sandbox": None}

DATASETS: dict[str, DatasetSpec] = {s.name: s for s in (
    DatasetSpec("gsm8k", gsm8k, {}, _score_number, {},
                "numeric: extract_number (last 'The answer is N', else '#### N' or \\boxed{N}, else the last number) "
                "== gold"),
    DatasetSpec("gsm8k-train", gsm8k_train, {}, _score_number, {}, "as gsm8k (GSM8K's train split, for calibration)"),
    DatasetSpec("mgsm", mgsm, {"lang": "en"}, _score_number, {},
                "numeric, as gsm8k: extract_number (last 'The answer is N', else the last number) == answer_number"),
    DatasetSpec("math500", math500, {}, _score_math500, {},
                "math_verify: verify(parse('$' + gold + '$'), parse(output)), \\boxed{} content preferred"),
    DatasetSpec("humaneval", humaneval, {}, _score_humaneval, _CODE_SCORE_OPTIONS,
                "pass@1: code from the reply's ```python block (full function or body) + tests run in the sandbox",
                short_answer=False),
    DatasetSpec("mbpp-train", mbpp_train, {}, _score_humaneval, _CODE_SCORE_OPTIONS,
                "pass@1 as humaneval: code from the reply + MBPP's asserts run in the sandbox (MBPP's train split, "
                "for calibration)", short_answer=False),
    DatasetSpec("specbench", specbench, {"category": None}, None, {},
                "none: judged only by agreement with the ar output"),
    DatasetSpec("mtbench", mtbench, {}, None, {},
                "none: judged only by agreement with the ar output"),
    DatasetSpec("niah", niah, {"context_lengths": (1024, 2048, 4096), "depths": (0.0, 0.25, 0.5, 0.75, 1.0),
                               "count_tokens": None, "seed": 0}, _score_niah, {},
                "exact retrieval: the needle's code (e.g. 7319-BRAVO, any case/separator) appears in the output"),
)}

SCORERS_DOC: dict[str, str] = {name: spec.scorer_doc for name, spec in DATASETS.items()}


def _spec(name: str) -> DatasetSpec:
    if name not in DATASETS:
        raise LoosespecError(f"unknown dataset '{name}'; choose one of: {', '.join(DATASETS)}")
    return DATASETS[name]


def _check_options(name: str, given: Mapping[str, Any], valid: Mapping[str, Any], what: str) -> None:
    unknown = [k for k in given if k not in valid]
    if unknown:
        choices = ", ".join(valid) if valid else "none"
        raise LoosespecError(f"unknown {what} option{'s' if len(unknown) > 1 else ''} {', '.join(unknown)} for "
                             f"dataset '{name}'; valid: {choices}")


def load_dataset(name: str, limit: int | None = None, directory: str | Path | None = None, **options) -> list[Problem]:
    """The problems of dataset ``name`` (see the module docstring for options and ``limit`` semantics)."""
    spec = _spec(name)
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise LoosespecError(f"limit must be a positive integer, got {limit}")
    _check_options(name, options, spec.options, "load")
    return spec.loader(limit, directory, **options)


def judge(name: str, problem: Problem, output: str, **options) -> Verdict:
    """What scoring ``output`` for ``problem`` of dataset ``name`` found, as a :class:`Verdict`.

    Never raises for a failure of the scoring itself (a sandbox that could not start, a scorer's bug): that is
    ``Verdict("error", ...)``, no answer. A program under test that fails, times out or runs out of memory is
    ``"wrong"``. Bad options, and code execution that was not allowed, still raise :class:`LoosespecError`.
    Options of the sets that run code (humaneval, mbpp-train): ``allow_code_execution`` (False: see
    :func:`code_execution_allowed`), ``sandbox`` (None: :func:`loosespec.eval.sandbox.resolve_mode`'s),
    ``timeout_s`` (10) and ``memory_mb`` (1024).
    """
    spec = _spec(name)
    _check_options(name, options, spec.score_options, "score")
    if spec.scorer is None:
        return Verdict("unscored")
    try:
        return as_verdict(spec.scorer(problem, output, **options))
    except ScoringError as e:
        return Verdict("error", {"error": str(e), **e.detail})
    except LoosespecError:
        raise
    except Exception as e:  # a scorer's bug is the harness's failure, not a wrong answer
        return Verdict("error", {"error": f"{type(e).__name__}: {e}"})


def score(name: str, problem: Problem, output: str, **options) -> bool | None:
    """Whether ``output`` answers ``problem`` of dataset ``name``; ``None`` when the set has no scorer.

    Raises :class:`ScoringError` when the scoring itself failed (see :func:`judge`, which reports it instead).
    """
    v = judge(name, problem, output, **options)
    if v.status == "error":
        raise ScoringError(v.detail.get("error", "scoring failed"), v.detail)
    return v.score
