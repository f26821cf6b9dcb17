"""``session.finish()``: a finished rank stays a member (a repair source) until the manager
says the job is over, and a silent manager never hangs it."""

from __future__ import annotations

import collections
import time

import numpy as np
import pytest

from ms_recover.config import JobConfig
from ms_recover.protocol import messages as M
from ms_recover.protocol.codec import Envelope
from ms_recover.worker import repair
from ms_recover.worker.phase import Phase
from ms_recover.worker.session import Session

from .test_session_repair import ArrayState, PeerBackend

pytestmark = pytest.mark.timeout(30)


class ScriptedLink:
    """The manager's side, scripted: ``next_command`` hands out the queued commands."""

    def __init__(self, *commands: M.Message, epoch: int = 3) -> None:
        self.inbox = collections.deque(
            Envelope("j", epoch, "manager", i, c) for i, c in enumerate(commands)
        )
        self.sent: list[M.Message] = []
        self.committed = -1
        self.closed_with: float | None = None

    def send(self, msg: M.Message, epoch: int | None = None) -> None:
        self.sent.append(msg)

    def next_command(self, timeout_s: float) -> Envelope | None:
        if self.inbox:
            return self.inbox.popleft()
        time.sleep(min(timeout_s, 0.01))
        return None

    def close(self, flush_s: float = 0.0) -> None:
        self.closed_with = flush_s

    def kinds(self) -> list[str]:
        return [type(m).__name__ for m in self.sent]


def _finished(link: ScriptedLink, step: int = 29) -> tuple[Session, PeerBackend]:
    backend = PeerBackend({})
    session = Session(JobConfig(), 0, backend, ArrayState(float(step)), standalone=True)
    session.link = link  # type: ignore[assignment]
    session.committed = link.committed = step
    session.next_step, session.total = step + 1, step + 1
    session.phase = Phase.TRAINING
    return session, backend


def test_finish_returns_when_the_manager_ends_the_job() -> None:
    link = ScriptedLink(M.Exit(0, "every rank finished training"))
    session, backend = _finished(link)
    session.finish()
    assert link.sent == [M.WorkerDone(0, 29, True)]
    assert session.phase is Phase.EXITED and link.closed_with is not None
    link.closed_with = None
    session.finish()  # a second call does nothing
    assert link.sent == [M.WorkerDone(0, 29, True)] and link.closed_with is None
    assert backend._aborted  # the data plane is closed


def test_a_finished_rank_repairs_a_replacement_before_the_end() -> None:
    world = M.runs([0])
    link = ScriptedLink(
        M.Stop("rank 1 died"),
        M.Rebuild(world, {}, False, []),
        M.Repair(29, 0, [1], -1, {1: "tcp://h1:51"}),
        M.Resume(30),
        M.Exit(0, "every rank finished training"),
    )
    session, backend = _finished(link)
    session.finish()
    assert link.kinds() == ["WorkerDone", "Stopped", "Rebuilt", "Repaired"]
    stopped = link.sent[1]
    assert isinstance(stopped, M.Stopped) and stopped.committed_step == 29
    repaired = link.sent[3]
    assert isinstance(repaired, M.Repaired) and repaired.ok and repaired.committed_step == 29
    ((dst, tag, payload),) = [s for s in backend.sent if s[0] != "peers"]
    arrays, step = repair.unpack(payload, 0)
    assert dst == 1 and step == 29 and tag.startswith("repair.3.")
    np.testing.assert_array_equal(arrays["w"], np.full(3, 29.0, np.float32))
    assert session.phase is Phase.EXITED


def test_an_exit_with_a_failure_code_ends_the_process_with_it() -> None:
    link = ScriptedLink(M.Exit(87, "no replica left"))
    session, _ = _finished(link)
    with pytest.raises(SystemExit) as exc:
        session.finish()
    assert exc.value.code == 87 and link.closed_with is not None


def test_a_silent_manager_never_hangs_a_finished_rank() -> None:
    link = ScriptedLink()
    session, _ = _finished(link)
    started = time.monotonic()
    session.finish(timeout_s=0.3)
    assert 0.3 <= time.monotonic() - started < 5.0
    assert link.kinds() == ["WorkerDone"] and link.closed_with is not None


def test_resumed_before_the_last_step_it_asks_to_be_replaced() -> None:
    """A finished rank cannot run steps again: taken back (repaired to an earlier step), it
    reports a fatal error, and the manager replaces it."""
    link = ScriptedLink(
        M.Stop("diverged"),
        M.Rebuild(M.runs([0]), {}, False, []),
        M.Repair(27, 0, [], -1, {}),
        M.Resume(28),
        M.Exit(0, "done"),
    )
    session, _ = _finished(link)
    session.finish()
    faults = [m for m in link.sent if isinstance(m, M.WorkerFault)]
    assert len(faults) == 1 and faults[0].kind == "fatal"
    assert "resumed it at step 28 of 30" in faults[0].message


def test_a_restarted_manager_learns_that_a_waiting_rank_is_done() -> None:
    link = ScriptedLink()
    session, _ = _finished(link)
    assert not any(isinstance(m, M.WorkerDone) for m in session._registration())
    session.finish(timeout_s=0.05)
    done = [m for m in session._registration() if isinstance(m, M.WorkerDone)]
    assert done == [M.WorkerDone(0, 29, True)]
