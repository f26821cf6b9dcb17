"""Control-plane messages. One frozen dataclass per kind; the docstring gives the direction.

Every message travels inside an :class:`~ms_recover.protocol.codec.Envelope` that adds job_id,
epoch, sender and seq. Bodies hold only msgpack-native values (int, float, str, bool, bytes,
lists and string- or int-keyed maps); nothing is pickled.
"""

import dataclasses
import typing
from typing import Any, ClassVar


@dataclasses.dataclass(frozen=True)
class Message:
    KIND: ClassVar[bytes] = b""

    def to_wire(self) -> dict[str, Any]:
        names = _NAMES.get(type(self))
        if names is None:  # once per kind: dataclasses.fields() is slow enough to show
            names = _NAMES[type(self)] = tuple(f.name for f in dataclasses.fields(self))
        return {name: getattr(self, name) for name in names}


_NAMES: dict[type[Message], tuple[str, ...]] = {}


# ----------------------------------------------------------------------------- agent -> manager
@dataclasses.dataclass(frozen=True)
class AgentHello(Message):
    """agent -> manager: a (re)started agent announces its node and local ranks."""

    KIND: ClassVar[bytes] = b"agent_hello"
    node_rank: int
    pod_ip: str
    ranks: list[int]
    pid: int
    is_scheduler: bool


@dataclasses.dataclass(frozen=True)
class SpareHello(Message):
    """agent -> manager: a spare node's agent (``ms-recover agent --spare``) offers itself,
    its ranks pre-warmed, to take a lost node's place; sent again every heartbeat interval
    (its liveness, and its registration with a restarted manager)."""

    KIND: ClassVar[bytes] = b"spare_hello"
    pod_ip: str
    pid: int
    warm: int  # its pre-warmed rank processes alive now


@dataclasses.dataclass(frozen=True)
class AgentHeartbeat(Message):
    """agent -> manager: liveness. (It used to list every local rank's pid as well, which the
    manager never read; a heartbeat in that layout is dropped as malformed and logged.)"""

    KIND: ClassVar[bytes] = b"agent_hb"
    node_rank: int
    #: The committed step of each local rank heard since the agent's last heartbeat: the
    #: ranks' own heartbeats, folded in by the agent's relay (docs/design.md §1c).
    steps: dict[int, int] = dataclasses.field(default_factory=dict)
    #: The step timing of each local rank in ``steps`` that reported one (WorkerHeartbeat.health).
    health: dict[int, list[float]] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class RankExited(Message):
    """agent -> manager: a local rank process ended. signal > 0 if it was killed by one.

    ``requested`` is True when the agent ended it on the manager's command (KillRanks,
    AgentExit): never a fault, whatever process it was.
    """

    KIND: ClassVar[bytes] = b"rank_exited"
    node_rank: int
    rank: int
    pid: int
    exit_code: int
    signal: int
    observed_at: float
    requested: bool = False
    #: Where the rank ran, and its traceback or its log's last lines (bounded): '' if unknown.
    host: str = ""
    log_tail: str = ""


@dataclasses.dataclass(frozen=True)
class RankFrozen(Message):
    """agent -> manager: a local rank's process has been stopped by a signal (state ``T``:
    SIGSTOP, SIGTSTP) for ``stopped_s`` seconds, ``JobConfig.frozen_s`` or more; sent once per
    stop (:mod:`ms_recover.agent.frozen`). The manager declares a hang naming it."""

    KIND: ClassVar[bytes] = b"rank_frozen"
    node_rank: int
    rank: int
    pid: int
    stopped_s: float
    host: str = ""


@dataclasses.dataclass(frozen=True)
class NodeLeaving(Message):
    """agent -> manager: this node is about to go (its agent got SIGTERM: a pod deletion, a
    node drain, a preemption), a planned stop and not a crash (docs/design.md §1d).

    ``deadline_s``: seconds from sending until the agent kills its ranks and leaves on its
    own (the pod's termination grace less the agent's safety margin); until then its ranks
    keep running, and the agent leaves earlier when the manager tells it to (AgentExit).
    """

    KIND: ClassVar[bytes] = b"node_leaving"
    node_rank: int
    reason: str
    deadline_s: float


