"""The ``loosespec`` command group, its global options (``--verbose``, ``--quiet``) and :func:`main`.

Errors from bad input are printed as one line (``loosespec: error: ...``) with exit status 2;
no traceback reaches the terminal.
"""

from __future__ import annotations

import logging
import os
import sys

os.environ.setdefault("TYPER_USE_RICH", "0")  # plain one-screen click errors, no boxed tracebacks
import typer  # noqa: E402

from loosespec.config import ConfigError  # noqa: E402
from loosespec.errors import LoosespecError  # noqa: E402
from loosespec.log import LEVEL_ENV, ROOT, configure, level_from_env  # noqa: E402

app = typer.Typer(
    add_completion=False,
    pretty_exceptions_enable=False,
    no_args_is_help=True,
    help="Loose speculative decoding for LLMs, with lossless baselines and measurements.",
)
models_app = typer.Typer(
    invoke_without_command=True, help="List the embedded models, prepare one (pull) or remove one (rm)."
)
app.add_typer(models_app, name="models")


@app.callback()
def _global_options(
    verbose: bool = typer.Option(False, "--verbose", help=f"Log debug messages too (as {LEVEL_ENV}=DEBUG)."),
    quiet: bool = typer.Option(
        False,
        "--quiet",
        help=f"Log only warnings and errors on stderr: no progress notices, "
        f"statistics or status lines (as {LEVEL_ENV}=WARNING). Results on stdout and progress "
        "bars are unchanged.",
    ),
):
    # no docstring: the group's help is the Typer's
    if verbose and quiet:
        raise LoosespecError("--verbose and --quiet exclude each other")
    configure(logging.DEBUG if verbose else logging.WARNING if quiet else level_from_env())


def main() -> None:
    root = logging.getLogger(ROOT)
    level = root.level  # restored after the run: a caller that runs main() in its own process keeps its level
    try:
        app()
    except ConfigError as e:  # a knob's bad value, named as the user typed it (--num-draft-tokens)
        print(f"loosespec: error: {e.render('cli')}", file=sys.stderr)
        sys.exit(2)
    except LoosespecError as e:
        print(f"loosespec: error: {e}", file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt:
        print("loosespec: interrupted", file=sys.stderr)
        sys.exit(130)
    finally:
        root.setLevel(level)
