"""``loosespec`` command line: generate, bench, report, calibrate, serve, models.

One module per command group: :mod:`~loosespec.cli.generate`, :mod:`~loosespec.cli.calibrate`,
:mod:`~loosespec.cli.bench` (``bench`` and ``report``), :mod:`~loosespec.cli.serve`, :mod:`~loosespec.cli.models`;
the group, its global options (``--verbose``, ``--quiet``) and :func:`main` in :mod:`~loosespec.cli.root`; the
options several commands share, derived from their one declaration (the decoding knobs, the model-loading options),
in :mod:`~loosespec.cli.options`.

Errors from bad input are printed as one line (``loosespec: error: ...``) with exit status 2;
no traceback reaches the terminal.
"""

from loosespec.cli import bench as _bench  # noqa: E402,F401
from loosespec.cli import calibrate as _calibrate  # noqa: E402,F401

# the commands, registered on `app` in the order --help lists them
from loosespec.cli import generate as _generate  # noqa: E402,F401
from loosespec.cli import models as _models  # noqa: E402,F401
from loosespec.cli import serve as _serve  # noqa: E402,F401
from loosespec.cli.bench import BENCH_DEFAULT_METHODS  # noqa: E402
from loosespec.cli.options import knob_options, knob_values, load_options  # noqa: E402
from loosespec.cli.root import app, main, models_app

__all__ = ["app", "main", "models_app", "knob_options", "knob_values", "load_options", "BENCH_DEFAULT_METHODS"]
