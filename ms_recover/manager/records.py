"""The events the manager writes, as typed records, and the recovery phases (defined once).

Every record names its event (``EVENT``) and turns into the fields of one JSONL line with
:meth:`Record.fields`; the event log adds ``ts``, the executor adds ``epoch`` (and ``state``
for the records that ``decide`` emits). Readers (timeline, report, metrics, the benches) find
the phase names here. Pure: standard library only.
"""

from __future__ import annotations

import dataclasses
import enum
from typing import Any, ClassVar


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


@dataclasses.dataclass(frozen=True)
class Record:
    """One event's payload. Fields that are None are left out of the event."""

    EVENT: ClassVar[str] = ""

    def fields(self) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        return {k: v for k, v in out.items() if v is not None}


@dataclasses.dataclass(frozen=True)
class FaultRecord(Record):
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
    compute_s: float
    reference_s: float


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
    EVENT: ClassVar[str] = "phase"
    phase: str
    duration_s: float


@dataclasses.dataclass(frozen=True)
class JobStartRecord(Record):
    """The formation round ended: the job trains."""

    EVENT: ClassVar[str] = "job_start"
    phases: dict[str, float]


@dataclasses.dataclass(frozen=True)
class RestoredRecord(Record):
    """A restarted manager found every rank back at the job's epoch: training went on."""

    EVENT: ClassVar[str] = "restored"
    waited_s: float
    steps: dict[str, int]


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
