"""``python -m loosespec.cli``: the ``loosespec`` command."""

from loosespec.cli import main

main()
