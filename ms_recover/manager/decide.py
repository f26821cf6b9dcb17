"""The manager's pure decision function: ``decide(model, now) -> list[Action]``.

It reads the :class:`JobModel` and the clock and never changes either; the server's executor
applies the returned actions in order. Every action carries its reason as a string, which the
executor logs with ``epoch= rank= state=`` fields.
"""

from __future__ import annotations

from ms_recover.manager.actions import Action
from ms_recover.manager.model import Fault, JobModel, JobState
from ms_recover.manager.phases import PROGRESS
from ms_recover.manager.rounds import on_faults


def decide(m: JobModel, now: float) -> list[Action]:
    """Everything the manager should do now, given the model. Pure."""
    if m.state in (JobState.EXITING, JobState.FINISHED):
        return []
    faults = list(m.pending) + detect_silence(m, now)
    if faults:
        return on_faults(m, faults, now, "fault detected")
    return PROGRESS[m.state](m, now)


# ----------------------------------------------------------------------------- detection
def detect_silence(m: JobModel, now: float) -> list[Fault]:
    """Lost nodes (silent agents), silent ranks and a job-wide hang, from the clock alone."""
    cfg = m.config
    faults: list[Fault] = []
    lost_nodes: set[int] = set()
    for node, agent in sorted(m.agents.items()):
        silent = now - agent.last_seen
        if agent.alive and silent > cfg.silence_s:
            lost_nodes.add(node)
            faults.append(
                Fault("node_lost", node, -1, f"agent silent for {silent:.2f}s", now, silent)
            )
    for rank, info in sorted(m.ranks.items()):
        silent = now - info.last_seen
        if (
            info.alive
            and not info.done
            and info.node_rank not in lost_nodes
            and silent > max(cfg.rank_silence_s, cfg.silence_s)
        ):
            faults.append(
                Fault(
                    "rank_silent",
                    info.node_rank,
                    rank,
                    f"no heartbeat for {silent:.2f}s",
                    now,
                    silent,
                )
            )
    if m.state is JobState.RUNNING and not faults:
        faults.extend(_detect_hang(m, now))
    return faults


def _detect_hang(m: JobModel, now: float) -> list[Fault]:
    active = [i for i in m.members().values() if i.alive and not i.done]
    if not active:
        return []
    stalled = now - max(i.last_progress for i in active)
    if stalled <= m.config.hang_timeout_s:
        return []
    # A stopped process (SIGSTOP) is also silent; the others wait in a collective for it.
    culprit = min(active, key=lambda i: (i.last_seen, i.committed_step, i.rank))
    return [
        Fault(
            "hang",
            culprit.node_rank,
            culprit.rank,
            f"no step progress for {stalled:.1f}s (stuck at step {culprit.committed_step})",
            now,
            stalled,
        )
    ]
