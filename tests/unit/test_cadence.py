"""When the manager decides (manager/cadence.py): at once after anything but heartbeats, not
more than a quarter of the time, every quarter heartbeat while only heartbeats come; agents
answered once per quarter of their grace, one ManagerBeat encoding shared by the agents heard
meanwhile."""

from __future__ import annotations

import pytest

from ms_recover.config import JobConfig
from ms_recover.manager.cadence import JUDGE_SHARE, REST_S, Cadence, SharedBeat
from ms_recover.manager.model import JobModel
from ms_recover.observability.schema import JobState
from ms_recover.protocol import messages as M
from ms_recover.protocol.codec import Codec


class Clock:
    def __init__(self) -> None:
        self.t = 64.0  # binary fractions below: exact float sums

    def __call__(self) -> float:
        return self.t


@pytest.fixture
def running() -> JobModel:
    model = JobModel(JobConfig(job_id="c", node_nums=2, proc_per_node=2, heartbeat_s=0.5))
    model.state = JobState.RUNNING
    return model


def _decides(cadence: Cadence, took: float = 0.0, clock: Clock | None = None) -> bool:
    def decide(judge: bool) -> None:
        if clock is not None:
            clock.t += took

    return cadence.run(decide)


def test_heartbeats_alone_wait_for_the_quiet_tick(running: JobModel) -> None:
    clock = Clock()
    cadence = Cadence(running, tick_s=0.02, clock=clock)
    assert _decides(cadence)  # the first decision is always due
    cadence.heard(M.AgentHeartbeat)
    cadence.heard(M.WorkerHeartbeat)
    clock.t += 0.09375
    assert not _decides(cadence) and cadence.rest_s() == REST_S
    assert cadence.poll_ms() == 32  # until the quarter heartbeat (0.125 s)
    clock.t += 0.015625
    assert cadence.poll_ms() == 16 and not _decides(cadence)
    clock.t += 0.015625
    assert _decides(cadence)


def test_any_other_frame_is_decided_on_at_once(running: JobModel) -> None:
    clock = Clock()
    cadence = Cadence(running, tick_s=0.02, clock=clock)
    assert _decides(cadence)
    clock.t += 0.0009765625
    cadence.heard(M.RankExited)
    assert cadence.rest_s() == 0.0 and cadence.poll_ms() == 0
    assert _decides(cadence)


def test_deciding_takes_at_most_a_quarter_of_the_thread(running: JobModel) -> None:
    clock = Clock()
    cadence = Cadence(running, tick_s=0.02, clock=clock)
    assert _decides(cadence, took=0.00390625, clock=clock)  # a ~4 ms decision (16k ranks)
    cadence.heard(M.Stopped)
    clock.t += 0.0009765625
    assert not _decides(cadence) and cadence.poll_ms() == 11  # 4 x 3.9 ms from its start
    clock.t += 0.0107421875
    assert _decides(cadence)


def test_every_phase_but_running_decides_each_tick(running: JobModel) -> None:
    running.state = JobState.STOPPING
    clock = Clock()
    cadence = Cadence(running, tick_s=0.02, clock=clock)
    assert _decides(cadence)
    cadence.heard(M.WorkerHeartbeat)
    clock.t += 0.015625
    assert cadence.rest_s() == 0.0 and not _decides(cadence)
    clock.t += 0.0078125  # past the 20 ms tick
    assert _decides(cadence)


class Sock:
    def __init__(self) -> None:
        self.sent: list[bytes] = []

    def send(self, frame: bytes, flags: int = 0) -> None:
        self.sent.append(frame)