@dataclasses.dataclass(frozen=True)
class RelayUp(Message):
    """agent -> manager: frames of this node's ranks, relayed in one frame (docs/design.md §1c).

    Item ``i`` is one rank frame the agent authenticated: the rank's local identity at the
    agent (``idents[i]``), its envelope (``senders``, ``nonces``, ``seqs``, ``epochs``) and its
    message (``kinds``, ``bodies``). The manager checks each item again and handles it as if
    the rank had sent it directly (:mod:`ms_recover.manager.relay`).
    """

    KIND: ClassVar[bytes] = b"relay_up"
    node_rank: int
    idents: list[bytes]
    senders: list[str]
    nonces: list[int]
    seqs: list[int]
    epochs: list[int]
    kinds: list[str]
    bodies: list[dict[str, Any]]


@dataclasses.dataclass(frozen=True)
class RelayAcks(Message):
    """agent -> manager: one kind of answer from several of this node's ranks, column by
    column (docs/design.md §1c): the commonest relayed frames (every rank's STOPPED in a stop-all,
    REBUILT in a rebuild, REPAIRED in a repair, the heartbeat that closes a RESUME) without a map
    per rank.

    Item ``i`` is one rank frame the agent authenticated and replay-checked: the rank's local
    identity at the agent (``idents[i]``), its envelope (``senders``, ``nonces``, ``seqs``,
    and ``epoch``, shared by the items) and its message of ``kind``: ``ranks[i]``, with
    ``steps[i]`` (the ``committed_step``) and ``digests[i]`` where ``kind`` has those fields;
    a column ``kind`` does not have is empty (:data:`ms_recover.protocol.relay.ACK_COLUMNS`),
    and its other fields are implied (:data:`ms_recover.protocol.relay.ACK_IMPLIED`).
    """

    KIND: ClassVar[bytes] = b"relay_acks"
    node_rank: int
    kind: str
    epoch: int
    idents: list[bytes]
    senders: list[str]
    nonces: list[int]
    seqs: list[int]
    ranks: list[int]
    steps: list[int]
    digests: list[str]


@dataclasses.dataclass(frozen=True)
class GroupOpen(Message):
    """agent -> manager: this agent leads its heartbeat group (the nodes from ``node_rank`` on,
    ``JobConfig.group_size`` of them; docs/design.md §1c) and takes their agents' heartbeats
    at ``endpoint``. Sent after every welcome."""

    KIND: ClassVar[bytes] = b"group_open"
    node_rank: int
    endpoint: str


@dataclasses.dataclass(frozen=True)
class GroupBeats(Message):
    """agent -> manager: a group leader's batch of the heartbeats its group's agents sent it
    since its last batch, column by column (docs/design.md §1c). Item ``i``: the agent of node
    ``nodes[i]``, whose identity at the manager is ``idents[i]``, beat; ``steps[i]`` and
    ``health[i]`` are that heartbeat's ``AgentHeartbeat.steps`` and ``.health``. The leader
    authenticated and replay-checked every heartbeat; the manager checks each item's agent
    as if it had beaten directly."""

    KIND: ClassVar[bytes] = b"group_beats"
    node_rank: int
    nodes: list[int]
    idents: list[bytes]
    steps: list[dict[int, int]]
    health: list[dict[int, list[float]]]


@dataclasses.dataclass(frozen=True)
class GroupAck(Message):
    """agent -> agent: a group leader took this agent's heartbeat, and last heard the
    manager ``manager_age_s`` ago (docs/design.md §1c)."""

    KIND: ClassVar[bytes] = b"group_ack"
    node_rank: int
    manager_age_s: float


@dataclasses.dataclass(frozen=True)
class GroupStopped(Message):
    """agent -> manager: a group leader's batch of the STOPPED answers its group's agents sent
    it (each one's :class:`RelayAcks` of kind ``stopped``), column by column (docs/design.md
    §1c), every item of one ``epoch``. Node ``nodes[i]``, whose agent's identity at the
    manager is ``idents[i]``, relayed the next ``counts[i]`` items of the flat columns: each a
    rank's identity at that agent (``locals``), its rank, committed step and digest. The
    leader authenticated and replay-checked every member's frame; the manager checks each
    node's agent and each rank as if the member had relayed them directly."""

    KIND: ClassVar[bytes] = b"group_stopped"
    node_rank: int
    epoch: int
    nodes: list[int]
    idents: list[bytes]
    counts: list[int]
    locals: list[bytes]
    ranks: list[int]
    steps: list[int]
    digests: list[str]


# ----------------------------------------------------------------------------- manager -> agent
@dataclasses.dataclass(frozen=True)
class AgentWelcome(Message):
    """manager -> agent: registration accepted (or ``ok=False`` with a reason)."""

    KIND: ClassVar[bytes] = b"agent_welcome"
    ok: bool
    reason: str


