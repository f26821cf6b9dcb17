"""An agent's planned stop: the SIGTERM of a pod deletion, a node drain or a preemption.

Kubernetes sends SIGKILL ``termination_grace_s`` after SIGTERM. The agent leaves a safety
margin before it (:func:`leave_margin_s`) to kill and reap its ranks itself, and tells the
manager how long it has (:meth:`PlannedStop.message`); see :class:`~ms_recover.agent.agent.
Agent` for the rest. Pure: no zmq.
"""

from __future__ import annotations

import dataclasses

from ms_recover.protocol import messages as M

#: Exit code of an agent that left at its planned-stop deadline (128 + SIGTERM, as a shell).
LEFT_AT_DEADLINE = 128 + 15


def leave_margin_s(grace_s: float) -> float:
    """How long before the pod's SIGKILL a leaving agent kills its ranks itself: a fifth of
    the grace, at most 5 s (killing, reaping and reporting the ranks takes well under 1 s)."""
    return min(5.0, grace_s / 5)


@dataclasses.dataclass
class PlannedStop:
    """A SIGTERM the agent got (``asked``: monotonic time) and, once the agent loop took it
    up (:meth:`begin`), the deadline at which it kills its ranks and leaves."""

    asked: float
    reason: str
    deadline: float | None = None

    def begin(self, grace_s: float, welcomed: bool, now: float) -> str:
        """Fix the deadline (at once when no manager welcomed the agent: nobody to wait for);
        the log line that says so."""
        self.deadline = self.asked + grace_s - leave_margin_s(grace_s) if welcomed else now
        then = (
            "its ranks run until the manager stops the job"
            if welcomed
            else "no manager welcomed this agent, so it does not wait"
        )
        return f"deadline in {self.deadline - now:.1f} s (termination grace {grace_s:g} s); {then}"

    def due(self, now: float) -> bool:
        """Whether the deadline has come (never before :meth:`begin`)."""
        return self.deadline is not None and now >= self.deadline

    def message(self, node_rank: int, now: float) -> M.NodeLeaving:
        """What the manager is told (again after a manager restart): the time left."""
        assert self.deadline is not None
        left = max(0.0, self.deadline - now)
        return M.NodeLeaving(node_rank, f"{self.reason}: pod deletion or node drain", left)
