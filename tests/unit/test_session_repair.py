"""A rank's side of REBUILD and REPAIR: what it builds, loads and reports, and which steps it
did not run."""

from __future__ import annotations

import threading
from typing import Any

import numpy as np
import pytest

from ms_recover.comm.local import LocalBackend
from ms_recover.config import JobConfig
from ms_recover.errors import CommError, RecoveryError
from ms_recover.protocol import messages as M
from ms_recover.worker import repair
from ms_recover.worker.phase import Phase
from ms_recover.worker.session import Session


class ArrayState:
    def __init__(self, value: float) -> None:
        self.arrays = {"w": np.full(3, value, dtype=np.float32)}

    def state_dict(self) -> dict[str, np.ndarray]:
        return {k: v.copy() for k, v in self.arrays.items()}

    def load_state_dict(self, arrays: dict[str, np.ndarray]) -> None:
        self.arrays = {k: v.copy() for k, v in arrays.items()}


class PeerBackend(LocalBackend):
    """A one-rank backend whose peers are scripted: recv returns ``inbox[src]``."""

    def __init__(self, inbox: dict[int, dict[str, np.ndarray]]) -> None:
        super().__init__()
        self.inbox, self.sent = inbox, []  # type: ignore[var-annotated]

    def send(self, arrays: dict[str, np.ndarray], dst: int, tag: str = "") -> None:
        self.sent.append((dst, tag, arrays))

    def add_peers(self, endpoints: dict[int, str]) -> None:
        self.sent.append(("peers", dict(endpoints)))

    def recv(self, src: int, tag: str = "") -> dict[str, np.ndarray]:
        return self.inbox[src]


class Link:
    def __init__(self) -> None:
        self.sent: list[M.Message] = []
        self.committed = -1

    def send(self, msg: M.Message, epoch: int | None = None) -> None:
        self.sent.append(msg)


def _session(committed: int, inbox: dict[int, Any]) -> tuple[Session, ArrayState, Link]:
    state = ArrayState(float(committed))
    session = Session(JobConfig(), 0, PeerBackend(inbox), state, standalone=True)
    link = Link()
    session.link = link  # type: ignore[assignment]
    session.committed = link.committed = committed
    session.phase = Phase.REBUILT  # a REPAIR follows a REBUILD
    return session, state, link


@pytest.mark.parametrize(
    "committed, skipped",
    [
        (8, [(9, 9)]),  # a survivor whose step 9 was interrupted while a peer committed it
        (-1, [(0, 9)]),  # a restarted rank: it ran none of steps 0..9
        (9, []),  # already at the target: the copy changes no step
    ],
    ids=["survivor-behind", "restarted", "at-target"],
)
def test_a_received_state_is_loaded_and_the_steps_not_run_are_recorded(committed, skipped):
    session, state, link = _session(
        committed, {2: repair.pack({"w": np.full(3, 9.0, np.float32)}, 9)}
    )
    assert session._handle(4, M.Repair(target_step=9, attempt=0, send_to=[], recv_from=2)) is False
    assert state.arrays["w"].tolist() == [9.0, 9.0, 9.0]
    assert session.committed == link.committed == 9
    assert session.skipped == skipped
    assert link.sent == [M.Repaired(0, 0, True, 9, -1, "")]


def test_a_source_sends_its_state_and_skips_nothing():
    session, _, link = _session(9, {})
    endpoints = {1: "tcp://h1:1", 3: "tcp://h3:1"}
    session._handle(4, M.Repair(9, 1, send_to=[1, 3], recv_from=-1, endpoints=endpoints))
    backend = session.comm
    assert backend.sent[0] == ("peers", endpoints)  # the pairs' endpoints before the sends
    assert [(dst, tag) for dst, tag, _ in backend.sent[1:]] == [
        (1, "repair.4.1"),
        (3, "repair.4.1"),
    ]
    arrays, step = repair.unpack(backend.sent[1][2], src=0)
    assert step == 9 and arrays["w"].tolist() == [9.0, 9.0, 9.0]
    assert session.skipped == [] and link.sent == [M.Repaired(0, 1, True, 9, -1, "")]


