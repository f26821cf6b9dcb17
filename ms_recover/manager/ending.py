"""The end of a job: who is told it is over, and how long the manager goes on serving.

A rank that finished training stays a member inside ``session.finish()`` (its WorkerDone says
it ``waits``): if another rank fails at the very end, it stops, rebuilds and is a repair
source like any survivor. Only once every rank of the world finished does the manager release
the members:

* every agent gets ``AgentExit(0)`` (it waits, bounded, for its ranks to leave on their own),
  and so does every spare node's;
* every waiting rank gets ``Exit(0)``, and its ``finish()`` returns;
* a member that appears after the end (a rescheduled pod that comes back late, its ranks) is
  told the same at once, so it exits 0 instead of waiting for a manager that is gone.

After the end the manager serves on until every rank's exit was reported and no node that was
lost or rescheduled can still come back (bounded: see :func:`may_stop`). Pure: no zmq, numpy
or msgpack.
"""

from __future__ import annotations

from ms_recover import exitcodes
from ms_recover.manager import sparenodes
from ms_recover.manager.actions import Action, Emit, SendAgent, SendRanks, Transition
from ms_recover.manager.model import JobModel
from ms_recover.observability.schema import JobEndRecord, JobState
from ms_recover.protocol.messages import AgentExit, Exit

#: Why a member that appears after the end is sent away.
LATE = "the job already finished"


def finish_job(m: JobModel, reason: str) -> list[Action]:
    """Every rank finished training: release every member and end the job with 0."""
    return release(m, reason) + [
        Emit(reason, JobEndRecord(exitcodes.OK, reason)),
        Transition(reason, JobState.FINISHED),
    ]


def release(m: JobModel, reason: str) -> list[Action]:
    """Tell every live member not yet released that the job is over (exit 0).

    Ranks that finished without waiting (a MindIO processor) leave on their own and are not
    sent anything; a live rank that is not done registered after the end: it is released too.
    """
    actions: list[Action] = [
        SendAgent(reason, n, AgentExit(exitcodes.OK, reason))
        for n, a in sorted(m.agents.items())
        if a.alive and not a.released
    ]
    ranks = tuple(
        r
        for r, i in m.ranks.items()
        if i.alive and i.identity and not i.released and (i.waits or not i.done)
    )
    if ranks:
        actions.append(SendRanks(reason, ranks, Exit(exitcodes.OK, reason)))
    return actions + sparenodes.release_all(m, exitcodes.OK, reason)


def after_end(m: JobModel) -> list[Action]:
    """What ``decide`` does once the job FINISHED: release the members that appear late."""
    return release(m, LATE)


def away_nodes(m: JobModel, now: float) -> list[int]:
    """Nodes lost or sent to be rescheduled, whose pod may still come back: gone less than
    ``silence_s + wait_reschedule_timeout_s`` ago (how long a pod is given to return)."""
    window = m.config.silence_s + m.config.wait_reschedule_timeout_s
    return [
        n
        for n, a in sorted(m.agents.items())
        if a.registered and not a.alive and not a.released and now - a.last_seen <= window
    ]


def may_stop(m: JobModel, now: float, waited: float) -> bool:
    """Whether the manager may stop serving, ``waited`` seconds after the job ended.

    After a failure: at once. After a normal end: once no node may still come back (see
    :func:`away_nodes`) and every rank's real exit was reported, or ``phase_timeout_s``
    passed (the agents wait that long for their ranks to leave).
    """
    if m.state is not JobState.FINISHED:
        return True
    if away_nodes(m, now):
        return False
    reported = all(i.exit_code is not None for i in m.ranks.values())
    return reported or waited > m.config.phase_timeout_s
