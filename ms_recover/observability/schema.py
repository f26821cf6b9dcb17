"""The event schema: one typed record per kind of event line, and the codec of a line.

Every line of the manager's event log (JSONL, one object a line, keys sorted) is an envelope
and a record::

    {"ts": 1700000000.25, "event": "fault", "job_id": "j", "schema": 1, "epoch": 3,
     "state": "running", <the record's fields>}

* ``ts``: wall-clock seconds when the line was written;
* ``event``: the record's kind (:attr:`Record.EVENT`), one of :data:`RECORDS`;
* ``job_id``: the job the line belongs to, so that the logs of several jobs can be merged;
* ``schema``: :data:`SCHEMA_VERSION`, raised when a field's meaning changes (a line without it
  was written before the field existed: layout 1);
* ``epoch``: the manager's epoch when it wrote the line (absent on a MindIO notice);
* ``state``: the job state, on the records that ``decide`` emits and on ``divergence``.

The manager writes only records (:meth:`~ms_recover.observability.events.EventLog.write`); a
record's fields that are None are left out of its line (``recovery`` keeps its None). Readers
turn a line back into an :class:`EventLine` with :func:`decode` (a parsed object) or
:func:`parse_line` (text): a line that is not JSON, names no known event, lacks a required field
or holds a field of the wrong type raises :class:`SchemaError` with a one-line reason, never
anything else. Keys a reader does not know are dropped, so a newer writer's added optional field
does not make a line unreadable. Pure: standard library only (the manager, its pure ``decide``
and every reader import it).
"""

from __future__ import annotations

import dataclasses
import enum
import json
import math
import types
import typing
from collections.abc import Callable
from typing import Any, ClassVar

#: The layout of an event line; readers compare it before they interpret the fields.
SCHEMA_VERSION = 1

#: The envelope's keys (every other key of a line is a field of its record).
ENVELOPE = ("ts", "event", "job_id", "schema", "epoch", "state")


class Phase(str, enum.Enum):
    """The phases of a recovery, in order; each recovery event reports the duration of each."""

    DETECT = "detect"
    STOP = "stop"
    REPLACE = "replace"
    REBUILD = "rebuild"
    REPAIR = "repair"
    RESUME = "resume"

    def __str__(self) -> str:
        return self.value


#: The phase names in order, as they appear in events.
PHASES: tuple[str, ...] = tuple(p.value for p in Phase)


class JobState(str, enum.Enum):
    """The job's state (an event's ``state``); the manager's model holds the lifecycle and its
    table of transitions (:mod:`ms_recover.manager.model`)."""

    FORMING = "forming"
    RUNNING = "running"
    STOPPING = "stopping"
    REBUILDING = "rebuilding"
    REPAIRING = "repairing"
    RESUMING = "resuming"
    DUMPING = "dumping"
    EXITING = "exiting"
    FINISHED = "finished"

    def __str__(self) -> str:
        return self.value


class FaultKind(str, enum.Enum):
    """What was detected (the ``kind`` of a fault event)."""

    RANK_EXIT = "rank_exit"  # an agent saw a rank process end on its own
    RANK_SILENT = "rank_silent"  # no heartbeat from a rank
    NODE_LOST = "node_lost"  # no heartbeat from an agent
    NODE_RESTARTED = "node_restarted"  # a pod was recreated before its loss was noticed
    HANG = "hang"  # no step progress, or a rank stuck in a recovery phase
    WORKER_ERROR = "worker_error"  # a rank caught an error and reported it (it lives on)
    # A rank reported an error after which it cannot redo its step (MindSpore's RS_UNKNOWN):
    # it lives on, but ``retry`` does not apply.
    WORKER_FATAL = "worker_fatal"
    ESCALATION = "escalation"  # a phase failed with no rank to blame
    REJOIN = "rejoin"  # after a manager restart, a rank did not come back at the job's epoch
    DIVERGED = "diverged"  # a replica's state digest differs from its replicas' (it lives on)
    #: Not a crash: a node's agent got SIGTERM (pod deletion, drain) and leaves at a deadline;
    #: its ranks live on until the round stops them (see :mod:`~ms_recover.manager.leaving`).
    PLANNED_STOP = "planned_stop"
    #: Not a crash: a flagged node's ranks, moved or ended by the job's sub-health policy
    #: (:mod:`~ms_recover.manager.subhealth`); they are alive until their agent ends them.
    SUB_HEALTHY = "sub_healthy"

    def __str__(self) -> str:
        return self.value