def test_one_beat_is_shared_and_agents_answered_each_quarter_grace(
    running: JobModel, monkeypatch
) -> None:
    from ms_recover.manager import cadence as cadence_mod

    sent: list[list[bytes]] = []
    monkeypatch.setattr(cadence_mod, "send_frames", lambda sock, frames: sent.append(frames))
    seq = {"n": 0}

    def next_seq() -> int:
        seq["n"] += 1
        return seq["n"]

    codec, clock = Codec("c", b"k"), Clock()
    beat = SharedBeat(running, codec, lambda: seq["n"], next_seq, clock)
    # The default grace is 60 s: an agent is answered every 15 s.
    assert running.config.lost_manager_grace_s == 60.0
    assert beat.every_s == pytest.approx(15.0)
    assert [beat.send(None, ident) for ident in (b"a0", b"a1")] == [True, True]  # type: ignore[arg-type]
    assert sent[0][1:] == sent[1][1:] and seq["n"] == 1  # encoded once
    clock.t += 14.5
    assert not beat.send(None, b"a0")  # type: ignore[arg-type]  # answered 14.5 s ago
    clock.t += 0.5
    # Due again: a fresh seq (the same frames twice would be a replay at the agent).
    assert beat.send(None, b"a0")  # type: ignore[arg-type]
    next_seq()  # anything else the manager sent
    clock.t += 0.5
    assert beat.send(None, b"a1")  # type: ignore[arg-type]
    assert [codec.decode(f[1:]).seq for f in sent] == [1, 1, 2, 4]
    running.state = JobState.STOPPING
    clock.t += 15.0
    beat.send(None, b"a1")  # type: ignore[arg-type]
    assert codec.decode(sent[-1][1:]).msg == M.ManagerBeat("stopping")


@pytest.mark.parametrize(
    ("grace_s", "answered_every"),
    [(0.0, 23), (7.0, 3), (2.5, 1)],
    ids=["default grace", "7 s grace", "short grace"],
)
def test_an_agent_hears_the_manager_well_within_its_grace(
    grace_s: float, answered_every: int, monkeypatch
) -> None:
    """Agents beat every agent_heartbeat_s; the manager answers the first beat at least a
    quarter grace after the last answer (every beat when that is shorter): the longest gap an
    agent waits is below half its grace."""
    from ms_recover.manager import cadence as cadence_mod

    monkeypatch.setattr(cadence_mod, "send_frames", lambda sock, frames: None)
    cfg = JobConfig(job_id="c", node_nums=2, proc_per_node=2, manager_grace_s=grace_s)
    clock = Clock()
    beat = SharedBeat(JobModel(cfg), Codec("c", b"k"), lambda: 0, lambda: 1, clock)
    period, start, answers = cfg.agent_heartbeat_s, clock.t, []
    for i in range(100):
        clock.t = start + i * period
        if beat.send(None, b"a0"):  # type: ignore[arg-type]
            answers.append(i)
    assert {b - a for a, b in zip(answers, answers[1:], strict=False)} == {answered_every}
    assert answered_every * period < cfg.lost_manager_grace_s / 2


def test_the_last_answer_owed_is_decided_on_at_once(running: JobModel) -> None:
    """A stop-all's last STOPPED ends the manager's reading and is decided on at once, even
    within the SHARE wait after an expensive decision; answers of another epoch do not count."""
    clock = Clock()
    cadence = Cadence(running, 0.02, clock)
    running.state, running.epoch = JobState.STOPPING, 3
    assert _decides(cadence, took=0.01, clock=clock)  # the broadcast's decision: 10 ms
    cadence.owed(M.Stop, 2)
    cadence.owed(M.Resume, 2)  # not a broadcast that ends on answers
    cadence.heard(M.Stopped, 3)
    cadence.heard(M.Stopped, 2)  # a late answer to the previous epoch's stop
    assert not cadence.answered and not cadence.due() and not _decides(cadence)
    cadence.heard(M.Stopped, 3)
    assert cadence.answered and cadence.due()
    assert _decides(cadence)  # 10 ms after a 10 ms decision: SHARE would wait 30 ms more
    assert not cadence.answered
    cadence.heard(M.Stopped, 3)  # more than owed (a rank that re-registered): no new trigger
    assert not cadence.answered
    running.epoch = 4  # a new epoch owes anew
    cadence.owed(M.Rebuild, 1)
    cadence.heard(M.Rebuilt, 4)
    assert cadence.answered


