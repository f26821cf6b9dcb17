"""The manager's view of the job: job state machine, members, faults and the recovery round.

``JobState`` lifecycle::

    FORMING ──members of a running job re-registered (restarted manager)──▶ RUNNING
    FORMING ──all ranks registered──▶ REBUILDING ─all rebuilt─▶ REPAIRING ─all repaired─▶
    RESUMING ──every rank committed the resume step──▶ RUNNING
    RUNNING ──fault──▶ STOPPING ──survivors stopped and replacements registered──▶ REBUILDING
    any recovery state ──new fault / failure / timeout──▶ STOPPING (new epoch) or EXITING
    RUNNING ──every rank done──▶ FINISHED
    STOPPING ──dump chosen, survivors stopped──▶ DUMPING ──files written──▶ EXITING

Only :meth:`JobModel.transition` changes the state, and it raises on a transition the table
does not allow. The model holds data only; the pure :func:`~ms_recover.manager.decide.decide`
reads it and changes nothing.

Who writes what: **handlers record facts, the executor applies decisions.** The server's
message handlers (and their helpers: acks, health, leaving, divergence, the relay) record what
members reported as it arrives: ``ranks`` (liveness, identity, acks, committed steps,
digests), ``agents``, ``pending`` faults, ``early_exits``, ``leaving``, ``health`` and
``health_rev``, ``led_stops``, ``heard_at``, ``restore``, ``manager``, ``group_log`` and
``spares``. Only the :class:`~ms_recover.manager.executor.Executor` writes the decisions, as
the actions of ``decide`` say: ``state``, ``epoch``, ``round``, ``tries``, ``active``,
``recoveries``, ``last_recovery``, ``exit_code``, ``restarts``, ``flagged``, ``judged_rev``
and ``promoted`` (it may update facts too). One exception: a restarted manager, still
forming and before any decision, adopts the epoch its members report
(``WorkerHandlers.note_rejoin``). ``config`` is never written.
``tests/unit/test_model_ownership.py`` reads every write from the code and holds this table.
Pure: no zmq, numpy or msgpack.
"""

from __future__ import annotations

import dataclasses
import enum
import math

from ms_recover.comm.grouplog import GroupLog
from ms_recover.config import JobConfig
from ms_recover.errors import MsRecoverError
from ms_recover.manager.health import RankHealth
from ms_recover.observability.schema import FaultKind, JobState, Phase
from ms_recover.strategy import Strategy

_RECOVERY = {
    JobState.STOPPING,
    JobState.REBUILDING,
    JobState.REPAIRING,
    JobState.RESUMING,
    JobState.DUMPING,
}

TRANSITIONS: dict[JobState, frozenset[JobState]] = {
    JobState.FORMING: frozenset(
        {JobState.REBUILDING, JobState.RUNNING, JobState.STOPPING, JobState.EXITING}
    ),
    JobState.RUNNING: frozenset({JobState.STOPPING, JobState.FINISHED, JobState.EXITING}),
    JobState.STOPPING: frozenset(
        {JobState.REBUILDING, JobState.STOPPING, JobState.DUMPING, JobState.EXITING}
    ),
    JobState.DUMPING: frozenset({JobState.EXITING}),
    JobState.REBUILDING: frozenset({JobState.REPAIRING, JobState.STOPPING, JobState.EXITING}),
    JobState.REPAIRING: frozenset(
        {JobState.RESUMING, JobState.REPAIRING, JobState.STOPPING, JobState.EXITING}
    ),
    JobState.RESUMING: frozenset({JobState.RUNNING, JobState.STOPPING, JobState.EXITING}),
    JobState.EXITING: frozenset(),
    JobState.FINISHED: frozenset(),
}


class Ack(str, enum.Enum):
    """The recovery phases a rank acknowledges (repair acks also carry the attempt)."""

    STOP = "stop"
    REBUILD = "rebuild"
    REPAIR = "repair"

    def __str__(self) -> str:
        return self.value


class IllegalTransition(MsRecoverError):
    """The state machine was asked for a transition its table does not allow."""


