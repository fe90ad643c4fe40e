"""The wheel (issue 45): `make dist` builds it; installed with --no-deps into a fresh environment outside the checkout
(the dependencies are this venv's, the checkout's editable loosespec is not), it imports, carries the evaluation sets,
runs `loosespec generate` on SmolLM2 without the bench extra (matplotlib, scipy and math-verify hidden) and refuses
`loosespec bench` with the extra named; `make hf-custom-generate` puts it in the Hub layout, whose requirements.txt it
satisfies."""

import json
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from loosespec import __version__

ROOT = Path(__file__).resolve().parents[1]
BENCH_MODULES = ("matplotlib", "scipy", "math_verify")

pytestmark = pytest.mark.real_model  # generate runs SmolLM2-135M from the model cache (make test prepares it)


def _run(args, timeout=300, **kw):
    p = subprocess.run([str(a) for a in args], capture_output=True, text=True, timeout=timeout, **kw)
    assert p.returncode == 0, f"{args}\n{p.stdout[-2000:]}\n{p.stderr[-3000:]}"
    return p


def _make_n(*args) -> list[str]:
    """The command lines a make target runs here (make -n), the venv set up (-o setup). Run from `make test`, make
    passes its flags down (MAKEFLAGS, MAKELEVEL: "Entering directory" lines); they are dropped."""
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL")}
    cmd = ["make", "--no-print-directory", "-n", "-o", "setup", *args]
    return _run(cmd, cwd=ROOT, env=env).stdout.strip().splitlines()


def test_make_dist_builds_the_wheel_without_downloading():
    lines = _make_n("dist", "DIST_DIR=/x")
    assert lines[0] == "rm -rf build/lib build/bdist.* /x/loosespec-*.whl", lines
    assert lines[-1].endswith(" wheel --no-deps --no-build-isolation --wheel-dir /x ."), lines
    phony = next(line for line in (ROOT / "Makefile").read_text().splitlines() if line.startswith(".PHONY:"))
    assert "dist" in phony.split()
    hub = _make_n("hf-custom-generate", "HF_CUSTOM_GENERATE_DIR=/x/y", "DIST_DIR=/d")
    assert hub[-1].endswith("python -m loosespec.integrations.hf_hub /x/y --wheel-dir /d"), hub
    assert any(" wheel --no-deps" in line for line in hub), "make hf-custom-generate builds the wheel first"


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """The wheel `make dist` builds, by its own command lines, run on a copy of what the wheel is made of (the
    checkout's build/ and egg-info stay untouched)."""
    src = tmp_path_factory.mktemp("src")
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(ROOT / name, src / name)
    shutil.copytree(ROOT / "loosespec", src / "loosespec", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    dist = tmp_path_factory.mktemp("dist")
    for line in _make_n("dist", f"DIST_DIR={dist}", f"BIN={Path(sys.executable).parent}"):
        _run(["bash", "-c", line], cwd=src)
    (whl,) = dist.glob("*.whl")
    assert whl.name == f"loosespec-{__version__}-py3-none-any.whl"
    return whl


@pytest.fixture(scope="module")
def fresh(tmp_path_factory, wheel):
    """A new virtual environment outside the checkout with the wheel installed (--no-deps, no index); this venv's
    site-packages on its path through a .pth line, so its dependencies are found but the editable loosespec's own
    .pth (its import finder) is not processed; matplotlib, scipy and math-verify hidden (the base install)."""
    venv = tmp_path_factory.mktemp("fresh") / "venv"
    base = getattr(sys, "_base_executable", None) or shutil.which("python3")
    _run([base, "-m", "venv", "--without-pip", venv])
    python = venv / "bin" / "python"
    site = Path(_run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]).stdout.strip())
    ours = dict.fromkeys(sysconfig.get_paths()[k] for k in ("purelib", "platlib"))
    (site / "checkout_venv.pth").write_text("".join(f"{p}\n" for p in ours))
    hide = f"import sys; sys.modules.update(dict.fromkeys({BENCH_MODULES!r}))\n"  # import as with None: ImportError
    (site / "hide_bench_extra.pth").write_text(hide)
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q", "--python", python]
    _run([*pip, "install", "--no-deps", "--no-index", wheel])
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    env["HF_HUB_OFFLINE"] = "1"
    cwd = tmp_path_factory.mktemp("cwd")
    return venv, site, env, cwd


