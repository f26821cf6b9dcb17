"""The manager's decisions, driven through ``decide(model, now)`` and the real executor.

A :class:`Job` wraps a real :class:`Executor` with a fake sender (no socket), a fake clock,
and hand-set member facts. ``tick()`` runs ``executor.execute(decide(model, now))`` and the
fake sender records every message the executor sends.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import pytest

from ms_recover import exitcodes
from ms_recover.comm.peers import own_rebuild
from ms_recover.config import JobConfig
from ms_recover.manager import actions as A
from ms_recover.manager.decide import decide
from ms_recover.manager.executor import PHASES, Executor
from ms_recover.manager.model import TRANSITIONS, Ack, Fault, IllegalTransition, JobModel
from ms_recover.observability.events import EventLog
from ms_recover.observability.schema import JobState
from ms_recover.protocol import messages as M
from ms_recover.strategy import parse_strategies

T0 = 1000.0
RIP, REC = "recover-in-place", "recover"


class Clock:
    def __init__(self) -> None:
        self.t = T0

    def __call__(self) -> float:
        return self.t


class FakeSender:
    """Records (identity, message) for every send, as the server's ROUTER would send them."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, M.Message]] = []

    def send(self, identities: Sequence[bytes], msg: M.Message) -> None:
        self.sent.extend((identity.decode(), msg) for identity in identities)


class Job:
    """2 nodes x 2 ranks by default; node 0 hosts the scheduler."""

    def __init__(self, strategies: str, **changes: Any) -> None:
        base: dict[str, Any] = dict(
            job_id="unit",
            node_nums=2,
            proc_per_node=2,
            manager_port=0,
            heartbeat_s=0.5,
            liveness=3,
            rank_silence_s=2.0,
            hang_timeout_s=30.0,
            phase_timeout_s=10.0,
            wait_reschedule_timeout_s=20.0,
            max_tries=2,
            strategies=parse_strategies(strategies),
        )
        base.update(changes)
        self.config = JobConfig(**base)
        self.clock = Clock()
        self.model = JobModel(self.config)
        self.sender = FakeSender()
        self.executor = Executor(self.model, EventLog(), self.clock, self.sender)
        self.actions: list[A.Action] = []
        self._pid = 100

    @property
    def sent(self) -> list[tuple[str, M.Message]]:
        return self.sender.sent

    # ------------------------------------------------------------ facts
    @property
    def now(self) -> float:
        return self.clock.t

    def register_agent(self, node: int) -> None:
        agent = self.model.agents[node]
        self._pid += 1
        agent.registered = agent.alive = True
        agent.pid, agent.last_seen, agent.pod_ip = self._pid, self.now, f"10.0.0.{node}"
        agent.is_scheduler = node == self.config.sched_node_rank
        self.executor.agent_ids[node] = f"a{node}".encode()

    def register_rank(self, rank: int, step: int = -1, shard: int = 0, endpoint: str = "") -> None:
        info = self.model.ranks[rank]
        self._pid += 1
        info.registered = info.alive = True
        info.identity = f"r{rank}".encode()
        info.pid, info.incarnation = self._pid, info.incarnation + 1
        info.endpoint = endpoint or f"tcp://h{rank}:5{rank}"
        info.endpoint_epoch, info.shard, info.committed_step = self.model.epoch, shard, step
        info.last_seen = info.last_progress = self.now
        info.acks, info.repair_failure, info.done = {}, None, False

    def advance(self, dt: float, silent: tuple[str, ...] = ()) -> None:
        """Move the clock; every live member except ``silent`` ("a1", "r3") heartbeats."""
        self.clock.t += dt
        for node, agent in self.model.agents.items():
            if agent.alive and f"a{node}" not in silent:
                agent.last_seen = self.now
        for rank, info in self.model.ranks.items():
            if info.alive and f"r{rank}" not in silent:
                info.last_seen = self.now

    def commit(self, step: int, ranks: Any = None) -> None:
        for rank in self.model.ranks if ranks is None else ranks:
            info = self.model.ranks[rank]
            info.committed_step, info.last_progress = step, self.now

    def ack(self, phase: Ack, ranks: Any = None, attempt: int = 0) -> None:
        for rank in self.model.ranks if ranks is None else ranks:
            self.model.ranks[rank].ack(phase, self.model.epoch, attempt)

    def stopped(self, ranks: Any, step: int) -> None:
        """Survivors answer Stop with their committed step (what
        ``WorkerHandlers.on_stopped`` records)."""
        for rank in ranks:
            info = self.model.ranks[rank]
            info.ack(Ack.STOP, self.model.epoch)
            info.committed_step = step

    def fault(
        self,
        kind: str,
        rank: int,
        detail: str = "",
        node: int | None = None,
        detect_s: float = 0.05,
    ) -> Fault:
        node = self.config.node_of(rank) if node is None else node
        fault = Fault(kind, node, rank, detail or f"{kind} on rank {rank}", self.now, detect_s)
        self.model.pending.append(fault)
        return fault

    # ------------------------------------------------------------ driving
    def tick(self) -> list[A.Action]:
        actions = decide(self.model, self.now)
        self.actions = actions
        self.executor.execute(actions)
        return actions

    def take(self) -> list[tuple[str, M.Message]]:
        sent, self.sender.sent = self.sender.sent, []
        return sent

    def events(self, name: str) -> list[dict[str, Any]]:
        return self.executor.events.recent(name)

    def decision(self) -> dict[str, Any]:
        return self.events("decision")[-1]

    def form(self) -> None:
        """Register everyone and run the formation round to RUNNING (epoch 1, step 0)."""
        for node in range(self.config.node_nums):
            self.register_agent(node)
        for rank in range(self.config.world_size):
            self.register_rank(rank)
        self.tick()
        assert self.model.state is JobState.REBUILDING
        self.ack(Ack.REBUILD)
        self.tick()
        assert self.model.state is JobState.REPAIRING
        self.ack(Ack.REPAIR)
        self.tick()
        assert self.model.state is JobState.RESUMING
        self.advance(0.1)
        self.commit(0)
        self.tick()
        assert self.model.state is JobState.RUNNING
        self.take()

    def running(self, step: int = 10) -> None:
        self.form()
        self.advance(1.0)
        self.commit(step)
        assert self.tick() == []


