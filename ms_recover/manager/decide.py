"""The manager's pure decision function: ``decide(model, now) -> list[Action]``.

It reads the :class:`JobModel` and the clock and never changes either; the server's executor
applies the returned actions in order. Every action carries its reason as a string, which the
executor logs with ``epoch= rank= state=`` fields.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from ms_recover import exitcodes
from ms_recover.errors import RepairError
from ms_recover.manager.actions import (
    Action,
    Emit,
    Exhaust,
    FinishRound,
    MarkLost,
    SendAgent,
    SendRanks,
    SetActive,
    StartRound,
    Transition,
    UpdateRound,
    WriteManifest,
)
from ms_recover.manager.feasibility import choose_strategy
from ms_recover.manager.model import Fault, JobModel, JobState, Round
from ms_recover.manager.planner import plan_repair, target_step
from ms_recover.protocol.messages import (
    AgentExit,
    Dump,
    Exit,
    KillRanks,
    Rebuild,
    Repair,
    Resume,
    StartRanks,
    Stop,
)
from ms_recover.strategy import Strategy


def decide(m: JobModel, now: float) -> list[Action]:
    """Everything the manager should do now, given the model. Pure."""
    if m.state in (JobState.EXITING, JobState.FINISHED):
        return []
    faults = list(m.pending) + detect_silence(m, now)
    if faults:
        return on_faults(m, faults, now, "fault detected")
    return _PROGRESS[m.state](m, now)


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


# ----------------------------------------------------------------------------- faults
def on_faults(
    m: JobModel, faults: list[Fault], now: float, why: str, exhausted: str = ""
) -> list[Action]:
    """Mark the faults, then start a new round with the first feasible strategy, or exit."""
    cfg = m.config
    actions: list[Action] = []
    hit: set[int] = set()
    for f in faults:
        ranks = cfg.ranks_of(f.node_rank) if f.rank < 0 else (f.rank,)
        hit.update(ranks)
        lost = () if f.kind == "worker_error" else tuple(ranks)  # that rank is still alive
        actions.append(MarkLost(f"{f.kind}: {f.detail}", f, lost, f.kind == "node_lost"))
        steps = [m.ranks[r].committed_step for r in ranks]
        actions.append(
            Emit(
                f.detail,
                "fault",
                {
                    "kind": f.kind,
                    "rank": f.rank,
                    "node_rank": f.node_rank,
                    "detail": f.detail,
                    "detect_s": round(f.detect_s, 4),
                    "step": max(steps),
                },
            )
        )
    prev = m.round if m.in_recovery else None
    if prev is not None:
        hit |= prev.replace_ranks
    all_faults = (prev.faults if prev else []) + faults
    lost_nodes = {f.node_rank for f in all_faults if f.kind == "node_lost"}
    if prev is not None:
        lost_nodes |= {n for n in prev.reschedule_nodes if not m.agents[n].alive}
    strategy, reason = choose_strategy(m, all_faults, hit, lost_nodes, exhausted)
    if strategy is None or strategy is Strategy.EXIT:
        return actions + exit_job(m, exitcodes.JOB_EXIT, f"{why}; {reason}")
    if why != "fault detected":
        reason = f"{why}; {reason}"
    return actions + _new_round(m, now, strategy, all_faults, hit, lost_nodes, prev, reason)


def _new_round(
    m: JobModel,
    now: float,
    strategy: Strategy,
    faults: list[Fault],
    hit: set[int],
    lost_nodes: set[int],
    prev: Round | None,
    reason: str,
) -> list[Action]:
    cfg = m.config
    epoch = m.epoch + 1
    restarts = strategy in (Strategy.RECOVER, Strategy.RECOVER_IN_PLACE)
    replace = set(hit) if restarts else set()
    excluded: frozenset[int] = frozenset()
    if strategy in (Strategy.DUMP, Strategy.ELASTIC_TRAINING):
        excluded = frozenset(hit | {r for r, i in m.ranks.items() if not i.alive})
    corrupt = frozenset(f.rank for f in faults if f.corrupt and strategy is Strategy.RETRY)
    nodes: set[int] = set()
    if strategy is Strategy.RECOVER:
        nodes = {cfg.node_of(r) for r in hit} | lost_nodes
        for node in nodes:
            replace.update(cfg.ranks_of(node))
    first = faults[0] if faults else Fault("escalation", -1, -1, reason, now, 0.0)
    peak = max(i.committed_step for i in m.ranks.values())
    rnd = Round(
        epoch=epoch,
        strategy=strategy,
        faults=faults,
        replace_ranks=frozenset(replace),
        reschedule_nodes=frozenset(nodes),
        started=now,
        incident_start=prev.incident_start if prev else first.ts - first.detect_s,
        detect_s=prev.detect_s if prev else first.detect_s,
        peak_step=max(prev.peak_step, peak) if prev else peak,
        phase_start=now,
        corrupt_ranks=corrupt,
        excluded_ranks=excluded,
        new_active=m.active - excluded,
    )
    survivors = tuple(
        r for r in sorted(m.ranks) if r not in replace | excluded and m.ranks[r].alive
    )
    # A recreated pod already started fresh ranks: its agent needs no command.
    fresh = {f.node_rank for f in faults if f.kind == "node_restarted"}
    actions: list[Action] = [
        Emit(
            reason,
            "decision",
            {
                "strategy": strategy.value,
                "reason": reason,
                "replace": sorted(replace),
                "nodes": sorted(nodes),
            },
        ),
        StartRound(reason, rnd),
        SendRanks("stop survivors", survivors, Stop(reason)),
    ]
    if strategy is Strategy.RECOVER:
        for node in sorted(nodes - fresh):
            if m.agents[node].alive:
                actions.append(
                    SendAgent("reschedule pod", node, AgentExit(exitcodes.RESCHEDULE, reason))
                )
    elif restarts or strategy is Strategy.ELASTIC_TRAINING:
        # Elastic training goes on without waiting, but still asks for replacements.
        todo = replace or {r for r in hit if m.agents[cfg.node_of(r)].alive}
        for node in sorted({cfg.node_of(r) for r in todo} - fresh):
            local = sorted(r for r in todo if cfg.node_of(r) == node)
            actions.append(SendAgent("kill leftovers", node, KillRanks(local, reason)))
            actions.append(SendAgent("restart in place", node, StartRanks(local, reason)))
    actions.append(Transition(reason, JobState.STOPPING))
    return actions


def exit_job(m: JobModel, code: int, reason: str) -> list[Action]:
    """Stop every process of the job with ``code`` (the ``exit`` strategy or the end)."""
    actions: list[Action] = [Emit(reason, "decision", {"strategy": "exit", "reason": reason})]
    if m.round is not None and m.in_recovery:
        actions.append(FinishRound(reason, False))
    actions.append(SendRanks("exit", tuple(m.live_ranks()), Exit(code, reason)))
    for node, agent in sorted(m.agents.items()):
        if agent.alive:
            actions.append(SendAgent("exit", node, AgentExit(code, reason)))
    actions.append(Emit(reason, "job_end", {"exit_code": code, "reason": reason}))
    actions.append(Transition(reason, JobState.EXITING))
    return actions


def escalate(
    m: JobModel, now: float, why: str, stuck: Sequence[int] = (), exhausted: str = ""
) -> list[Action]:
    """A phase failed or timed out: new epoch, same or next strategy (never ``exhausted``)."""
    faults = [Fault("hang", m.config.node_of(r), r, f"{why} (rank {r})", now, 0.0) for r in stuck]
    if not faults and not m.round:
        return exit_job(m, exitcodes.JOB_EXIT, why)
    return on_faults(m, faults, now, why, exhausted)


# ----------------------------------------------------------------------------- progress per state
def _forming(m: JobModel, now: float) -> list[Action]:
    if not all(i.alive for i in m.ranks.values()):
        return []
    reason = f"all {len(m.ranks)} ranks registered"
    rnd = Round(epoch=m.epoch + 1, strategy=None, started=now, incident_start=now, phase_start=now)
    return [StartRound(reason, rnd), _rebuild(m), Transition(reason, JobState.REBUILDING)]


def _rebuild(m: JobModel, active: frozenset[int] | None = None) -> SendRanks:
    world = m.active if active is None else active
    members = {r: i.endpoint for r, i in sorted(m.ranks.items()) if r in world}
    return SendRanks("rebuild", tuple(members), Rebuild(members, m.group_log.to_wire()))


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
    if not unstopped and not missing and rnd.strategy is Strategy.DUMP:
        return actions + _start_dump(m, now, survivors)
    if not unstopped and not missing and rnd.strategy is Strategy.ELASTIC_TRAINING:
        reason = f"elastic-training: data-parallel world is now ranks {sorted(rnd.new_active)}"
        return actions + [
            SetActive(reason, rnd.new_active),
            _rebuild(m, rnd.new_active),
            UpdateRound(reason, {"phase_start": now}),
            Transition(reason, JobState.REBUILDING),
        ]
    if not unstopped and not missing:
        reason = f"survivors stopped, ranks {sorted(rnd.replace_ranks)} replaced"
        return actions + [
            _rebuild(m),
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
        return _grow(m, now, joiners)
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


def _grow(m: JobModel, now: float, joiners: frozenset[int]) -> list[Action]:
    """Elastic training: replacements registered; stop, rebuild with them, repair, resume."""
    world = m.active | joiners
    reason = f"elastic-training: ranks {sorted(joiners)} are back; grow to ranks {sorted(world)}"
    rnd = Round(
        epoch=m.epoch + 1,
        strategy=Strategy.ELASTIC_TRAINING,
        started=now,
        incident_start=now,
        peak_step=max(i.committed_step for i in m.ranks.values()),
        phase_start=now,
        excluded_ranks=frozenset(r for r, i in m.ranks.items() if not i.alive),
        new_active=world,
    )
    return [
        Emit(reason, "decision", {"strategy": "elastic-training", "reason": reason,
                                  "replace": [], "nodes": []}),
        StartRound(reason, rnd),
        SendRanks("stop to grow", tuple(sorted(world)), Stop(reason)),
        Transition(reason, JobState.STOPPING),
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


_PROGRESS: dict[JobState, Callable[[JobModel, float], list[Action]]] = {
    JobState.FORMING: _forming,
    JobState.RUNNING: _running,
    JobState.STOPPING: _stopping,
    JobState.REBUILDING: _rebuilding,
    JobState.REPAIRING: _repairing,
    JobState.RESUMING: _resuming,
    JobState.DUMPING: _dumping,
}
