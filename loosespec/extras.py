"""The optional extras of a loosespec install (pyproject.toml's ``[project.optional-dependencies]``) as the code meets
them: an import of one of their modules, or a one-line error naming the extra that installs it.

The base install is what ``loosespec generate`` and ``loosespec serve`` need. ``bench`` adds what ``loosespec bench``
and ``loosespec calibrate`` use besides: matplotlib (plots), scipy (McNemar's exact test, rank statistics) and
math-verify (MATH-500's answer equivalence). Those are imported where they are used, never at a module's top, so that
a base install runs every base command; the commands that need them check for them before any model loads
(:func:`require`).
"""

from __future__ import annotations

import importlib
import importlib.util
from types import ModuleType

from loosespec.errors import LoosespecError

BENCH = "bench"
# the extra -> the top-level modules it installs (what its distributions are imported as)
EXTRAS: dict[str, tuple[str, ...]] = {BENCH: ("matplotlib", "scipy", "math_verify")}


class MissingExtraError(LoosespecError):
    """A feature's optional dependency is not installed; the message names the extra that installs it."""


def _missing(module: str, extra: str, what: str) -> MissingExtraError:
    return MissingExtraError(f"{module.split('.')[0]} is not installed (for {what}): pip install 'loosespec[{extra}]'")


def import_extra(module: str, what: str, extra: str = BENCH) -> ModuleType:
    """``import module`` (dotted names too), one of ``extra``'s; :class:`MissingExtraError` naming the extra when it is
    not installed. ``what``: the feature that needs it, for the message (e.g. ``"McNemar's test"``)."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise _missing(module, extra, what) from e


def require(extra: str, what: str) -> None:
    """Every module of ``extra`` is installed (found, not imported: cheap), else :class:`MissingExtraError`; called by
    the commands that need the extra before they load anything."""
    for module in EXTRAS[extra]:
        try:
            found = importlib.util.find_spec(module) is not None
        except (ImportError, ValueError):  # a module set to None in sys.modules, or without a spec
            found = False
        if not found:
            raise _missing(module, extra, what)