@dataclasses.dataclass(slots=True)
class RankInfo:
    """What the manager knows about one rank."""

    rank: int
    node_rank: int
    registered: bool = False
    alive: bool = False
    incarnation: int = -1
    pid: int = 0
    endpoint: str = ""
    endpoint_epoch: int = 0  # the model epoch when ``endpoint`` was (re)registered
    shard: int = 0
    committed_step: int = -1
    last_seen: float = 0.0
    last_progress: float = 0.0
    acks: dict[tuple[Ack, int], int] = dataclasses.field(default_factory=dict)  # -> epoch
    repair_failure: tuple[int, int, str] | None = None  # (attempt, failed peer, reason)
    dump: dict[str, object] | None = None  # the Dumped answer of this epoch
    stop_digest: str = ""  # the state digest of its last Stopped
    digests: dict[int, str] = dataclasses.field(default_factory=dict)  # step -> steady digest
    done: bool = False
    #: It said it stays a member after finishing (a repair source) until told the job is over.
    waits: bool = False
    released: bool = False  # told to exit (the job is over for it)
    exit_code: int | None = None  # of the registered process, once its agent reported it
    identity: bytes = b""

    def ack(self, phase: Ack, epoch: int, attempt: int = 0) -> None:
        """Record that this rank finished ``phase`` (repair: attempt ``attempt``) in ``epoch``."""
        self.acks[phase, attempt] = epoch

    def acked(self, phase: Ack, epoch: int, attempt: int = 0) -> bool:
        return self.acks.get((phase, attempt)) == epoch

    def acked_epoch(self, phase: Ack, attempt: int = 0) -> int:
        """The epoch of this rank's last ack of ``phase``, or -1."""
        return self.acks.get((phase, attempt), -1)


@dataclasses.dataclass(slots=True)
class AgentInfo:
    """What the manager knows about one node's agent."""

    node_rank: int
    registered: bool = False
    alive: bool = False
    is_scheduler: bool = False
    pid: int = 0
    last_seen: float = 0.0
    pod_ip: str = ""
    released: bool = False  # told to exit for good (not to reschedule)
    via: int = -1  # its last heartbeat came through this node's agent (a group leader), or -1


@dataclasses.dataclass(slots=True)
class SpareNode:
    """A spare node's agent (``ms-recover agent --spare``): a pod that holds pre-warmed rank
    processes and no node rank, until a lost node's place is given to it
    (:mod:`~ms_recover.manager.sparenodes`)."""

    identity: bytes
    pid: int
    pod_ip: str
    since: float  # when it first said hello
    last_seen: float
    warm: int  # its pre-warmed rank processes, as it last said


@dataclasses.dataclass(frozen=True)
class Origin:
    """Where and how a rank died, as its agent reported it (for the fault event)."""

    host: str
    pid: int
    exit_code: int
    signal: int
    log_tail: str  # its traceback, or its log's last lines (bounded); '' when unknown


@dataclasses.dataclass(frozen=True)
class Fault:
    """A detected failure (see :class:`FaultKind`)."""

    kind: FaultKind
    node_rank: int
    rank: int  # -1 for a whole node
    detail: str
    ts: float
    detect_s: float  # from the last sign of health to detection
    corrupt: bool = False  # the rank survived but its state must be repaired (retry)
    origin: Origin | None = None  # what its agent saw of a rank that died

    def __post_init__(self) -> None:
        object.__setattr__(self, "kind", FaultKind(self.kind))  # a plain string is checked


@dataclasses.dataclass(frozen=True)
class Leaving:
    """A node whose agent said it is leaving (a planned stop): why, when the manager heard
    it, and when the agent leaves on its own (both on the manager's clock)."""

    node_rank: int
    reason: str
    since: float
    deadline: float


