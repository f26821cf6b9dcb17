"""The worker's phase: one state machine per rank, moved by the manager's commands.

A rank is built (``NEW``), registers (``REGISTERING``) and is accepted by a WELCOME
(``JOINED``). Every world it trains in is then made by REBUILD (``REBUILT``), REPAIR
(``REPAIRED``: the state is at the recovery's target step, whether copied or already there) and
RESUME (``TRAINING``). A STOP (``STOPPED``) ends training at a safe point and starts the next
recovery, which again goes through REBUILD, REPAIR and RESUME, or through DUMP (``DUMPED``) to
the end of the job. EXIT (``EXITED``) ends the process from any phase. A rank without a
manager (a plain single-process job) goes from ``NEW`` straight to ``TRAINING``.

Within a recovery the manager may start a phase again, or start a new recovery (a new epoch)
before the current one finished: a STOP, a REBUILD or a REPAIR is accepted again in the
recovery phases. What is never accepted: a command before the WELCOME, training (RESUME)
without a rebuilt and repaired world, a REBUILD, REPAIR or DUMP while training (no STOP took the
committed step first), a DUMP of a state that was not stopped, anything after EXIT.
:func:`check` raises :class:`~ms_recover.errors.RecoveryError` for those.
"""

from __future__ import annotations

import enum

from ms_recover.errors import RecoveryError
from ms_recover.protocol import messages as M


class Phase(str, enum.Enum):
    NEW = "new"
    REGISTERING = "registering"
    JOINED = "joined"
    TRAINING = "training"
    STOPPED = "stopped"
    REBUILT = "rebuilt"
    REPAIRED = "repaired"
    DUMPED = "dumped"
    EXITED = "exited"

    def __str__(self) -> str:
        return self.value


P = Phase
# Phase -> the phases it may move to.
TRANSITIONS: dict[Phase, frozenset[Phase]] = {
    P.NEW: frozenset({P.REGISTERING, P.TRAINING}),
    P.REGISTERING: frozenset({P.JOINED, P.EXITED}),
    P.JOINED: frozenset({P.STOPPED, P.REBUILT, P.EXITED}),
    P.TRAINING: frozenset({P.STOPPED, P.EXITED}),
    P.STOPPED: frozenset({P.STOPPED, P.REBUILT, P.DUMPED, P.EXITED}),
    P.REBUILT: frozenset({P.STOPPED, P.REBUILT, P.REPAIRED, P.EXITED}),
    P.REPAIRED: frozenset({P.STOPPED, P.REBUILT, P.REPAIRED, P.TRAINING, P.EXITED}),
    P.DUMPED: frozenset({P.STOPPED, P.DUMPED, P.EXITED}),
    P.EXITED: frozenset(),
}

# A manager command -> the phase it moves the rank to. Other messages are not commands.
COMMANDS: dict[type[M.Message], Phase] = {
    M.Welcome: P.JOINED,
    M.Stop: P.STOPPED,
    M.Rebuild: P.REBUILT,
    M.Repair: P.REPAIRED,
    M.Resume: P.TRAINING,
    M.Dump: P.DUMPED,
    M.Exit: P.EXITED,
}


def check(rank: int, current: Phase, target: Phase, command: str) -> Phase:
    """``target`` if ``current`` may move to it; else RecoveryError naming what was allowed."""
    if target not in TRANSITIONS[current]:
        allowed = ", ".join(sorted(p.value for p in TRANSITIONS[current])) or "nothing"
        raise RecoveryError(
            f"rank {rank}: {command} is not valid in phase {current.value} "
            f"(it would lead to {target.value}; from {current.value} only: {allowed})"
        )
    return target