@dataclasses.dataclass(frozen=True)
class Record:
    """One event's payload. Fields that are None are left out of the event."""

    EVENT: ClassVar[str] = ""

    def fields(self) -> dict[str, Any]:
        names = _NAMES.get(type(self))
        if names is None:  # read once per class, not per event (a member event per rank)
            names = _NAMES[type(self)] = tuple(f.name for f in dataclasses.fields(self))
        get = self.__getattribute__
        return {k: v for k in names if (v := get(k)) is not None}


_NAMES: dict[type, tuple[str, ...]] = {}  # Record class -> its field names, in order


# ---------------------------------------------------------------- emitted by decide


@dataclasses.dataclass(frozen=True)
class FaultRecord(Record):
    """A fault detected (``kind``: a :class:`FaultKind` value); ``rank`` -1 for a node's."""

    EVENT: ClassVar[str] = "fault"
    kind: str
    rank: int
    node_rank: int
    detail: str
    detect_s: float
    reported_step: int
    # A rank that died: where (its host), its process and how it ended, and its traceback or
    # its log's last lines (bounded). None (left out) for faults with no dead process.
    host: str | None = None
    pid: int | None = None
    exit_code: int | None = None
    signal: int | None = None
    log_tail: str | None = None


@dataclasses.dataclass(frozen=True)
class DecisionRecord(Record):
    """A strategy chosen (``replace``/``nodes`` are None for ``exit``)."""

    EVENT: ClassVar[str] = "decision"
    strategy: str
    reason: str
    replace: list[int] | None = None
    nodes: list[int] | None = None


@dataclasses.dataclass(frozen=True)
class DivergenceRecord(Record):
    """Replicas of ``shard`` at ``step`` hold different state digests: ``ranks`` are repaired
    from ``majority`` (``outcome`` "repair"), or, with no majority, escalated ("escalate")."""

    EVENT: ClassVar[str] = "divergence"
    shard: int
    step: int
    ranks: list[int]
    majority: list[int]
    digests: dict[str, str]
    outcome: str
    reason: str


@dataclasses.dataclass(frozen=True)
class FlaggedRecord(Record):
    """A rank found persistently slow (``reason`` "slow") while it lives on, with the evidence
    (:mod:`ms_recover.manager.detection`)."""

    EVENT: ClassVar[str] = "flagged"
    rank: int
    node: int
    host: str
    step: int
    reason: str
    detail: str
    score: float
    compute_s: float | None = None
    reference_s: float | None = None


@dataclasses.dataclass(frozen=True)
class SubHealthRecord(Record):
    """The job's sub-health policy (``subHealthyStrategy``) acting on flagged ``node``:
    ``action`` is one of ``reported``, ``dump_and_exit``, ``exit``, ``switch_requested``,
    ``switching``, ``switch_timed_out``, ``not_movable`` (:mod:`~ms_recover.manager.subhealth`)."""

    EVENT: ClassVar[str] = "sub_health"
    policy: str
    node: int
    ranks: list[int]
    action: str
    reason: str
    waited_s: float | None = None


@dataclasses.dataclass(frozen=True)
class RepairRetryRecord(Record):
    EVENT: ClassVar[str] = "repair_retry"
    attempt: int
    bad_sources: list[int]
    reason: str


@dataclasses.dataclass(frozen=True)
class JobEndRecord(Record):
    EVENT: ClassVar[str] = "job_end"
    exit_code: int
    reason: str


@dataclasses.dataclass(frozen=True)
class RestoredRecord(Record):
    """A restarted manager found every rank back at the job's epoch: training went on."""

    EVENT: ClassVar[str] = "restored"
    waited_s: float
    steps: dict[str, int]


# ---------------------------------------------------------------- written by the executor


@dataclasses.dataclass(frozen=True)
class WorldRecord(Record):
    """Elastic training: the data-plane world changed."""

    EVENT: ClassVar[str] = "world"
    active: list[int]


@dataclasses.dataclass(frozen=True)
class DumpRecord(Record):
    EVENT: ClassVar[str] = "dump"
    step: int
    manifest: str
    files: list[str]