@pytest.fixture
def make_job() -> Iterator[Callable[..., Job]]:
    jobs: list[Job] = []

    def make(strategies: str = "recover-in-place,recover,exit", **changes: Any) -> Job:
        job = Job(strategies, **changes)
        jobs.append(job)
        return job

    yield make
    for job in jobs:
        job.executor.events.close()


def msgs(sent: list[tuple[str, M.Message]], kind: type[M.Message]) -> list[tuple[str, Any]]:
    return [(who, m) for who, m in sent if isinstance(m, kind)]


def own(rank: int, msg: M.Rebuild) -> dict[int, str]:
    """The endpoints ``rank`` keeps of its node's REBUILD (the peers it sends to)."""
    members, _ = own_rebuild(rank, M.ranks_of(msg.world, 4), msg.endpoints, msg.group_log)
    return {q: ep for q, ep in members.items() if ep}


# ============================================================================ formation
def test_forming_waits_for_every_rank(make_job: Callable[..., Job]) -> None:
    job = make_job()
    for node in (0, 1):
        job.register_agent(node)
    for rank in (0, 1, 2):
        job.register_rank(rank)
    assert job.tick() == []
    assert job.model.state is JobState.FORMING and job.model.epoch == 0
    job.advance(0.2)
    job.register_rank(3)
    job.tick()
    assert job.model.state is JobState.REBUILDING and job.model.epoch == 1
    rebuilds = msgs(job.take(), M.Rebuild)
    assert [who for who, _ in rebuilds] == ["r0", "r1", "r2", "r3"]
    # One REBUILD per node (r0 and r1 get the same), with the endpoints its ranks send to
    # together; each rank keeps those of the ranks it sends to (ring +1, +2, XOR 1 and 2).
    assert rebuilds[0][1] is rebuilds[1][1] and rebuilds[2][1] is rebuilds[3][1]
    sends_to = {0: [1, 2], 1: [0, 2, 3], 2: [3, 0], 3: [0, 1, 2]}
    everyone = {q: f"tcp://h{q}:5{q}" for q in range(4)}
    for who, msg in rebuilds:
        rank = int(who[1:])
        assert msg == M.Rebuild([[0, 3]], everyone, True, [])
        assert own(rank, msg) == {q: f"tcp://h{q}:5{q}" for q in sorted(sends_to[rank])}


def test_formation_round_runs_to_running_with_a_job_start_event(
    make_job: Callable[..., Job],
) -> None:
    job = make_job()
    job.form()
    assert job.model.epoch == 1 and job.model.recoveries == 0
    (start,) = job.events("job_start")
    assert set(start["phases"]) == set(PHASES)
    assert job.events("recovery") == []
    assert job.model.exit_code is None


def test_formation_repair_is_empty_and_resume_starts_at_step_zero(
    make_job: Callable[..., Job],
) -> None:
    job = make_job()
    for node in (0, 1):
        job.register_agent(node)
    for rank in range(4):
        job.register_rank(rank)
    job.tick()
    job.ack(Ack.REBUILD)
    job.take()
    job.tick()
    repairs = msgs(job.take(), M.Repair)
    assert len(repairs) == 4
    assert all(m == M.Repair(-1, 0, [], -1) for _, m in repairs)
    job.ack(Ack.REPAIR)
    job.tick()
    assert {m.step for _, m in msgs(job.take(), M.Resume)} == {0}


# ============================================================================ faults
def test_rank_exit_in_running_restarts_the_rank_in_place(make_job: Callable[..., Job]) -> None:
    job = make_job()
    job.running(step=10)
    job.fault("rank_exit", 3, "rank 3 died (signal 9)")
    job.tick()
    m = job.model
    assert m.state is JobState.STOPPING and m.epoch == 2
    assert m.round is not None and m.round.strategy is not None
    assert m.round.strategy.value == RIP and m.round.replace_ranks == {3}
    assert m.pending == [] and not m.ranks[3].alive and m.ranks[3].committed_step == -1
    sent = job.take()
    assert sorted(who for who, _ in msgs(sent, M.Stop)) == ["r0", "r1", "r2"]
    agent_msgs = [
        (who, type(msg).__name__, msg.ranks)
        for who, msg in sent
        if isinstance(msg, (M.KillRanks, M.StartRanks))
    ]
    assert agent_msgs == [("a1", "KillRanks", [3]), ("a1", "StartRanks", [3])]
    assert msgs(sent, M.AgentExit) == []
    assert job.decision()["strategy"] == RIP
    (fault,) = job.events("fault")
    assert fault["kind"] == "rank_exit" and fault["rank"] == 3 and fault["node_rank"] == 1


def test_recover_reschedules_the_whole_node(make_job: Callable[..., Job]) -> None:
    job = make_job("recover,exit")
    job.running()
    job.fault("rank_exit", 3)
    job.tick()
    m = job.model
    assert m.state is JobState.STOPPING and m.epoch == 2
    assert m.round is not None and m.round.replace_ranks == {2, 3}
    assert m.round.reschedule_nodes == {1}
    assert not m.ranks[2].alive and not m.ranks[3].alive
    sent = job.take()
    assert [(who, msg.code) for who, msg in msgs(sent, M.AgentExit)] == [
        ("a1", exitcodes.RESCHEDULE)
    ]
    assert exitcodes.RESCHEDULE == 86
    assert sorted(who for who, _ in msgs(sent, M.Stop)) == ["r0", "r1"]
    assert msgs(sent, M.KillRanks) == [] and msgs(sent, M.StartRanks) == []
    assert job.decision()["replace"] == [2, 3] and job.decision()["nodes"] == [1]


