"""The install's extras (issue 45, item 1): the base install is what generate and serve need; matplotlib, scipy and
math-verify are the bench extra's, imported only where a bench feature uses them, with a one-line error naming the
extra when they are missing."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib
from conftest import run_cli

from loosespec.errors import LoosespecError
from loosespec.extras import BENCH, EXTRAS, MissingExtraError, import_extra, require

ROOT = Path(__file__).resolve().parents[1]
HINT = "pip install 'loosespec[bench]'"


def _names(requirements: list[str]) -> set[str]:
    return {r.split("[")[0].split(">")[0].split("=")[0].split("<")[0].strip().lower() for r in requirements}


def test_pyproject_base_is_generate_and_serve_and_the_bench_extra_has_the_rest():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    base, extras = _names(project["dependencies"]), project["optional-dependencies"]
    assert {"fastapi", "uvicorn", "prometheus-client", "torch", "transformers"} <= base
    assert not base & {"matplotlib", "scipy", "math-verify"}
    assert _names(extras["bench"]) == {"matplotlib", "scipy", "math-verify"}
    assert {m.replace("_", "-") for m in EXTRAS[BENCH]} == _names(extras["bench"])
    assert "server" in extras and "peers" in extras and "hub" in extras
    assert "loosespec[bench]" in extras["test"], "make setup (pip install -e '.[test]') installs what the tests import"


def test_import_extra_names_the_extra_when_its_module_is_missing(monkeypatch):
    assert import_extra("scipy.stats", "a test").binomtest is not None
    monkeypatch.setitem(sys.modules, "scipy.stats", None)
    with pytest.raises(MissingExtraError) as e:
        import_extra("scipy.stats", "McNemar's exact test")
    assert str(e.value) == f"scipy is not installed (for McNemar's exact test): {HINT}"
    assert isinstance(e.value, LoosespecError)
    from loosespec.eval.stats import mcnemar_exact

    with pytest.raises(MissingExtraError, match=r"McNemar.*loosespec\[bench\]"):
        mcnemar_exact(1, 3)


def test_require_checks_every_module_of_the_extra(monkeypatch):
    require(BENCH, "a test")
    for module in EXTRAS[BENCH]:
        with monkeypatch.context() as m:
            m.setitem(sys.modules, module, None)
            with pytest.raises(MissingExtraError, match=f"^{module} is not installed \\(for loosespec bench\\)"):
                require(BENCH, "loosespec bench")


@pytest.mark.parametrize("command", ["bench", "calibrate"])
def test_bench_commands_without_the_extra_are_a_one_line_error_before_anything_loads(monkeypatch, tmp_path, command):
    monkeypatch.setitem(sys.modules, "math_verify", None)
    monkeypatch.setenv("LOOSESPEC_CACHE", str(tmp_path / "cache"))
    args = ["--dataset", "gsm8k", "--limit", "1", "--target", "smollm2-135m-instruct", "--out", tmp_path / "run"]
    r = run_cli(command, *args)
    assert r.returncode == 2, r.stderr[-2000:]
    assert r.stderr == f"loosespec: error: math_verify is not installed (for loosespec {command}): {HINT}\n"
    assert not (tmp_path / "cache").exists() and not (tmp_path / "run").exists(), "prepared or wrote something first"


HIDDEN_IMPORT = r"""
import importlib, json, pkgutil, sys
hidden = ("matplotlib", "scipy", "math_verify")
for m in hidden:
    sys.modules[m] = None
import loosespec
bad = {}
for info in pkgutil.walk_packages(loosespec.__path__, "loosespec."):
    leaf = info.name.rsplit(".", 1)[-1]
    if leaf == "__main__" or leaf.startswith("sandbox_"):  # scripts: they run when imported
        continue
    try:
        importlib.import_module(info.name)
    except ImportError as e:
        if (e.name or "").split(".")[0] in hidden:
            bad[info.name] = str(e)
print(json.dumps(bad))
"""


def test_no_module_imports_a_bench_dependency_when_it_is_imported():
    """Every module of the package imports without matplotlib, scipy and math-verify (the base install): they are
    imported inside the functions that use them. The wheel test (tests/test_wheel.py) runs generate without them."""
    p = subprocess.run([sys.executable, "-c", HIDDEN_IMPORT], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert p.returncode == 0, p.stderr[-2000:]
    assert json.loads(p.stdout.strip().splitlines()[-1]) == {}