def test_a_state_of_the_wrong_step_is_refused_and_nothing_changes():
    session, state, link = _session(8, {2: repair.pack({"w": np.zeros(3, np.float32)}, 7)})
    session._handle(4, M.Repair(target_step=9, attempt=0, send_to=[], recv_from=2))
    assert state.arrays["w"].tolist() == [8.0, 8.0, 8.0]
    assert session.committed == 8 and session.skipped == []
    (reply,) = link.sent
    assert isinstance(reply, M.Repaired) and not reply.ok and reply.failed_peer == 2
    assert "sent step 7, expected 9" in reply.reason


def _stateless(committed: int, inbox: dict[int, Any]) -> tuple[Session, Link]:
    session, _, link = _session(committed, inbox)
    session.state = None  # ms_recover.init() without state=
    return session, link


def test_without_a_state_provider_a_repair_carries_the_step_alone():
    """A script with no named state (``ms_recover.init()``) is repaired like any other: the
    source sends its step, the restarted rank takes it (its data position follows)."""
    source, link = _stateless(9, {})
    source._handle(4, M.Repair(9, 0, send_to=[1], recv_from=-1, endpoints={1: "tcp://h1:1"}))
    (dst, _, payload) = source.comm.sent[1]
    assert dst == 1 and repair.unpack(payload, src=0) == ({}, 9)
    assert link.sent == [M.Repaired(0, 0, True, 9, -1, "")]
    restarted, link = _stateless(-1, {2: payload})
    restarted._handle(4, M.Repair(target_step=9, attempt=0, send_to=[], recv_from=2))
    assert restarted.committed == link.committed == 9 and restarted.skipped == [(0, 9)]
    assert link.sent == [M.Repaired(0, 0, True, 9, -1, "")]


def test_state_received_by_a_rank_without_a_provider_is_refused():
    session, link = _stateless(-1, {2: repair.pack({"w": np.zeros(3, np.float32)}, 9)})
    session._handle(4, M.Repair(target_step=9, attempt=0, send_to=[], recv_from=2))
    (reply,) = link.sent
    assert isinstance(reply, M.Repaired) and not reply.ok and session.committed == -1
    assert "received state ['w'] from rank" in reply.reason and "no state provider" in reply.reason


def test_no_state_from_a_source_without_a_provider_is_refused():
    session, state, link = _session(-1, {2: repair.pack({}, 9)})
    session._handle(4, M.Repair(target_step=9, attempt=0, send_to=[], recv_from=2))
    (reply,) = link.sent
    assert isinstance(reply, M.Repaired) and not reply.ok and session.committed == -1
    assert "received no state (its source has no state provider)" in reply.reason
    assert state.arrays["w"].tolist() == [-1.0, -1.0, -1.0]


class RebuildRecorder(LocalBackend):
    def __init__(self, world_size: int) -> None:
        super().__init__()
        self.world_size = world_size
        self.builds: list[tuple[int, dict[int, str]]] = []

    def rebuild(self, epoch: int, members: dict[int, str], group_log: Any) -> None:
        self.builds.append((epoch, dict(members)))


def test_a_rebuild_builds_the_world_with_only_the_endpoints_it_carries():
    backend = RebuildRecorder(4)
    session = Session(JobConfig(), 0, backend, ArrayState(0.0), standalone=True)
    session.link = Link()  # type: ignore[assignment]
    session.phase = Phase.STOPPED  # a REBUILD follows a STOP
    session._handle(1, M.Rebuild([[0, 3]], {1: "tcp://h1:1", 2: "tcp://h2:1"}, True, []))
    session._handle(2, M.Rebuild([[0, 3]], {1: "tcp://h1:2"}, False, []))
    session._handle(3, M.Rebuild([[0, 1], [3, 3]], {3: "tcp://h3:2"}, False, []))  # 2 left
    assert backend.builds == [  # "" marks a member this rank does not send to; none carried
        (1, {0: "", 1: "tcp://h1:1", 2: "tcp://h2:1", 3: ""}),
        (2, {0: "", 1: "tcp://h1:2", 2: "", 3: ""}),
        (3, {0: "", 1: "", 3: "tcp://h3:2"}),
    ]
    assert session.members == [0, 1, 3] and session.data_world == 3
    assert session.link.sent == [M.Rebuilt(0)] * 3  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    "msg, problem",
    [
        (M.Rebuild([[0, 2]], {3: "tcp://h3:1"}, False, []), r"ranks \[3\] outside its world"),
        (M.Rebuild([[0, 4]], {}, True, []), "malformed REBUILD"),
    ],
    ids=["endpoint-outside-the-world", "rank-outside-the-world"],
)
def test_a_rebuild_the_rank_cannot_follow_is_a_recovery_error(msg, problem):
    session = Session(JobConfig(), 0, RebuildRecorder(4), ArrayState(0.0), standalone=True)
    session.link = Link()  # type: ignore[assignment]
    session.phase = Phase.STOPPED
    with pytest.raises(RecoveryError, match=problem):
        session._handle(1, msg)


