"""loosespec's logging (loosespec/log.py): the core logs to loosespec.* loggers, never to stderr itself; plain
messages on stderr at LOOSESPEC_LOGGING_LEVEL (INFO by default)."""

import ast
import contextlib
import io
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

from loosespec import log as L
from loosespec.errors import LoosespecError

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def restored():
    """The loosespec logger as the test found it."""
    root = logging.getLogger("loosespec")
    handlers, level, propagate = list(root.handlers), root.level, root.propagate
    yield root
    root.handlers[:] = handlers
    root.setLevel(level)
    root.propagate = propagate


def test_records_are_plain_lines_on_stderr_as_it_is_now(restored, monkeypatch):
    monkeypatch.delenv(L.LEVEL_ENV, raising=False)
    L.configure()
    L.configure()  # idempotent: one handler
    assert sum(isinstance(h, L.StderrHandler) for h in restored.handlers) == 1
    assert restored.level == logging.INFO and not restored.propagate
    err = io.StringIO()
    with contextlib.redirect_stderr(err):  # the stream of the moment, not the one at import
        logging.getLogger("loosespec.some.module").info("converting x (once) ...")
        logging.getLogger("loosespec.some.module").debug("not at INFO")
    assert err.getvalue() == "converting x (once) ...\n"


@pytest.mark.parametrize(
    "value, level",
    [
        ("", logging.INFO),
        ("debug", logging.DEBUG),
        (" WARNING ", logging.WARNING),
        ("Error", logging.ERROR),
        ("CRITICAL", logging.CRITICAL),
    ],
)
def test_the_environment_names_the_level(value, level):
    assert L.level_from_env({L.LEVEL_ENV: value}) == level
    assert L.level_from_env({}) == logging.INFO


def test_a_bad_level_is_an_error_for_the_cli_and_a_warning_on_import(restored, monkeypatch):
    with pytest.raises(LoosespecError, match="LOOSESPEC_LOGGING_LEVEL must be one of DEBUG, INFO"):
        L.level_from_env({L.LEVEL_ENV: "loud"})
    monkeypatch.setenv(L.LEVEL_ENV, "loud")
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        L.configure_on_import()
    assert restored.level == logging.INFO and "logging at INFO" in err.getvalue() and "'loud'" in err.getvalue()


def _import_loosespec(env: dict) -> str:
    code = (
        "import logging, loosespec; r = logging.getLogger('loosespec'); "
        "print(len(r.handlers), r.propagate, logging.getLevelName(r.getEffectiveLevel()))"
    )
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True, env=env
    ).stdout.strip()


def test_import_configures_the_logger_unless_told_not_to():
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOOSESPEC_")}
    assert _import_loosespec(env) == "1 False INFO"
    assert _import_loosespec({**env, L.LEVEL_ENV: "error"}) == "1 False ERROR"
    # the application's: no handler, propagating to its own, at the root's level
    assert _import_loosespec({**env, L.CONFIGURE_ENV: "0"}) == "0 True WARNING"


def stderr_writes(path: Path) -> list[int]:
    """Lines of ``path`` that write a message to stderr themselves: ``print(..., file=sys.stderr)``,
    ``sys.stderr.write(...)``, ``typer.echo(..., err=True)``, ``tqdm.write(..., file=sys.stderr)`` (a progress bar's
    own stream is not a message)."""

    def is_stderr(node) -> bool:
        return (
            isinstance(node, ast.Attribute)
            and node.attr == "stderr"
            and isinstance(node.value, ast.Name)
            and node.value.id == "sys"
        )

    lines = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if not isinstance(node, ast.Call):
            continue
        f, kw = node.func, {k.arg: k.value for k in node.keywords}
        name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else None
        if (
            (name in ("print", "write") and is_stderr(kw.get("file")))
            or (name == "echo" and "err" in kw)
            or (isinstance(f, ast.Attribute) and f.attr == "write" and is_stderr(f.value))
        ):
            lines.append(node.lineno)
    return sorted(lines)


def test_the_core_never_writes_to_stderr_itself(tmp_path):
    """Messages go through logging (a loosespec.* logger named by __name__), so that --quiet, --verbose and
    LOOSESPEC_LOGGING_LEVEL govern them. The exceptions: the CLI's one-line errors (cli/root.py, printed whatever
    the level), its progress lines between tqdm's bars (cli/options.py's tqdm_write, which asks the level first),
    and the sandbox's child bootstrap, a script of its own whose stderr is a pipe its parent reads."""
    allowed = {"cli/root.py", "cli/options.py", "eval/sandbox_boot.py"}
    found = [
        f"{path.relative_to(ROOT / 'loosespec').as_posix()}:{line}"
        for path in sorted((ROOT / "loosespec").rglob("*.py"))
        if path.relative_to(ROOT / "loosespec").as_posix() not in allowed
        for line in stderr_writes(path)
    ]
    assert not found, "log instead (logging.getLogger(__name__)):\n" + "\n".join(found)
    probe = tmp_path / "probe.py"  # the scan is not vacuous
    probe.write_text(
        'import sys\nprint("a",\n      file=sys.stderr)\nsys.stderr.write("b")\ntyper.echo("c", err=True)\n'
        'tqdm.write("d", file=sys.stderr)\nprint("fine")\ntqdm(range(3), file=sys.stderr)\n'
    )
    assert stderr_writes(probe) == [2, 4, 5, 6]