@dataclasses.dataclass
class Round:
    """One recovery attempt (or the initial formation when ``strategy`` is None).

    The strategy sets the rank sets once, when it starts the round; the executor moves the
    rest (phase marks, target step, repair attempts) with typed round updates.
    """

    epoch: int
    strategy: Strategy | None
    started: float
    incident_start: float
    faults: list[Fault] = dataclasses.field(default_factory=list)
    replace_ranks: frozenset[int] = frozenset()
    reschedule_nodes: frozenset[int] = frozenset()
    detect_s: float = 0.0
    target_step: int = -1
    peak_step: int = -1
    repair_attempt: int = 0
    bad_sources: frozenset[int] = frozenset()
    untrusted: frozenset[int] = frozenset()  # alive, but their state is repaired too
    left_out: frozenset[int] = frozenset()  # neither stopped nor in the world after the round
    world: frozenset[int] = frozenset()  # the data-plane world after this round
    dump_ranks: tuple[int, ...] = ()  # DUMPING: the ranks that write the state
    phase_start: float = 0.0
    phases: dict[Phase, float] = dataclasses.field(default_factory=dict)
    stop_done: float = 0.0
    stop_again: float = 0.0  # when the STOP went again to the survivors yet to answer it
    stop_reason: str = ""  # the round's STOP's reason (MindIO reads the fault kind from it)
    replace_done: float = 0.0


