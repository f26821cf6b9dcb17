"""The manager's pure decision function: ``decide(model, now) -> list[Action]``.

It reads the :class:`JobModel` and the clock and never changes either; the
:class:`~ms_recover.manager.executor.Executor` applies the returned actions in order. Every
action carries its reason as a string, which the executor logs with ``epoch= rank= state=``
fields. Pure: no zmq, numpy or msgpack.
"""

from __future__ import annotations

from ms_recover.manager import detection, sparenodes, subhealth
from ms_recover.manager.actions import Action, Emit, Judged
from ms_recover.manager.ending import after_end
from ms_recover.manager.health import RankHealth
from ms_recover.manager.leaving import asked_to_stop, settled
from ms_recover.manager.model import AgentInfo, Fault, JobModel, RankInfo
from ms_recover.manager.progress import PROGRESS
from ms_recover.manager.rounds import Failure, escalate, on_faults
from ms_recover.observability.schema import FaultKind, JobState


def decide(m: JobModel, now: float, judge: bool = True) -> list[Action]:
    """Everything the manager should do now, given the model. Pure. ``judge``: also apply the
    rules that read every rank (silent ranks, adaptive hangs, fail-slow ranks, repeat
    divergence); the server skips them on some ticks of a large job (``Cadence.run``)."""
    if m.state is JobState.EXITING:
        return []
    if m.state is JobState.FINISHED:  # members that appear late are told it is over
        return after_end(m)
    restoring = m.state is JobState.FORMING and m.restore is not None
    # the busy ranks' reports, read once for the hang and fail-slow rules
    pairs = (detection.busy_reports(m) or []) if judge and m.state is JobState.RUNNING else None
    faults = (
        []
        if restoring
        else [*m.pending, *detect_silence(m, now, judge, pairs), *detect_early_exits(m, now)]
    )
    if (m.leaving and not restoring) or m.stop_asked:  # planned stops (docs/design.md §1d)
        ending = asked_to_stop(m, now)
        if ending is not None:
            return ending
        faults = settled(m, faults, now)
    if faults:  # a restarted manager's faults wait for its members (see phases._restoring)
        return on_faults(m, faults, now)
    progress = PROGRESS[m.state](m, now)
    if isinstance(progress, Failure):
        return escalate(m, now, progress)  # every failed phase re-enters the fault path here
    if m.spares:  # a lost node's place goes to a spare node (docs/design.md §1f)
        progress = [*sparenodes.act(m, now), *progress]
    if m.state is JobState.RUNNING and m.switching:  # hot switches (docs/design.md §1e)
        swap = subhealth.switches(m, now)
        if swap:
            return swap
    if m.state is JobState.RUNNING and m.health_rev != m.judged_rev and judge:
        judged, ends = _judge(m, now, pairs)
        return judged if ends else judged + progress
    return progress


def _judge(
    m: JobModel, now: float, pairs: list[tuple[RankInfo, RankHealth]] | None = None
) -> tuple[list[Action], bool]:
    """The fail-slow and repeat-divergence rules over the reports that arrived since they
    last ran, and the sub-health policy's actions on what they flag (with whether those end
    the running state)."""
    found = detection.slow_flags(m, pairs) + subhealth.divergence_flags(m, now)
    flags: list[Action] = [Emit(f"rank {f.rank} flagged {f.reason}: {f.detail}", f) for f in found]
    policy, ends = subhealth.act(m, found, now)
    return [Judged("", m.health_rev), *flags, *policy], ends


# ----------------------------------------------------------------------------- detection
#: How long a rank's exit 0 waits for its WorkerDone before it is a fault. A MindIO
#: processor's WorkerDone and its agent's exit report travel on two connections, so the
#: report can arrive first; anything on its way arrives within milliseconds.
EARLY_EXIT_GRACE_S = 0.25


def detect_early_exits(m: JobModel, now: float) -> list[Fault]:
    """Ranks whose process exited 0 before they finished (``m.early_exits``): a ``rank_exit``
    fault each, once no WorkerDone came within :data:`EARLY_EXIT_GRACE_S` of the report.
    Only ``session.finish()`` (``fit`` calls it; a MindIO processor's end sends the same
    WorkerDone) finishes a rank; any other exit before the job's end is a fault."""
    if not m.early_exits:  # the common case, every tick
        return []
    faults = []
    for rank, (reported, exited) in sorted(m.early_exits.items()):
        info = m.ranks[rank]
        if info.done or now - reported < EARLY_EXIT_GRACE_S:
            continue
        why = f"rank {rank} left with exit code 0 before it finished (no session.finish())"
        faults.append(Fault(FaultKind.RANK_EXIT, info.node_rank, rank, why, now, now - exited))
    return faults