def test_a_repairs_last_answer_is_decided_on_at_once(running: JobModel) -> None:
    """The last REPAIRED owed (done or failed: decide reads which) ends the reading too: the
    decision that planned a 65,536-rank repair took about a second, and the repair phase
    waited SHARE times that after its last answer (3.7 s where it takes 1.6 s now)."""
    clock = Clock()
    cadence = Cadence(running, 0.02, clock)
    running.state, running.epoch = JobState.REPAIRING, 2
    assert _decides(cadence, took=1.0, clock=clock)  # the plan's decision: one second
    cadence.owed(M.Repair, 3)
    cadence.heard(M.Repaired, 2, 2)  # one node's answers in columns
    assert not cadence.answered and not cadence.due()
    cadence.heard(M.Repaired, 2)  # a rank's own REPAIRED (a failure, or a retry's)
    assert cadence.answered and _decides(cadence)


def test_answers_heard_in_one_batch_count_each(running: JobModel) -> None:
    """A node's answers recorded in one pass (a RelayAcks batch) count as that many: the
    batch that brings the last one owed ends the reading, and an empty batch changes nothing."""
    cadence = Cadence(running, 0.02, Clock())
    running.state, running.epoch = JobState.STOPPING, 3
    cadence.owed(M.Stop, 5)
    cadence.heard(M.Stopped, 3, 0)
    assert not cadence.answered
    cadence.heard(M.Stopped, 3, 3)
    assert not cadence.answered
    cadence.heard(M.Stopped, 3, 4)  # two more than owed: the last owed was among them
    assert cadence.answered
    assert _decides(cadence) and not cadence.answered
    cadence.heard(M.Stopped, 3, 2)  # past the count: no new trigger
    assert not cadence.answered


def test_judging_every_reports_takes_a_bounded_share(running: JobModel) -> None:
    """A decision that judges the ranks' timing reports comes again only JUDGE_SHARE times
    its own duration later: every decision when it is cheap, rarer when it is not."""
    clock = Clock()
    cadence = Cadence(running, tick_s=0.02, clock=clock)
    judged: list[bool] = []

    def decide(judge: bool) -> None:
        judged.append(judge)
        clock.t += 0.05 if judge else 0.001  # judging reads 65,536 reports: 50 ms

    for _ in range(40):
        cadence.run(decide)
        clock.t += cadence.quiet_s
    assert judged[0] and judged.count(True) >= 2
    first, second = [i for i, j in enumerate(judged) if j][:2]
    # the second judging decision began at least 40 x 50 ms = 2 s after the first one began
    assert (second - first) * (cadence.quiet_s + 0.001) >= JUDGE_SHARE * 0.05 - cadence.quiet_s
    cheap = Cadence(running, tick_s=0.02, clock=clock)
    flags: list[bool] = []
    for _ in range(5):
        cheap.run(lambda judge: flags.append(judge))
        clock.t += cheap.quiet_s
    assert flags == [True] * 5  # a small job judges on every decision


def test_a_fault_right_after_a_judging_decision_waits_on_an_ordinary_ones_cost(
    running: JobModel,
) -> None:
    """JUDGE_SHARE bounds the judging decisions; the SHARE wait after one of them is that of
    the ordinary decisions, so a fault reported right after 65,536 ranks were judged (200 ms)
    is decided within milliseconds, not 4 x 200 ms later."""
    clock = Clock()
    cadence = Cadence(running, tick_s=0.02, clock=clock)

    def decide(judge: bool) -> None:
        clock.t += 0.1875 if judge else 0.0009765625  # judging: ~200 ms, else ~1 ms

    assert cadence.run(decide) and cadence.judged == 1  # the first decision judges
    clock.t += cadence.quiet_s
    assert cadence.run(decide) and cadence.judged == 1  # an ordinary one: ~1 ms
    clock.t += 8.0  # ... and 40 x 187 ms later the next judging decision
    assert cadence.run(decide) and cadence.judged == 2
    cadence.heard(M.RankExited)  # a fault reported as it ends
    clock.t += 4 * 0.0009765625
    assert cadence.due()  # SHARE x the ordinary decision's cost has passed, not 4 x 187 ms