@dataclasses.dataclass(frozen=True)
class PhaseRecord(Record):
    """A phase of a recovery took ``duration_s``; ``start``/``end`` (wall clock), when a writer
    knows them, place it on the timeline (the manager writes durations only)."""

    EVENT: ClassVar[str] = "phase"
    phase: str
    duration_s: float
    start: float | None = None
    end: float | None = None


@dataclasses.dataclass(frozen=True)
class JobStartRecord(Record):
    """The formation round ended: the job trains."""

    EVENT: ClassVar[str] = "job_start"
    phases: dict[str, float]


@dataclasses.dataclass(frozen=True)
class RecoveryRecord(Record):
    """One recovery round ended (``ok`` False: given up); ``lost_steps`` None when not ok."""

    EVENT: ClassVar[str] = "recovery"
    ok: bool
    strategy: str
    reason: str
    mttr_s: float
    phases: dict[str, float]
    target_step: int
    lost_steps: int | None
    faults: list[str]
    replaced: list[int]

    def fields(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}  # keeps None


@dataclasses.dataclass(frozen=True)
class SparePromotedRecord(Record):
    """A spare node's agent (``pid`` on ``pod_ip``) was given lost node ``node_rank``'s place,
    ``waited_s`` after the incident began (the node's last sign of life); ``spares_left``
    wait on."""

    EVENT: ClassVar[str] = "spare_promoted"
    node_rank: int
    pid: int
    pod_ip: str
    waited_s: float
    spares_left: int


@dataclasses.dataclass(frozen=True)
class SpareRecord(Record):
    """A spare node's agent (``pid`` on ``pod_ip``) registered, or was sent away (``left``:
    the job ended, or it stopped answering) with ``reason``."""

    EVENT: ClassVar[str] = "spare"
    pid: int
    pod_ip: str
    left: bool
    reason: str


@dataclasses.dataclass(frozen=True)
class GoodputRecord(Record):
    """The goodput ledger when the job ended: wall time, ETTR and seconds per category
    (:mod:`ms_recover.observability.goodput`)."""

    EVENT: ClassVar[str] = "goodput"
    wall_s: float
    ettr: float
    seconds: dict[str, float]


# ---------------------------------------------------------------- facts the handlers record


@dataclasses.dataclass(frozen=True)
class ManagerStartRecord(Record):
    """The manager serves on ``port`` with the configuration ``config`` (one line of text)."""

    EVENT: ClassVar[str] = "manager_start"
    port: int
    config: str


@dataclasses.dataclass(frozen=True)
class ConfigWarningRecord(Record):
    """A configured strategy that cannot apply to this job, reported at start."""

    EVENT: ClassVar[str] = "config_warning"
    problem: str


@dataclasses.dataclass(frozen=True)
class MemberRecord(Record):
    """A member registered: ``role`` "worker" (with ``rank``, ``incarnation``, ``reboot``: it
    waits for state) or "agent" (with ``node_rank`` and ``pod_ip``); ``rejoin``: it came back
    to a restarted manager."""

    EVENT: ClassVar[str] = "member"
    role: str
    pid: int
    rejoin: bool
    rank: int | None = None
    incarnation: int | None = None
    reboot: bool | None = None
    node_rank: int | None = None
    pod_ip: str | None = None


@dataclasses.dataclass(frozen=True)
class RejectRecord(Record):
    """A registration refused (of ``rank``, or of the agent of ``node_rank``)."""

    EVENT: ClassVar[str] = "reject"
    reason: str
    rank: int | None = None
    node_rank: int | None = None


@dataclasses.dataclass(frozen=True)
class ManagerRestoreRecord(Record):
    """A member of a running job reached a restarted manager: the job's epoch is adopted."""

    EVENT: ClassVar[str] = "manager_restore"


@dataclasses.dataclass(frozen=True)
class GroupRecord(Record):
    """A communicator group was logged (its name and ranks)."""

    EVENT: ClassVar[str] = "group"
    name: str
    ranks: list[int]


@dataclasses.dataclass(frozen=True)
class RankExitRecord(Record):
    """An agent reported a rank's process ended; ``expected``: not a fault (the manager killed
    it, or it was already lost); ``requested``: the manager asked for it (None after the end)."""

    EVENT: ClassVar[str] = "rank_exit"
    rank: int
    pid: int
    exit_code: int
    signal: int
    expected: bool
    requested: bool | None = None


