"""loosespec's logging: every module logs to ``logging.getLogger(__name__)`` (a ``loosespec.*`` logger) and none
writes to the standard error stream itself.

On import, loosespec gives its ``loosespec`` logger one handler: the plain message (``%(message)s``, the lines the
command line printed before it logged) on the standard error stream as it is when each record is written, at the
level ``LOOSESPEC_LOGGING_LEVEL`` names (DEBUG, INFO, WARNING, ERROR or CRITICAL; default INFO: the notices a user
sees, such as a model being converted or quantized once). The records stop there (as vLLM's and transformers'
loggers do): an application's own root handler does not print them a second time. ``LOOSESPEC_CONFIGURE_LOGGING=0``
leaves the ``loosespec`` logger to the application: no handler, no level, records propagating as usual.

The command line's global ``--verbose`` (DEBUG) and ``--quiet`` (WARNING: warnings and errors only) override the
variable for one run (:mod:`loosespec.cli.root`).
"""

from __future__ import annotations

import logging
import os
import sys

from loosespec.errors import LoosespecError

LEVEL_ENV = "LOOSESPEC_LOGGING_LEVEL"
CONFIGURE_ENV = "LOOSESPEC_CONFIGURE_LOGGING"
LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
ROOT = "loosespec"

log = logging.getLogger(__name__)


class StderrHandler(logging.StreamHandler):
    """Writes to ``sys.stderr`` as it is at each record, not as it was when the handler was made: a caller that
    redirects the stream (``contextlib.redirect_stderr``, pytest's capture) gets the records."""

    def __init__(self, level: int = logging.NOTSET):
        logging.Handler.__init__(self, level)  # no stream of its own

    @property
    def stream(self):
        return sys.stderr


def level_from_env(environ=None) -> int:
    """The level ``LOOSESPEC_LOGGING_LEVEL`` names (case-insensitive), INFO when it is unset or empty; a
    :class:`~loosespec.errors.LoosespecError` for any other value."""
    text = (os.environ if environ is None else environ).get(LEVEL_ENV, "").strip()
    if not text:
        return logging.INFO
    if text.upper() not in LEVELS:
        raise LoosespecError(f"{LEVEL_ENV} must be one of {', '.join(LEVELS)}, got {text!r}")
    return getattr(logging, text.upper())


def configured() -> bool:
    """Whether loosespec configures its logger (``LOOSESPEC_CONFIGURE_LOGGING`` is not ``0``)."""
    return os.environ.get(CONFIGURE_ENV, "1").strip() != "0"


def configure(level: int | None = None) -> None:
    """Give the ``loosespec`` logger its handler (once) and ``level`` (None: ``LOOSESPEC_LOGGING_LEVEL``'s, a bad
    value of which raises); nothing with ``LOOSESPEC_CONFIGURE_LOGGING=0``."""
    if not configured():
        return
    root = logging.getLogger(ROOT)
    if not any(isinstance(h, StderrHandler) for h in root.handlers):
        handler = StderrHandler()
        handler.setFormatter(logging.Formatter("%(message)s"))
        root.addHandler(handler)
    root.propagate = False
    root.setLevel(level_from_env() if level is None else level)


def configure_on_import() -> None:
    """:func:`configure` as ``import loosespec`` runs it: a bad ``LOOSESPEC_LOGGING_LEVEL`` is said, not raised."""
    try:
        configure()
    except LoosespecError as e:
        configure(logging.INFO)
        log.warning("loosespec: %s; logging at INFO", e)