def test_fault_on_the_scheduler_node_without_in_place_means_exit(
    make_job: Callable[..., Job],
) -> None:
    job = make_job("recover,exit")
    job.running()
    job.fault("rank_exit", 1)
    job.tick()
    m = job.model
    assert m.state is JobState.EXITING and m.exit_code == exitcodes.JOB_EXIT == 87
    assert job.executor.exit_code() == 87
    sent = job.take()
    assert sorted(who for who, _ in msgs(sent, M.Exit)) == ["r0", "r2", "r3"]
    assert all(msg.code == 87 for _, msg in msgs(sent, M.Exit))
    assert sorted((who, msg.code) for who, msg in msgs(sent, M.AgentExit)) == [
        ("a0", 87),
        ("a1", 87),
    ]
    decision = job.decision()
    assert decision["strategy"] == "exit"
    assert "scheduler" in decision["reason"] and "node 0" in decision["reason"]
    (end,) = job.events("job_end")
    assert end["exit_code"] == 87
    assert job.tick() == []  # EXITING is terminal


def test_fault_on_the_scheduler_node_can_be_recovered_in_place(
    make_job: Callable[..., Job],
) -> None:
    job = make_job()
    job.running()
    job.fault("rank_exit", 0)
    job.tick()
    assert job.model.state is JobState.STOPPING and job.decision()["strategy"] == RIP
    assert [(w, type(x).__name__) for w, x in job.take() if w.startswith("a")] == [
        ("a0", "KillRanks"),
        ("a0", "StartRanks"),
    ]


def test_node_lost_is_detected_from_agent_silence(make_job: Callable[..., Job]) -> None:
    job = make_job()
    job.running()
    job.advance(1.4, silent=("a1", "r2", "r3"))  # below heartbeat*liveness = 1.5 s
    assert job.tick() == []
    job.advance(0.2, silent=("a1", "r2", "r3"))
    job.tick()
    m = job.model
    assert m.state is JobState.STOPPING
    faults = job.events("fault")
    assert [(f["kind"], f["node_rank"], f["rank"]) for f in faults] == [("node_lost", 1, -1)]
    assert faults[0]["detect_s"] == pytest.approx(1.6)
    decision = job.decision()
    assert decision["strategy"] == REC
    assert "recover-in-place: node(s) [1] lost" in decision["reason"]
    assert not m.agents[1].alive
    assert m.round is not None and m.round.replace_ranks == {2, 3}


def test_silence_is_judged_as_of_the_last_empty_queue(make_job: Callable[..., Job]) -> None:
    """A manager that has not read its queue since ``heard_at`` judges silence as of then:
    what waits unread may be the heartbeat it would miss; once read up, the clock rules."""
    job = make_job()
    job.running()
    job.model.heard_at = job.now + 1.0  # the queue was last found empty here
    job.advance(3.0, silent=("a1", "r2", "r3"))  # 3 s of clock, 1 s of reading
    assert job.tick() == []
    assert job.model.agents[1].alive
    job.model.heard_at = job.now  # read up: nothing from node 1 came
    job.tick()
    assert [(f["kind"], f["node_rank"]) for f in job.events("fault")] == [("node_lost", 1)]


def test_node_lost_with_only_in_place_exits(make_job: Callable[..., Job]) -> None:
    job = make_job("recover-in-place,exit")
    job.running()
    job.advance(2.0, silent=("a1",))
    job.tick()
    assert job.model.state is JobState.EXITING
    assert "no agent to restart ranks in place" in job.decision()["reason"]


def test_rank_silence(make_job: Callable[..., Job]) -> None:
    job = make_job()
    job.running()
    job.advance(1.9, silent=("r2",))  # a rank is lost after rank_silence_s = 2 s
    assert job.tick() == []
    job.advance(0.2, silent=("r2",))
    job.tick()
    assert job.model.state is JobState.STOPPING
    (fault,) = job.events("fault")
    assert (fault["kind"], fault["rank"]) == ("rank_silent", 2)
    assert job.decision()["strategy"] == RIP
    assert [
        (w, type(x).__name__, x.ranks)
        for w, x in job.take()
        if isinstance(x, (M.KillRanks, M.StartRanks))
    ] == [("a1", "KillRanks", [2]), ("a1", "StartRanks", [2])]


def test_hang_is_no_progress_anywhere_for_the_hang_timeout(make_job: Callable[..., Job]) -> None:
    job = make_job()
    job.running(step=10)
    job.commit(9, ranks=[3])  # rank 3 is the straggler
    job.advance(29.0)  # heartbeats keep coming, steps do not
    assert job.tick() == []
    job.advance(1.5)
    job.tick()
    (fault,) = job.events("fault")
    assert (fault["kind"], fault["rank"], fault["node_rank"]) == ("hang", 3, 1)
    assert "stuck at step 9" in fault["detail"]
    assert job.model.state is JobState.STOPPING


def test_progress_of_any_rank_prevents_a_hang(make_job: Callable[..., Job]) -> None:
    job = make_job()
    job.running()
    job.advance(20.0)
    job.commit(11, ranks=[0])
    job.advance(20.0)
    assert job.tick() == [] and job.model.state is JobState.RUNNING


def test_worker_error_restarts_the_rank(make_job: Callable[..., Job]) -> None:
    job = make_job()
    job.running()
    job.fault("worker_error", 2, "rank 2 device: ECC error")
    job.tick()
    assert job.model.state is JobState.STOPPING
    assert job.model.round is not None and job.model.round.replace_ranks == {2}


