"""Moved to :mod:`ms_recover.scheduler.hooks`; this old path is the same module (see
:mod:`ms_recover._moved`), and ``python -m ms_recover.hooks CMD`` still runs it."""

import sys

from ms_recover._moved import alias
from ms_recover.scheduler.hooks import *  # noqa: F403 - the names, for type checkers

if __name__ == "__main__":
    from ms_recover.scheduler.hooks import main

    sys.exit(main())
alias(__name__, "ms_recover.scheduler.hooks")
