"""Fault-injection points of the worker and the data plane: an interface that does nothing.

The worker's :class:`~ms_recover.worker.session.Session` and the host backend call these hooks
at named points. The default, :data:`NO_FAULTS`, does nothing; a test kit subclasses
:class:`FaultHooks` to kill, hang or corrupt a rank at one of them
(:class:`ms_recover.localrun.faults.FaultInjector` does, for the tests, the demo and the
benchmarks).

Guarantees:

* Unarmed hooks cost one attribute test: callers on a hot path (every step, every data-plane
  chunk) check :attr:`FaultHooks.armed` before calling, and it is False unless a fault is
  planned for this very process.
* No test code is imported on the product path: :func:`from_env` loads the test kit, by name,
  only when ``MS_RECOVER_FAULTS`` holds a fault plan.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ms_recover import env as E

if TYPE_CHECKING:
    from numpy.typing import NDArray

    from ms_recover.worker.session import Session

# The module whose ``FaultInjector.from_env(rank, incarnation)`` reads a fault plan.
FAULT_KIT = "ms_recover.localrun.faults"


class FaultHooks:
    """The points where a fault may be injected. Every method of this class does nothing."""

    def __init__(self) -> None:
        # True when some hook may act in this process; hot paths skip the calls when False.
        # An instance attribute: it is read twice per training step, and an instance lookup
        # is faster than a miss that falls through to the class.
        self.armed = False

    def at_command(self, command: str) -> None:
        """A recovery command (``stop``, ``rebuild``, ``resume``, ...) reached this rank."""

    def at_registration(self) -> None:
        """The manager has just accepted this rank's registration."""

    def at_commit(self, step: int, session: Session) -> None:
        """``step``'s update is done on this rank and nothing has reported it yet (its digest
        included). May change the state through ``session`` without telling anyone."""

    def after_commit(self, step: int, flush: Callable[[], None] | None = None) -> None:
        """``step`` is committed on this rank; ``flush`` closes its data plane gracefully."""

    def at_allreduce(self, step: int, session: Session) -> None:
        """Before ``step``'s world allreduce through ``session``. May raise
        :class:`~ms_recover.errors.CommError` (a transient data-plane failure) or
        :class:`~ms_recover.errors.Interrupted` (after reporting a fault through ``session``)."""

    def before_repair_send(self, payload: dict[str, NDArray[Any]]) -> None:
        """Before this rank sends its packed state for a repair; may replace entries."""

    def after_chunk_sent(self) -> None:
        """After each data-plane chunk this rank handed to the transport (host backend)."""


NO_FAULTS = FaultHooks()


def from_env(rank: int, incarnation: int) -> FaultHooks:
    """The hooks for this process: :data:`NO_FAULTS` unless ``MS_RECOVER_FAULTS`` holds a plan.

    Raises :class:`~ms_recover.errors.ConfigError` for a malformed plan (naming the valid kinds).
    """
    if not os.environ.get(E.FAULTS, "").strip():
        return NO_FAULTS
    kit = importlib.import_module(FAULT_KIT)
    hooks: FaultHooks = kit.FaultInjector.from_env(rank, incarnation)
    return hooks
