"""The slot rule (issue 9 #7), pure: a new incarnation takes a slot only on evidence."""

from __future__ import annotations

from ms_recover.manager.slots import TAKEOVER_BEATS, Hello, Slots
from ms_recover.protocol import messages as M
from ms_recover.protocol.codec import Envelope

HB = 0.5


def _hello(nonce: int, ident: bytes = b"a1") -> tuple[bytes, Envelope]:
    msg = M.AgentHello(1, "127.0.0.1", [2, 3], 100 + nonce, False)
    return ident, Envelope("j", 0, "agent:1", 0, msg, nonce)


def _worker(rank: int, ident: bytes) -> tuple[bytes, Envelope]:
    msg = M.WorkerHello(rank, 1, 700 + rank, 1, "tcp://h:1", -1, 0)
    return ident, Envelope("j", 0, f"rank:{rank}", 0, msg, 50 + rank)


def test_free_slots_and_the_same_incarnation_register() -> None:
    slots = Slots(HB, 2)
    assert slots.agent_hello(1, _hello(1), alive=False, silent_s=0.0) is Hello.REGISTER
    slots.agent_registered(1, 1)
    assert slots.agent_hello(1, _hello(1), alive=True, silent_s=0.0) is Hello.REGISTER


def test_a_new_incarnation_waits_for_silence_then_takes_over() -> None:
    slots = Slots(HB, 2)
    slots.agent_registered(1, 1)
    assert slots.agent_hello(1, _hello(2, b"new"), alive=True, silent_s=0.2) is Hello.HOLD
    assert slots.hold_worker(1, _worker(2, b"r2")) and slots.hold_worker(1, _worker(3, b"r3"))
    assert not slots.hold_worker(1, _worker(3, b"r3-again"))  # at most a node's ranks
    assert slots.claimant(1, b"new") is not None and slots.claimant(1, b"a1") is None
    silent = TAKEOVER_BEATS * HB
    assert slots.agent_hello(1, _hello(2, b"new"), alive=True, silent_s=silent) is Hello.TAKEOVER
    slots.agent_registered(1, 2)
    assert [ident for ident, _ in slots.take_released()] == [b"r2", b"r3"]
    assert slots.take_released() == [] and slots.claims == {}


def test_a_claim_is_refused_when_the_old_agent_speaks() -> None:
    slots = Slots(HB, 2)
    slots.agent_registered(1, 1)
    assert slots.agent_hello(1, _hello(9, b"impostor"), alive=True, silent_s=0.0) is Hello.HOLD
    slots.hold_worker(1, _worker(2, b"r2"))
    assert slots.refuse(1) == [b"impostor", b"r2"]
    assert slots.refuse(1) == [] and slots.claimant(1, b"impostor") is None
    assert not slots.hold_worker(1, _worker(2, b"r2"))  # no claim: handled at once


def test_a_live_rank_slot_is_never_taken_by_another_process() -> None:
    slots = Slots(HB, 2)
    slots.rank_nonce[2] = 5
    assert not slots.rank_taken(2, alive=True, pid=10, hello_pid=10, nonce=5)  # itself again
    assert slots.rank_taken(2, alive=True, pid=10, hello_pid=11, nonce=6)
    assert slots.rank_taken(2, alive=True, pid=10, hello_pid=10, nonce=6)  # a replay's nonce
    assert not slots.rank_taken(2, alive=False, pid=10, hello_pid=11, nonce=6)  # known gone
