"""``dump`` (MindCluster's "save last words"): once the survivors stopped, one healthy replica
per data-parallel shard writes its state at the highest committed step, the manager writes
the manifest over the files, and the job ends with :data:`~ms_recover.exitcodes.DUMPED`
(:data:`~ms_recover.exitcodes.STOPPED` when the job was asked to stop: every node leaving, or
the manager's node with no standby manager, :meth:`~ms_recover.manager.model.JobModel.stop_reason`).
The ranks of a node that is leaving (a planned stop) are alive until the job ends: they stop
and may write like any survivor.
"""

from __future__ import annotations

from ms_recover import exitcodes
from ms_recover.manager.actions import Action, ChooseWriters, SendRanks, Transition, WriteManifest
from ms_recover.manager.commands import ASKED_TO_STOP, exit_job
from ms_recover.manager.model import JobModel
from ms_recover.manager.strategies.base import (
    Incident,
    Launch,
    RecoveryStrategy,
    dead_ranks,
    no_source,
    planned_nodes,
)
from ms_recover.observability.schema import JobState
from ms_recover.protocol.messages import Dump as DumpMsg
from ms_recover.strategy import Strategy


class Dump(RecoveryStrategy):
    name = Strategy.DUMP

    def feasible(self, m: JobModel, incident: Incident) -> tuple[bool, str]:
        orphan = no_source(m, incident, _out(m, incident))
        if orphan is not None:
            return False, orphan
        return True, "save the last committed state from one healthy replica per shard"

    def launch(self, m: JobModel, incident: Incident, reason: str) -> Launch:
        return Launch(left_out=frozenset(_out(m, incident)))

    def after_stop(self, m: JobModel, now: float, survivors: list[int]) -> list[Action]:
        """One stopped, trusted replica per shard, at the highest committed step, writes its
        state (a replica found diverged at the stop is never a writer)."""
        rnd = m.round
        assert rnd is not None
        trusted = [r for r in survivors if r not in rnd.untrusted]
        step = max(m.ranks[r].committed_step for r in trusted) if trusted else -1
        chosen: dict[int, int] = {}
        for rank in sorted(trusted):
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
        where = m.config.effective_dump_dir()
        reason = f"dump step {step} from ranks {list(ranks)} into {where}"
        return [
            ChooseWriters(reason, ranks, step, now),
            SendRanks("dump", ranks, DumpMsg(step, where)),
            Transition(reason, JobState.DUMPING),
        ]


def _out(m: JobModel, incident: Incident) -> set[int]:
    """The ranks that cannot write: the incident's and the dead, but not the live ranks of a
    node that is leaving (a planned stop: they stop at a step boundary like the others)."""
    planned = planned_nodes(incident)
    hit = {r for r in incident.hit if m.config.node_of(r) not in planned or not m.ranks[r].alive}
    return hit | dead_ranks(m)


def dumping(m: JobModel, now: float) -> list[Action]:
    """DUMPING: wait for every writer's answer, then write the manifest and end the job."""
    rnd = m.round
    assert rnd is not None
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
    asked = m.stop_reason()
    if asked:  # the final dump of a job asked to stop
        why = f"{ASKED_TO_STOP}: {asked}; {reason}"
        return [WriteManifest(reason)] + exit_job(m, exitcodes.STOPPED, why)
    return [WriteManifest(reason)] + exit_job(m, exitcodes.DUMPED, reason)