def test_two_faults_in_one_tick_start_a_single_round(make_job: Callable[..., Job]) -> None:
    job = make_job()
    job.running()
    job.fault("rank_exit", 1)
    job.fault("rank_exit", 3)
    job.tick()
    assert job.model.epoch == 2
    assert [type(a) for a in job.actions].count(A.StartRound) == 1
    assert job.model.round is not None and job.model.round.replace_ranks == {1, 3}
    starts = [(w, x.ranks) for w, x in msgs(job.take(), M.StartRanks)]
    assert starts == [("a0", [1]), ("a1", [3])]


def _agent_cmds(sent: list[tuple[str, M.Message]]) -> list[tuple[str, str, Any]]:
    kinds = (M.KillRanks, M.StartRanks, M.AgentExit)
    return [
        (who, type(x).__name__, getattr(x, "ranks", getattr(x, "code", None)))
        for who, x in sent
        if isinstance(x, kinds)
    ]


def test_a_fault_while_a_replacement_starts_covers_both_and_spares_it(
    make_job: Callable[..., Job],
) -> None:
    """Issue 9 #1: rank 3 dies while rank 1's replacement starts (not registered yet). The
    new epoch covers both; the starting replacement is not killed; the job recovers."""
    job = make_job()
    job.running(step=10)
    job.fault("rank_exit", 1)
    job.tick()
    assert _agent_cmds(job.take()) == [("a0", "KillRanks", [1]), ("a0", "StartRanks", [1])]
    job.advance(0.05)
    job.fault("rank_exit", 3)
    job.tick()
    m = job.model
    assert m.state is JobState.STOPPING and m.epoch == 3
    assert m.round is not None and m.round.replace_ranks == {1, 3}
    assert _agent_cmds(job.take()) == [("a1", "KillRanks", [3]), ("a1", "StartRanks", [3])]
    job.stopped([0, 2], 10)
    job.register_rank(1)
    job.register_rank(3)
    job.tick()
    assert job.model.state is JobState.REBUILDING
    _recover_fully(job)
    assert job.model.state is JobState.RUNNING
    (rec,) = job.events("recovery")
    assert rec["ok"] is True and rec["replaced"] == [1, 3] and rec["lost_steps"] == 0


def test_a_registered_replacement_is_restarted_by_a_new_fault(
    make_job: Callable[..., Job],
) -> None:
    job = make_job()
    job.running(step=10)
    job.fault("rank_exit", 1)
    job.tick()
    job.register_rank(1)  # it registered: it is no longer "starting", so it is replaced again
    job.take()
    job.fault("rank_exit", 3)
    job.tick()
    cmds = _agent_cmds(job.take())
    assert ("a0", "KillRanks", [1]) in cmds and ("a1", "KillRanks", [3]) in cmds


def test_a_replacement_that_never_registers_is_started_again(
    make_job: Callable[..., Job],
) -> None:
    job = make_job()
    job.running(step=10)
    job.fault("rank_exit", 3)
    job.tick()
    job.take()
    job.stopped([0, 1, 2], 10)
    job.advance(10.5)
    job.tick()
    assert job.model.epoch == 3
    assert _agent_cmds(job.take()) == [("a1", "KillRanks", [3]), ("a1", "StartRanks", [3])]


def test_a_second_node_fault_spares_a_recreated_pod(make_job: Callable[..., Job]) -> None:
    """Issue 9 #1 for rescheduling: node 2 fails while node 1's recreated pod starts its ranks;
    only node 2 is told to exit."""
    job = make_job("recover,exit", node_nums=3)
    job.running(step=10)
    job.fault("rank_exit", 3)
    job.tick()
    assert _agent_cmds(job.take()) == [("a1", "AgentExit", exitcodes.RESCHEDULE)]
    job.register_agent(1)  # the pod came back; its ranks are starting
    job.fault("rank_exit", 5)
    job.tick()
    m = job.model
    assert m.epoch == 3 and m.round is not None and m.round.replace_ranks == {2, 3, 4, 5}
    assert _agent_cmds(job.take()) == [("a2", "AgentExit", exitcodes.RESCHEDULE)]
    job.stopped([0, 1], 10)
    for rank in (2, 3, 4, 5):
        job.register_rank(rank)
    job.tick()
    assert job.model.state is JobState.REBUILDING


# ============================================================================ recovery phases
def _to_rebuilding(job: Job, behind: dict[int, int] | None = None) -> None:
    """RUNNING at step 10 -> rank 3 dies -> survivors stop -> rank 3 re-registers."""
    job.running(step=10)
    job.fault("rank_exit", 3)
    job.tick()
    job.advance(0.1)
    steps = {0: 10, 1: 10, 2: 10, **(behind or {})}
    for rank, step in steps.items():
        job.stopped([rank], step)
    job.tick()
    assert job.model.state is JobState.STOPPING
    job.advance(0.4)
    job.register_rank(3)
    job.tick()
    assert job.model.state is JobState.REBUILDING


def test_stopping_waits_for_survivors_and_replacements(make_job: Callable[..., Job]) -> None:
    job = make_job()
    job.running(step=10)
    job.fault("rank_exit", 3)
    job.tick()
    epoch = job.model.epoch
    job.take()
    job.advance(0.1)
    job.stopped([0, 1], 10)
    job.tick()
    assert job.model.state is JobState.STOPPING
    job.stopped([2], 10)
    job.tick()
    assert job.model.state is JobState.STOPPING  # rank 3 has not re-registered yet
    assert job.model.round is not None and job.model.round.stop_done == pytest.approx(T0 + 1.2)
    job.advance(0.4)
    job.register_rank(3)
    job.tick()
    assert job.model.state is JobState.REBUILDING and job.model.epoch == epoch
    assert job.model.round is not None and job.model.round.replace_done == pytest.approx(T0 + 1.6)
    assert sorted(who for who, _ in msgs(job.take(), M.Rebuild)) == ["r0", "r1", "r2", "r3"]


