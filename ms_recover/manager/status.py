"""A JSON-ready snapshot of the job for ``ms-recover status`` and the demo."""

from __future__ import annotations

from typing import Any

from ms_recover.manager.model import JobModel
from ms_recover.protocol.relay import is_virtual
from ms_recover.strategy import format_strategies


def status_of(m: JobModel, now: float) -> dict[str, Any]:
    """Members, steps, epoch, state and the last recovery, as plain data."""
    return {
        "job_id": m.config.job_id,
        "state": m.state.value,
        "epoch": m.epoch,
        "world_size": m.config.world_size,
        "strategies": format_strategies(m.config.strategies),
        "recoveries": m.recoveries,
        "insecure": m.config.insecure,  # no secret: anyone reaching the port can drive the job
        "encrypted": m.config.control_curve,
        "last_recovery": m.last_recovery,
        #: Ranks flagged fail-slow (rank -> the step it was flagged at), as strings for JSON.
        "flagged": {str(r): step for r, step in sorted(m.flagged.items())},
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
                "relayed": is_virtual(i.identity),  # through its node agent (DESIGN.md §1c)
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
            }
            for _, a in sorted(m.agents.items())
        ],
        "groups": m.group_log.to_wire(),
    }
