"""Human-readable, live rendering of manager events (the demo's timeline)."""

from __future__ import annotations

from typing import TextIO

from ms_recover.manager.records import PHASES
from ms_recover.observability.events import Event


class Timeline:
    """Prints one line per interesting event, with seconds since the first event."""

    def __init__(self, out: TextIO) -> None:
        self.out = out
        self.t0: float | None = None

    def on_event(self, e: Event) -> None:
        if self.t0 is None:
            self.t0 = e["ts"]
        text = describe(e)
        if text:
            print(f"[{e['ts'] - self.t0:7.2f}s] {text}", file=self.out, flush=True)


def describe(e: Event) -> str:
    """One line for an event, or "" for events not worth a line."""
    kind = e["event"]
    if kind == "manager_start":
        return f"manager up: {e['config']}"
    if kind == "job_start":
        return f"all ranks registered, communicators built: training starts (epoch {e['epoch']})"
    if kind == "fault":
        return f"FAULT    {e['detail']}"
    if kind == "planned_stop":
        # The agent's reason is its own text: not printed here (the event keeps it).
        node, left = e["node_rank"], e["grace_s"]
        return f"LEAVING  node {node} got SIGTERM (planned stop), leaves in {left:g}s"
    if kind == "decision":
        return f"DECIDE   {e['reason']}"
    if kind == "member" and e.get("reboot"):
        return f"REJOIN   rank {e['rank']} registered again (pid {e['pid']}), waiting for state"
    if kind == "divergence":
        return f"DIVERGED {e['reason']}"
    if kind == "repair_retry":
        return f"RETRY    repair attempt {e['attempt']}: {e['reason']}"
    if kind == "recovery":
        phases = " | ".join(f"{p} {e['phases'][p]:.3f}s" for p in PHASES)
        verdict = (
            f"RECOVERED with {e['strategy']} in {e['mttr_s']:.2f}s, resumed at step "
            f"{e['target_step'] + 1}, lost steps {e['lost_steps']}"
            if e["ok"]
            else f"RECOVERY FAILED ({e['strategy']}): {e['reason']}"
        )
        return f"{verdict}\n{'':12}{phases}"
    if kind == "job_end":
        return f"job ended: {e['reason']} (exit {e['exit_code']})"
    return ""