def test_a_replacement_s_new_endpoint_goes_to_the_ranks_that_send_to_it(
    make_job: Callable[..., Job],
) -> None:
    job = make_job()
    job.running(step=10)
    job.fault("rank_exit", 3)
    job.tick()
    job.stopped([0, 1, 2], 10)
    job.register_rank(3, endpoint="tcp://h3:7000")
    job.tick()
    rebuilds = dict(msgs(job.take(), M.Rebuild))
    ep = {0: "tcp://h0:50", 1: "tcp://h1:51", 2: "tcp://h2:52", 3: "tcp://h3:7000"}
    # the new rank 3 gets a REBUILD of its own (full), rank 2 of node 1 another
    assert rebuilds["r3"] == M.Rebuild([[0, 3]], {q: ep[q] for q in (0, 1, 2)}, True, [])
    assert rebuilds["r2"] == M.Rebuild([[0, 3]], {q: ep[q] for q in (0, 3)}, False, [])
    assert rebuilds["r0"] is rebuilds["r1"]  # node 0's ranks: one, with what both send to
    assert rebuilds["r0"] == M.Rebuild([[0, 3]], {q: ep[q] for q in (0, 1, 2, 3)}, False, [])
    sends_to = {0: (1, 2), 1: (0, 2, 3), 2: (0, 3), 3: (0, 1, 2)}
    for rank, peers in sends_to.items():  # what each keeps
        assert own(rank, rebuilds[f"r{rank}"]) == {q: ep[q] for q in peers}


def test_a_stop_ack_of_an_older_epoch_does_not_count(make_job: Callable[..., Job]) -> None:
    job = make_job()
    job.running()
    job.fault("rank_exit", 3)
    job.tick()
    for rank in (0, 1, 2):
        job.model.ranks[rank].ack(Ack.STOP, job.model.epoch - 1)
    job.register_rank(3)
    job.tick()
    assert job.model.state is JobState.STOPPING


def test_rebuilding_to_repairing_with_a_plan_per_rank(make_job: Callable[..., Job]) -> None:
    job = make_job()
    _to_rebuilding(job, behind={1: 9})
    job.take()
    job.ack(Ack.REBUILD, [0, 1, 2])
    job.tick()
    assert job.model.state is JobState.REBUILDING  # rank 3 has not rebuilt
    job.ack(Ack.REBUILD, [3])
    job.tick()
    assert job.model.state is JobState.REPAIRING
    assert job.model.round is not None and job.model.round.target_step == 10
    repairs = dict(msgs(job.take(), M.Repair))
    assert repairs == {  # a sender gets its receivers' endpoints: repair pairs
        "r0": M.Repair(10, 0, [1], -1, {1: "tcp://h1:51"}),
        "r1": M.Repair(10, 0, [], 0),
        "r2": M.Repair(10, 0, [3], -1, {3: "tcp://h3:53"}),
        "r3": M.Repair(10, 0, [], 2),
    }


def test_repair_failure_retries_without_the_bad_source(make_job: Callable[..., Job]) -> None:
    job = make_job()
    _to_rebuilding(job, behind={1: 9})
    job.ack(Ack.REBUILD)
    job.tick()
    job.take()
    epoch = job.model.epoch
    job.model.ranks[0].ack(Ack.REPAIR, epoch)
    job.model.ranks[1].ack(Ack.REPAIR, epoch)
    job.model.ranks[1].committed_step = 10
    job.model.ranks[2].ack(Ack.REPAIR, epoch)
    job.model.ranks[3].repair_failure = (0, 2, "checksum mismatch on tensor 'w' from rank 2")
    job.tick()
    m = job.model
    assert m.state is JobState.REPAIRING and m.epoch == epoch  # same round, next attempt
    assert m.round is not None and m.round.repair_attempt == 1 and m.round.bad_sources == {2}
    repairs = dict(msgs(job.take(), M.Repair))
    assert repairs["r3"] == M.Repair(10, 1, [], 0)
    assert repairs["r2"] == M.Repair(10, 1, [], -1)
    assert repairs["r0"] == M.Repair(10, 1, [3], -1, {3: "tcp://h3:53"})
    (retry,) = job.events("repair_retry")
    assert retry["attempt"] == 1 and retry["bad_sources"] == [2]
    assert "checksum mismatch" in retry["reason"]
    job.tick()
    assert job.model.state is JobState.REPAIRING  # old failure is not counted twice
    assert job.model.round is not None and job.model.round.repair_attempt == 1
    job.ack(Ack.REPAIR)  # acks of the previous attempt do not count
    job.tick()
    assert job.model.state is JobState.REPAIRING
    job.ack(Ack.REPAIR, attempt=1)
    job.tick()
    assert job.model.state is JobState.RESUMING
    assert {m.step for _, m in msgs(job.take(), M.Resume)} == {11}


def test_no_source_left_escalates_with_a_new_epoch(make_job: Callable[..., Job]) -> None:
    job = make_job()
    _to_rebuilding(job)
    job.ack(Ack.REBUILD)
    job.tick()
    epoch = job.model.epoch
    assert job.model.round is not None
    job.model.round = dataclasses.replace(job.model.round, bad_sources=frozenset({0, 1}))
    job.model.ranks[3].repair_failure = (0, 2, "source 2 vanished")
    job.tick()
    assert job.model.state is JobState.STOPPING and job.model.epoch == epoch + 1
    assert job.model.round is not None and job.model.round.replace_ranks == {3}


def test_an_escalation_records_why(make_job: Callable[..., Job]) -> None:
    job = make_job()
    job.running()
    job.fault("rank_exit", 3)
    job.tick()
    job.stopped([0, 1, 2], 10)
    job.advance(10.5)  # rank 3 never re-registers
    job.tick()
    assert job.model.epoch == 3
    assert any("did not register" in str(e) for e in job.executor.events.recent())


