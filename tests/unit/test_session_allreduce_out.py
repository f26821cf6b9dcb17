"""``Session.allreduce(..., out=)``: the result lands in ``out`` (in place when it is the
input), and the step's fault-injection point runs exactly as without it."""

from __future__ import annotations

import numpy as np
import pytest

from ms_recover.comm.local import LocalBackend
from ms_recover.config import JobConfig
from ms_recover.errors import CommError, Interrupted
from ms_recover.localrun.faults import FaultInjector, Faults
from ms_recover.worker.session import Session


def session(faults: FaultInjector | None = None) -> Session:
    return Session(JobConfig(), 0, LocalBackend(), None, faults=faults, standalone=True)


def test_out_is_written_and_returned_in_place_or_not() -> None:
    s = session()
    x = np.arange(8, dtype=np.float32)
    assert s.allreduce(x, "mean", out=x) is x and np.array_equal(x, np.arange(8))
    out = np.zeros_like(x)
    assert s.allreduce(x, out=out) is out and np.array_equal(out, x)
    with pytest.raises(CommError, match=r"float32 ndarray of shape \(8,\).*float64"):
        s.allreduce(x, out=np.zeros(8))


def test_the_fault_point_and_the_comm_entry_still_run_in_place() -> None:
    inj = FaultInjector(Faults().transient(rank=0, step=3).specs, 0, 0)
    s = session(inj)
    s.next_step = 3
    x = np.ones(4, np.float32)
    with pytest.raises(CommError, match="step 3"):
        s.allreduce(x, out=x)
    assert np.array_equal(x, np.ones(4))
    s.comm.abort()
    s.next_step = 4
    with pytest.raises(Interrupted):
        s.allreduce(x, out=x)


def test_a_backend_without_out_still_serves_calls_without_it() -> None:
    class Old(LocalBackend):
        def allreduce(self, array, op="sum", group="world"):  # type: ignore[no-untyped-def,override]
            return np.asarray(array) * 2

    s = Session(JobConfig(), 0, Old(), None, standalone=True)
    assert np.array_equal(s.allreduce(np.ones(2, np.float32), "sum"), [2.0, 2.0])


def test_a_backend_step_hook_runs_on_every_commit_and_none_is_called_without_one() -> None:
    class Hooked(LocalBackend):
        ends = 0

        def on_step_end(self) -> None:
            self.ends += 1

    hooked = Hooked()
    s = Session(JobConfig(), 0, hooked, None, standalone=True)
    s.connect()
    assert s.run(lambda step: None, 3) == 2 and hooked.ends == 3
    plain = session()
    plain.connect()
    assert plain._on_step_end is None and plain.run(lambda step: None, 2) == 1
