"""The agent's hands: whatever actually starts, watches and kills this node's rank processes.

The :class:`~ms_recover.agent.agent.Agent` holds all manager-facing logic (registration,
heartbeats, exit reports, carrying out KillRanks / StartRanks / AgentExit). It touches rank
processes only through this interface, which has two implementations:

* :class:`~ms_recover.agent.ranks.RankSet`: processes the agent spawns itself
  (``ms-recover agent -- python train.py``);
* :class:`~ms_recover.integrations.msrun.hands.MsrunHands`: msrun's four callbacks, when msrun
  is the launcher and ms_recover's ``taskd`` shim is its agent.

Ranks are global rank ids throughout.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Protocol

from ms_recover.errors import MsRecoverError


@dataclasses.dataclass(frozen=True)
class Exited:
    """One rank process that ended: ``signal > 0`` if a signal killed it."""

    rank: int
    pid: int
    exit_code: int
    signal: int
    observed_at: float
    host: str = ""  # where it ran (its own word when it left one)
    log_tail: str = ""  # its traceback, or its log's last lines (bounded); '' when unknown


class LauncherError(MsRecoverError):
    """The launcher under the agent failed (a callback raised or answered nonsense)."""


class RankHands(Protocol):
    """Start, watch and kill the local ranks. Every exit is returned exactly once, either by
    :meth:`poll` (the process ended by itself) or by :meth:`kill` (we ended it)."""

    def start_all(self, ranks: Sequence[int]) -> None:
        """Start every local rank (incarnation 0) at the beginning of the job."""

    def start(self, rank: int) -> int:
        """(Re)start one rank with the next incarnation, killing a leftover first; its pid."""

    def poll(self) -> list[Exited]:
        """Ranks that ended by themselves since the last poll."""

    def kill(self, ranks: list[int]) -> list[Exited]:
        """Kill the given ranks that still run and wait until they are gone."""

    def pids(self) -> dict[int, int]:
        """Rank -> pid of every local rank believed to be running."""

    def training(self) -> None:
        """Every local rank committed a step (background work may start now)."""

    def close(self) -> None:
        """Kill whatever still runs and release resources (never raises)."""
