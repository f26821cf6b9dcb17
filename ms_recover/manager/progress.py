"""Progress of a round, one pure handler per job state (see ``decide``).

Each handler waits for the acknowledgements of its phase, then starts the next phase. A
timeout or a failure is returned as a :class:`~ms_recover.manager.rounds.Failure`, which
``decide`` turns into a new epoch in one place. Where strategies differ (after the stop, the
replacement wait, the dump), the round's strategy decides.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from ms_recover.errors import RepairError
from ms_recover.manager.actions import (
    Action,
    Distrust,
    Emit,
    FinishRound,
    NextPhase,
    ReplaceDone,
    RetryRepair,
    SendRanks,
    SetTarget,
    StartRound,
    StopAgain,
    StopDone,
    Transition,
)
from ms_recover.manager.commands import rebuild
from ms_recover.manager.divergence import Report, compare, faults_of
from ms_recover.manager.ending import finish_job
from ms_recover.manager.model import Ack, Fault, JobModel, Round
from ms_recover.manager.planner import plan_repair, target_step
from ms_recover.manager.rounds import Failure, on_faults
from ms_recover.manager.strategies.base import finished_and_gone
from ms_recover.manager.strategies.dump import dumping
from ms_recover.manager.strategies.elastic_training import grow
from ms_recover.manager.strategies.registry import strategy_of
from ms_recover.observability.schema import (
    FaultKind,
    JobState,
    Phase,
    RepairRetryRecord,
    RestoredRecord,
)
from ms_recover.protocol.messages import Repair, Resume, Stop

Progress = list[Action] | Failure

#: A survivor that has not answered a round's STOP within this many agent beats is sent it
#: again, once (:func:`stop_again`).
STOP_AGAIN_BEATS = 2


def _forming(m: JobModel, now: float) -> Progress:
    if m.restore is not None:
        return _restoring(m, now)
    if not all(i.alive for i in m.ranks.values()):
        return []
    reason = f"all {len(m.ranks)} ranks registered"
    rnd = Round(
        epoch=m.epoch + 1,
        strategy=None,
        started=now,
        incident_start=now,
        phase_start=now,
        world=m.active,
    )
    return [StartRound(reason, rnd), *rebuild(m), Transition(reason, JobState.REBUILDING)]


def _restoring(m: JobModel, now: float) -> Progress:
    """A restarted manager: members re-register, and training goes on untouched.

    Once every rank is back (or done) at the job's epoch, the job is RUNNING again with no
    round. Faults (a rank whose agent re-sent its exit, a rank not back within the rejoin
    grace, a rank back from another epoch: a fresh process, or the old manager died
    mid-recovery) are acted on once every rank is accounted for, so the job's epoch is known
    before the new round's: they are then recovered like any other.
    """
    assert m.restore is not None
    grace = max(m.config.silence_s, m.config.rank_silence_s)
    faulty = {
        r for f in m.pending for r in (m.config.ranks_of(f.node_rank) if f.rank < 0 else (f.rank,))
    }
    missing = [r for r, i in m.ranks.items() if not (i.alive or i.done or r in faulty)]
    waited = now - m.restore.since
    if missing and waited <= grace:
        return []
    stale = [
        r
        for r, i in m.ranks.items()
        if i.alive and r not in faulty and m.restore.epochs.get(r, 0) < m.epoch
    ]
    faults = list(m.pending) + [
        Fault(
            FaultKind.REJOIN,
            m.config.node_of(r),
            r,
            f"rank {r} did not re-register within {grace:g}s of the manager restart"
            if r in missing
            else f"rank {r} re-registered from epoch {m.restore.epochs.get(r, 0)}, "
            f"not the job's epoch {m.epoch}",
            now,
            waited,
        )
        for r in missing + stale
    ]
    if faults:
        return on_faults(m, faults, now, "manager restarted")
    reason = f"all {len(m.ranks)} ranks re-registered at epoch {m.epoch}: training goes on"
    steps = {str(r): i.committed_step for r, i in m.ranks.items()}
    return [
        Emit(reason, RestoredRecord(round(waited, 4), steps)),
        Transition(reason, JobState.RUNNING),
    ]


def _stopping(m: JobModel, now: float) -> Progress:
    rnd = _round(m)
    # Decided every tick while a stop-all is answered and while the replacements start: the
    # two common states are decided from one pass that lists nothing (the full pass below
    # gives the same actions, at 16,384 ranks several times the cost).
    some_unstopped = _some_unstopped(m, rnd)
    missing = [r for r in rnd.replace_ranks if not m.ranks[r].alive]
    if some_unstopped and now - rnd.started <= m.config.phase_timeout_s:
        late = _stop_late(m, rnd, now, [], missing)  # survivors still answering, none late
        if late is not None:
            return late
        again = stop_again(m, rnd, now)
        if again:
            return again
        if missing or rnd.replace_done:
            return []
        return [ReplaceDone("replacements registered", now)]
    if not some_unstopped and missing:  # all stopped; replacements still to register
        first: list[Action] = [] if rnd.stop_done else [StopDone("survivors stopped", now)]
        late = _stop_late(m, rnd, now, [], missing)
        return late if late is not None else first
    survivors, unstopped, missing = _stop_state(m, rnd)
    actions: list[Action] = []
    if not unstopped and not rnd.stop_done:
        actions.append(StopDone("survivors stopped", now))
    if not missing and not rnd.replace_done:
        actions.append(ReplaceDone("replacements registered", now))
    if not unstopped and not missing:
        gone = sorted(finished_and_gone(m) & rnd.world)
        if gone:  # they would never rebuild: decide again (a clear end if nothing else fits)
            return Failure(f"ranks {gone} finished training and left", first=tuple(actions))
        checked = _check_replicas(m, now, survivors)
        if isinstance(checked, Failure):
            return dataclasses.replace(checked, first=(*actions, *checked.first))
        if checked:  # a minority distrusted: the next tick goes on with the trusted replicas
            return actions + checked
        return actions + strategy_of(rnd).after_stop(m, now, survivors)
    late = _stop_late(m, rnd, now, unstopped, missing)
    return late if late is not None else actions


def stop_again(m: JobModel, rnd: Round, now: float) -> list[Action]:
    """The round's STOP once more, directly, to each live survivor it went to through its
    heartbeat group's leader that has not answered it within :data:`STOP_AGAIN_BEATS` agent
    beats: a STOP lost on that way (a leader that went quiet after taking it, docs/design.md
    §1c) costs two beats, not the phase timeout. The relay sends a node's second STOP of an
    epoch directly; a rank answers a repeated STOP as the first (STOPPED, again). A STOP sent
    directly is not sent again: it is lost only with its connection."""
    if rnd.stop_again or now - rnd.started < STOP_AGAIN_BEATS * m.config.agent_heartbeat_s:
        return []
    led, epoch, node_of = m.led_stops, m.epoch, m.config.node_of
    if epoch not in led.values():
        return []
    _, unstopped, _ = _stop_state(m, rnd)
    late = tuple(r for r in unstopped if m.ranks[r].alive and led.get(node_of(r)) == epoch)
    if not late:  # checked once: the survivors reached through a leader all answered
        return [StopAgain(f"every survivor reached through a leader answered epoch {epoch}", now)]
    some = ", ".join(map(str, late[:8])) + (", ..." if len(late) > 8 else "")
    why = f"{len(late)} ranks ({some}) did not answer the stop of epoch {epoch}: sent again"
    return [StopAgain(why, now), SendRanks("stop again", late, Stop(rnd.stop_reason))]


def _stop_state(m: JobModel, rnd: Round) -> tuple[list[int], list[int], list[int]]:
    """(survivors, survivors that have not stopped, replacements not registered yet).

    A rank that finished training is a survivor while it waits in ``finish()`` (a repair
    source at the last step); one whose process left is not."""
    out = rnd.replace_ranks | rnd.left_out
    survivors = [
        r
        for r, i in m.ranks.items()
        if (r in m.active or i.alive) and r not in out and not (i.done and not i.alive)
    ]
    unstopped = [r for r in survivors if not m.ranks[r].acked(Ack.STOP, m.epoch)]
    missing = [r for r in rnd.replace_ranks if not m.ranks[r].alive]
    return survivors, unstopped, missing


def _some_unstopped(m: JobModel, rnd: Round) -> bool:
    """Whether a survivor (as :func:`_stop_state` counts them) has not stopped yet; stops at
    the first one found."""
    out, epoch, active, key = rnd.replace_ranks | rnd.left_out, m.epoch, m.active, (Ack.STOP, 0)
    return any(
        i.acks.get(key) != epoch  # not i.acked(Ack.STOP, epoch), without a call per rank
        and (r in active or i.alive)
        and r not in out
        and not (i.done and not i.alive)
        for r, i in m.ranks.items()
    )


def _stop_late(
    m: JobModel, rnd: Round, now: float, unstopped: list[int], missing: list[int]
) -> Failure | None:
    """A Failure once survivors took too long to stop or replacements to register."""
    waited = now - rnd.started
    if unstopped and waited > m.config.phase_timeout_s:
        why = f"ranks {unstopped} did not stop within {m.config.phase_timeout_s:g}s"
        return Failure(why, tuple(unstopped))
    strategy = strategy_of(rnd)
    limit = strategy.replace_limit(m.config)
    if missing and waited > limit:
        why = f"replacements for ranks {missing} did not register within {limit:g}s"
        # The missing ranks are the culprits: the next round starts them again.
        given_up = strategy.name if strategy.exhausted_when_late else None
        return Failure(why, tuple(missing), given_up)
    return None


def _check_replicas(m: JobModel, now: float, survivors: list[int]) -> Progress:
    """Compare the stopped replicas' digests (see :mod:`~ms_recover.manager.divergence`).

    A minority that differs becomes untrusted: no repair source, repaired from the majority.
    Replicas with no majority are never guessed between: they are ``diverged`` faults, which
    leave no repairing strategy feasible for their shard (a Failure, escalated by decide).
    Nothing (an empty list) when the trusted replicas agree.
    """
    rnd = _round(m)
    reports = {
        r: Report(m.ranks[r].shard, m.ranks[r].committed_step, m.ranks[r].stop_digest)
        for r in survivors
        if r not in rnd.untrusted
    }
    verdicts = compare(reports)
    events: list[Action] = [Emit(v.reason, v.record()) for v in verdicts]
    undecided = [f for v in verdicts if not v.decided for f in faults_of(v, m.config.node_of, now)]
    if undecided:
        return Failure("replicas diverged", first=tuple(events), faults=tuple(undecided))
    minority = frozenset(r for v in verdicts for r in v.minority)
    if minority:
        why = f"diverged ranks {sorted(minority)} are repaired from the majority"
        events.append(Distrust(why, minority))
    return events


def _rebuilding(m: JobModel, now: float) -> Progress:
    rnd = _round(m)
    if any(not i.acked(Ack.REBUILD, m.epoch) for i in m.members().values()):
        return _phase_timeout(m, now, Phase.REBUILD, Ack.REBUILD)
    survivors = {r for r in m.ranks if r not in rnd.replace_ranks | rnd.untrusted}
    steps = {r: i.committed_step for r, i in m.members().items()}
    target = target_step(steps, survivors & set(steps))
    first: list[Action] = [SetTarget("rebuilt", target), NextPhase("rebuilt", now, Phase.REBUILD)]
    return _plan(m, target, 0, rnd.bad_sources, first)


def _plan(
    m: JobModel, target: int, attempt: int, bad: frozenset[int], first: list[Action]
) -> Progress:
    rnd = _round(m)
    steps = {r: i.committed_step for r, i in m.members().items()}
    shards = {r: i.shard for r, i in m.members().items()}
    try:
        plan = plan_repair(steps, shards, set(rnd.replace_ranks | rnd.untrusted), target, bad)
    except RepairError as exc:
        return Failure(f"repair impossible: {exc}", first=tuple(first))
    actions = list(first)
    what = f"repair plan attempt {attempt}"
    idle: list[int] = []  # ranks that neither send nor receive: one message for them all
    for rank in steps:
        send_to, recv_from = plan.send_to(rank), plan.recv_from.get(rank, -1)
        if not send_to and recv_from < 0:
            idle.append(rank)
            continue
        endpoints = {q: m.ranks[q].endpoint for q in send_to}  # repair pairs: see comm.peers
        msg = Repair(target, attempt, send_to, recv_from, endpoints)
        actions.append(SendRanks(what, (rank,), msg))
    if idle:
        actions.append(SendRanks(what, tuple(idle), Repair(target, attempt, [], -1, {})))
    reason = f"repair to step {target}: {plan.recv_from or 'nothing to copy'}"
    return actions + [Transition(reason, JobState.REPAIRING)]


def _repairing(m: JobModel, now: float) -> Progress:
    rnd = _round(m)
    attempt = rnd.repair_attempt
    failures = [
        i.repair_failure
        for i in m.ranks.values()
        if i.repair_failure and i.repair_failure[0] == attempt
    ]
    if failures:
        bad = rnd.bad_sources | {peer for _, peer, _ in failures if peer >= 0}
        note = "; ".join(reason for _, _, reason in failures)
        if bad == rnd.bad_sources or now - rnd.phase_start > m.config.phase_timeout_s:
            return Failure(f"repair failed: {note}")
        retry = RepairRetryRecord(attempt + 1, sorted(bad), note)
        first: list[Action] = [Emit(note, retry), RetryRepair(note, attempt + 1, bad)]
        return _plan(m, rnd.target_step, attempt + 1, bad, first)
    if any(not i.acked(Ack.REPAIR, m.epoch, attempt) for i in m.members().values()):
        return _phase_timeout(m, now, Phase.REPAIR, Ack.REPAIR, attempt)
    step = rnd.target_step + 1
    reason = f"every rank at step {rnd.target_step}; resume at {step}"
    return [
        NextPhase(reason, now, Phase.REPAIR),
        SendRanks("resume", tuple(m.members()), Resume(step)),
        Transition(reason, JobState.RESUMING),
    ]


def _resuming(m: JobModel, now: float) -> Progress:
    rnd = _round(m)
    step = rnd.target_step + 1
    if not all(i.done or i.committed_step >= step for i in m.members().values()):
        if now - rnd.phase_start > m.config.hang_timeout_s:
            slow = [r for r, i in m.members().items() if i.committed_step < step and not i.done]
            return Failure(f"ranks {slow} did not commit step {step}", tuple(slow))
        return []
    reason = f"every rank committed step {step}"
    return [
        NextPhase(reason, now, Phase.RESUME),
        FinishRound(reason, True),
        Transition(reason, JobState.RUNNING),
    ]


def _running(m: JobModel, now: float) -> Progress:
    # Decided several times a second at 16,384 ranks: the common answer (every rank is a
    # member, the first is still training) costs no pass over the ranks.
    active = m.active
    if len(active) < len(m.ranks):
        joiners = frozenset(r for r, i in m.ranks.items() if i.alive and r not in active)
        if joiners and not any(i.done for r, i in m.ranks.items() if r in active):
            return grow(m, now, joiners)
    if not all(i.done for r, i in m.ranks.items() if r in active):
        return []
    return finish_job(m, "every rank finished training")


def _phase_timeout(m: JobModel, now: float, phase: Phase, ack: Ack, attempt: int = 0) -> Progress:
    rnd = _round(m)
    if now - rnd.phase_start <= m.config.phase_timeout_s:
        return []
    late = sorted(r for r, i in m.members().items() if not i.acked(ack, m.epoch, attempt))
    why = f"{phase.value} not finished within {m.config.phase_timeout_s:g}s"
    return Failure(why, tuple(late))


def _round(m: JobModel) -> Round:
    assert m.round is not None, f"state {m.state} needs a round"
    return m.round


PROGRESS: dict[JobState, Callable[[JobModel, float], Progress]] = {
    JobState.FORMING: _forming,
    JobState.RUNNING: _running,
    JobState.STOPPING: _stopping,
    JobState.REBUILDING: _rebuilding,
    JobState.REPAIRING: _repairing,
    JobState.RESUMING: _resuming,
    JobState.DUMPING: dumping,
}
