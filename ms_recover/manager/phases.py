"""Progress of a round, one pure handler per job state (see ``decide``).

Each handler waits for the acknowledgements of its phase, then starts the next phase; a
timeout or a failure escalates through :func:`~ms_recover.manager.rounds.escalate`.
"""

from __future__ import annotations

from collections.abc import Callable

from ms_recover import exitcodes
from ms_recover.errors import RepairError
from ms_recover.manager.actions import (
    Action,
    Emit,
    Exhaust,
    FinishRound,
    SendAgent,
    SendRanks,
    SetActive,
    StartRound,
    Transition,
    UpdateRound,
    WriteManifest,
)
from ms_recover.manager.divergence import Report, compare, faults_of
from ms_recover.manager.model import JobModel, JobState, Round
from ms_recover.manager.planner import plan_repair, target_step
from ms_recover.manager.rounds import escalate, exit_job, grow, on_faults
from ms_recover.protocol.messages import (
    AgentExit,
    Dump,
    Rebuild,
    Repair,
    Resume,
    runs,
)
from ms_recover.strategy import Strategy


def _forming(m: JobModel, now: float) -> list[Action]:
    if not all(i.alive for i in m.ranks.values()):
        return []
    reason = f"all {len(m.ranks)} ranks registered"
    rnd = Round(epoch=m.epoch + 1, strategy=None, started=now, incident_start=now, phase_start=now)
    return [StartRound(reason, rnd), *_rebuild(m), Transition(reason, JobState.REBUILDING)]


def _rebuild(m: JobModel, active: frozenset[int] | None = None) -> list[SendRanks]:
    """REBUILD for every member: each gets the endpoints registered since its last rebuild
    (a rank that never acknowledged one, in this incarnation, gets all of them)."""
    world = sorted(m.active if active is None else active)
    wire_world, group_log = runs(world), m.group_log.to_wire()
    by_known: dict[int, list[int]] = {}
    for r in world:
        by_known.setdefault(m.ranks[r].acked.get("rebuild", -1), []).append(r)
    sends = []
    for known, ranks in sorted(by_known.items()):
        full = known < 0
        endpoints = {
            q: m.ranks[q].endpoint for q in world if full or m.ranks[q].endpoint_epoch >= known
        }
        msg = Rebuild(wire_world, endpoints, full, group_log)
        sends.append(SendRanks("rebuild", tuple(ranks), msg))
    return sends


def _stopping(m: JobModel, now: float) -> list[Action]:
    rnd = _round(m)
    out = rnd.replace_ranks | rnd.excluded_ranks
    survivors = [
        r for r, i in m.ranks.items() if (r in m.active or i.alive) and r not in out and not i.done
    ]
    unstopped = [r for r in survivors if m.ranks[r].acked.get("stop") != m.epoch]
    missing = [r for r in rnd.replace_ranks if not m.ranks[r].alive]
    actions: list[Action] = []
    if not unstopped and not rnd.stop_done:
        actions.append(UpdateRound("survivors stopped", {"stop_done": now}))
    if not missing and not rnd.replace_done:
        actions.append(UpdateRound("replacements registered", {"replace_done": now}))
    if not unstopped and not missing:
        diverged = _check_replicas(m, now, survivors)
        if diverged:
            return actions + diverged
    if not unstopped and not missing and rnd.strategy is Strategy.DUMP:
        trusted = [r for r in survivors if r not in rnd.corrupt_ranks]
        return actions + _start_dump(m, now, trusted)
    if not unstopped and not missing and rnd.strategy is Strategy.ELASTIC_TRAINING:
        reason = f"elastic-training: data-parallel world is now ranks {sorted(rnd.new_active)}"
        return actions + [
            SetActive(reason, rnd.new_active),
            *_rebuild(m, rnd.new_active),
            UpdateRound(reason, {"phase_start": now}),
            Transition(reason, JobState.REBUILDING),
        ]
    if not unstopped and not missing:
        reason = f"survivors stopped, ranks {sorted(rnd.replace_ranks)} replaced"
        return actions + [
            *_rebuild(m),
            UpdateRound(reason, {"phase_start": now}),
            Transition(reason, JobState.REBUILDING),
        ]
    waited = now - rnd.started
    if unstopped and waited > m.config.phase_timeout_s:
        return escalate(
            m,
            now,
            f"ranks {unstopped} did not stop within {m.config.phase_timeout_s:g}s",
            unstopped,
        )
    limit = (
        m.config.wait_reschedule_timeout_s
        if rnd.strategy is Strategy.RECOVER
        else m.config.phase_timeout_s
    )
    if missing and waited > limit:
        why = f"replacements for ranks {missing} did not register within {limit:g}s"
        if rnd.strategy is not Strategy.RECOVER:
            return escalate(m, now, why)
        # wait-reschedule-timeout passed: the pod will not come back in time; fall through.
        return [Exhaust(why, "recover")] + escalate(m, now, why, exhausted="recover")
    return actions


