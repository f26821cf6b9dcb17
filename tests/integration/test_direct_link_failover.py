"""Members that talk to the manager directly follow a takeover (docs/manager-takeover.md, the
msrun path): msrun's ranks (no relay) and the TaskD shim's agent.

Two raw ROUTER sockets on 127.0.0.1 stand in for the managers of ``MS_RECOVER_MANAGERS``:
the first one's loss (its socket closed: the connection drops as when node 0's pod dies) makes
a rank's :class:`ManagerLink` move to the second and register there; a TaskD agent whose first
manager never welcomes it (a recreated node 0's manager, standing by) moves on while it waits
for its welcome, before msrun starts any worker.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

import pytest
import zmq

from ms_recover.agent.agent import Agent
from ms_recover.config import JobConfig
from ms_recover.localrun.wait import wait_for
from ms_recover.protocol import messages as M
from ms_recover.protocol.codec import Codec, Envelope
from ms_recover.worker.link import ManagerLink
from tests.integration.test_claimant_waits_for_welcome import _NoHands

pytestmark = pytest.mark.timeout(60)


class FakeManager:
    """A bound ROUTER that records every decoded frame and can answer."""

    def __init__(self, ctx: zmq.Context[zmq.Socket[bytes]], config: JobConfig) -> None:
        self.sock = ctx.socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.port = self.sock.bind_to_random_port("tcp://127.0.0.1")
        self.codec = Codec(config.job_id, config.effective_secret(), config.max_frame_bytes)
        self.got: list[tuple[bytes, Envelope]] = []
        self._seq = 0

    def pump(self) -> None:
        """Read what is queued (non-blocking)."""
        while self.sock.poll(0):
            ident, *frames = self.sock.recv_multipart()
            self.got.append((ident, self.codec.decode(frames)))

    def kinds(self) -> list[type[M.Message]]:
        self.pump()
        return [type(env.msg) for _, env in self.got]

    def answer(self, ident: bytes, msg: M.Message) -> None:
        self._seq += 1
        self.sock.send_multipart([ident, *self.codec.encode(msg, 0, "manager", self._seq)])


@pytest.fixture
def managers() -> Iterator[tuple[JobConfig, FakeManager, FakeManager]]:
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    base = JobConfig(job_id="link-failover", node_nums=2, proc_per_node=1, heartbeat_s=0.1)
    first, second = FakeManager(ctx, base), FakeManager(ctx, base)
    cfg = base.replace(
        manager_port=first.port,
        managers=(f"127.0.0.1:{first.port}", f"127.0.0.1:{second.port}"),
    )
    try:
        yield cfg, first, second
    finally:
        for m in (first, second):
            m.sock.close(0)
        ctx.term()


def _hello(rank: int) -> M.WorkerHello:
    return M.WorkerHello(rank, 1, 4242, 0, "tcp://127.0.0.1:1", 7, 0)


@contextlib.contextmanager
def rank_link(cfg: JobConfig, first: FakeManager) -> Iterator[ManagerLink]:
    """Rank 1's link, registered as a session does, its hello seen by ``first``."""
    link = ManagerLink(cfg, 1, b"r1", lambda: None)
    link.registration = lambda: [_hello(1)]
    link.send(_hello(1))
    link.start()
    try:
        wait_for(lambda: M.WorkerHello in first.kinds(), 10, "the hello at the first manager")
        yield link
    finally:
        link.close()


def test_a_direct_rank_link_moves_to_the_standby_when_its_manager_is_lost(managers) -> None:
    cfg, first, second = managers
    with rank_link(cfg, first):
        ident = first.got[0][0]
        first.answer(ident, M.Welcome(True, "", False, 2, []))
        wait_for(lambda: M.WorkerHeartbeat in first.kinds(), 10, "a heartbeat after the welcome")
        assert second.kinds() == [], "a welcomed rank left its manager"
        first.sock.close(0)  # the manager's pod is gone: its connections drop
        wait_for(lambda: M.WorkerHello in second.kinds(), 10, "the hello at the standby")
        hello = next(env.msg for _, env in second.got if isinstance(env.msg, M.WorkerHello))
        assert hello.committed_step == 7  # the registration, as for a restarted manager


def test_a_direct_rank_link_waits_for_its_first_manager_however_long(managers) -> None:
    """A first hello that the manager holds (its node's claim undecided) is not given up on:
    only a link that moved leaves a manager for not answering."""
    cfg, first, second = managers
    with rank_link(cfg, first):
        beats = lambda: first.kinds().count(M.WorkerHeartbeat)  # noqa: E731
        wait_for(lambda: beats() >= int(3 * cfg.silence_s / cfg.heartbeat_s), 20, "3 silences")
        assert second.kinds() == [], "left a live manager that held its first hello"


def test_a_taskd_agent_moves_on_from_a_standby_while_it_waits_for_its_welcome(
    managers,
) -> None:
    """A recreated node 0's TaskD agent (msrun's) says hello to its own pod's manager first,
    which stands by and never answers: it moves to the next one, is welcomed there, and
    tells its workers to start at that one."""
    cfg, first, second = managers
    agent = Agent(cfg.replace(node_rank=0), [], hands=_NoHands())
    stop = threading.Event()

    def serve_second() -> None:  # the active manager: welcomes every agent
        while not stop.is_set():
            if second.sock.poll(20):
                ident, *frames = second.sock.recv_multipart()
                env = second.codec.decode(frames)
                second.got.append((ident, env))
                if isinstance(env.msg, M.AgentHello):
                    second.answer(ident, M.AgentWelcome(True, ""))

    thread = threading.Thread(target=serve_second, daemon=True)
    thread.start()
    try:
        agent.hello()
        assert agent.await_welcome(10 * cfg.silence_s), "never welcomed"
        assert agent.manager_index == 1
        assert M.AgentHello in first.kinds()  # it did try its own pod's manager first
    finally:
        stop.set()
        thread.join(timeout=5)
        agent.close()
