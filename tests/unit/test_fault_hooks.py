"""The fault-injection hooks: a default that does nothing, and the test kit behind them."""

from __future__ import annotations

import os
import signal
from typing import Any

import numpy as np
import pytest
from numpy.typing import NDArray

from ms_recover import faulthooks
from ms_recover.comm.local import LocalBackend
from ms_recover.config import JobConfig
from ms_recover.errors import CommError, ConfigError, Interrupted, RepairError
from ms_recover.faulthooks import NO_FAULTS, FaultHooks
from ms_recover.localrun import faults as F
from ms_recover.localrun.faults import FaultInjector, Faults
from ms_recover.worker import repair
from ms_recover.worker.session import Session


class ArrayState:
    def __init__(self) -> None:
        self.arrays = {"w": np.arange(4, dtype=np.float32) + 1}

    def state_dict(self) -> dict[str, NDArray[Any]]:
        return {k: v.copy() for k, v in self.arrays.items()}

    def load_state_dict(self, arrays: dict[str, NDArray[Any]]) -> None:
        self.arrays = {k: v.copy() for k, v in arrays.items()}


@pytest.fixture
def signals(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, int]]:
    sent: list[tuple[int, int]] = []
    monkeypatch.setattr(os, "kill", lambda pid, sig: sent.append((pid, sig)))
    assert F.os is os
    return sent


def test_the_default_hooks_are_unarmed_and_do_nothing() -> None:
    hooks = FaultHooks()
    assert not hooks.armed and not NO_FAULTS.armed
    session = Session(JobConfig(), 0, LocalBackend(), ArrayState(), standalone=True)
    payload = {"w": np.ones(3)}
    hooks.at_registration()
    hooks.at_commit(3, session)
    hooks.after_commit(3, flush=lambda: pytest.fail("flushed"))
    hooks.at_allreduce(3, session)
    hooks.before_repair_send(payload)
    hooks.after_chunk_sent()
    assert payload["w"].tolist() == [1.0, 1.0, 1.0]
    assert session._state().state_dict()["w"].tolist() == [1.0, 2.0, 3.0, 4.0]


def test_a_session_without_a_plan_hands_the_unarmed_default_to_its_backend() -> None:
    backend = LocalBackend()
    session = Session(JobConfig(), 0, backend, ArrayState(), standalone=True)
    assert session.faults is NO_FAULTS and backend.faults is NO_FAULTS
    armed = FaultInjector(Faults().transient(rank=0, step=0).specs, 0, 0)
    other = LocalBackend()
    assert Session(JobConfig(), 0, other, None, faults=armed, standalone=True).faults is armed
    assert other.faults is armed