@dataclasses.dataclass(frozen=True)
class ManagerBeat(Message):
    """manager -> agent: answer to a heartbeat, so the agent knows the manager is alive."""

    KIND: ClassVar[bytes] = b"manager_hb"
    state: str


@dataclasses.dataclass(frozen=True)
class GroupAt(Message):
    """manager -> agent: send your heartbeats to your group's leader, the agent of node
    ``leader``, at ``endpoint``; "" to the manager itself (docs/design.md §1c)."""

    KIND: ClassVar[bytes] = b"group_at"
    leader: int
    endpoint: str


@dataclasses.dataclass(frozen=True)
class GroupStop(Message):
    """manager -> agent: as a group leader, pass a STOP with ``reason`` on to the agents of
    ``nodes`` (``idents[i]``: node ``nodes[i]``'s agent's identity, ``targets[i]``: its ranks'
    identities at that agent), one signed RelayDown each (docs/design.md §1c). The frame's
    epoch is the STOP's."""

    KIND: ClassVar[bytes] = b"group_stop"
    node_rank: int
    reason: str
    nodes: list[int]
    idents: list[bytes]
    targets: list[list[bytes]]


@dataclasses.dataclass(frozen=True)
class SpareAssign(Message):
    """manager -> spare agent: take node ``node_rank``'s place (its pod was lost or sent
    away): register as that node's agent and start its ranks from the warm spares."""

    KIND: ClassVar[bytes] = b"spare_assign"
    node_rank: int
    reason: str


@dataclasses.dataclass(frozen=True)
class BecomeSpare(Message):
    """manager -> agent: the node this agent registered for was taken by a spare meanwhile
    (a recreated pod that came back late): stay as a spare instead."""

    KIND: ClassVar[bytes] = b"become_spare"
    reason: str


@dataclasses.dataclass(frozen=True)
class Rejoin(Message):
    """manager -> agent or worker: "I do not know you": this manager was restarted and the
    member must register again with its current state (sent in answer to a heartbeat)."""

    KIND: ClassVar[bytes] = b"rejoin"
    reason: str


@dataclasses.dataclass(frozen=True)
class KillRanks(Message):
    """manager -> agent: SIGKILL these local ranks (leftovers of a fault) and reap them."""

    KIND: ClassVar[bytes] = b"kill_ranks"
    ranks: list[int]
    reason: str


@dataclasses.dataclass(frozen=True)
class StartRanks(Message):
    """manager -> agent: (re)start these local ranks with the same rank ids."""

    KIND: ClassVar[bytes] = b"start_ranks"
    ranks: list[int]
    reason: str


@dataclasses.dataclass(frozen=True)
class AgentExit(Message):
    """manager -> agent: kill every local rank and exit with ``code`` (reschedule or the end)."""

    KIND: ClassVar[bytes] = b"agent_exit"
    code: int
    reason: str


@dataclasses.dataclass(frozen=True)
class RelayDown(Message):
    """manager -> agent: messages for this node's ranks, in the order sent. Message ``i``
    (``kinds[i]``, ``bodies[i]``, sent at ``epochs[i]``) goes to every local rank identity in
    ``targets[i]``: a broadcast is one item, per-rank payloads are one item each."""

    KIND: ClassVar[bytes] = b"relay_down"
    kinds: list[str]
    epochs: list[int]
    targets: list[list[bytes]]
    bodies: list[dict[str, Any]]


# ----------------------------------------------------------------------------- worker -> manager
@dataclasses.dataclass(frozen=True)
class WorkerHello(Message):
    """worker -> manager: a rank process registers; committed_step is -1 for a fresh process."""

    KIND: ClassVar[bytes] = b"worker_hello"
    rank: int
    node_rank: int
    pid: int
    incarnation: int
    data_endpoint: str
    committed_step: int
    shard: int


#: The layout of ``WorkerHeartbeat.health``: the epoch the rank is in; seconds since it last
#: committed a step; seconds inside its current collective (-1: in none); the p99 of its timed
#: step times (-1: too few timed since its start or last recovery); the median and tenth
#: percentile of its compute time per step, outside collectives, over its last steps (-1: too
#: few); 1 while it is in a declared long stretch, paused or done (its steps are not timed).
HEALTH_FIELDS = ("epoch", "idle_s", "coll_s", "p99_s", "compute_s", "compute_lo_s", "long")