def _check_replicas(m: JobModel, now: float, survivors: list[int]) -> list[Action]:
    """Compare the stopped replicas' digests (see :mod:`~ms_recover.manager.divergence`).

    A minority that differs joins the round's corrupt ranks: it is no repair source and is
    repaired from the majority. Replicas with no majority are never guessed between: they
    become ``diverged`` faults, which leave no repairing strategy feasible for their shard.
    """
    rnd = _round(m)
    reports = {
        r: Report(m.ranks[r].shard, m.ranks[r].committed_step, m.ranks[r].stop_digest)
        for r in survivors
        if r not in rnd.corrupt_ranks
    }
    verdicts = compare(reports)
    actions: list[Action] = [Emit(v.reason, "divergence", v.fields()) for v in verdicts]
    undecided = [f for v in verdicts if not v.decided for f in faults_of(v, m.config.node_of, now)]
    if undecided:
        return actions + on_faults(m, undecided, now, "replicas diverged")
    minority = frozenset(r for v in verdicts for r in v.minority)
    if minority:
        why = f"diverged ranks {sorted(minority)} are repaired from the majority"
        actions.append(UpdateRound(why, {"corrupt_ranks": rnd.corrupt_ranks | minority}))
    return actions


def _rebuilding(m: JobModel, now: float) -> list[Action]:
    rnd = _round(m)
    if any(i.acked.get("rebuild") != m.epoch for i in m.members().values()):
        return _phase_timeout(m, now, "rebuild")
    survivors = {r for r in m.ranks if r not in rnd.replace_ranks | rnd.corrupt_ranks}
    steps = {r: i.committed_step for r, i in m.members().items()}
    target = target_step(steps, survivors & set(steps))
    return [
        UpdateRound(
            "rebuilt",
            {
                "target_step": target,
                "repair_attempt": 0,
                "phases": {**rnd.phases, "rebuild": now - rnd.phase_start},
                "phase_start": now,
            },
        )
    ] + _plan(m, now, target, 0, rnd.bad_sources)


def _plan(m: JobModel, now: float, target: int, attempt: int, bad: frozenset[int]) -> list[Action]:
    rnd = _round(m)
    steps = {r: i.committed_step for r, i in m.members().items()}
    shards = {r: i.shard for r, i in m.members().items()}
    try:
        plan = plan_repair(steps, shards, set(rnd.replace_ranks | rnd.corrupt_ranks), target, bad)
    except RepairError as exc:
        return escalate(m, now, f"repair impossible: {exc}")
    actions: list[Action] = []
    for rank in steps:
        msg = Repair(target, attempt, plan.send_to(rank), plan.recv_from.get(rank, -1))
        actions.append(SendRanks(f"repair plan attempt {attempt}", (rank,), msg))
    reason = f"repair to step {target}: {plan.recv_from or 'nothing to copy'}"
    return actions + [Transition(reason, JobState.REPAIRING)]


def _repairing(m: JobModel, now: float) -> list[Action]:
    rnd = _round(m)
    key = f"repair{rnd.repair_attempt}"
    failures = [
        i.repair_failure
        for i in m.ranks.values()
        if i.repair_failure and i.repair_failure[0] == rnd.repair_attempt
    ]
    if failures:
        bad = rnd.bad_sources | {peer for _, peer, _ in failures if peer >= 0}
        attempt = rnd.repair_attempt + 1
        note = "; ".join(reason for _, _, reason in failures)
        if bad == rnd.bad_sources or now - rnd.phase_start > m.config.phase_timeout_s:
            return escalate(m, now, f"repair failed: {note}")
        return [
            Emit(
                note,
                "repair_retry",
                {"attempt": attempt, "bad_sources": sorted(bad), "reason": note},
            ),
            UpdateRound(note, {"repair_attempt": attempt, "bad_sources": bad}),
        ] + _plan(m, now, rnd.target_step, attempt, bad)
    if any(i.acked.get(key) != m.epoch for i in m.members().values()):
        return _phase_timeout(m, now, "repair")
    step = rnd.target_step + 1
    reason = f"every rank at step {rnd.target_step}; resume at {step}"
    return [
        UpdateRound(
            reason, {"phases": {**rnd.phases, "repair": now - rnd.phase_start}, "phase_start": now}
        ),
        SendRanks("resume", tuple(m.members()), Resume(step)),
        Transition(reason, JobState.RESUMING),
    ]


