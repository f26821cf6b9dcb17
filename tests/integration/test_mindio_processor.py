"""MindIO-style processors on the real ms_recover manager, with recording handlers.

Each rank is a :class:`Processor` plus a thread that plays MindSpore's training thread exactly
as ``Model.train`` and ``TrainFaultTolerance`` drive it (end_updating_os, pause_train, the
report on a RuntimeError, wait_next_action, the repair step). The handlers record their calls,
so the order and arguments MindIO defines are asserted.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest

from ms_recover import exitcodes
from ms_recover.config import JobConfig
from ms_recover.integrations.mindio.controller import Controller
from ms_recover.integrations.mindio.enums import Action, RepairType, ReportState
from ms_recover.integrations.mindio.processor import Processor
from ms_recover.localrun.wait import wait_for
from ms_recover.manager.server import ManagerServer
from ms_recover.observability.events import EventLog
from ms_recover.observability.schema import JobState
from ms_recover.protocol import messages as M
from ms_recover.strategy import parse_strategies
from tests.eventlines import line

STEPS = 6


class Rank:
    """One processor and its fake training thread."""

    def __init__(self, rank: int, cfg: JobConfig, hang_stop: bool = False) -> None:
        self.proc = Processor(rank, cfg.world_size, cfg, action_timeout_s=3.0)
        self.calls: list[tuple[str, tuple[Any, ...]]] = []
        self.force_stop = threading.Event()
        self.actions: list[int] = []
        self.exited = threading.Event()
        self.hang_stop = hang_stop
        self.unhang = threading.Event()  # ends a hung stop handler (the fixture's teardown)
        for name in ("save_ckpt", "rename", "stop", "clean", "repair", "rebuild_group"):
            self.proc.register(name, self._recorder(name), f"ctx{rank}")
        self.proc.register("exit", lambda ctx: self.exited.set(), f"ctx{rank}")

    def _recorder(self, name: str) -> Any:
        arity = {"save_ckpt": 4, "rename": 2, "stop": 2, "clean": 3, "repair": 6}.get(name, 3)

        def handler(*args: Any) -> Any:
            self.calls.append((name, args))
            if name == "stop":
                if self.hang_stop:
                    self.unhang.wait(10)
                self.force_stop.set()  # the device stop: ForceStopError at the safe point
            return 0

        handler.__signature__ = _sig(arity)  # type: ignore[attr-defined]
        return handler

    def names(self) -> list[str]:
        return [n for n, _ in self.calls]

    def train(self, fail_at: int = 0, state: ReportState = ReportState.RS_HCCL_FAILED) -> None:
        """``Model.train`` under ``_handle_tft``: steps 1..STEPS, re-entered at the repair step."""
        step, failed = 1, False
        while step <= STEPS:
            if step == fail_at and not failed:
                failed = True
                self.proc.report_error(state.value)
            else:
                self.proc.end_updating_os(step)
                self.proc.pause_train(step)
                if not self.force_stop.is_set():
                    step += 1
                    continue
                self.force_stop.clear()
                self.proc.report_error(ReportState.RS_NORMAL.value)
            action = self.proc.wait_next_action()
            self.actions.append(action)
            if action == Action.EXIT.value:
                return
            step = self.proc.repair_step + 1
        self.proc.done()


def _sig(n: int) -> Any:
    import inspect

    params = [inspect.Parameter(f"a{i}", inspect.Parameter.POSITIONAL_OR_KEYWORD) for i in range(n)]
    return inspect.Signature(params)


@pytest.fixture
def job(tmp_path: Any) -> Iterator[Any]:
    made: list[tuple[ManagerServer, list[Rank]]] = []

    def start(strategies: str, hang_stop: bool = False) -> tuple[ManagerServer, list[Rank]]:
        cfg = JobConfig(
            node_nums=1,
            proc_per_node=2,
            manager_port=0,
            strategies=parse_strategies(strategies),
            heartbeat_s=0.1,
            phase_timeout_s=5.0,
            hang_timeout_s=20.0,
            dump_dir=str(tmp_path / "dump"),
        )
        server = ManagerServer(cfg, events=EventLog(str(tmp_path / "events.jsonl")))
        server.start_thread()
        cfg = cfg.replace(manager_port=server.port)
        ranks = [Rank(0, cfg, hang_stop), Rank(1, cfg)]
        for r in ranks:
            r.proc.start(timeout_s=10)
        made.append((server, ranks))
        wait_for(lambda: all(r.proc._formed for r in ranks), 10, "formation")
        return server, ranks

    yield start
    for server, ranks in made:
        server.stop()
        for r in ranks:
            r.unhang.set()  # its thread ends now, not 10 s after the hang began
            r.proc.close()


def _job_end(server: ManagerServer) -> dict[str, Any]:
    """The job_end event (written just after the Exit it follows went out)."""
    return wait_for(lambda: server.events.recent("job_end"), 10, "job_end")[-1]


def _run(ranks: list[Rank], fail_rank: int, fail_at: int, state: ReportState) -> None:
    threads = [
        threading.Thread(
            target=r.train, args=(fail_at if r.proc.rank == fail_rank else 0, state), daemon=True
        )
        for r in ranks
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
        assert not t.is_alive(), "a training thread is stuck"


def test_mindio_hccl_fault_runs_mindio_order_and_repairs_by_send_recv(job: Any) -> None:
    server, ranks = job("retry,exit")
    survivor, faulty = ranks
    survivor.proc.set_limit_step(3)  # the prelock: the survivor waits at step 3
    faulty.proc.set_limit_step(3)
    _run(ranks, fail_rank=1, fail_at=3, state=ReportState.RS_HCCL_FAILED)
    # MindIO's order; the faulty rank, already out of its step, is not stopped.
    assert survivor.names() == ["stop", "clean", "rebuild_group", "repair"]
    assert faulty.names() == ["clean", "rebuild_group", "repair"]
    assert survivor.proc.repair_type == faulty.proc.repair_type == "recover"
    send = survivor.calls[3][1]
    recv = faulty.calls[2][1]
    assert send[0] == recv[0] == 3  # the repair step: 3 steps done
    assert send[3] == {"repair_type": RepairType.RT_SEND.value, "src": [0], "dst": [1]}
    assert recv[3] == {"repair_type": RepairType.RT_RECV_REPAIR.value, "src": [0], "dst": [1]}
    assert send[1] is True and send[4] is None and send[5] == "ctx0"
    assert survivor.actions == faulty.actions == [Action.RETRY.value]
    assert survivor.proc.repair_step == faulty.proc.repair_step == 3
    wait_for(lambda: server.model.state is JobState.FINISHED, 10, "job end")
    rec = server.events.recent("recovery")[-1]
    assert rec["ok"] is True and rec["strategy"] == "retry"


def test_mindio_unknown_error_with_no_strategy_left_exits(job: Any) -> None:
    server, ranks = job("retry,exit")
    ranks[0].proc.set_limit_step(2)  # still training when the decision comes
    _run(ranks, fail_rank=1, fail_at=2, state=ReportState.RS_UNKNOWN)
    assert all(r.exited.is_set() for r in ranks)
    assert ranks[1].actions == [Action.EXIT.value]
    end = _job_end(server)
    assert end["exit_code"] == exitcodes.JOB_EXIT
    assert "retry: needs a fault the rank survives" in end["reason"]
    assert "worker_fatal" in end["reason"]


def test_mindio_dump_saves_on_one_replica_renames_once_then_exits(job: Any) -> None:
    server, ranks = job("dump,exit")
    ranks[0].proc.set_limit_step(4)  # the survivor must still be there to be dumped
    _run(ranks, fail_rank=1, fail_at=4, state=ReportState.RS_UNKNOWN)
    saved = [r for r in ranks if "save_ckpt" in r.names()]
    renamed = [r for r in ranks if "rename" in r.names()]
    assert len(saved) == 1 and renamed == saved
    step, save_info, args, ctx = saved[0].calls[saved[0].names().index("save_ckpt")][1]
    assert step == saved[0].proc.committed + 1 and ctx == f"ctx{saved[0].proc.rank}"
    assert all(r.exited.is_set() for r in ranks)
    assert _job_end(server)["exit_code"] == exitcodes.DUMPED


def test_mindio_hung_stop_handler_is_bounded_and_escalates(job: Any) -> None:
    server, ranks = job("retry,exit", hang_stop=True)
    ranks[0].proc.set_limit_step(2)
    _run(ranks, fail_rank=1, fail_at=2, state=ReportState.RS_HCCL_FAILED)
    end = _job_end(server)
    assert end["exit_code"] == exitcodes.JOB_EXIT
    faults = [e["detail"] for e in server.events.recent("fault")]
    assert any("stop handler hung past 3s" in d for d in faults), faults


class _FakeLink:
    def __init__(self) -> None:
        self.sent: list[M.Message] = []
        self.committed = -1

    def send(self, msg: M.Message, epoch: int | None = None) -> None:
        self.sent.append(msg)


def test_mindio_reboot_rank_handshake_contract() -> None:
    """A restarted rank: RS_INIT_FINISH held until the survivors rebuilt (the manager's
    REPAIR comes only then), RS_PREREPAIR_FINISH, the receiving repair, then resume."""
    cfg = JobConfig(node_nums=1, proc_per_node=2, phase_timeout_s=5.0)
    rank = Rank(1, cfg)
    proc = rank.proc
    proc.reboot = proc._formed = True
    proc.link = _FakeLink()  # type: ignore[assignment]
    seen: list[int] = []

    def init_and_train() -> None:  # TftHandle.init on a reboot node, then ARF FINISH
        proc.report_error(ReportState.RS_INIT_FINISH.value)
        seen.append(proc.wait_next_action())
        proc.report_error(ReportState.RS_PREREPAIR_FINISH.value)
        seen.append(proc.wait_next_action())

    t = threading.Thread(target=init_and_train, daemon=True)
    t.start()
    proc._handle(2, M.Rebuild([[0, 1]], {}, True, []))
    assert seen == [] and rank.names() == []  # held; a reboot rank rebuilds nothing
    repaired = proc._on_repair(M.Repair(4, 0, [], 0))
    proc._handle(2, M.Resume(5))
    t.join(10)
    assert seen == [Action.RETRY.value, Action.RETRY.value]
    assert rank.names() == ["repair"]
    assert rank.calls[0][1][3] == {"repair_type": 3, "src": [0], "dst": [1]}
    assert repaired.ok and repaired.committed_step == 4 and proc.repair_step == 5


def test_mindio_stop_with_the_prelock_armed_waits_for_the_survivor_to_park() -> None:
    """A stop that arrives between a survivor's optimizer update and its step end (MindSpore's
    flag still reads the world size there, and its stop handler refuses) is carried out only
    once the training thread parks in the prelock."""
    cfg = JobConfig(node_nums=1, proc_per_node=2, phase_timeout_s=5.0)
    proc = Processor(0, 2, cfg, action_timeout_s=5.0)
    proc._formed = True
    parked_at_stop: list[bool] = []
    called = threading.Event()

    def stop(args: Any, ctx: Any) -> None:
        parked_at_stop.append(proc._parked)
        called.set()

    proc.register("stop", stop, "ctx0")
    proc.set_limit_step(3)
    stopper = threading.Thread(target=proc._on_stop, args=(M.Stop("retry: hccl"),), daemon=True)
    stopper.start()
    wait_for(lambda: proc._stopping, 5, "the stop taken")
    assert not called.wait(0.3), "stopped mid-update, before the step end"
    proc.end_updating_os(3)  # the step end: update reported, flag reset, then the prelock
    proc.pause_train(3)  # parks; the stop handler runs and releases the prelock
    proc.report_error(ReportState.RS_NORMAL.value)  # ForceStopError at the safe point
    stopper.join(10)
    assert not stopper.is_alive() and parked_at_stop == [True]


def test_mindio_repair_source_gets_its_receivers_endpoints_before_send_recv() -> None:
    """A survivor sending by send_recv: the Repair's endpoints reach the data plane first (a
    repair pair is rarely a ring neighbour, so the Rebuild did not carry them)."""
    cfg = JobConfig(node_nums=1, proc_per_node=4, phase_timeout_s=5.0)
    rank = Rank(0, cfg)
    proc = rank.proc
    proc._formed, proc.committed = True, 4
    order: list[str] = []

    class Plane:
        def add_peers(self, endpoints: dict[int, str]) -> None:
            order.append(f"peers {endpoints}")

    proc.data_plane = Plane()  # type: ignore[assignment]
    rank.proc.register("repair", lambda *a: order.append("repair") or 0, "ctx0")
    repaired = proc._on_repair(M.Repair(4, 0, [3], -1, {3: "tcp://h3:1"}))
    assert repaired.ok and order == ["peers {3: 'tcp://h3:1'}", "repair"]


def test_mindio_controller_calls_mindx_callbacks_with_one_or_two_args() -> None:
    ctl = Controller(0, 2)
    got: dict[str, tuple[Any, ...]] = {}
    ctl.register_callback("report_fault_ranks", lambda d: got.setdefault("one", (d,)))
    event = line(1.0, "fault", kind="worker_error", rank=1, detail="x")
    ctl._on_event(event)
    ctl.register_callback("report_fault_ranks", lambda d, info: got.setdefault("two", (d, info)))
    ctl._on_event(event)
    assert got["one"] == ({1: "worker_error"},)
    assert got["two"] == ({1: "worker_error"}, {"detail": "x"})
