"""A JSON-ready snapshot of the job for ``ms-recover status`` and the demo."""

from __future__ import annotations

from typing import Any

from ms_recover.manager.model import JobModel
from ms_recover.observability.events import Event, EventLog
from ms_recover.protocol.relay import is_virtual
from ms_recover.strategy import format_strategies

#: Fault events a status snapshot carries (the latest ones), each with its bounded log tail.
LAST_FAULTS = 3


def status_of(m: JobModel, now: float, events: EventLog | None = None) -> dict[str, Any]:
    """Members, steps, epoch, state and the last recovery, as plain data; with ``events``,
    also the latest faults and the ranks flagged and not replaced since."""
    return {
        **(_observed(events) if events is not None else _flagged_in(m)),
        "job_id": m.config.job_id,
        "state": m.state.value,
        "epoch": m.epoch,
        "world_size": m.config.world_size,
        "strategies": format_strategies(m.config.strategies),
        "recoveries": m.recoveries,
        "insecure": m.config.insecure,  # no secret: anyone reaching the port can drive the job
        "encrypted": m.config.control_curve,
        "last_recovery": m.last_recovery,
        "sub_healthy": m.config.sub_healthy.value,  # the policy for flagged nodes
        # hotSwitch: node -> seconds since its new pod was asked for (and whether it is here)
        "hot_switch": [
            {"node": n, "waiting_s": round(now - t, 3), "pod_up": n in m.backups}
            for n, t in sorted(m.switching.items())
        ],
        "manager": {"role": "active", "term": 0, "node": m.config.node_rank, **m.manager},
        "ranks": [
            {
                "rank": i.rank,
                "node_rank": i.node_rank,
                "alive": i.alive,
                "done": i.done,
                "step": i.committed_step,
                "pid": i.pid,
                "incarnation": i.incarnation,
                "silent_s": round(now - i.last_seen, 3) if i.registered else None,
                "relayed": is_virtual(i.identity),  # through its node agent (docs/design.md §1c)
            }
            for _, i in sorted(m.ranks.items())
        ],
        "agents": [
            {
                "node_rank": a.node_rank,
                "alive": a.alive,
                "pid": a.pid,
                "pod_ip": a.pod_ip,
                "is_scheduler": a.is_scheduler,
                "silent_s": round(now - a.last_seen, 3) if a.registered else None,
                # Its heartbeats come through this node's agent (docs/design.md §1c), or None.
                "beats_via": a.via if a.via >= 0 else None,
            }
            for _, a in sorted(m.agents.items())
        ],
        # Spare nodes waiting to take a lost node's place (docs/design.md §1f), oldest first.
        "spares": [
            {
                "pid": s.pid,
                "pod_ip": s.pod_ip,
                "warm": s.warm,
                "waiting_s": round(now - s.since, 3),
                "silent_s": round(now - s.last_seen, 3),
            }
            for s in sorted(m.spares.values(), key=lambda s: (s.since, s.pid))
        ],
        "groups": m.group_log.to_wire(),
    }


def _flagged_in(m: JobModel) -> dict[str, Any]:
    """Without the event log: the ranks the model flagged, with their node and step."""
    flags = [
        {"rank": r, "node": m.ranks[r].node_rank, "step": step}
        for r, step in sorted(m.flagged.items())
    ]
    return {"flagged": flags}


def _observed(events: EventLog) -> dict[str, Any]:
    faults = events.recent("fault")[-LAST_FAULTS:]
    return {"last_faults": faults, "flagged": flagged(events.recent())}


def flagged(events: list[Event]) -> list[Event]:
    """The latest ``flagged`` event of each rank that no recovery replaced since, by rank."""
    out: dict[int, Event] = {}
    for e in events:
        if e["event"] == "flagged" and isinstance(e.get("rank"), int):
            out[e["rank"]] = e
        elif e["event"] == "recovery":
            for rank in e.get("replaced") or ():
                out.pop(rank, None)
    return [out[r] for r in sorted(out)]
