"""Old import paths of modules that moved: the old name becomes the very same module object.

A shim at the old path calls :func:`alias`, so ``import ms_recover.events`` gives
``ms_recover.observability.events`` itself (not a copy of its names): module state, monkeypatching
and ``__doc__`` stay one. The shim also star-imports the new module, for type checkers.
"""

from __future__ import annotations

import importlib
import sys


def alias(old: str, new: str) -> None:
    """Make ``old`` (the shim being imported) resolve to the module ``new``."""
    sys.modules[old] = importlib.import_module(new)
