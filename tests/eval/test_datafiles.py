"""Where the evaluation sets' files come from: the shipped copies (checked against their README's sha256 and row
counts, and packaged), --data-dir and LOOSESPEC_DATA file by file, and the Hugging Face Hub copies."""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

import pytest
from fakes.fake_essays import only_repository_data

from loosespec.errors import LoosespecError
from loosespec.eval import datafiles
from loosespec.eval.datasets import DATASETS, load_dataset

DATA = datafiles.SHIPPED


@pytest.fixture(autouse=True)
def _only_repository_data(tmp_path_factory, monkeypatch):
    only_repository_data(tmp_path_factory, monkeypatch)


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
    assert (
        set(table)
        == {p.name for p in DATA.glob("*.jsonl")}
        >= {
            "gsm8k_test.jsonl",
            "gsm8k_train.jsonl",
            "mgsm.jsonl",
            "humaneval.jsonl",
            "spec_bench_question.jsonl",
            "math500_test.jsonl",
            "mt_bench_question.jsonl",
            "mbpp.jsonl",
        }
    )
    for name, (rows, size, sha) in table.items():
        data = (DATA / name).read_bytes()
        assert (data.count(b"\n"), len(data), hashlib.sha256(data).hexdigest()) == (rows, size, sha), name


def test_the_shipped_files_are_package_data():
    """pyproject.toml's package-data takes every shipped file, so a pip-installed loosespec has them too."""
    import fnmatch

    import tomllib

    root = Path(datafiles.__file__).resolve().parents[2]
    config = tomllib.loads((root / "pyproject.toml").read_text(encoding="utf-8"))
    patterns = config["tool"]["setuptools"]["package-data"]["loosespec.eval"]
    files = sorted(f"data/{p.name}" for p in DATA.iterdir())
    assert "data/README.md" in files and len(files) == 9
    assert [f for f in files if not any(fnmatch.fnmatch(f, pat) for pat in patterns)] == []


def test_every_set_loads_from_the_repository_alone(monkeypatch):
    """No --data-dir, no LOOSESPEC_DATA: each set's file comes from the copy inside the package (a clone
    without a shared/ folder beside it works), and only niah asks for its essays."""
    monkeypatch.delenv("LOOSESPEC_DATA")
    package = Path(datafiles.__file__).resolve().parent
    for name in (
        "gsm8k_test.jsonl",
        "gsm8k_train.jsonl",
        "mgsm.jsonl",
        "math500_test.jsonl",
        "humaneval.jsonl",
        "spec_bench_question.jsonl",
        "mt_bench_question.jsonl",
        "mbpp.jsonl",
    ):
        assert datafiles.data_file(name) == package / "data" / name
    assert datafiles.data_dir() == package / "data"
    counts = {
        name: len(load_dataset(name, **({"lang": "all"} if name == "mgsm" else {})))
        for name in DATASETS
        if name != "niah"
    }
    assert counts == {
        "gsm8k": 1319,
        "gsm8k-train": 7473,
        "mgsm": 2750,
        "math500": 500,
        "humaneval": 164,
        "mbpp-train": 374,
        "specbench": 480,
        "mtbench": 80,
    }
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

    shipped = {
        n: [json.loads(line) for line in (DATA / n).read_text(encoding="utf-8").splitlines()]
        for n in datafiles.HUB_SOURCES
    }
    by_source = {src: shipped[n] for n, src in datafiles.HUB_SOURCES.items()}
    calls = []

    def fake_load_dataset(repo, config=None, split=None):
        calls.append((repo, config, split))
        return [dict(row, extra_column=1) for row in by_source[repo, config, split]]

    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=fake_load_dataset))
    monkeypatch.delenv("LOOSESPEC_DATA")
    for name in ("gsm8k", "humaneval", "math500"):
        assert load_dataset(name, directory="hub") == load_dataset(name), name
    assert calls == [
        ("openai/gsm8k", "main", "test"),
        ("openai/openai_humaneval", None, "test"),
        ("HuggingFaceH4/MATH-500", None, "test"),
    ]
    assert datafiles._hub_rows("gsm8k_train.jsonl") == shipped["gsm8k_train.jsonl"]
    monkeypatch.setenv("LOOSESPEC_DATA", "hub")  # the environment variable takes it too
    assert load_dataset("gsm8k", limit=2) == load_dataset("gsm8k", limit=2, directory=DATA)
    assert len(calls) == 5
    assert len(load_dataset("mtbench")) == 80 and len(calls) == 5  # no Hub source: the shipped copy
    monkeypatch.setitem(sys.modules, "datasets", None)  # not installed
    with pytest.raises(LoosespecError, match=r"needs the 'datasets' package: pip install 'loosespec\[hub\]'"):
        load_dataset("gsm8k")