@dataclasses.dataclass(frozen=True)
class WorkerHeartbeat(Message):
    """worker -> manager: liveness plus the last committed step.

    ``health``: the rank's step timing (:mod:`ms_recover.worker.health`, laid out as
    :data:`HEALTH_FIELDS`), empty when it has none; ``urgent``: relayed at
    once instead of folded into the agent's next report (a stall or a shift in compute time).
    """

    KIND: ClassVar[bytes] = b"worker_hb"
    rank: int
    committed_step: int
    health: list[float] = dataclasses.field(default_factory=list)
    urgent: bool = False


@dataclasses.dataclass(frozen=True)
class GroupCreated(Message):
    """worker -> manager: the rank created a communicator group; the manager keeps the log."""

    KIND: ClassVar[bytes] = b"group_created"
    rank: int
    name: str
    ranks: list[int]


@dataclasses.dataclass(frozen=True)
class Stopped(Message):
    """worker -> manager: the rank is paused at a step boundary (answer to Stop)."""

    KIND: ClassVar[bytes] = b"stopped"
    rank: int
    committed_step: int
    digest: str


@dataclasses.dataclass(frozen=True)
class StateDigest(Message):
    """worker -> manager: the digest of the rank's whole state at committed ``step``, sent every
    ``digest_every_steps`` steps so the manager can compare replicas in steady state."""

    KIND: ClassVar[bytes] = b"state_digest"
    rank: int
    step: int
    digest: str


@dataclasses.dataclass(frozen=True)
class Rebuilt(Message):
    """worker -> manager: the rank rebuilt every group of the log at the current epoch."""

    KIND: ClassVar[bytes] = b"rebuilt"
    rank: int


@dataclasses.dataclass(frozen=True)
class Repaired(Message):
    """worker -> manager: the rank finished its part of the repair plan (sent and/or received)."""

    KIND: ClassVar[bytes] = b"repaired"
    rank: int
    attempt: int
    ok: bool
    committed_step: int
    failed_peer: int
    reason: str


@dataclasses.dataclass(frozen=True)
class WorkerFault(Message):
    """worker -> manager: the rank caught an error it survived (kind: comm, device, hang...)."""

    KIND: ClassVar[bytes] = b"worker_fault"
    rank: int
    kind: str
    message: str


@dataclasses.dataclass(frozen=True)
class WorkerDone(Message):
    """worker -> manager: the rank finished training normally at ``committed_step``.

    ``waits``: it stays a member (it stops, rebuilds and repairs others on command) until the
    manager ends the job with Exit; otherwise it leaves on its own.
    """

    KIND: ClassVar[bytes] = b"worker_done"
    rank: int
    committed_step: int
    waits: bool = False


# ----------------------------------------------------------------------------- manager -> worker
@dataclasses.dataclass(frozen=True)
class Welcome(Message):
    """manager -> worker: registration accepted. ``reboot`` tells a restarted rank to wait."""

    KIND: ClassVar[bytes] = b"welcome"
    ok: bool
    reason: str
    reboot: bool
    world_size: int
    group_log: list[list[Any]]


@dataclasses.dataclass(frozen=True)
class Stop(Message):
    """manager -> worker: abort in-flight collectives, pause at a step boundary, answer Stopped."""

    KIND: ClassVar[bytes] = b"stop"
    reason: str


@dataclasses.dataclass(frozen=True)
class Rebuild(Message):
    """manager -> worker: rebuild the world and every logged group.

    One per node: the manager sends the same REBUILD to the node's ranks (those it names).
    ``world`` lists the member ranks as inclusive ``[first, last]`` runs (see :func:`runs`).
    ``endpoints`` holds the data endpoints of exactly the members those ranks send to in this
    world and the logged groups (:mod:`ms_recover.comm.peers`: ring successor, barrier and
    recursive-doubling partners): O(log n) per rank and group, not the world's. ``group_log``
    holds the logged groups one of them is a member of, in log order. Each rank keeps its own
    part (:func:`ms_recover.comm.peers.own_rebuild`), replacing any it had. ``full`` is True
    for the first Rebuild these ranks acknowledge in their incarnation.
    """

    KIND: ClassVar[bytes] = b"rebuild"
    world: list[list[int]]
    endpoints: dict[int, str]
    full: bool
    group_log: list[list[Any]]


