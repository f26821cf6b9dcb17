"""The worker's phase: the transition table, and a Session that refuses commands out of order."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from ms_recover.comm.local import LocalBackend
from ms_recover.config import JobConfig
from ms_recover.errors import RecoveryError
from ms_recover.protocol import messages as M
from ms_recover.worker.phase import COMMANDS, TRANSITIONS, Phase, check
from ms_recover.worker.session import Session

P = Phase
WELCOME = M.Welcome(True, "", False, 1, [])
REBUILD = M.Rebuild([[0, 0]], {0: "local"}, True, [])
REPAIR = M.Repair(target_step=-1, attempt=0, send_to=[], recv_from=-1)
RESUME = M.Resume(0)
STOP = M.Stop("a peer died")


class ArrayState:
    def __init__(self) -> None:
        self.arrays = {"w": np.zeros(2, np.float32)}

    def state_dict(self) -> dict[str, Any]:
        return dict(self.arrays)

    def load_state_dict(self, arrays: dict[str, Any]) -> None:
        self.arrays = dict(arrays)


class Recorder(LocalBackend):
    def __init__(self) -> None:
        super().__init__()
        self.rebuilds: list[int] = []

    def rebuild(self, epoch: int, members: dict[int, str], group_log: Any) -> None:
        self.rebuilds.append(epoch)


class Link:
    def __init__(self) -> None:
        self.sent: list[M.Message] = []
        self.committed = -1

    def send(self, msg: M.Message, epoch: int | None = None) -> None:
        self.sent.append(msg)


def _session(phase: Phase = P.NEW) -> tuple[Session, Recorder, Link]:
    backend = Recorder()
    session = Session(JobConfig(), 0, backend, ArrayState(), standalone=True)
    link = Link()
    session.link = link  # type: ignore[assignment]
    session.phase = phase
    return session, backend, link


def test_every_phase_has_a_row_and_only_exit_is_terminal() -> None:
    assert set(TRANSITIONS) == set(Phase)
    assert [p for p, nxt in TRANSITIONS.items() if not nxt] == [P.EXITED]
    assert all(P.EXITED in nxt for p, nxt in TRANSITIONS.items() if p not in (P.NEW, P.EXITED))
    assert set(COMMANDS.values()) == set(Phase) - {P.NEW, P.REGISTERING}


@pytest.mark.parametrize(
    "path",
    [
        # registration, the first world, a recovery, the end of the job by dump
        "registering joined rebuilt repaired training stopped rebuilt repaired training "
        "stopped dumped exited",
        # a new recovery (new epoch) starts in the middle of one, and a repair is retried
        "registering joined rebuilt stopped stopped rebuilt repaired repaired rebuilt "
        "repaired training",
        # a rank that joins while the others stop; a job without a manager
        "registering joined stopped rebuilt repaired training exited",
        "training",
    ],
)
def test_the_lifecycles_the_manager_drives_are_legal(path: str) -> None:
    phase = P.NEW
    for name in path.split():
        phase = check(0, phase, Phase(name), name)
    assert phase is Phase(path.split()[-1])


@pytest.mark.parametrize(
    ("current", "target"),
    [
        (P.NEW, P.STOPPED),  # before registering
        (P.REGISTERING, P.REBUILT),  # before the WELCOME
        (P.REGISTERING, P.TRAINING),
        (P.JOINED, P.TRAINING),  # training without a world
        (P.JOINED, P.REPAIRED),
        (P.TRAINING, P.TRAINING),  # RESUME while training
        (P.TRAINING, P.REBUILT),  # no STOP took the committed step
        (P.TRAINING, P.REPAIRED),
        (P.TRAINING, P.DUMPED),
        (P.STOPPED, P.TRAINING),  # resume without a rebuilt world
        (P.REBUILT, P.TRAINING),  # resume without a repair
        (P.REBUILT, P.DUMPED),
        (P.DUMPED, P.TRAINING),
        (P.EXITED, P.STOPPED),
        (P.TRAINING, P.JOINED),  # a second WELCOME
    ],
)
def test_an_illegal_transition_raises_and_names_what_was_allowed(
    current: Phase, target: Phase
) -> None:
    allowed = ", ".join(sorted(p.value for p in TRANSITIONS[current])) or "nothing"
    with pytest.raises(RecoveryError, match=f"from {current.value} only: {allowed}"):
        check(3, current, target, "cmd")


def test_a_session_walks_registration_and_recovery_through_its_commands() -> None:
    session, backend, link = _session()
    session.phase = check(0, session.phase, P.REGISTERING, "registration")
    assert session._handle(0, WELCOME) is False and session.phase is P.JOINED
    assert session._handle(1, REBUILD) is False and session.phase is P.REBUILT
    assert session._handle(1, REPAIR) is False and session.phase is P.REPAIRED
    assert session._handle(1, RESUME) is True and session.phase is P.TRAINING
    assert session._handle(2, STOP) is False and session.phase is P.STOPPED
    assert backend.rebuilds == [1]
    assert [type(m) for m in link.sent] == [M.Rebuilt, M.Repaired, M.Stopped]


@pytest.mark.parametrize(
    ("phase", "msg"),
    [
        (P.TRAINING, REBUILD),
        (P.TRAINING, REPAIR),
        (P.TRAINING, RESUME),
        (P.REGISTERING, STOP),
        (P.JOINED, RESUME),
        (P.STOPPED, RESUME),
    ],
)
def test_a_session_refuses_a_command_out_of_order_and_does_nothing(
    phase: Phase, msg: M.Message
) -> None:
    session, backend, link = _session(phase)
    session.next_step = 7
    with pytest.raises(RecoveryError, match=f"{msg.KIND.decode()} is not valid in phase {phase}"):
        session._handle(3, msg)
    assert session.phase is phase
    assert backend.rebuilds == [] and link.sent == [] and session.next_step == 7


def test_a_session_ignores_what_is_not_a_command() -> None:
    session, _, link = _session(P.TRAINING)
    assert session._handle(1, M.StatusReply({})) is False
    assert session.phase is P.TRAINING and link.sent == []


def test_a_run_without_a_manager_trains_at_once() -> None:
    session = Session(JobConfig(), 0, LocalBackend(), ArrayState(), standalone=True)
    assert session.phase is P.NEW
    session.connect()
    assert session.phase is P.TRAINING
    assert session.run(lambda step: None, 3) == 2


def test_a_rank_stopped_again_in_the_middle_of_a_recovery_can_rebuild() -> None:
    session, backend, _ = _session(P.REPAIRED)
    session._handle(5, STOP)
    session._handle(5, REBUILD)
    assert session.phase is P.REBUILT and backend.rebuilds == [5]