@dataclasses.dataclass(frozen=True)
class PlannedStopRecord(Record):
    """A node's agent got SIGTERM: it leaves at ``deadline`` (wall clock), ``grace_s`` after."""

    EVENT: ClassVar[str] = "planned_stop"
    node_rank: int
    reason: str
    deadline: float
    grace_s: float


@dataclasses.dataclass(frozen=True)
class TakeoverRecord(Record):
    """This standby manager became active with ``term`` after ``lost_node`` was lost, or
    (``handover``) when the active manager of ``lost_node`` handed over: it was asked to
    stop, and its node is not lost."""

    EVENT: ClassVar[str] = "takeover"
    term: int
    lost_node: int
    reason: str
    handover: bool | None = None


@dataclasses.dataclass(frozen=True)
class ManagerTakeoverRecord(Record):
    """Every survivor registered with the new manager, ``takeover_s`` after the detection
    (``lost_node`` -1 after a handover: every member came back)."""

    EVENT: ClassVar[str] = "manager_takeover"
    lost_node: int
    takeover_s: float


@dataclasses.dataclass(frozen=True)
class StandDownRecord(Record):
    """The manager stops serving with exit ``code`` (the job ended, or a higher term is
    active)."""

    EVENT: ClassVar[str] = "stand_down"
    code: int
    reason: str


@dataclasses.dataclass(frozen=True)
class MindxNoticeRecord(Record):
    """A MindIO ``tft_notify_controller_*`` call (``arg``: its argument's repr)."""

    EVENT: ClassVar[str] = "mindx_notice"
    notice: str
    arg: str


#: Every kind of event line, by its ``event`` name.
RECORDS: dict[str, type[Record]] = {
    cls.EVENT: cls
    for cls in (
        FaultRecord,
        DecisionRecord,
        SparePromotedRecord,
        SpareRecord,
        DivergenceRecord,
        FlaggedRecord,
        SubHealthRecord,
        RepairRetryRecord,
        JobEndRecord,
        RestoredRecord,
        WorldRecord,
        DumpRecord,
        PhaseRecord,
        JobStartRecord,
        RecoveryRecord,
        GoodputRecord,
        ManagerStartRecord,
        ConfigWarningRecord,
        MemberRecord,
        RejectRecord,
        ManagerRestoreRecord,
        GroupRecord,
        RankExitRecord,
        PlannedStopRecord,
        TakeoverRecord,
        ManagerTakeoverRecord,
        StandDownRecord,
        MindxNoticeRecord,
    )
}


class SchemaError(ValueError):
    """An event line that does not follow the schema; the message is one line."""


@dataclasses.dataclass(frozen=True)
class EventLine:
    """One event line: the envelope (see the module docstring) and its typed record."""

    ts: float
    record: Record
    job_id: str = ""
    schema: int = SCHEMA_VERSION
    epoch: int | None = None
    state: str | None = None

    @property
    def event(self) -> str:
        return self.record.EVENT


def encode(line: EventLine) -> dict[str, Any]:
    """The JSON object of ``line`` (as written to the log, keys sorted on writing)."""
    out: dict[str, Any] = {"ts": line.ts, "event": line.event}
    out.update(job_id=line.job_id, schema=line.schema)
    if line.epoch is not None:
        out["epoch"] = line.epoch
    if line.state is not None:
        out["state"] = line.state
    out.update(line.record.fields())
    return out


def dumps(obj: dict[str, Any]) -> str:
    """One log line (no newline) of an encoded event."""
    return json.dumps(obj, sort_keys=True, default=str)


def parse_line(text: str) -> EventLine:
    """The event of one log line; SchemaError (one line) if it is not one."""
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as exc:
        raise SchemaError(f"not JSON ({exc.msg})") from None
    except (ValueError, RecursionError) as exc:  # a 4300-digit number, too deep to parse
        raise SchemaError(f"not usable JSON ({type(exc).__name__})") from None
    return decode(obj)


