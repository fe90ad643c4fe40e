"""Where the evaluation sets' files are read from, and the problem every loader returns.

Each file is taken from the first of ``--data-dir`` (``directory=``), ``$LOOSESPEC_DATA`` and the copy shipped
in ``loosespec/eval/data`` that holds it (:func:`data_file`), so a folder with only some of the files overrides
just those. A ``--data-dir`` that is not a folder is an error, never skipped. ``hub`` instead of a folder
(``--data-dir hub`` or ``LOOSESPEC_DATA=hub``) loads the standard Hugging Face Hub copies through the optional
``datasets`` package (``pip install 'loosespec[hub]'``) for the sets that have one (:data:`HUB_SOURCES`), with
the same rows as the shipped files. The Paul Graham essays of ``niah`` are not shipped (the essays are their
author's copyright): that set needs a folder holding ``paul_graham_essays.jsonl`` (see the README).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping

from loosespec.errors import LoosespecError


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
            raise LoosespecError(
                f"{where} {value} is not a folder: pass the folder holding the evaluation sets' "
                f".jsonl files (or '{HUB}' for the Hugging Face Hub copies)"
            )
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
        raise LoosespecError(
            f"{ESSAYS} (niah's haystack) is not shipped with loosespec: put it in a folder and pass "
            "--data-dir or set LOOSESPEC_DATA (where to get it: loosespec/eval/data/README.md)"
        )
    raise LoosespecError(f"evaluation data {name} not found in --data-dir, $LOOSESPEC_DATA or {SHIPPED}")


def _hub_rows(name: str) -> list[dict]:
    """The rows of file ``name`` from its Hugging Face Hub source (:data:`HUB_SOURCES`), as the file has them."""
    try:
        import datasets as hf_datasets
    except ImportError:
        raise LoosespecError(
            f"loading {name} from the Hugging Face Hub needs the 'datasets' package: "
            "pip install 'loosespec[hub]' (or use the copies shipped with loosespec)"
        ) from None
    repo, config, split = HUB_SOURCES[name]
    try:
        table = hf_datasets.load_dataset(repo, config, split=split)
    except Exception as e:  # offline, gated, renamed: one clear line
        raise LoosespecError(f"could not load {repo} ({split}) from the Hugging Face Hub: {e}") from e
    fields = {
        "gsm8k_test.jsonl": ("question", "answer"),
        "gsm8k_train.jsonl": ("question", "answer"),
        "humaneval.jsonl": ("task_id", "prompt", "canonical_solution", "test", "entry_point"),
        "math500_test.jsonl": ("problem", "solution", "answer", "subject", "level", "unique_id"),
    }[name]
    rows = [{k: row[k] for k in fields} for row in table]
    if not rows:
        raise LoosespecError(f"{repo} ({split}) on the Hugging Face Hub has no rows")
    return rows


def load_rows(name: str, directory: str | Path | None) -> list[dict]:
    """The rows of file ``name``, from where :func:`data_file` finds it."""
    where = data_file(name, directory)
    return _hub_rows(name) if where == HUB else _rows(Path(where))


def _rows(path: Path) -> list[dict]:
    if not path.is_file():
        raise LoosespecError(f"missing data file {path}")
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
