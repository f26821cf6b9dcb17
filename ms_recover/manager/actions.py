"""Actions returned by ``decide`` and carried out by the server's executor."""

from __future__ import annotations

import dataclasses
from typing import Any

from ms_recover.manager.model import Fault, JobState, Round
from ms_recover.protocol.messages import Message


@dataclasses.dataclass(frozen=True)
class Action:
    reason: str


@dataclasses.dataclass(frozen=True)
class SendRanks(Action):
    """Send ``msg`` to each of ``ranks`` (skipping ranks with no live connection)."""

    ranks: tuple[int, ...]
    msg: Message


@dataclasses.dataclass(frozen=True)
class SendAgent(Action):
    node_rank: int
    msg: Message


@dataclasses.dataclass(frozen=True)
class MarkLost(Action):
    """Record a fault: the ranks (and the agent, for a node) are no longer alive."""

    fault: Fault
    ranks: tuple[int, ...]
    agent: bool


@dataclasses.dataclass(frozen=True)
class StartRound(Action):
    """Begin a recovery (or the initial formation) round at ``round.epoch``."""

    round: Round


@dataclasses.dataclass(frozen=True)
class UpdateRound(Action):
    """Change fields of the current round (target step, repair attempt, phase marks...)."""

    changes: dict[str, Any]


@dataclasses.dataclass(frozen=True)
class Transition(Action):
    to: JobState


@dataclasses.dataclass(frozen=True)
class FinishRound(Action):
    """Close the current round: success or give-up, with per-phase times in the event."""

    ok: bool


@dataclasses.dataclass(frozen=True)
class SetActive(Action):
    """Elastic training: the data-plane world becomes ``ranks``."""

    ranks: frozenset[int]


@dataclasses.dataclass(frozen=True)
class Exhaust(Action):
    """No more tries of ``strategy`` in this incident (its replacement never came)."""

    strategy: str


@dataclasses.dataclass(frozen=True)
class WriteManifest(Action):
    """Write the dump manifest from the ranks' Dumped answers."""


@dataclasses.dataclass(frozen=True)
class Emit(Action):
    """Write one event to the job's event log."""

    event: str
    fields: dict[str, Any]
