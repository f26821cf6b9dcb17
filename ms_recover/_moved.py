"""Old import paths of modules that moved to a new home.

Importing an old path gives the very same module object as its new path (module state,
monkeypatching and ``__doc__`` stay one), and ``python -m <old path>`` runs the module. No file
is left at the old path, so git follows each move (history and merges); an ``<old>.pyi`` stub
gives type checkers the names of the public ones.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
from collections.abc import Sequence
from types import CodeType, ModuleType

# Old dotted path -> new dotted path.
MOVED: dict[str, str] = {
    "ms_recover.api": "ms_recover.scheduler.api",
    "ms_recover.autostart": "ms_recover.scheduler.autostart",
    "ms_recover.hooks": "ms_recover.scheduler.hooks",
    "ms_recover.events": "ms_recover.observability.events",
    "ms_recover.metrics": "ms_recover.observability.metrics",
    "ms_recover.report": "ms_recover.observability.report",
    "ms_recover.status": "ms_recover.observability.status",
    "ms_recover.timeline": "ms_recover.observability.timeline",
    "ms_recover.transport": "ms_recover.protocol.transport",
    "ms_recover.mindspore.demo_train": "ms_recover.mindspore.programs.demo_train",
    "ms_recover.mindspore.fit_train": "ms_recover.mindspore.programs.fit_train",
    "ms_recover.mindspore.allreduce_bench": "ms_recover.mindspore.programs.allreduce_bench",
    "ms_recover.bench.overhead_train": "ms_recover.mindspore.programs.overhead_train",
    "ms_recover.testing.record": "ms_recover.worker.record",
    # Served from here, so that nothing under agent/ imports the test kit.
    "ms_recover.agent.pods": "ms_recover.testing.pods",
}


class _Alias(importlib.abc.Loader):
    """Loads an old path as the module at its new path (imported, or run by ``-m``)."""

    def __init__(self, new: str) -> None:
        self.new = new
        self._spec: importlib.machinery.ModuleSpec | None = None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        module = importlib.import_module(self.new)
        self._spec = module.__spec__
        return module

    def exec_module(self, module: ModuleType) -> None:
        # The import system pointed __spec__ at the old name; the module keeps its own.
        module.__spec__ = self._spec

    def get_code(self, fullname: str) -> CodeType | None:
        """For ``python -m <old path>``: the new module's code, run as ``__main__``."""
        spec = importlib.util.find_spec(self.new)
        loader = spec.loader if spec is not None else None
        if not isinstance(loader, importlib.abc.InspectLoader):
            raise ImportError(f"cannot run {fullname}: no code for {self.new}")
        return loader.get_code(self.new)


class _Finder(importlib.abc.MetaPathFinder):
    """Last on ``sys.meta_path``: it answers only for old paths no file provides."""

    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None,
        target: ModuleType | None = None,
    ) -> importlib.machinery.ModuleSpec | None:
        new = MOVED.get(fullname)
        if new is None:
            return None
        home = importlib.util.find_spec(new)
        return importlib.machinery.ModuleSpec(
            fullname, _Alias(new), origin=home.origin if home is not None else None
        )


def install() -> None:
    """Serve the old paths (idempotent; ``ms_recover/__init__`` calls it)."""
    if not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.append(_Finder())
