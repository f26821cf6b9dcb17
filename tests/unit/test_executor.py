"""The stand-alone executor: one handler per action, a fake sender, a fake clock, no socket."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from typing import Any

import pytest

from ms_recover import exitcodes
from ms_recover.config import JobConfig
from ms_recover.manager import actions as A
from ms_recover.manager.executor import Executor
from ms_recover.manager.model import Fault, JobModel, Round
from ms_recover.observability.events import EventLog
from ms_recover.observability.schema import (
    PHASES,
    DecisionRecord,
    FaultKind,
    JobEndRecord,
    JobState,
    Phase,
)
from ms_recover.protocol import messages as M
from ms_recover.strategy import Strategy


class FakeSender:
    def __init__(self) -> None:
        self.sent: list[tuple[bytes, M.Message]] = []

    def send(self, identities: Sequence[bytes], msg: M.Message) -> None:
        self.sent.extend((identity, msg) for identity in identities)


class Clock:
    t = 100.0

    def __call__(self) -> float:
        return self.t


@pytest.fixture
def ex(tmp_path: Any) -> Executor:
    config = JobConfig(job_id="unit", node_nums=2, proc_per_node=2, dump_dir=str(tmp_path / "dump"))
    model = JobModel(config)
    for rank, info in model.ranks.items():
        info.alive, info.identity = True, f"r{rank}".encode()
    for agent in model.agents.values():
        agent.alive = True
    return Executor(model, EventLog(), Clock(), FakeSender(), {0: b"a0", 1: b"a1"})


def _sender(ex: Executor) -> FakeSender:
    assert isinstance(ex.sender, FakeSender)
    return ex.sender


def _round(ex: Executor, **changes: Any) -> Round:
    base: dict[str, Any] = dict(
        epoch=2, strategy=Strategy.RECOVER_IN_PLACE, started=90.0, incident_start=89.5
    )
    rnd = Round(**{**base, **changes})
    ex.execute([A.StartRound("test", rnd)])
    return rnd


def test_every_action_type_has_a_handler(ex: Executor) -> None:
    kinds = {
        cls
        for cls in vars(A).values()
        if isinstance(cls, type) and issubclass(cls, A.Action) and cls is not A.Action
    }
    assert kinds == set(ex._handlers)


def test_send_ranks_skips_ranks_without_a_connection(ex: Executor) -> None:
    ex.model.ranks[2].identity = b""
    ex.execute([A.SendRanks("test", (0, 2, 3), M.Resume(4))])
    assert _sender(ex).sent == [(b"r0", M.Resume(4)), (b"r3", M.Resume(4))]


def test_agent_exit_marks_the_agent_gone(ex: Executor) -> None:
    ex.execute([A.SendAgent("test", 1, M.AgentExit(86, "move"))])
    assert _sender(ex).sent == [(b"a1", M.AgentExit(86, "move"))]
    assert not ex.model.agents[1].alive and ex.model.agents[0].alive


def test_a_restarted_rank_owes_its_exit_again(ex: Executor) -> None:
    """After StartRanks the rank's exit is unreported again: a manager whose job just ended
    waits for the new process (it is told the job is over) instead of stopping at once."""
    for rank in (2, 3):
        ex.model.ranks[rank].exit_code = -9
    ex.execute([A.SendAgent("test", 1, M.StartRanks([3], "restart in place"))])
    assert _sender(ex).sent == [(b"a1", M.StartRanks([3], "restart in place"))]
    assert ex.model.ranks[3].exit_code is None and ex.model.ranks[2].exit_code == -9


def test_start_round_resets_the_replaced_ranks_and_counts_a_try(ex: Executor) -> None:
    ex.model.ranks[3].committed_step = 9
    _round(ex, replace_ranks=frozenset({3}))
    info = ex.model.ranks[3]
    assert (info.alive, info.identity, info.committed_step) == (False, b"", -1)
    assert ex.model.epoch == 2 and ex.model.tries == {"recover-in-place": 1}


def test_mark_lost_removes_the_pending_fault(ex: Executor) -> None:
    fault = Fault(FaultKind.NODE_LOST, 1, -1, "agent silent", 100.0, 1.6)
    ex.model.pending.append(fault)
    ex.execute([A.MarkLost("test", fault, (2, 3), True)])
    assert ex.model.pending == [] and not ex.model.agents[1].alive
    assert [i.alive for i in ex.model.ranks.values()] == [True, True, False, False]


def test_typed_round_updates(ex: Executor) -> None:
    _round(ex, phase_start=90.0)
    ex.execute(
        [
            A.StopDone("t", 90.1),
            A.ReplaceDone("t", 90.5),
            A.SetTarget("t", 10),
            A.NextPhase("t", 90.7, Phase.REBUILD),
            A.RetryRepair("t", 1, frozenset({2})),
        ]
    )
    rnd = ex.model.round
    assert rnd is not None
    assert (rnd.stop_done, rnd.replace_done, rnd.target_step) == (90.1, 90.5, 10)
    assert rnd.phases == {Phase.REBUILD: pytest.approx(0.7)} and rnd.phase_start == 90.7
    assert (rnd.repair_attempt, rnd.bad_sources) == (1, {2})
    ex.execute([A.SetTarget("t", 11)])
    assert ex.model.round is not None and ex.model.round.repair_attempt == 0


def test_a_round_update_without_a_round_raises(ex: Executor) -> None:
    with pytest.raises(AssertionError, match="needs a round"):
        ex.execute([A.SetTarget("t", 1)])


def test_emit_writes_the_record_with_epoch_and_state(ex: Executor) -> None:
    ex.execute([A.Emit("t", DecisionRecord("exit", "why"))])
    (event,) = ex.events.recent("decision")
    assert {k: v for k, v in event.items() if k not in ("ts", "job_id", "schema")} == {
        "event": "decision",
        "epoch": 0,
        "state": "forming",
        "strategy": "exit",
        "reason": "why",
    }
    ex.execute([A.Emit("t", JobEndRecord(88, "dumped"))])
    assert ex.model.exit_code == 88 and ex.exit_code() == 88


def test_exiting_without_a_code_is_a_job_exit(ex: Executor) -> None:
    ex.execute([A.Transition("t", JobState.EXITING)])
    assert ex.exit_code() == exitcodes.JOB_EXIT


def test_finish_round_writes_phases_and_the_recovery(ex: Executor) -> None:
    _round(ex, replace_ranks=frozenset({3}), peak_step=11, detect_s=0.05, phase_start=90.0)
    ex.execute(
        [
            A.StopDone("t", 90.1),
            A.ReplaceDone("t", 90.5),
            A.SetTarget("t", 10),
            A.NextPhase("t", 90.7, Phase.REBUILD),
        ]
    )
    ex.clock.t = 91.0  # type: ignore[attr-defined]
    ex.execute([A.FinishRound("done", True)])
    assert [e["phase"] for e in ex.events.recent("phase")] == list(PHASES)
    (rec,) = ex.events.recent("recovery")
    assert rec["phases"] == pytest.approx(
        {"detect": 0.05, "stop": 0.1, "replace": 0.5, "rebuild": 0.7, "repair": 0, "resume": 0}
    )
    assert (rec["ok"], rec["lost_steps"], rec["replaced"], rec["mttr_s"]) == (True, 1, [3], 1.5)
    assert ex.model.recoveries == 1 and ex.model.tries == {}


def test_a_failed_round_keeps_its_tries_and_loses_no_count(ex: Executor) -> None:
    _round(ex)
    ex.execute([A.Exhaust("t", Strategy.RECOVER), A.FinishRound("gave up", False)])
    (rec,) = ex.events.recent("recovery")
    assert rec["ok"] is False and rec["lost_steps"] is None
    assert ex.model.tries == {"recover-in-place": 1, "recover": ex.config.max_tries}


def test_set_active_writes_the_world(ex: Executor) -> None:
    ex.execute([A.SetActive("t", frozenset({0, 1, 2}))])
    assert ex.model.active == {0, 1, 2}
    assert ex.events.recent("world")[0]["active"] == [0, 1, 2]


def test_write_manifest_from_the_writers_answers(ex: Executor) -> None:
    _round(ex, strategy=Strategy.DUMP)
    ex.execute([A.ChooseWriters("t", (0,), 10, 95.0)])
    answer = dict(rank=0, step=10, file="rank_0.npz", format="npz", sha256="0" * 64, size=3)
    ex.model.ranks[0].dump = {"ok": True, "reason": "", **answer}
    ex.execute([A.WriteManifest("t")])
    (event,) = ex.events.recent("dump")
    assert event["step"] == 10 and event["files"] == ["rank_0.npz"]
    with open(os.path.join(ex.config.effective_dump_dir(), "manifest.json")) as fh:
        manifest = json.load(fh)
    assert manifest["ranks"]["3"] == {"shard": 0, "file": "rank_0.npz"}
    assert ex.model.round is not None and ex.model.round.dump_ranks == (0,)
