"""An agent's planned stop (SIGTERM: a pod deletion, a node drain) with real ZeroMQ.

The agent says at once that its node is leaving (``NodeLeaving``, with its deadline), keeps
its ranks running, and leaves when the manager tells it, or by itself at the deadline (the
pod's termination grace less a safety margin; at once when no manager ever welcomed it, see
tests/integration/test_cli.py). A real :class:`~ms_recover.agent.agent.Agent`
with in-memory rank hands; a real :class:`ManagerServer` thread, or a bare ROUTER that never
answers (a manager that cannot act in time).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import pytest
import zmq

from ms_recover import exitcodes
from ms_recover.agent.agent import Agent
from ms_recover.agent.hands import Exited
from ms_recover.agent.leaving import LEFT_AT_DEADLINE, leave_margin_s
from ms_recover.config import JobConfig
from ms_recover.localrun.wait import wait_for
from ms_recover.protocol import messages as M
from ms_recover.protocol.codec import Codec
from tests.integration.test_saturated_manager import Agent as RawAgent
from tests.integration.test_saturated_manager import serving

pytestmark = pytest.mark.timeout(60)


class _Hands:
    """One local rank that runs until it is killed."""

    def __init__(self, rank: int) -> None:
        self.rank, self.running = rank, False
        self.killed: list[float] = []

    def start_all(self, ranks: Sequence[int]) -> None:
        self.running = True

    def start(self, rank: int) -> int:
        raise AssertionError("a leaving node restarted a rank")

    def poll(self) -> list[Exited]:
        return []

    def kill(self, ranks: list[int]) -> list[Exited]:
        if not self.running or self.rank not in ranks:
            return []
        self.running = False
        self.killed.append(time.monotonic())
        return [Exited(self.rank, 4242, -9, 9, time.time())]

    def pids(self) -> dict[int, int]:
        return {self.rank: 4242} if self.running else {}

    def training(self) -> None:
        pass

    def close(self) -> None:
        self.running = False


def _serve(agent: Agent) -> tuple[threading.Thread, list[int]]:
    codes: list[int] = []
    thread = threading.Thread(target=lambda: codes.append(agent.run()), daemon=True)
    thread.start()
    return thread, codes


def test_a_leaving_agent_tells_the_manager_and_leaves_when_told() -> None:
    with serving() as (srv, ctx):
        node0 = RawAgent(ctx, srv, 0)  # stays: one node leaving is not the job deleted
        node0.hello()

        def beating(cond: Callable[[], Any]) -> Callable[[], Any]:
            def check() -> Any:
                node0.beat()
                return cond()

            return check

        hands = _Hands(1)
        agent = Agent(srv.config.replace(node_rank=1, manager_port=srv.port), [], hands=hands)
        thread, codes = _serve(agent)
        alive = srv.model.agents

        # Registered, and welcomed as the agent sees it: the manager marks it alive before
        # its welcome is on the wire (an agent no manager welcomed leaves at once).
        def welcomed() -> bool:
            return alive[0].alive and alive[1].alive and agent._welcomed

        wait_for(beating(welcomed), 10, "agents registered and welcomed")
        asked = time.time()
        agent.leave("SIGTERM")
        found = wait_for(beating(lambda: srv.events.recent("planned_stop")), 5, "planned_stop")
        stop = found[0]
        assert stop["ts"] - asked < 1.0 and stop["node_rank"] == 1
        assert stop["grace_s"] == pytest.approx(30.0 - leave_margin_s(30.0), abs=1.0)
        assert hands.running and not hands.killed  # the ranks run until the manager decides
        wait_for(beating(lambda: codes), 20, "agent 1 leaves")
        assert codes == [exitcodes.RESCHEDULE]  # sent away to have its pod recreated
        assert hands.killed and hands.killed[0] - asked < 20
        (decision,) = srv.events.recent("decision")
        assert decision["strategy"] == "recover" and decision["nodes"] == [1]
        assert srv.events.recent("fault") == []
        thread.join(10)


def test_a_leaving_agent_kills_its_ranks_itself_at_the_deadline() -> None:
    ctx = zmq.Context()
    router = ctx.socket(zmq.ROUTER)
    router.setsockopt(zmq.LINGER, 0)
    try:
        port = router.bind_to_random_port("tcp://127.0.0.1")
        cfg = JobConfig(
            job_id="leave", node_nums=2, node_rank=1, manager_port=port, termination_grace_s=1.0
        )
        hands = _Hands(1)
        agent = Agent(cfg, [], hands=hands)
        thread, codes = _serve(agent)
        codec = Codec(cfg.job_id, cfg.effective_secret(), cfg.max_frame_bytes)
        assert router.poll(10_000), "no hello"
        ident, *frames = router.recv_multipart()
        assert isinstance(codec.decode(frames).msg, M.AgentHello)
        router.send_multipart([ident, *codec.encode(M.AgentWelcome(True, ""), 0, "manager", 1)])
        wait_for(lambda: hands.running and agent._welcomed, 10, "the ranks started, welcomed")
        asked = time.monotonic()
        agent.leave("SIGTERM")  # the "manager" answers nothing more
        got: list[M.Message] = []

        def leaving_heard() -> bool:
            if router.poll(100):
                got.append(codec.decode(router.recv_multipart()[1:]).msg)
            return any(isinstance(m, M.NodeLeaving) for m in got)

        wait_for(leaving_heard, 5, "NodeLeaving")
        (msg,) = [m for m in got if isinstance(m, M.NodeLeaving)]
        assert msg.node_rank == 1 and msg.reason.startswith("SIGTERM")
        assert 0.5 < msg.deadline_s <= 1.0 - leave_margin_s(1.0)
        thread.join(10)
        assert codes == [LEFT_AT_DEADLINE] == [143]
        left = hands.killed[0] - asked
        assert 1.0 - leave_margin_s(1.0) - 0.05 <= left < 1.0, left  # before the SIGKILL
    finally:
        router.close(0)
        ctx.term()
