"""Print the directory of ms_recover's opt-in ``taskd`` (and ``mindio_ttp``) packages.

Put it first on PYTHONPATH in the start script, before msrun and manager.py run:

    export PYTHONPATH="$(ms-recover shim-path):$PYTHONPATH"

msrun then hands its workers to ms_recover's taskd agent (with MS_ENABLE_TFT set), and
MindCluster's manager.py (``from taskd.api import ...``) starts ms_recover's manager. If a real
MindCluster package of the same name is installed, the shim wins while this directory comes
first on PYTHONPATH; a note on stderr names the package it shadows.
"""

from __future__ import annotations

import argparse
import sys

from ms_recover.integrations import shims

PACKAGES = ("taskd", "mindio_ttp")


def configure(p: argparse.ArgumentParser) -> None:
    p.formatter_class = argparse.RawDescriptionHelpFormatter


def run(args: argparse.Namespace) -> int:
    here = shims.path()
    for name in PACKAGES:
        other = shims.shadowed(name, sys.path)
        if other is not None:
            print(
                f"ms-recover shim-path: note: {name} is also installed at {other}; with this "
                f"directory first on PYTHONPATH, ms_recover's {name} wins (PYTHONPATH precedes "
                "site-packages)",
                file=sys.stderr,
            )
    print(here)
    return 0
