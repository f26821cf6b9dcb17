"""A new agent incarnation whose claim on its node is held gets its answer while it waits.

A pod recreated before its loss was noticed: its new agent says hello while the old agent
still counts as alive and was heard moments ago, so the manager holds the claim until the old
one has been silent for ``TAKEOVER_BEATS`` heartbeat intervals, and decides it when the
claimant speaks again (docs/design.md §5). The TaskD shim's agent (msrun's pods) waits for its
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
from ms_recover.localrun.wait import wait_for
from ms_recover.manager.server import ManagerServer
from tests.integration.test_saturated_manager import Agent as RawAgent
from tests.integration.test_saturated_manager import serving

pytestmark = pytest.mark.timeout(60)


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


@pytest.fixture
def running() -> Iterator[tuple[ManagerServer, zmq.Context]]:
    with serving() as got:
        yield got


def test_a_held_claim_is_decided_while_the_new_agent_waits_for_its_welcome(running) -> None:
    srv, ctx = running
    old = RawAgent(ctx, srv, 1)  # the node's first agent
    old.hello()
    wait_for(lambda: srv.model.agents[1].alive, 10, "the old agent registered")
    old.beat()  # heard just now: a new incarnation's claim is held
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
