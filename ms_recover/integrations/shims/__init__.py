"""Opt-in stand-ins for MindCluster's Python packages (docs/design.md §1b).

This directory holds top-level packages, side by side:

* ``taskd/``: MindCluster TaskD's ``taskd.api`` (the msrun agent, the manager API);
* ``mindio_ttp/``: MindIO TTP's ``mindio_ttp`` (``framework_ttp``, ``controller_ttp``).

They become importable under those names only when this directory is put first on
``PYTHONPATH``; ``ms-recover shim-path`` prints it, so a start script opts in with one line::

    export PYTHONPATH="$(ms-recover shim-path):$PYTHONPATH"

Nothing here is ever on ``sys.path`` by default. When a real MindCluster package of the same name
is installed too, the one found first on ``sys.path`` wins: with this directory on
``PYTHONPATH`` that is ours, since ``PYTHONPATH`` entries come before site-packages. The shim
says so once, naming the package it shadows, and ``ms-recover shim-path`` warns as well.
"""

from __future__ import annotations

import importlib.machinery
import os


def path() -> str:
    """The directory to put first on ``PYTHONPATH``."""
    return os.path.dirname(os.path.abspath(__file__))


def shadowed(name: str, search: list[str]) -> str | None:
    """Where another package ``name`` lives on ``search`` (this directory excluded), if any."""
    others = [p for p in search if not _ours(p)]
    spec = importlib.machinery.PathFinder.find_spec(name, others)
    if spec is None:
        return None
    if spec.submodule_search_locations:
        return os.fspath(next(iter(spec.submodule_search_locations)))
    return spec.origin


def _ours(entry: str) -> bool:
    """This directory, or another copy of it (a checkout beside an installed ms_recover): a
    shim found there is ms_recover's own, never a MindCluster package it shadows."""
    real = os.path.realpath(entry or os.curdir)
    own = os.sep + os.path.join("ms_recover", "integrations", "shims")
    return real == os.path.realpath(path()) or real.endswith(own)
