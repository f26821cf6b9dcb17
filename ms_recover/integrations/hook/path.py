"""Print the path of the scheduler hook script, ``ms_recover_hook.sh``.

Source it from a job's start script (see docs/deployment.md):

    source "$(ms-recover hook-path)"    # starts the manager if this is the scheduler pod
    trap ms_recover_hook_stop EXIT

The script lives beside this module, ``ms_recover/integrations/hook/ms_recover_hook.sh``, in a
source checkout and in an installed wheel alike (it is package data).
"""

from __future__ import annotations

import argparse
import pathlib
import sys

NAME = "ms_recover_hook.sh"


def hook_path() -> pathlib.Path | None:
    """The hook script of this installation, or None if it has none."""
    candidate = pathlib.Path(__file__).resolve().parent / NAME
    return candidate if candidate.is_file() else None


def configure(p: argparse.ArgumentParser) -> None:
    p.formatter_class = argparse.RawDescriptionHelpFormatter


def run(args: argparse.Namespace) -> int:
    path = hook_path()
    if path is None:
        print(
            f"ms-recover hook-path: error: this installation has no {NAME} (reinstall "
            "ms-recover from its wheel or sdist)",
            file=sys.stderr,
        )
        return 1
    print(path)
    return 0