def _resuming(m: JobModel, now: float) -> list[Action]:
    rnd = _round(m)
    step = rnd.target_step + 1
    if not all(i.done or i.committed_step >= step for i in m.members().values()):
        if now - rnd.phase_start > m.config.hang_timeout_s:
            slow = [r for r, i in m.members().items() if i.committed_step < step and not i.done]
            return escalate(m, now, f"ranks {slow} did not commit step {step}", slow)
        return []
    reason = f"every rank committed step {step}"
    return [
        UpdateRound(reason, {"phases": {**rnd.phases, "resume": now - rnd.phase_start}}),
        FinishRound(reason, True),
        Transition(reason, JobState.RUNNING),
    ]


def _start_dump(m: JobModel, now: float, survivors: list[int]) -> list[Action]:
    """One stopped replica per shard, at the highest committed step, writes its state."""
    step = max(m.ranks[r].committed_step for r in survivors)
    chosen: dict[int, int] = {}
    for rank in sorted(survivors):
        info = m.ranks[rank]
        if info.committed_step == step:
            chosen.setdefault(info.shard, rank)
    missing = sorted({i.shard for i in m.ranks.values()} - set(chosen))
    if missing:
        return exit_job(
            m,
            exitcodes.JOB_EXIT,
            f"dump impossible: shards {missing} have no stopped replica at step {step}",
        )
    ranks = tuple(sorted(chosen.values()))
    reason = f"dump step {step} from ranks {list(ranks)} into {m.config.effective_dump_dir()}"
    return [
        UpdateRound(reason, {"dump_ranks": ranks, "target_step": step, "phase_start": now}),
        SendRanks("dump", ranks, Dump(step, m.config.effective_dump_dir())),
        Transition(reason, JobState.DUMPING),
    ]


def _dumping(m: JobModel, now: float) -> list[Action]:
    rnd = _round(m)
    answers = [m.ranks[r].dump for r in rnd.dump_ranks]
    failed = [a for a in answers if a is not None and not a["ok"]]
    if failed:
        why = "; ".join(str(a["reason"]) for a in failed)
        return exit_job(m, exitcodes.JOB_EXIT, f"dump failed: {why}")
    if any(a is None for a in answers):
        if now - rnd.phase_start > m.config.phase_timeout_s:
            late = [r for r in rnd.dump_ranks if m.ranks[r].dump is None]
            return exit_job(m, exitcodes.JOB_EXIT, f"ranks {late} did not finish their dump")
        return []
    reason = f"state of step {rnd.target_step} saved by ranks {list(rnd.dump_ranks)}"
    return [WriteManifest(reason)] + exit_job(m, exitcodes.DUMPED, reason)


def _running(m: JobModel, now: float) -> list[Action]:
    members = m.members().values()
    joiners = frozenset(r for r, i in m.ranks.items() if i.alive and r not in m.active)
    if joiners and not any(i.done for i in members):
        return grow(m, now, joiners)
    if not all(i.done for i in members):
        return []
    reason = "every rank finished training"
    actions: list[Action] = [
        SendAgent(reason, n, AgentExit(exitcodes.OK, reason))
        for n, a in sorted(m.agents.items())
        if a.alive
    ]
    return actions + [
        Emit(reason, "job_end", {"exit_code": 0, "reason": reason}),
        Transition(reason, JobState.FINISHED),
    ]


def _phase_timeout(m: JobModel, now: float, phase: str) -> list[Action]:
    rnd = _round(m)
    if now - rnd.phase_start <= m.config.phase_timeout_s:
        return []
    key = "rebuild" if phase == "rebuild" else f"repair{rnd.repair_attempt}"
    late = sorted(r for r, i in m.members().items() if i.acked.get(key) != m.epoch)
    return escalate(m, now, f"{phase} not finished within {m.config.phase_timeout_s:g}s", late)


def _round(m: JobModel) -> Round:
    assert m.round is not None, f"state {m.state} needs a round"
    return m.round


PROGRESS: dict[JobState, Callable[[JobModel, float], list[Action]]] = {
    JobState.FORMING: _forming,
    JobState.RUNNING: _running,
    JobState.STOPPING: _stopping,
    JobState.REBUILDING: _rebuilding,
    JobState.REPAIRING: _repairing,
    JobState.RESUMING: _resuming,
    JobState.DUMPING: _dumping,
}