@dataclasses.dataclass
class Restore:
    """A restarted manager rebuilding its view of a running job from its members.

    Members that registered with a previous manager (their hello carries an epoch above 0)
    re-register when this manager answers their heartbeat with ``Rejoin``. ``epochs`` holds
    the epoch each rank re-registered at; the job's epoch is the highest of them.
    """

    since: float
    epochs: dict[int, int] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class JobModel:
    """The mutable job view owned by the manager server."""

    config: JobConfig
    state: JobState = JobState.FORMING
    epoch: int = 0
    ranks: dict[int, RankInfo] = dataclasses.field(default_factory=dict)  # 0..N-1, in order
    agents: dict[int, AgentInfo] = dataclasses.field(default_factory=dict)
    pending: list[Fault] = dataclasses.field(default_factory=list)
    round: Round | None = None
    tries: dict[str, int] = dataclasses.field(default_factory=dict)
    group_log: GroupLog = dataclasses.field(default_factory=GroupLog)
    recoveries: int = 0
    last_recovery: dict[str, object] | None = None
    exit_code: int | None = None
    restore: Restore | None = None  # set while a restarted manager is still FORMING
    #: Ranks in the data plane. All of them, except while elastic training runs shrunk.
    active: frozenset[int] = frozenset()
    #: Ranks whose process exited 0 before it finished (no WorkerDone heard): rank -> (when the
    #: exit was reported, when it happened). Past ``EARLY_EXIT_GRACE_S`` it is a fault (see
    #: ``decide.detect_early_exits``); a WorkerDone that was on its way settles it.
    early_exits: dict[int, tuple[float, float]] = dataclasses.field(default_factory=dict)
    #: When a recovery last restarted each rank (once per incident; the last hour only): the
    #: per-rank restart budget (see :mod:`~ms_recover.manager.budget`).
    restarts: dict[int, list[float]] = dataclasses.field(default_factory=dict)
    #: When the server last found its inbound queue empty: silence is judged as of then, so
    #: heartbeats still unread in the queue of a saturated or stalled manager are never taken
    #: for silence (``inf``: no queue, the clock alone).
    heard_at: float = math.inf
    #: Nodes whose agent announced a planned stop, until a new agent registers for the node.
    leaving: dict[int, Leaving] = dataclasses.field(default_factory=dict)
    #: Why this manager itself was asked to stop with no standby to take over (its SIGTERM:
    #: the pod of its node deleted or drained); "" when it was not. The job then ends as
    #: asked (:meth:`stop_reason`).
    stop_asked: str = ""
    #: This manager's role among the job's managers (docs/manager-takeover.md): ``role``
    #: (active or standby), ``term``, ``node``, ``seen_active``; in every status reply.
    manager: dict[str, object] = dataclasses.field(default_factory=dict)
    #: node -> the epoch of the last STOP that went to it through its heartbeat group's leader
    #: (:mod:`~ms_recover.manager.groups`): only such a STOP goes again when unanswered.
    led_stops: dict[int, int] = dataclasses.field(default_factory=dict)
    #: Each rank's last step-timing report (:mod:`ms_recover.manager.health`).
    health: dict[int, RankHealth] = dataclasses.field(default_factory=dict)
    health_rev: int = 0  # reports recorded so far
    judged_rev: int = 0  # reports the fail-slow rule has judged
    #: Ranks flagged fail-slow or repeat-divergent, and the step they were flagged at.
    flagged: dict[int, int] = dataclasses.field(default_factory=dict)
    #: When each rank's replica was last found diverged (steady-state digests), newest last.
    diverged_at: dict[int, list[float]] = dataclasses.field(default_factory=dict)
    #: hotSwitch (:mod:`~ms_recover.manager.subhealth`): node -> when its new pod was asked for.
    switching: dict[int, float] = dataclasses.field(default_factory=dict)
    #: node -> when the new pod of a switching node said hello (held while the old one runs).
    backups: dict[int, float] = dataclasses.field(default_factory=dict)
    #: Nodes the sub-health policy has acted on (or gave up on): never acted on again.
    settled_nodes: set[int] = dataclasses.field(default_factory=set)
    #: Spare nodes waiting to take a lost node's place, by their agent's identity (a fact:
    #: their hellos; the executor removes one when it promotes or releases it).
    spares: dict[bytes, SpareNode] = dataclasses.field(default_factory=dict)
    #: node -> (the spare's identity, when it was given the node): a decision. While the node
    #: has a live agent, a new pod's agent for it is told to become a spare.
    promoted: dict[int, tuple[bytes, float]] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        cfg = self.config
        for rank in range(cfg.world_size):
            self.ranks.setdefault(rank, RankInfo(rank=rank, node_rank=cfg.node_of(rank)))
        self.active = self.active or frozenset(self.ranks)
        for node in range(cfg.node_nums):
            self.agents.setdefault(node, AgentInfo(node_rank=node))

    @property
    def in_recovery(self) -> bool:
        return self.state in _RECOVERY

    def transition(self, to: JobState) -> None:
        if to not in TRANSITIONS[self.state]:
            allowed = ", ".join(sorted(s.value for s in TRANSITIONS[self.state])) or "none"
            raise IllegalTransition(
                f"job state {self.state.value} -> {to.value} is not allowed (allowed: {allowed})"
            )
        self.state = to

    def members(self) -> dict[int, RankInfo]:
        """The active ranks (the data-plane world), by rank id."""
        return {r: i for r, i in self.ranks.items() if r in self.active}  # ranks is in rank order

    def live_ranks(self) -> list[int]:
        return [r for r, info in self.ranks.items() if info.alive]

    def every_node_leaving(self) -> bool:
        """Whether every node still in the job (its agent alive) announced a planned stop:
        the job itself is being deleted (or every node drained), not one pod moved."""
        live = [n for n, a in self.agents.items() if a.alive]
        return bool(self.leaving) and all(n in self.leaving for n in live)

    def stop_reason(self) -> str:
        """Why the job was asked to stop as a whole, or "": every node still in the job is
        leaving (the job deleted, or every node drained), or the manager's own node is
        leaving (its manager or its agent got SIGTERM) and no standby manager can take over
        (:attr:`stop_asked`, or no second entry in ``MS_RECOVER_MANAGERS``)."""
        if self.stop_asked:
            return self.stop_asked
        if self.every_node_leaving():
            nodes = sorted(self.leaving)
            why = "the job deleted or its nodes drained"
            return f"every node is leaving (SIGTERM to nodes {nodes}: {why})"
        sched = self.config.sched_node_rank
        if sched in self.leaving and len(self.config.managers) < 2:
            return (
                f"node {sched}, which hosts the manager, is leaving (SIGTERM: its pod deleted or "
                "its node drained) and no standby manager can take over (MS_RECOVER_MANAGERS "
                "lists none)"
            )
        return ""

    def min_committed(self) -> int:
        return min(info.committed_step for info in self.ranks.values())