def test_repair_failures_are_bounded_by_the_phase_timeout(make_job: Callable[..., Job]) -> None:
    job = make_job()
    _to_rebuilding(job)
    job.ack(Ack.REBUILD)
    job.tick()
    epoch = job.model.epoch
    for _ in range(30):  # 30 s of failures, three times the phase timeout
        job.advance(1.0)
        rnd = job.model.round
        assert rnd is not None
        job.model.ranks[3].repair_failure = (rnd.repair_attempt, -1, "receiver out of memory")
        job.tick()
        if job.model.epoch != epoch or job.model.state is not JobState.REPAIRING:
            break
    assert job.model.epoch > epoch or job.model.state is JobState.EXITING


def _recover_fully(job: Job) -> None:
    """From REBUILDING: rebuild +0.2 s, repair +0.3 s, resume +0.4 s."""
    job.advance(0.2)
    job.ack(Ack.REBUILD)
    job.tick()
    assert job.model.state is JobState.REPAIRING
    job.advance(0.3)
    job.ack(Ack.REPAIR)
    rnd = job.model.round
    assert rnd is not None
    job.commit(rnd.target_step, [3])
    job.tick()
    assert job.model.state is JobState.RESUMING
    job.advance(0.4)
    job.commit(rnd.target_step + 1)
    job.tick()


def test_resuming_to_running_writes_a_recovery_event(make_job: Callable[..., Job]) -> None:
    job = make_job()
    _to_rebuilding(job)
    t_fault = T0 + 1.1
    job.advance(0.2)
    job.ack(Ack.REBUILD)
    job.tick()
    job.advance(0.3)
    job.ack(Ack.REPAIR)
    job.tick()
    job.advance(0.4)
    job.commit(11, [0, 1, 2])
    assert job.tick() == [] and job.model.state is JobState.RESUMING  # rank 3 has not
    job.commit(11, [3])
    job.tick()
    m = job.model
    assert m.state is JobState.RUNNING and m.recoveries == 1 and m.tries == {}
    (rec,) = job.events("recovery")
    assert m.last_recovery == rec
    assert set(rec["phases"]) == {"detect", "stop", "replace", "rebuild", "repair", "resume"}
    assert rec["phases"] == pytest.approx(
        {"detect": 0.05, "stop": 0.1, "replace": 0.5, "rebuild": 0.2, "repair": 0.3, "resume": 0.4}
    )
    assert rec["ok"] is True and rec["strategy"] == RIP
    assert rec["target_step"] == 10 and rec["lost_steps"] == 0
    assert rec["replaced"] == [3]
    assert rec["mttr_s"] == pytest.approx(job.now - (t_fault - 0.05))
    assert [e["phase"] for e in job.events("phase")] == list(PHASES)


def test_lost_steps_counts_a_faulty_rank_ahead_of_the_survivors(
    make_job: Callable[..., Job],
) -> None:
    job = make_job()
    job.running(step=10)
    job.commit(11, [3])  # rank 3 committed 11, then died; the survivors are at 10
    job.fault("rank_exit", 3)
    job.tick()
    job.stopped([0, 1, 2], 10)
    job.register_rank(3)
    job.tick()
    _recover_fully(job)
    (rec,) = job.events("recovery")
    assert rec["target_step"] == 10 and rec["lost_steps"] == 1


def test_lost_steps_survives_an_escalation(make_job: Callable[..., Job]) -> None:
    job = make_job()
    job.running(step=10)
    job.commit(11, [3])
    job.fault("rank_exit", 3)
    job.tick()
    job.stopped([0, 1, 2], 10)
    job.advance(10.5)  # rank 3 never comes back within the phase timeout
    job.tick()
    assert job.model.epoch == 3 and job.model.state is JobState.STOPPING
    job.stopped([0, 1, 2], 10)
    job.register_rank(3)
    job.tick()
    _recover_fully(job)
    (rec,) = job.events("recovery")
    assert rec["lost_steps"] == 1


def test_every_rank_done_finishes_the_job(make_job: Callable[..., Job]) -> None:
    job = make_job()
    job.running(step=99)
    for rank in (0, 1, 2):
        job.model.ranks[rank].done = True
    assert job.tick() == []
    job.model.ranks[3].done = True
    job.tick()
    assert job.model.state is JobState.FINISHED and job.executor.exit_code() == 0
    assert sorted((w, x.code) for w, x in msgs(job.take(), M.AgentExit)) == [("a0", 0), ("a1", 0)]
    (end,) = job.events("job_end")
    assert end["exit_code"] == 0
    assert job.tick() == []


def test_finishing_during_resume_still_releases_the_agents(make_job: Callable[..., Job]) -> None:
    job = make_job()
    _to_rebuilding(job)
    job.ack(Ack.REBUILD)
    job.tick()
    job.ack(Ack.REPAIR)
    job.tick()
    job.take()
    for info in job.model.ranks.values():
        info.done, info.committed_step = True, 11
    job.tick()  # RESUMING -> RUNNING (the recovery is recorded)
    job.tick()  # RUNNING -> FINISHED (the agents are released)
    assert job.model.state is JobState.FINISHED
    assert sorted((w, x.code) for w, x in msgs(job.take(), M.AgentExit)) == [("a0", 0), ("a1", 0)]
    assert [e["exit_code"] for e in job.events("job_end")] == [0]


def test_a_finished_rank_that_lingers_is_not_a_fault(make_job: Callable[..., Job]) -> None:
    job = make_job()
    job.running()
    job.model.ranks[0].done = True  # WorkerDone arrived; the process saves files, then exits
    job.advance(3.0, silent=("r0",))
    job.commit(11, [1, 2, 3])
    assert job.tick() == []
    assert job.model.state is JobState.RUNNING


def test_a_job_that_never_started_has_no_job_start_event(make_job: Callable[..., Job]) -> None:
    job = make_job("exit")
    for node in (0, 1):
        job.register_agent(node)
    for rank in range(4):
        job.register_rank(rank)
    job.tick()
    assert job.model.state is JobState.REBUILDING
    job.fault("rank_exit", 2)
    job.tick()
    assert job.model.state is JobState.EXITING
    assert job.events("job_start") == []