def _leader_went_quiet(m: JobModel, a: AgentInfo, heard: float) -> bool:
    """Whether a silent agent was last heard through a heartbeat group leader that went quiet
    too, less than ``2 x agent_heartbeat_s`` before the silence window began: its agent is
    still moving its beats to the manager (docs/design.md §1c)."""
    leader = m.agents.get(a.via) if a.via >= 0 else None
    if leader is None:
        return False
    beat = m.config.agent_heartbeat_s
    quiet = heard - leader.last_seen > 1.5 * beat
    return quiet and leader.last_seen + 2 * beat >= heard - m.config.silence_s


def detect_silence(
    m: JobModel,
    now: float,
    judge: bool = True,
    pairs: list[tuple[RankInfo, RankHealth]] | None = None,
) -> list[Fault]:
    """Lost nodes (silent agents), silent ranks and a job-wide hang, from the clock; silent
    ranks and hangs by the timing reports only when ``judge`` (see ``decide``; ``pairs``:
    the busy ranks' reports if it read them).

    Silence is judged as of ``m.heard_at`` when that is earlier than ``now``: a member whose
    frames wait unread in the manager's queue is not silent, however long the manager took
    to read them. Called on every tick, so the scan over every rank is one cheap comparison
    per rank; only the (rare) silent ones are then sorted and described.
    """
    cfg = m.config
    heard = min(now, m.heard_at)
    agent_limit = heard - cfg.silence_s
    lost = sorted(
        node
        for node, a in m.agents.items()
        if a.last_seen < agent_limit
        and a.alive
        and not _all_left(m, node)
        and not _leader_went_quiet(m, a, heard)
    )
    faults = [
        Fault(
            FaultKind.NODE_LOST,
            node,
            -1,
            f"agent silent for {now - m.agents[node].last_seen:.2f}s",
            now,
            now - m.agents[node].last_seen,
        )
        for node in lost
    ]
    rank_limit = heard - max(cfg.rank_silence_s, cfg.silence_s)
    # Ranks are judged over a window of seconds: with the timing reports (``judge``), which a
    # large job reads every few seconds, not on every tick (65,536 ranks: ~4 ms a scan).
    ranks = m.ranks.values() if judge else ()
    silent = [i for i in ranks if i.last_seen < rank_limit and i.alive]
    lost_nodes = set(lost)
    for info in sorted(silent, key=lambda i: i.rank):
        if info.done or info.node_rank in lost_nodes:
            continue
        quiet = now - info.last_seen
        faults.append(
            Fault(
                FaultKind.RANK_SILENT,
                info.node_rank,
                info.rank,
                f"no heartbeat for {quiet:.2f}s",
                now,
                quiet,
            )
        )
    if m.state is JobState.RUNNING and not faults:
        hangs = (judge and detection.detect_hang(m, now, heard, pairs)) or _detect_hang(
            m, now, heard
        )
        faults.extend(subhealth.hangs_not_held(m, hangs, now))
    return faults


def _all_left(m: JobModel, node: int) -> bool:
    """Every rank of ``node`` finished and left: its agent ends on its own, nothing is lost."""
    return all(m.ranks[r].done and not m.ranks[r].alive for r in m.config.ranks_of(node))


def _detect_hang(m: JobModel, now: float, heard: float) -> list[Fault]:
    limit = heard - m.config.hang_timeout_s
    ranks, members = m.ranks.values(), m.active
    # One rank that progressed lately settles it (the first, as a rule); the list is built
    # only for a (rare) hang.
    if any(i.last_progress >= limit and _busy(i, members) for i in ranks):
        return []
    active = [i for i in ranks if _busy(i, members)]
    if not active:
        return []
    stalled = now - max(i.last_progress for i in active)
    # The ranks' reports of this epoch, where every one has sent one, say who is not waiting
    # in a collective while the others are (a rank stuck in its own compute, before its step
    # times are known for the adaptive rule); else the least recently heard: a stopped process
    # (SIGSTOP) is also silent, and the others wait in a collective for it.
    pairs = detection.reports(m, active)
    named = detection.culprits(pairs) if pairs else []
    why = "not waiting in a collective while the others are" if named else ""
    culprits = named or [min(active, key=lambda i: (i.last_seen, i.committed_step, i.rank))]
    return [
        Fault(
            FaultKind.HANG,
            c.node_rank,
            c.rank,
            f"no step progress for {stalled:.1f}s (stuck at step {c.committed_step})"
            + (f"; rank {c.rank}: {why}" if why else ""),
            now,
            stalled,
        )
        for c in culprits
    ]


def _busy(info: RankInfo, members: frozenset[int]) -> bool:
    """A live member still training."""
    return info.alive and not info.done and info.rank in members
