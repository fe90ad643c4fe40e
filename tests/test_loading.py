"""The model-loading options: each declared once (loosespec.loading.LoadConfig), every command that loads models and
Engine.load derived from that declaration."""

import dataclasses
import inspect
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from loosespec.loading import CACHE_OPTIONS, LOAD_OPTIONS, LoadConfig, load_option_info
from loosespec.models import DEFAULT_DRAFT, DEFAULT_TARGET

ROOT = Path(__file__).resolve().parents[1]

# the loading options each command takes (all of them, but those that do not apply to it)
EXPECTED = {
    "generate": set(LOAD_OPTIONS),
    "bench": set(LOAD_OPTIONS),
    "serve": set(LOAD_OPTIONS) - set(CACHE_OPTIONS),
    "calibrate": set(LOAD_OPTIONS) - {"revision", "draft_revision", "draft_quantize", *CACHE_OPTIONS},
    "models cost": {"dtype", "quantize", "device"},
}


def _command(path: str):
    import typer

    from loosespec.cli import app

    cmd = typer.main.get_command(app)
    for word in path.split():
        cmd = cmd.commands[word]
    return cmd


@pytest.mark.parametrize("path", sorted(EXPECTED))
def test_each_command_takes_the_load_options_as_declared(path):
    """A command's loading options are LoadConfig's fields: the same flags, defaults and help text (calibrate's
    --draft keeps its own default and help: it drafts with the default draft whatever the target)."""
    params = {p.name: p for p in _command(path).params if p.name in LOAD_OPTIONS}
    assert set(params) == EXPECTED[path]
    for name, p in params.items():
        info = load_option_info(name)
        flags = (info.flag or "--" + name.replace("_", "-")).split("/")
        assert [*p.opts, *p.secondary_opts] == flags, name
        if path == "calibrate" and name == "draft":
            assert p.default == DEFAULT_DRAFT and p.help.startswith("Draft model (SpecGuard")
            continue
        assert p.default == LOAD_OPTIONS[name].default, name
        assert p.help == info.help, name
    if "max_cache_len" in params:  # the declaration's bounds reach the option: refused before the command runs
        from typer.testing import CliRunner

        from loosespec.cli import app

        r = CliRunner().invoke(app, [*path.split(), "--max-cache-len", "0"])
        assert r.exit_code == 2 and "--max-cache-len" in r.output, r.output


def test_no_load_option_is_declared_twice():
    """No module but loosespec/loading.py declares a loading option (a typer option of that name) or writes out one
    of their help texts."""
    option = re.compile(r"\b(%s)\s*[:=].*\btyper\.Option\(" % "|".join(LOAD_OPTIONS))
    helps = {n: load_option_info(n).help[:40] for n in LOAD_OPTIONS}
    offenders = []
    for path in (ROOT / "loosespec").rglob("*.py"):
        if path.name == "loading.py" and path.parent.name == "loosespec":
            continue
        text = path.read_text()
        for i, line in enumerate(text.splitlines(), 1):
            if option.search(line.split("#")[0]):
                offenders.append(f"{path.relative_to(ROOT)}:{i}: {line.strip()}")
        offenders += [f"{path.relative_to(ROOT)}: the help of {n}" for n, h in helps.items() if h in text]
    assert not offenders, "\n".join(offenders)


def test_engine_load_takes_the_load_options(monkeypatch):
    """Engine.load's keywords are LoadConfig's fields: it builds one and hands it to Engine.load_from."""
    from loosespec.decode.engine import Engine

    assert [p.name for p in inspect.signature(Engine.load).parameters.values()] == [
        "target",
        "draft",
        "progress",
        "torch_draft",
        "torch_target",
        "options",
    ]
    seen = []
    monkeypatch.setattr(Engine, "load_from", classmethod(lambda cls, cfg, **kw: seen.append((cfg, kw))))
    values = {
        "revision": "main",
        "draft_revision": "v1",
        "dtype": "float32",
        "quantize": "none",
        "draft_quantize": "int8",
        "device": "cpu",
        "cache_implementation": "static",
        "compile": True,
        "max_cache_len": 77,
    }
    assert set(values) | {"target", "draft"} == set(LOAD_OPTIONS)
    Engine.load("t", "d", progress=False, **values)
    assert seen == [
        (LoadConfig(target="t", draft="d", **values), {"progress": False, "torch_draft": False, "torch_target": False})
    ]
    Engine.load()
    assert seen[-1][0] == LoadConfig(target=DEFAULT_TARGET, draft=DEFAULT_DRAFT)
    with pytest.raises(TypeError):
        Engine.load("t", None, no_such_option=1)


def test_the_draft_a_config_loads():
    assert LoadConfig().draft == "auto" and LoadConfig().draft_model == DEFAULT_DRAFT
    assert LoadConfig(target="smollm2-135m-instruct").draft_model is None  # auto: no draft for another target
    for none in ("none", "None", None):
        assert LoadConfig(draft=none).draft_model is None
    assert LoadConfig(target="x", draft="y").draft_model == "y"
    assert dataclasses.replace(LoadConfig(), draft=None) == LoadConfig().replace(draft=None)


PROBE = r"""
import json, sys, typer
from typer.testing import CliRunner
from loosespec.cli import app
from loosespec.decode.engine import Engine

class Seen(Exception):
    pass

def load_from(cls, cfg, **kw):
    raise Seen(cfg)

Engine.load_from = classmethod(load_from)
cmd = typer.main.get_command(app)
out = {c: [p.opts for p in cmd.commands[c].params if p.name == "dummy_load"] for c in ("generate", "bench", "serve",
                                                                                      "calibrate")}
out["help"] = [p.help for p in cmd.commands["generate"].params if p.name == "dummy_load"]
r = CliRunner().invoke(app, ["generate", "--dummy-load", "5", "--draft", "none", "--method", "ar", "hi"])
out["generate_passes"] = getattr(r.exception, "args", [None])[0].dummy_load
r = CliRunner().invoke(app, ["serve", "--dummy-load", "6", "--draft", "none", "--method", "ar"])
out["serve_passes"] = getattr(r.exception, "args", [None])[0].dummy_load
out["refused"] = CliRunner().invoke(app, ["generate", "--dummy-load", "-1", "hi"]).exit_code
try:
    Engine.load("t", None, dummy_load=4)
except Seen as e:
    out["engine_passes"] = e.args[0].dummy_load
print(json.dumps(out))
"""


def test_adding_a_load_option_is_one_edit(tmp_path):
    """One load_option() line in a copy of the package, and the option is a flag of every command that takes all
    loading options, with its help and bounds, and reaches Engine.load_from from the command line and Engine.load."""
    pkg = tmp_path / "loosespec"
    shutil.copytree(ROOT / "loosespec", pkg, ignore=shutil.ignore_patterns("__pycache__"))
    loading = pkg / "loading.py"
    text = loading.read_text()
    anchor = "    device: str = load_option("
    assert text.count(anchor) == 1
    loading.write_text(
        text.replace(anchor, '    dummy_load: int = load_option(3, "a dummy loading option.", min=0)\n' + anchor)
    )
    r = subprocess.run(
        [sys.executable, "-c", PROBE],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(tmp_path)},
    )
    assert r.returncode == 0, r.stderr[-2000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["generate"] == out["bench"] == out["serve"] == out["calibrate"] == [["--dummy-load"]]
    assert out["help"] == ["a dummy loading option."]
    assert out["generate_passes"] == 5 and out["serve_passes"] == 6 and out["engine_passes"] == 4
    assert out["refused"] == 2