def test_impossible_repair_during_formation_does_not_crash(make_job: Callable[..., Job]) -> None:
    job = make_job()
    for node in (0, 1):
        job.register_agent(node)
    # ranks come up from checkpoints of different steps; shard 1 has no replica at step 100
    for rank, step, shard in ((0, 100, 0), (1, 90, 1), (2, 100, 0), (3, 90, 1)):
        job.register_rank(rank, step=step, shard=shard)
    job.tick()
    job.ack(Ack.REBUILD)
    job.tick()
    assert job.model.state in (JobState.STOPPING, JobState.EXITING)


# ============================================================================ escalation
def test_timeouts_escalate_then_move_down_the_strategy_list(make_job: Callable[..., Job]) -> None:
    job = make_job()  # recover-in-place, recover, exit; max_tries=2
    job.running(step=10)
    job.fault("rank_exit", 3)
    job.tick()
    seen: list[tuple[int, str]] = [(job.model.epoch, job.decision()["strategy"])]
    for _ in range(6):
        job.stopped([r for r in (0, 1, 2) if job.model.ranks[r].alive], 10)
        job.tick()
        assert job.model.state is JobState.STOPPING  # replacements never register
        wait = (
            job.config.wait_reschedule_timeout_s
            if seen[-1][1] == REC
            else job.config.phase_timeout_s
        )
        job.advance(wait - 0.5)
        job.tick()
        assert job.model.state is JobState.STOPPING and job.model.epoch == seen[-1][0]
        job.advance(1.0)
        job.tick()
        seen.append((job.model.epoch, job.decision()["strategy"]))
        if job.model.state is JobState.EXITING:
            break
    # recover-in-place gets max_tries; recover gives up after one wait-reschedule-timeout
    # (MindCluster's semantics: the pod did not come back in time).
    assert seen == [(2, RIP), (3, RIP), (4, REC), (4, "exit")]
    assert job.model.exit_code == exitcodes.JOB_EXIT
    (rec,) = job.events("recovery")
    assert rec["ok"] is False and rec["lost_steps"] is None
    reason = job.decision()["reason"]
    assert "tried 2 time(s), max_tries=2" in reason and "recover: given up on" in reason


def test_unstopped_survivors_are_replaced_on_escalation(make_job: Callable[..., Job]) -> None:
    job = make_job()
    job.running()
    job.fault("rank_exit", 3)
    job.tick()
    job.stopped([0, 2], 10)  # rank 1 never answers Stop
    job.register_rank(3)
    job.advance(10.5)
    job.tick()
    m = job.model
    assert m.state is JobState.STOPPING and m.epoch == 3
    assert m.round is not None and m.round.replace_ranks == {1, 3}
    fault = job.events("fault")[-1]
    assert (fault["kind"], fault["rank"]) == ("hang", 1)
    assert "ranks [1] did not stop within 10s" in fault["detail"]


def test_a_rebuild_timeout_escalates_with_the_late_ranks(make_job: Callable[..., Job]) -> None:
    job = make_job()
    _to_rebuilding(job)
    job.ack(Ack.REBUILD, [0, 1, 3])
    job.advance(9.0)
    assert job.tick() == []
    job.advance(1.5)
    job.tick()
    assert job.model.state is JobState.STOPPING and job.model.epoch == 3
    assert job.model.round is not None and job.model.round.replace_ranks == {2, 3}


def test_a_new_fault_during_recovery_starts_a_new_epoch(make_job: Callable[..., Job]) -> None:
    job = make_job()
    _to_rebuilding(job)
    job.fault("rank_exit", 0)
    job.tick()
    m = job.model
    assert m.state is JobState.STOPPING and m.epoch == 3
    assert m.round is not None and m.round.replace_ranks == {0, 3}
    assert len(m.round.faults) == 2  # the incident keeps its first fault


def test_resume_timeout_escalates(make_job: Callable[..., Job]) -> None:
    job = make_job()
    _to_rebuilding(job)
    job.ack(Ack.REBUILD)
    job.tick()
    job.ack(Ack.REPAIR)
    job.tick()
    assert job.model.state is JobState.RESUMING
    job.commit(11, [0, 1, 2])
    job.advance(31.0)
    job.tick()
    assert job.model.state is JobState.STOPPING and job.model.epoch == 3
    assert job.model.round is not None and job.model.round.replace_ranks == {3}
    fault = job.events("fault")[-1]
    assert "ranks [3] did not commit step 11" in fault["detail"]


# ============================================================================ transitions
def test_an_illegal_transition_raises(make_job: Callable[..., Job]) -> None:
    job = make_job()
    job.running()
    with pytest.raises(IllegalTransition, match=r"running -> repairing is not allowed \(allowed:"):
        job.executor.execute([A.Transition("test", JobState.REPAIRING)])
    assert job.model.state is JobState.RUNNING


def test_terminal_states_allow_nothing(make_job: Callable[..., Job]) -> None:
    job = make_job()
    job.model.transition(JobState.EXITING)
    for to in JobState:
        with pytest.raises(IllegalTransition, match="allowed: none"):
            job.model.transition(to)


@pytest.mark.parametrize("src", list(JobState))
def test_transition_table_is_enforced(make_job: Callable[..., Job], src: JobState) -> None:
    job = make_job()
    assert set(TRANSITIONS) == set(JobState)
    for dst in JobState:
        job.model.state = src
        if dst in TRANSITIONS[src]:
            job.model.transition(dst)
            assert job.model.state is dst
        else:
            with pytest.raises(IllegalTransition):
                job.model.transition(dst)
            assert job.model.state is src


# ============================================================================ fault x strategy
def _rank_exit(job: Job) -> None:
    job.fault("rank_exit", 3)


def _worker_error(job: Job) -> None:
    job.fault("worker_error", 3)


