"""A stand-in for niah's haystack, which is not shipped (Paul Graham's essays are their author's copyright):
generated prose in the same file format, used by the dataset tests in tests/eval/."""

from __future__ import annotations

import json
import random
from pathlib import Path

from loosespec.eval.datafiles import ESSAYS

ESSAYS_START = "March 2011Every haystack here is made up"  # the first stand-in essay begins like the real ones


def stand_in_essays(folder: Path) -> Path:
    """A ``paul_graham_essays.jsonl`` of generated prose (49 rows, ``rss`` a stub, about the real 640 KB)."""
    rng = random.Random(0)
    words = (
        "the startup founders users program language idea work people time money problem city school "
        "essay question reason growth investors market hard good simple write think build learn"
    ).split()
    rows = []
    for i in range(49):
        title = "rss" if i == 40 else f"essay{i:02d}"
        sentences = [
            " ".join(rng.choice(words) for _ in range(rng.randrange(6, 24))).capitalize() + "."
            for _ in range(3 if title == "rss" else 140)
        ]
        text = "\n\n".join(" ".join(sentences[j : j + 5]) for j in range(0, len(sentences), 5))
        rows.append(
            {"title": title, "file": f"{title}.txt", "text": (ESSAYS_START + ". " if i == 0 else "May 2009") + text}
        )
    folder.mkdir(parents=True, exist_ok=True)
    (folder / ESSAYS).write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return folder


def only_repository_data(tmp_path_factory, monkeypatch) -> None:
    """LOOSESPEC_DATA: a folder with only the stand-in essays; every other set comes from the shipped copy."""
    folder = tmp_path_factory.getbasetemp() / "stand-in-essays"
    if not (folder / ESSAYS).is_file():
        stand_in_essays(folder)
    monkeypatch.setenv("LOOSESPEC_DATA", str(folder))
