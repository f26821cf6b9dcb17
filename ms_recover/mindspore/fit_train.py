"""Moved to :mod:`ms_recover.mindspore.programs.fit_train`; this old path re-exports it and runs it
(``python -m ms_recover.mindspore.fit_train`` still works)."""

from ms_recover.mindspore.programs.fit_train import *  # noqa: F403
from ms_recover.mindspore.programs.fit_train import main

if __name__ == "__main__":
    raise SystemExit(main())