def _rank_silent(job: Job) -> None:
    job.advance(2.1, silent=("r3",))


def _node_lost(job: Job) -> None:
    job.advance(1.6, silent=("a1", "r2", "r3"))


def _hang(job: Job) -> None:
    job.commit(9, [3])
    job.advance(30.5)


FAULTS: dict[str, Callable[[Job], None]] = {
    "rank_exit": _rank_exit,
    "worker_error": _worker_error,
    "rank_silent": _rank_silent,
    "node_lost": _node_lost,
    "hang": _hang,
}
NOT_YET: dict[str, str] = {}  # every strategy is implemented

CASES = [
    # strategies, {fault kind: chosen strategy}, the usual choice
    ("recover-in-place,exit", {"node_lost": "exit"}, RIP),
    ("recover,exit", {}, REC),
    ("recover-in-place,recover,exit", {"node_lost": REC}, RIP),
    ("exit", {}, "exit"),
    ("retry,dump,exit", {"worker_error": "retry"}, "dump"),
    ("retry,recover-in-place,recover,dump,exit", {"worker_error": "retry", "node_lost": REC}, RIP),
    ("dump,exit", {}, "dump"),
    ("retry,exit", {"worker_error": "retry"}, "exit"),
    ("elastic-training,exit", {}, "elastic-training"),
    ("recover-in-place,elastic-training,exit", {"node_lost": "elastic-training"}, RIP),
    ("", {}, "exit"),
]


@pytest.mark.parametrize("kind", sorted(FAULTS))
@pytest.mark.parametrize(
    ("strategies", "special", "usual"), CASES, ids=[c[0] or "none" for c in CASES]
)
def test_strategy_choice(
    make_job: Callable[..., Job], kind: str, strategies: str, special: dict[str, str], usual: str
) -> None:
    job = make_job(strategies)
    job.running(step=10)
    FAULTS[kind](job)
    job.tick()
    (fault,) = job.events("fault")
    assert fault["kind"] == kind and fault["node_rank"] == 1
    expected = special.get(kind, usual)
    decision = job.decision()
    assert decision["strategy"] == expected
    if expected == "exit":
        assert job.model.state is JobState.EXITING and job.model.exit_code == 87
    else:
        assert job.model.state is JobState.STOPPING and job.model.epoch == 2
        # retry, dump and elastic training restart nobody (elastic asks for replacements only)
        replaced = {REC: {2, 3}, RIP: {3}}.get(expected, set())
        assert job.model.round is not None and job.model.round.replace_ranks == replaced
    for name, why in NOT_YET.items():
        if name in parse_strategies(strategies):
            assert f"{name}: {why}" in decision["reason"]
    if not strategies:
        assert "none configured" in decision["reason"]


def test_hang_blamed_on_the_scheduler_node_cannot_be_rescheduled(
    make_job: Callable[..., Job],
) -> None:
    job = make_job("recover,exit")
    job.running(step=10)  # everyone at the same step: rank 0 is blamed
    job.advance(30.5)
    job.tick()
    assert job.events("fault")[0]["rank"] == 0
    assert job.model.state is JobState.EXITING
    assert "hosts the scheduler" in job.decision()["reason"]


def test_orphaned_shard_makes_recovery_infeasible(make_job: Callable[..., Job]) -> None:
    job = make_job("recover-in-place,exit")
    job.form()
    for rank in range(4):  # 2-way model parallel: shard 1 lives on ranks 1 and 3 only
        job.model.ranks[rank].shard = rank % 2
    job.commit(10)
    job.fault("rank_exit", 1)
    job.fault("rank_exit", 3)
    job.tick()
    assert job.model.state is JobState.EXITING
    assert "no healthy replica left for shard 1 (ranks [1, 3])" in job.decision()["reason"]


def test_a_stop_unanswered_for_two_agent_beats_goes_again_once(
    make_job: Callable[..., Job],
) -> None:
    """A STOP lost on its way through a heartbeat group's leader costs two agent beats, not
    the phase timeout: the live survivors it went to that way that have not answered get it
    again (with the round's own reason: MindIO reads the fault kind from it), once; one sent
    directly is not sent again. The round then goes on as ever."""
    job = make_job()
    job.running()
    job.fault("rank_exit", 3)
    job.tick()
    stop = msgs(job.take(), M.Stop)[0][1]
    job.model.led_stops = {0: job.model.epoch}  # node 0's STOP went through its leader
    job.stopped([0], 10)  # ranks 1 (node 0, led) and 2 (node 1, directly) do not answer
    beats = 2 * job.config.agent_heartbeat_s
    job.advance(beats - 0.01)
    assert job.tick() == []
    job.advance(0.02)
    job.tick()
    assert msgs(job.take(), M.Stop) == [("r1", stop)]
    (again,) = [a for a in job.actions if isinstance(a, A.StopAgain)]
    assert "1 ranks (1) did not answer the stop of epoch" in again.reason
    assert job.model.round is not None and job.model.round.stop_again == job.now
    job.advance(beats)
    job.tick()
    assert msgs(job.take(), M.Stop) == []  # once per round
    assert job.model.state is JobState.STOPPING


def test_the_stop_again_rule_looks_once(make_job: Callable[..., Job]) -> None:
    """Two agent beats on, the survivors reached through a leader all answered but one reached
    directly has not: nothing goes again, and the rule does not look again (a scan of every
    rank per tick at scale)."""
    job = make_job()
    job.running()
    job.fault("rank_exit", 3)
    job.tick()
    job.take()
    job.model.led_stops = {0: job.model.epoch}
    job.stopped([0, 1], 10)  # node 0's (led) answered; rank 2 (node 1, direct) has not
    job.advance(2 * job.config.agent_heartbeat_s + 0.01)
    job.tick()
    assert msgs(job.take(), M.Stop) == []
    assert job.model.round is not None and job.model.round.stop_again == job.now
    job.advance(0.5)
    assert job.tick() == []
