"""ms_recover: process-level fault recovery (recover / recover-in-place) for MindSpore.

A training script calls :func:`init` once, then runs its steps through the returned
:class:`Session` (``session.steps(n)`` with ``session.guard()``, or ``session.run(fn, n)``).
:func:`shard_indices` positions its data by (step, rank, world), so a resumed rank reads what an
uninterrupted run would; :func:`make_dataset` is a small synthetic dataset for samples. The
MindSpore pieces (``GraphStep``, ``MindSporeState``, ``fit``) are in :mod:`ms_recover.mindspore`.

The names below load on first use (PEP 562), so importing a pure layer such as
``ms_recover.manager.decide`` or ``ms_recover.config`` does not drag in the worker, ZeroMQ or
numpy through this package.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ms_recover.config import JobConfig
    from ms_recover.errors import (
        CommError,
        ConfigError,
        Interrupted,
        MsRecoverError,
        ProtocolError,
        RecoveryError,
        RepairError,
    )
    from ms_recover.strategy import Strategy, parse_strategies
    from ms_recover.worker.bootstrap import init
    from ms_recover.worker.sampler import make_dataset, shard_indices, split_indices
    from ms_recover.worker.session import Session

__version__ = "0.2.0"  # the one version source: pyproject reads it (dynamic)

# Public name -> the module that defines it.
_HOMES = {
    "CommError": "ms_recover.errors",
    "ConfigError": "ms_recover.errors",
    "Interrupted": "ms_recover.errors",
    "JobConfig": "ms_recover.config",
    "MsRecoverError": "ms_recover.errors",
    "ProtocolError": "ms_recover.errors",
    "RecoveryError": "ms_recover.errors",
    "RepairError": "ms_recover.errors",
    "Session": "ms_recover.worker.session",
    "Strategy": "ms_recover.strategy",
    "init": "ms_recover.worker.bootstrap",
    "make_dataset": "ms_recover.worker.sampler",
    "parse_strategies": "ms_recover.strategy",
    "shard_indices": "ms_recover.worker.sampler",
    "split_indices": "ms_recover.worker.sampler",
}

__all__ = [
    "CommError",
    "ConfigError",
    "Interrupted",
    "JobConfig",
    "MsRecoverError",
    "ProtocolError",
    "RecoveryError",
    "RepairError",
    "Session",
    "Strategy",
    "init",
    "make_dataset",
    "parse_strategies",
    "shard_indices",
    "split_indices",
    "__version__",
]


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
