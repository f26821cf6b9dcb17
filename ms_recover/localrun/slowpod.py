"""A rank made slow by its pod, for the demo and the benchmarks: a duty-cycled SIGSTOP
(:class:`~ms_recover.localrun.dutycycle.DutyCycle`) of the rank's process while it is a child
of the pod's first agent, from a given step on. A restart in the same pod stays slow; a move
to a new pod (the ``hotSwitch`` sub-health policy) cures it."""

from __future__ import annotations

from ms_recover.localrun.dutycycle import DutyCycle, pod_rank_pids
from ms_recover.localrun.job import LocalJob

#: Stopped a third of the time: 1.5x as slow.
STOP_S, PERIOD_S = 0.004, 0.012


def slow_rank_of_pod(job: LocalJob, node: int, rank: int, from_step: int = 0) -> DutyCycle:
    """A (not started) duty cycle that slows ``rank`` while it runs in ``node``'s current pod,
    once the manager has heard it reach ``from_step``."""
    agent = job.pods.procs[node].pid

    def pid() -> int:
        row = job.status()["ranks"][rank]
        return int(row["pid"]) if int(row["step"]) >= from_step else 0

    return DutyCycle(lambda: pod_rank_pids(agent, pid), STOP_S, PERIOD_S)