def runs(ranks: typing.Iterable[int]) -> list[list[int]]:
    """Ranks as inclusive ``[first, last]`` runs: ``[5, 0, 1, 2]`` -> ``[[0, 2], [5, 5]]``."""
    out: list[list[int]] = []
    for r in sorted(ranks):
        if out and out[-1][1] == r - 1:
            out[-1][1] = r
        else:
            out.append([r, r])
    return out


def ranks_of(world: list[list[int]], world_size: int) -> list[int]:
    """The ranks of :func:`runs` output; ValueError naming the problem for a malformed list."""
    ranks: list[int] = []
    for run in world:
        if len(run) != 2 or not 0 <= run[0] <= run[1] < world_size:
            raise ValueError(
                f"bad rank run {run!r}: need [first, last], 0 <= first <= last < {world_size}"
            )
        if ranks and run[0] <= ranks[-1]:
            raise ValueError(f"rank runs overlap or are out of order at {run!r}")
        ranks.extend(range(run[0], run[1] + 1))
    return ranks


@dataclasses.dataclass(frozen=True)
class Repair(Message):
    """manager -> worker: bring every rank to ``target_step``.

    ``send_to`` lists ranks this rank must send its whole state to; ``recv_from`` is the rank
    to receive from, or -1. ``endpoints`` are the data endpoints of ``send_to`` (a repair pair
    is usually no ring neighbour, so the Rebuild did not carry them).
    """

    KIND: ClassVar[bytes] = b"repair"
    target_step: int
    attempt: int
    send_to: list[int]
    recv_from: int
    endpoints: dict[int, str] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class Peers(Message):
    """manager -> worker: the answer to GroupCreated, the data endpoints of the members this
    rank sends to in the new group ``name`` (:mod:`ms_recover.comm.peers`)."""

    KIND: ClassVar[bytes] = b"peers"
    name: str
    endpoints: dict[int, str]


@dataclasses.dataclass(frozen=True)
class Resume(Message):
    """manager -> worker: training continues with ``step``."""

    KIND: ClassVar[bytes] = b"resume"
    step: int


@dataclasses.dataclass(frozen=True)
class Exit(Message):
    """manager -> worker: leave the training loop and exit the process with ``code``."""

    KIND: ClassVar[bytes] = b"exit"
    code: int
    reason: str


@dataclasses.dataclass(frozen=True)
class Dump(Message):
    """manager -> worker: save your whole state at your committed step into ``directory``."""

    KIND: ClassVar[bytes] = b"dump"
    step: int
    directory: str


@dataclasses.dataclass(frozen=True)
class Dumped(Message):
    """worker -> manager: the dump file this rank wrote (or ``ok=False`` with a reason)."""

    KIND: ClassVar[bytes] = b"dumped"
    rank: int
    ok: bool
    step: int
    file: str
    format: str
    sha256: str
    size: int
    reason: str


# ----------------------------------------------------------------------------- status (any client)
@dataclasses.dataclass(frozen=True)
class StatusRequest(Message):
    """client -> manager: ask for a status snapshot."""

    KIND: ClassVar[bytes] = b"status_req"


@dataclasses.dataclass(frozen=True)
class StatusReply(Message):
    """manager -> client: the status snapshot (members, steps, epoch, state, last recovery)."""

    KIND: ClassVar[bytes] = b"status"
    status: dict[str, Any]


KINDS: dict[bytes, type[Message]] = {
    cls.KIND: cls
    for cls in (
        AgentHello,
        SpareHello,
        AgentHeartbeat,
        RankExited,
        RankFrozen,
        NodeLeaving,
        RelayUp,
        RelayAcks,
        GroupOpen,
        GroupBeats,
        GroupAck,
        GroupStopped,
        AgentWelcome,
        ManagerBeat,
        SpareAssign,
        BecomeSpare,
        GroupAt,
        GroupStop,
        Rejoin,
        KillRanks,
        StartRanks,
        AgentExit,
        RelayDown,
        WorkerHello,
        WorkerHeartbeat,
        GroupCreated,
        Stopped,
        StateDigest,
        Rebuilt,
        Repaired,
        WorkerFault,
        WorkerDone,
        Welcome,
        Stop,
        Rebuild,
        Repair,
        Peers,
        Resume,
        Exit,
        Dump,
        Dumped,
        StatusRequest,
        StatusReply,
    )
}


def field_types(cls: type[Message]) -> dict[str, Any]:
    """The type hint of each field (``int``, ``list[int]``, ``dict[int, str]``...)."""
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls)}
