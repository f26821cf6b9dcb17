"""ms_recover: process-level fault recovery (recover / recover-in-place) for MindSpore.

A training script calls :func:`init` once, then runs its steps through the returned
:class:`Session` (``session.steps(n)`` with ``session.guard()``, or ``session.run(fn, n)``).
"""

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
from ms_recover.worker.session import Session

__version__ = "0.1.0"

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
    "parse_strategies",
    "__version__",
]
