"""ManagerRelay.take: what the manager sends to relayed ranks, queued per node in order."""

from __future__ import annotations

from typing import Any

from ms_recover.config import JobConfig
from ms_recover.manager.model import JobModel
from ms_recover.manager.relay import ManagerRelay
from ms_recover.manager.slots import Slots
from ms_recover.protocol import messages as M
from ms_recover.protocol.codec import Codec
from ms_recover.protocol.relay import virtual_identity


def _relay() -> ManagerRelay:
    cfg = JobConfig(job_id="take", node_nums=3, proc_per_node=2, manager_port=0)
    codec = Codec(cfg.job_id, cfg.effective_secret())
    sock: Any = None  # take() only queues; nothing is sent
    slots = Slots(cfg.agent_heartbeat_s, cfg.proc_per_node)
    return ManagerRelay(JobModel(cfg), slots, codec, sock, lambda: 1, lambda: 0.0)


def _v(agent: bytes, local: bytes) -> bytes:
    return virtual_identity(agent, local)


def test_a_broadcast_is_one_item_per_node_and_direct_identities_come_back_in_order() -> None:
    relay = _relay()
    stop = M.Stop("rank 1 died")
    idents = [
        _v(b"a0", b"r0"),
        _v(b"a0", b"r1"),
        b"direct-1",
        _v(b"a1", b"r2"),
        _v(b"a0", b"r9"),  # node 0 again, after node 1: joins node 0's item
        b"direct-2",
        _v(b"a1", b"r3"),
    ]
    assert relay.take(idents, stop, 4) == [b"direct-1", b"direct-2"]
    assert relay._out == {
        b"a0": [[stop, 4, [b"r0", b"r1", b"r9"]]],
        b"a1": [[stop, 4, [b"r2", b"r3"]]],
    }


def test_another_message_or_epoch_starts_a_new_item_and_equal_messages_share_one() -> None:
    relay = _relay()
    a, b = M.Stop("x"), M.Stop("y")
    relay.take([_v(b"a0", b"r0")], a, 4)
    relay.take([_v(b"a0", b"r1")], M.Stop("x"), 4)  # equal to a: shares its item
    relay.take([_v(b"a0", b"r0"), _v(b"a0", b"r1")], b, 4)
    relay.take([_v(b"a0", b"r0")], b, 5)
    assert relay._out[b"a0"] == [
        [a, 4, [b"r0", b"r1"]],
        [b, 4, [b"r0", b"r1"]],
        [b, 5, [b"r0"]],
    ]


def test_a_nodes_ranks_are_its_own_range() -> None:
    relay = _relay()
    mine = relay._mine(1)
    assert [r for r in range(-1, 8) if r in mine] == [2, 3]
    assert not [r for r in range(-1, 8) if r in relay._mine(7)]  # no such node
