"""Actions returned by ``decide`` and carried out by the :class:`~ms_recover.manager.executor.
Executor`, one small handler each. Every action carries its reason, which the executor logs.
Pure: no zmq, numpy or msgpack.
"""

from __future__ import annotations

import dataclasses

from ms_recover.manager.model import Fault, Round
from ms_recover.observability.schema import JobState, Phase, Record
from ms_recover.protocol.messages import Message
from ms_recover.strategy import Strategy


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
    """Begin a recovery (or the initial formation) round at ``round.epoch``. ``uses_try``:
    it counts against its strategy's ``max_tries`` (not when it only widens the current try);
    ``restarts``: the ranks whose restart it starts, counted against their restart budget."""

    round: Round
    uses_try: bool = True
    restarts: frozenset[int] = frozenset()


# ----------------------------------------------------------------------------- round updates
@dataclasses.dataclass(frozen=True)
class StopDone(Action):
    """Every survivor acknowledged the round's Stop at ``at``."""

    at: float


@dataclasses.dataclass(frozen=True)
class StopAgain(Action):
    """The round's STOP went again, at ``at``, to the survivors that had not answered it (or
    none had to: checked once)."""

    at: float


@dataclasses.dataclass(frozen=True)
class ReplaceDone(Action):
    """Every replacement registered at ``at``."""

    at: float


@dataclasses.dataclass(frozen=True)
class NextPhase(Action):
    """The phase clock restarts at ``at``; ``done`` (if any) lasted since the last start."""

    at: float
    done: Phase | None = None


@dataclasses.dataclass(frozen=True)
class Distrust(Action):
    """Replicas whose digests differed from the majority's at the stop: from now on in the
    round's untrusted ranks (never a repair source, repaired from a trusted replica)."""

    ranks: frozenset[int]


@dataclasses.dataclass(frozen=True)
class SetTarget(Action):
    """Every rank rebuilt: repair to ``step``, first attempt."""

    step: int


@dataclasses.dataclass(frozen=True)
class RetryRepair(Action):
    """A repair attempt failed: try ``attempt`` without ``bad_sources``."""

    attempt: int
    bad_sources: frozenset[int]


@dataclasses.dataclass(frozen=True)
class ChooseWriters(Action):
    """Dump: ``ranks`` write the state of ``step``; the phase clock restarts at ``at``."""

    ranks: tuple[int, ...]
    step: int
    at: float


# ----------------------------------------------------------------------------- job updates
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

    strategy: Strategy


@dataclasses.dataclass(frozen=True)
class WriteManifest(Action):
    """Write the dump manifest from the ranks' Dumped answers."""


@dataclasses.dataclass(frozen=True)
class Judged(Action):
    """The fail-slow rule has judged every step-timing report up to ``rev``
    (``JobModel.health_rev``): it runs again only on a new report."""

    rev: int


@dataclasses.dataclass(frozen=True)
class SubHealthStep(Action):
    """The sub-health policy acted on ``node`` (it is settled: never acted on again). With
    ``switching`` set, a hot switch of it waits for its new pod since then; None ends one."""

    node: int
    switching: float | None


@dataclasses.dataclass(frozen=True)
class PromoteSpare(Action):
    """Give ``node``'s place to the spare node whose agent is ``identity``
    (``waited_s``: since the incident began)."""

    node: int
    identity: bytes
    waited_s: float


@dataclasses.dataclass(frozen=True)
class ReleaseSpare(Action):
    """Send the spare node whose agent is ``identity`` away: exit with ``code`` (the job
    ended), or forget it (``code`` None: it stopped answering)."""

    identity: bytes
    code: int | None


@dataclasses.dataclass(frozen=True)
class Emit(Action):
    """Write one event to the job's event log."""

    record: Record