PROBE = r"""
import importlib.metadata as md, json, sys
from pathlib import Path
import loosespec, loosespec.cli, loosespec.serve.app, loosespec.eval.datasets
pkg = Path(loosespec.__file__).parent
print(json.dumps({
    "file": loosespec.__file__,
    "version": loosespec.__version__,
    "dist": str(md.distribution("loosespec").locate_file("")),
    "data": sorted(p.name for p in (pkg / "eval" / "data").iterdir()),
    "editable": sorted(m for m in sys.modules if "editable" in m),
    "bench": [m for m in %r if sys.modules.get(m) is not None],
}))
"""


def test_the_installed_wheel_imports_from_the_fresh_environment_with_its_data(fresh):
    venv, site, env, cwd = fresh
    p = _run([venv / "bin" / "python", "-c", PROBE % (BENCH_MODULES,)], cwd=cwd, env=env)
    out = json.loads(p.stdout.strip().splitlines()[-1])
    assert Path(out["file"]).resolve().is_relative_to(site.resolve()), out["file"]  # not the checkout's
    assert Path(out["dist"]).resolve() == site.resolve() and out["version"] == __version__
    assert not out["editable"] and not out["bench"]
    shipped = sorted(p.name for p in (ROOT / "loosespec/eval/data").iterdir() if p.suffix == ".jsonl")
    assert shipped and out["data"] == sorted([*shipped, "README.md"])


def test_the_installed_wheel_generates_without_the_bench_extra_and_bench_names_it(fresh, tmp_path):
    venv, _, env, cwd = fresh
    cmd = venv / "bin" / "loosespec"
    assert cmd.read_text().startswith(f"#!{venv}/bin/python")
    p = _run([cmd, "generate", "--target", "smollm2-135m-instruct", "--max-new-tokens", "8", "Hello"], cwd=cwd, env=env)
    assert p.stdout.strip(), p.stderr[-2000:]
    args = ["bench", "--dataset", "gsm8k", "--limit", "1", "--target", "smollm2-135m-instruct", "--out", tmp_path / "b"]
    p = subprocess.run([str(cmd), *map(str, args)], capture_output=True, text=True, timeout=300, cwd=cwd, env=env)
    assert p.returncode == 2, p.stderr[-2000:]
    assert p.stderr.strip().splitlines() == [
        "loosespec: error: matplotlib is not installed (for loosespec bench): pip install 'loosespec[bench]'"
    ]


def test_the_hub_layout_carries_the_wheel_its_requirements_name(fresh, wheel, tmp_path):
    venv, _, env, cwd = fresh
    python, out = venv / "bin" / "python", tmp_path / "hub"
    _run([python, "-m", "loosespec.integrations.hf_hub", out, "--wheel-dir", wheel.parent], cwd=cwd, env=env)
    assert (out / wheel.name).read_bytes() == wheel.read_bytes()
    requirements = (out / "custom_generate" / "requirements.txt").read_text()
    assert requirements.splitlines()[-1] == f"loosespec=={__version__}" and wheel.name in requirements
    readme = (out / "README.md").read_text()
    assert f"pip install ./{wheel.name}" in readme and f"resolve/main/{wheel.name}" in readme
    # what transformers checks when it loads the folder: satisfied by the wheel installed here
    check = "from transformers.dynamic_module_utils import check_python_requirements as c; import sys; c(sys.argv[1], "
    _run([python, "-c", check + "requirements_file='custom_generate/requirements.txt')", out], cwd=cwd, env=env)
    # no wheel of this version in the folder: a one-line error, nothing written
    p = subprocess.run(
        [str(python), "-m", "loosespec.integrations.hf_hub", str(tmp_path / "x"), "--wheel-dir", str(tmp_path)],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=env,
        timeout=300,
    )
    assert p.returncode == 2 and "make dist builds it" in p.stderr and not (tmp_path / "x").exists(), p.stderr
    assert len(p.stderr.strip().splitlines()) == 1, p.stderr
