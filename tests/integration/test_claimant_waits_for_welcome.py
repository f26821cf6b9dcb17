"""A new agent incarnation whose claim on its node is held gets its answer while it waits.

A pod recreated before its loss was noticed: its new agent says hello while the old agent
still counts as alive and was heard moments ago, so the manager holds the claim until the old
one has been silent for ``TAKEOVER_BEATS`` heartbeat intervals, and decides it when the
claimant speaks again (DESIGN.md §5). The TaskD shim's agent (msrun's pods) waits for its
welcome before it starts anything, so it must beat while it waits: it once waited in silence,
the claim was never decided, and after ``manager_wait_s`` the node ran without fault recovery
(`tests/e2e/test_msrun.py::test_killed_msrun_is_replaced_by_a_new_pod_under_recover`, exit 87).
A real :class:`ManagerServer` thread and a real :class:`~ms_recover.agent.agent.Agent`.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence

import pytest
import zmq

from ms_recover.agent.agent import Agent
from ms_recover.agent.hands import Exited
from ms_recover.config import JobConfig
from ms_recover.events import EventLog
from ms_recover.manager.server import ManagerServer
from ms_recover.protocol import messages as M
from ms_recover.protocol.codec import Codec
from ms_recover.testing.wait import wait_for

pytestmark = pytest.mark.timeout(60)

JOB = "claimant"


class _NoHands:
    """Rank hands that are never asked to do anything before the welcome."""

    def start_all(self, ranks: Sequence[int]) -> None:
        raise AssertionError("started ranks before the welcome")

    def start(self, rank: int) -> int:
        raise AssertionError("started a rank before the welcome")

    def poll(self) -> list[Exited]:
        return []

    def kill(self, ranks: list[int]) -> list[Exited]:
        return []

    def pids(self) -> dict[int, int]:
        return {}

    def training(self) -> None:
        pass

    def close(self) -> None:
        pass


class _OldAgent:
    """The node's first agent: a raw DEALER that registers and beats on demand."""

    def __init__(self, ctx: zmq.Context, srv: ManagerServer, node: int) -> None:
        self.sock = ctx.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.connect(f"tcp://127.0.0.1:{srv.port}")
        self.codec = Codec(JOB, srv.config.effective_secret())
        self.node, self.seq = node, 0

    def send(self, msg: M.Message) -> None:
        self.seq += 1
        self.sock.send_multipart(self.codec.encode(msg, 0, f"agent:{self.node}", self.seq))


@pytest.fixture
def running() -> Iterator[tuple[ManagerServer, zmq.Context]]:
    cfg = JobConfig(
        job_id=JOB, node_nums=2, proc_per_node=1, manager_port=0, heartbeat_s=0.25, liveness=4
    )
    srv = ManagerServer(cfg, events=EventLog(), bind="127.0.0.1")
    thread = srv.start_thread()
    ctx = zmq.Context()
    yield srv, ctx
    srv.stop()
    thread.join(10)
    assert not thread.is_alive()
    ctx.destroy(linger=0)


def test_a_held_claim_is_decided_while_the_new_agent_waits_for_its_welcome(running) -> None:
    srv, ctx = running
    old = _OldAgent(ctx, srv, 1)
    old.send(M.AgentHello(1, "127.0.0.1", [1], 4242, False))
    wait_for(lambda: srv.model.agents[1].alive, 10, "the old agent registered")
    old.send(M.AgentHeartbeat(1, {}))  # heard just now: a new incarnation's claim is held
    new = Agent(srv.config.replace(node_rank=1, manager_port=srv.port), [], hands=_NoHands())
    try:
        new.hello()
        wait_for(lambda: srv.slots.claims.get(1) is not None, 10, "the claim held")
        t0 = time.monotonic()
        # The old agent says nothing more (its pod is gone). Takeover needs it silent for
        # TAKEOVER_BEATS agent beats; the claimant's own beats while it waits ask again.
        assert new.await_welcome(20.0), "no welcome: the held claim was never decided"
        waited = time.monotonic() - t0
        assert new.exit_code is None  # welcomed, not refused
        assert 1 not in srv.slots.claims
        assert waited < 10 * srv.config.agent_heartbeat_s, waited
    finally:
        new.close()