def decode(obj: object) -> EventLine:
    """The event of a parsed line (or of an event as the log keeps it in memory); SchemaError
    naming the first problem if it does not follow the schema."""
    if not isinstance(obj, dict):
        raise SchemaError(f"a JSON {type(obj).__name__}, not an object")
    kind = obj.get("event")
    if not isinstance(kind, str):
        raise SchemaError("no string 'event' field")
    cls = RECORDS.get(kind)
    if cls is None:
        raise SchemaError(f"unknown event {_show(kind)} (known: {', '.join(sorted(RECORDS))})")
    ts = obj.get("ts")
    if not _is_float(ts) or ts < 0:
        raise SchemaError(f"'ts' is {_show(ts)}, not a number of seconds")
    schema = obj.get("schema", 1)
    if not _is_int(schema) or not 1 <= schema <= SCHEMA_VERSION:
        raise SchemaError(f"schema {_show(schema)} is not one of 1..{SCHEMA_VERSION}")
    for name, _required, check, type_name in _ENVELOPE_SPEC:
        if name in obj and not check(obj[name]):
            raise SchemaError(f"{kind}: '{name}' is {_show(obj[name])}, not {type_name}")
    record = cls(**_record_fields(cls, obj))
    return EventLine(
        float(ts), record, obj.get("job_id", ""), schema, obj.get("epoch"), obj.get("state")
    )


Check = Callable[[object], bool]
#: A field: its name, whether it is required, its type's check and the type's name.
Spec = tuple[tuple[str, bool, Check, str], ...]


def _record_fields(cls: type[Record], obj: dict[str, Any]) -> dict[str, Any]:
    """The fields of ``cls`` in ``obj``, checked against their types."""
    out: dict[str, Any] = {}
    for name, required, check, type_name in _spec(cls):
        if name not in obj:
            if required:
                raise SchemaError(f"{cls.EVENT}: no '{name}' field")
            continue
        value = obj[name]
        if not check(value):
            raise SchemaError(f"{cls.EVENT}: '{name}' is {_show(value)}, not {type_name}")
        out[name] = value
    return out


_SPECS: dict[type[Record], Spec] = {}


def _spec(cls: type[Record]) -> Spec:
    """The fields of ``cls`` with their checks, built once per class."""
    spec = _SPECS.get(cls)
    if spec is None:
        hints = typing.get_type_hints(cls)
        spec = tuple(
            (
                f.name,
                f.default is dataclasses.MISSING,
                _checker(hints[f.name]),
                _name(hints[f.name]),
            )
            for f in dataclasses.fields(cls)
        )
        _SPECS[cls] = spec
    return spec


def _is_float(value: object) -> typing.TypeGuard[float]:
    """A finite number (an int is one; a bool is not)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _is_int(value: object) -> typing.TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def _checker(hint: Any) -> Check:
    """The check of a parsed JSON value against the type ``hint``: str, int, float, bool,
    None, ``X | Y``, ``list[X]`` or ``dict[str, X]``. A float field takes an int; a bool is not
    a number; a float is finite."""
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        arms = tuple(_checker(arm) for arm in typing.get_args(hint))
        return lambda v: any(check(v) for check in arms)
    if origin is list:
        item = _checker(typing.get_args(hint)[0])
        return lambda v: isinstance(v, list) and all(item(x) for x in v)
    if origin is dict:
        key, item = (_checker(arg) for arg in typing.get_args(hint))
        return lambda v: isinstance(v, dict) and all(key(k) and item(x) for k, x in v.items())
    if hint is type(None):
        return lambda v: v is None
    simple: dict[Any, Check] = {float: _is_float, int: _is_int}
    if hint in simple:
        return simple[hint]
    if hint in (str, bool):
        return lambda v: isinstance(v, hint)
    raise TypeError(f"no check for a field of type {hint!r}")


def _name(hint: Any) -> str:
    return str(hint).replace("typing.", "").replace("<class '", "").replace("'>", "")


def _show(value: object, limit: int = 40) -> str:
    """``value``'s repr, cut to ``limit`` characters (a reader prints it escaped)."""
    try:
        text = repr(value)
    except (RecursionError, ValueError):  # nested deeper than repr goes, a 5000-digit int
        return f"a {type(value).__name__}"
    return text if len(text) <= limit else text[: limit - 3] + "..."


#: The envelope's optional keys, checked as a record's fields are.
_ENVELOPE_SPEC: Spec = tuple(
    (name, False, _checker(hint), _name(hint))
    for name, hint in (("job_id", str), ("epoch", int | None), ("state", str | None))
)
