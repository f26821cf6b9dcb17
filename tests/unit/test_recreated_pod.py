"""A pod recreated before its loss was noticed (a killed agent): its new ranks may register
before the manager decided on the restart, and must still count as the round's replacements.

The race a full suite met (test_killed_agent, test_fault[node-loss]): the new agent's claim is
accepted (TAKEOVER: a NODE_RESTARTED fault waits for the next decide), its ranks' hellos come
in the same drain, and the round the decision then starts replaced the node's ranks, dropping
the registrations just made; the ranks never said hello again and the round timed out.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from ms_recover.manager.slots import TAKEOVER_BEATS
from ms_recover.observability.schema import FaultKind, JobState
from ms_recover.protocol import messages as M
from ms_recover.protocol.codec import Envelope
from tests.unit.test_divergence import ServerJob


@pytest.fixture
def job() -> Iterator[ServerJob]:
    """2 nodes x 2 ranks, running at step 10, on a real ManagerServer's handlers."""
    running = ServerJob("recover-in-place,recover,exit")
    running.running(step=10)
    yield running
    running.server.close()


def _welcomes(job: ServerJob) -> list[tuple[bytes, M.Welcome]]:
    sent: list[tuple[bytes, M.Welcome]] = []
    job.server.workers.send = lambda ident, msg: sent.append((ident, msg))
    return sent


def _takeover(job: ServerJob) -> None:
    """A new agent incarnation for node 1 while the old one has been silent long enough."""
    agent = job.model.agents[1]
    agent.last_seen = job.now - TAKEOVER_BEATS * job.config.agent_heartbeat_s - 0.1
    hello = M.AgentHello(1, "10.0.0.9", [2, 3], 9999, False)
    job.server._on_agent_hello(b"a1-new", Envelope("unit", 1, "agent:1", 0, hello, 77), hello)
    assert [f.kind for f in job.model.pending] == [FaultKind.NODE_RESTARTED]


def _rank_hello(job: ServerJob, rank: int, ident: bytes) -> None:
    hello = M.WorkerHello(rank, 1, 5000 + rank, 1, f"tcp://h{rank}:9", -1, 0)
    job.server.workers.on_hello(ident, Envelope("unit", 0, f"rank:{rank}", 0, hello, rank), hello)


def test_ranks_that_register_before_the_restart_is_decided_are_its_replacements(
    job: ServerJob,
) -> None:
    sent = _welcomes(job)
    _takeover(job)
    _rank_hello(job, 2, b"r2-new")  # before the decision on the restart
    assert sent == [] and not job.model.ranks[2].alive  # it waits for that decision
    job.server._decide_and_execute()
    rnd = job.model.round
    assert rnd is not None and rnd.replace_ranks == {2, 3}
    assert job.model.state is JobState.STOPPING
    r2 = job.model.ranks[2]
    assert r2.alive and r2.identity == b"r2-new" and r2.pid == 5002
    assert [(i, w.ok, w.reboot) for i, w in sent] == [(b"r2-new", True, True)]
    _rank_hello(job, 3, b"r3-new")  # after it: handled at once
    assert job.model.ranks[3].alive and sent[-1] == (b"r3-new", job.server.workers._welcome(True))


def test_a_hello_of_a_rank_no_fault_names_is_handled_at_once(job: ServerJob) -> None:
    sent = _welcomes(job)
    job.fault("rank_exit", 1)  # node 0's rank: says nothing about node 1's ranks
    job.model.ranks[3].alive = False  # as if its exit had been reported and decided
    _rank_hello(job, 3, b"r3-new")
    assert job.model.ranks[3].alive and [i for i, _ in sent] == [b"r3-new"]
