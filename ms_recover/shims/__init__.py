"""Print the directory of ms_recover's opt-in MindCluster packages (``mindio_ttp``, ``taskd``).

Put it first on ``PYTHONPATH`` to opt in: ``export PYTHONPATH=$(ms-recover shim-path):$PYTHONPATH``.
It is never on ``sys.path`` by default, so a real MindCluster package is never shadowed silently.
"""

from __future__ import annotations

import argparse
import os


def shim_path() -> str:
    """The absolute directory holding the shim packages."""
    return os.path.dirname(os.path.abspath(__file__))


def configure(parser: argparse.ArgumentParser) -> None:
    del parser  # no options


def run(args: argparse.Namespace) -> int:
    print(shim_path())
    return 0