def test_a_fault_plan_loads_the_test_kit(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(
        "MS_RECOVER_FAULTS", Faults().kill(rank=1, step=4).to_env()["MS_RECOVER_FAULTS"]
    )
    hooks = faulthooks.from_env(1, 0)
    assert isinstance(hooks, FaultInjector) and hooks.armed
    assert not faulthooks.from_env(2, 0).armed  # a plan for another rank
    monkeypatch.setenv("MS_RECOVER_FAULTS", "explode:rank=1")
    with pytest.raises(ConfigError, match="not one of"):
        faulthooks.from_env(1, 0)


def test_the_injector_is_the_hooks_interface() -> None:
    assert issubclass(FaultInjector, FaultHooks)
    assert faulthooks.FAULT_KIT == F.__name__


def test_allreduce_fault_kills_after_the_next_chunk_only(signals: list[tuple[int, int]]) -> None:
    inj = FaultInjector(Faults().in_allreduce(rank=0, step=2).specs, 0, 0)
    session = Session(JobConfig(), 0, LocalBackend(), ArrayState(), faults=inj, standalone=True)
    inj.at_allreduce(1, session)
    inj.after_chunk_sent()
    assert signals == []
    inj.at_allreduce(2, session)
    assert signals == []  # not before anything is on the wire
    inj.after_chunk_sent()
    assert signals == [(os.getpid(), signal.SIGKILL)]


def test_transient_fault_raises_comm_error_at_its_step() -> None:
    inj = FaultInjector(Faults().transient(rank=0, step=3).specs, 0, 0)
    session = Session(JobConfig(), 0, LocalBackend(), ArrayState(), faults=inj, standalone=True)
    inj.at_allreduce(2, session)
    session.next_step = 3
    with pytest.raises(CommError, match="step 3"):
        session.allreduce(np.ones(2, dtype=np.float32))  # through the session's hook point


def test_memory_fault_zeroes_the_state_reports_and_interrupts() -> None:
    inj = FaultInjector(Faults().add("memory", rank=0, step=5).specs, 0, 0)
    state = ArrayState()
    session = Session(JobConfig(), 0, LocalBackend(), state, faults=inj, standalone=True)
    reported: list[tuple[str, str]] = []
    session.report_fault = lambda kind, message: reported.append((kind, message))  # type: ignore[method-assign]
    with pytest.raises(Interrupted, match="rank 0: device memory error at step 5"):
        inj.at_allreduce(5, session)
    assert not state.arrays["w"].any()
    assert reported == [("device_memory", "injected memory error at step 5")]


def test_bitflip_flips_one_bit_at_its_commit_only_and_reports_nothing() -> None:
    inj = FaultInjector(Faults().add("bitflip", rank=0, step=4).specs, 0, 0)
    state = ArrayState()
    session = Session(JobConfig(), 0, LocalBackend(), state, faults=inj, standalone=True)
    session.report_fault = lambda kind, message: pytest.fail("reported")  # type: ignore[method-assign]
    clean = state.state_dict()["w"]
    session.commit(3)
    assert np.array_equal(state.arrays["w"], clean)
    session.commit(4)  # through the session's commit hook point
    diff = np.bitwise_xor(clean.view(np.uint8), state.arrays["w"].view(np.uint8))
    assert np.count_nonzero(diff) == 1 and diff[0] == 1
    flipped = state.state_dict()["w"]
    session.commit(4)  # fires once
    assert np.array_equal(state.arrays["w"], flipped)


def test_memory_fault_without_a_state_provider_is_a_repair_error() -> None:
    inj = FaultInjector(Faults().add("memory", rank=0, step=0).specs, 0, 0)
    session = Session(JobConfig(), 0, LocalBackend(), None, faults=inj, standalone=True)
    with pytest.raises(RepairError, match="no state provider"):
        inj.at_allreduce(0, session)


def test_corrupt_flips_one_byte_of_the_first_repair_only() -> None:
    inj = FaultInjector(Faults().corrupt(rank=0).specs, 0, 0)
    payload = repair.pack(ArrayState().state_dict(), 7)
    clean = {k: v.copy() for k, v in payload.items()}
    inj.before_repair_send(payload)
    changed = [k for k in clean if not np.array_equal(clean[k], payload[k])]
    assert changed == ["w"]
    diff = np.bitwise_xor(clean["w"].view(np.uint8), payload["w"].view(np.uint8))
    assert np.count_nonzero(diff) == 1
    with pytest.raises(RepairError):
        repair.unpack(payload, 0)
    again = {k: v.copy() for k, v in clean.items()}
    inj.before_repair_send(again)
    assert all(np.array_equal(clean[k], again[k]) for k in clean)


def test_repairdie_kills_after_the_first_chunk_of_the_send(
    signals: list[tuple[int, int]],
) -> None:
    inj = FaultInjector(Faults().add("repairdie", rank=0).specs, 0, 0)
    inj.before_repair_send(repair.pack(ArrayState().state_dict(), 1))
    assert signals == []
    inj.after_chunk_sent()
    assert signals == [(os.getpid(), signal.SIGKILL)]
