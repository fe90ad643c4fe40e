"""Evaluation sets from ``shared/data`` (see its README): prompts and answer scoring.

Where the data lives: ``--data-dir``, else ``$LOOSESPEC_DATA``, else ``shared/data`` beside the
project checkout. GSM8K answers are scored by :func:`extract_number`, whose rules are:

1. the first number after the last "answer is" (the prompt asks for "The answer is N.");
2. else the number after the last "####" (GSM8K's own format), or in the last ``\\boxed{...}``;
3. else the last number in the text.

Numbers lose thousands separators, a leading ``$`` and a trailing period; two answers are equal
when they are numerically equal (``18`` == ``18.00``).
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

from .errors import LoosespecError

GSM8K_PROMPT = ("Solve the following math problem step by step. Write each step as its own short paragraph, "
                "separated by a blank line. End with a line of the form \"The answer is N.\"\n\n{question}")
_NUMBER = r"-?\$?\d[\d,]*(?:\.\d+)?"


@dataclass(frozen=True)
class Problem:
    id: str
    category: str
    prompt: str
    answer: str | None  # gold answer, None when the set has no scorer


def data_dir(explicit: str | Path | None = None) -> Path:
    candidates = [explicit, os.environ.get("LOOSESPEC_DATA"), Path(__file__).resolve().parents[2] / "shared" / "data"]
    for c in candidates:
        if c and Path(c).is_dir():
            return Path(c)
    raise LoosespecError("evaluation data not found: pass --data-dir or set LOOSESPEC_DATA to the folder holding "
                         "gsm8k_test.jsonl (shared/data in the project)")


def _rows(path: Path) -> list[dict]:
    if not path.is_file():
        raise LoosespecError(f"missing data file {path}")
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def gsm8k(limit: int | None = None, directory: str | Path | None = None) -> list[Problem]:
    """The first ``limit`` GSM8K test problems, in file order."""
    rows = _rows(data_dir(directory) / "gsm8k_test.jsonl")[:limit]
    return [Problem(f"gsm8k/{i}", "gsm8k", GSM8K_PROMPT.format(question=r["question"]),
                    r["answer"].split("####")[-1].strip()) for i, r in enumerate(rows)]


DATASETS = {"gsm8k": gsm8k}


def load_dataset(name: str, limit: int | None = None, directory: str | Path | None = None) -> list[Problem]:
    if name not in DATASETS:
        raise LoosespecError(f"unknown dataset '{name}'; choose one of: {', '.join(DATASETS)}")
    if limit is not None and limit < 1:
        raise LoosespecError(f"limit must be a positive integer, got {limit}")
    return DATASETS[name](limit, directory)


def _clean(number: str) -> str:
    return number.replace(",", "").replace("$", "").rstrip(".")


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
    for pattern in (r"answer is[^\d\-$]*(" + _NUMBER + ")", r"####\s*(" + _NUMBER + ")",
                    r"\\boxed\{\s*(" + _NUMBER + ")"):
        found = re.findall(pattern, text, flags=re.IGNORECASE)
        if found:
            return _clean(found[-1])
    numbers = re.findall(_NUMBER, text)
    return _clean(numbers[-1]) if numbers else None


def is_correct(output: str, gold: str) -> bool:
    got = extract_number(output)
    got, want = (_to_float(got) if got is not None else None), _to_float(gold)
    return got is not None and want is not None and abs(got - want) < 1e-6
