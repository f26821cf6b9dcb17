"""Human-readable, live rendering of manager events (the demo's timeline); text that ranks or
agents chose (details, reasons) is printed escaped."""

from __future__ import annotations

from typing import TextIO

from ms_recover.observability.events import Event
from ms_recover.observability.safetext import safe
from ms_recover.observability.schema import (
    PHASES,
    DecisionRecord,
    DivergenceRecord,
    EventLine,
    FaultRecord,
    FlaggedRecord,
    JobEndRecord,
    JobStartRecord,
    ManagerStartRecord,
    MemberRecord,
    PlannedStopRecord,
    RecoveryRecord,
    RepairRetryRecord,
    SchemaError,
    SubHealthRecord,
    decode,
)


class Timeline:
    """Prints one line per interesting event, with seconds since the first event."""

    def __init__(self, out: TextIO) -> None:
        self.out = out
        self.t0: float | None = None

    def on_event(self, e: Event) -> None:
        """An event listener; an event that does not follow the schema prints nothing."""
        try:
            line = decode(e)
        except SchemaError:
            return
        if self.t0 is None:
            self.t0 = line.ts
        text = describe(line)
        if text:
            print(f"[{line.ts - self.t0:7.2f}s] {text}", file=self.out, flush=True)


def describe(e: EventLine) -> str:
    """One line for an event, or "" for events not worth a line."""
    r = e.record
    if isinstance(r, ManagerStartRecord):
        return f"manager up: {r.config}"
    if isinstance(r, JobStartRecord):
        return f"all ranks registered, communicators built: training starts (epoch {e.epoch})"
    if isinstance(r, FaultRecord):
        return f"FAULT    {safe(r.detail)}"
    if isinstance(r, PlannedStopRecord):
        # The agent's reason is its own text: not printed here (the event keeps it).
        return f"LEAVING  node {r.node_rank} got SIGTERM (planned stop), leaves in {r.grace_s:g}s"
    if isinstance(r, DecisionRecord):
        return f"DECIDE   {safe(r.reason)}"
    if isinstance(r, MemberRecord) and r.reboot:
        return f"REJOIN   rank {r.rank} registered again (pid {r.pid}), waiting for state"
    if isinstance(r, DivergenceRecord):
        return f"DIVERGED {safe(r.reason)}"
    if isinstance(r, FlaggedRecord):
        return f"FLAGGED  rank {r.rank} (node {r.node}) at step {r.step}: {safe(r.detail)}"
    if isinstance(r, SubHealthRecord):
        return f"SUBHEALTH {r.policy}: {safe(r.reason)}"
    if isinstance(r, RepairRetryRecord):
        return f"RETRY    repair attempt {r.attempt}: {safe(r.reason)}"
    if isinstance(r, RecoveryRecord):
        return _recovery(r)
    if isinstance(r, JobEndRecord):
        return f"job ended: {safe(r.reason)} (exit {r.exit_code})"
    return ""


def _recovery(r: RecoveryRecord) -> str:
    phases = " | ".join(f"{p} {r.phases.get(p, 0.0):.3f}s" for p in PHASES)
    verdict = (
        f"RECOVERED with {r.strategy} in {r.mttr_s:.2f}s, resumed at step "
        f"{r.target_step + 1}, lost steps {r.lost_steps}"
        if r.ok
        else f"RECOVERY FAILED ({r.strategy}): {safe(r.reason)}"
    )
    return f"{verdict}\n{'':12}{phases}"