class GroupBackend(PeerBackend):
    """Rank 0 of four: groups of any of them are accepted (their traffic is not the point)."""

    def _make_group(self, name: str, ranks: tuple[int, ...]) -> None:
        pass


def _grouping_session(timeout_s: float) -> tuple[Session, PeerBackend, Link]:
    backend = GroupBackend({})
    backend.world_size = 4
    config = JobConfig(phase_timeout_s=timeout_s, heartbeat_s=0.05)
    session = Session(config, 0, backend, standalone=True)
    link = Link()
    session.link = link  # type: ignore[assignment]
    backend.on_group_created = session._group_created
    return session, backend, link


def test_a_member_of_a_new_group_waits_for_its_peers_endpoints():
    session, backend, link = _grouping_session(20.0)
    answer = M.Peers("g", {2: "tcp://h2:1"})
    timer = threading.Timer(0.05, session._on_peers, (answer,))  # the link thread's part
    timer.start()
    try:
        backend.create_group("g", [0, 2])
    finally:
        timer.join()
    assert link.sent == [M.GroupCreated(0, "g", [0, 2])]
    assert backend.sent == [("peers", {2: "tcp://h2:1"})]
    backend.create_group("h", [1, 2])  # not a member: nothing to wait for
    assert backend.sent == [("peers", {2: "tcp://h2:1"})]


def test_a_new_group_whose_peers_never_come_is_a_comm_error():
    _, backend, _ = _grouping_session(0.5)
    with pytest.raises(CommError, match="no data endpoints for group 'g' within 0.5s"):
        backend.create_group("g", [0, 3])


def test_a_session_without_state_repairs_its_step_only():
    """A script that passed no ``state=`` (its only state ms_recover knows is the step) is
    still repaired: the source sends the step, the receiver takes it (it used to fail the
    repair with "no state provider", so such a job could never recover)."""
    source = Session(JobConfig(), 0, PeerBackend({}), None, standalone=True)
    source.link = Link()  # type: ignore[assignment]
    source.committed, source.phase = 9, Phase.REBUILT
    source._handle(4, M.Repair(9, 0, send_to=[1], recv_from=-1, endpoints={1: "tcp://h:1"}))
    (_, _, payload) = source.comm.sent[1]
    receiver = Session(JobConfig(), 1, PeerBackend({0: payload}), None, standalone=True)
    link = Link()
    receiver.link = link  # type: ignore[assignment]
    receiver.committed, receiver.phase = -1, Phase.REBUILT
    receiver._handle(4, M.Repair(9, 0, send_to=[], recv_from=0))
    assert receiver.committed == link.committed == 9
    assert link.sent == [M.Repaired(1, 0, True, 9, -1, "")]


def test_a_session_without_state_refuses_tensors_it_cannot_hold():
    inbox = {2: repair.pack({"w": np.zeros(3, np.float32)}, 9)}
    session = Session(JobConfig(), 0, PeerBackend(inbox), None, standalone=True)
    link = Link()
    session.link = link  # type: ignore[assignment]
    session.committed, session.phase = 8, Phase.REBUILT
    session._handle(4, M.Repair(target_step=9, attempt=0, send_to=[], recv_from=2))
    (reply,) = link.sent
    assert not reply.ok and "no state provider" in reply.reason and session.committed == 8
