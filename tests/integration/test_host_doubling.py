"""Recursive doubling, the small-allreduce path of groups of more than two, over real ZeroMQ.

Every member must hold the same bits, rerun after rerun, or replica-divergence checks fire;
and the bits must be those of the documented order of sums (checked against a numpy model).
"""

from __future__ import annotations

import threading
import time
from typing import Any

import numpy as np
import pytest

from ms_recover.comm.host import doubling as hostdoubling
from ms_recover.comm.host import ring as hostring
from ms_recover.comm.host.backend import HostBackend
from ms_recover.errors import CommError, Interrupted
from ms_recover.faulthooks import FaultHooks
from tests.integration.test_host_backend import DEADLINE_S, blocked_in, inputs, make, run_all
from tests.kit.floats import bits, special_values

__all__ = ["make"]  # the fixture, shared with test_host_backend
pytestmark = pytest.mark.timeout(60)


def model(xs: list[np.ndarray], mean: bool) -> np.ndarray:
    """The documented order: fold ``i + p`` into ``i``, then ``lower + upper`` at each stage."""
    n = len(xs)
    p = 1 << (n.bit_length() - 1)
    acc = [np.add(xs[i], xs[i + p]) if i + p < n else xs[i] for i in range(p)]
    k = 1
    while k < p:
        acc = [np.add(acc[min(i, i ^ k)], acc[max(i, i ^ k)]) for i in range(p)]
        k *= 2
    return np.divide(acc[0], n) if mean else acc[0]


@pytest.fixture
def no_ring(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Fails any ring allreduce: the calls under test must all take recursive doubling."""
    rings: list[int] = []

    def refuse(*args: Any) -> Any:
        rings.append(1)
        raise AssertionError("the ring ran where recursive doubling was expected")

    monkeypatch.setattr(hostring, "ring", refuse)
    return rings


@pytest.mark.parametrize("n", [3, 4, 5, 6])
@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64, np.complex64])
def test_doubling_gives_the_model_bits_on_every_member_every_time(
    make: Any, no_ring: list[int], n: int, dtype: Any
) -> None:
    backends = make(n, chunk_bytes=64)  # several messages per stage
    for size in [1, n + 1, 1001]:
        xs = [x.astype(dtype) for x in inputs(n, size, np.float64, seed=size)]
        copies = [x.copy() for x in xs]
        for op in ("sum", "mean"):
            want = model(xs, op == "mean")
            first = run_all(backends, lambda b, op=op, xs=xs: b.allreduce(xs[b.rank], op))
            again = run_all(backends, lambda b, op=op, xs=xs: b.allreduce(xs[b.rank], op))
            for out in first + again:
                assert out.dtype == dtype and out.shape == (size,)
                assert out.tobytes() == want.tobytes(), (op, size)
        assert all(np.array_equal(x, c) for x, c in zip(xs, copies, strict=True))


@pytest.mark.parametrize("n", [3, 5])
@pytest.mark.parametrize("dtype", [np.int64, np.uint8])
def test_doubling_sums_integers_exactly_and_wraps_like_numpy(
    make: Any, no_ring: list[int], n: int, dtype: Any
) -> None:
    backends = make(n, chunk_bytes=64)
    rng = np.random.default_rng(n)
    xs = [rng.integers(0, 200, size=(7, 13)).astype(dtype) for _ in range(n)]
    out = run_all(backends, lambda b: b.allreduce(xs[b.rank]))
    want = np.sum(xs, axis=0, dtype=dtype)
    assert all(o.shape == (7, 13) and o.dtype == dtype and np.array_equal(o, want) for o in out)


@pytest.mark.parametrize("n", [3, 5, 6])
@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
@pytest.mark.filterwarnings("ignore:(overflow|invalid value) encountered:RuntimeWarning")
def test_nan_payloads_and_specials_have_the_same_bits_on_every_member(
    make: Any, no_ring: list[int], n: int, dtype: Any
) -> None:
    backends = make(n, chunk_bytes=64)
    specials = special_values(dtype)
    rng = np.random.default_rng(n)
    pool = np.tile(np.concatenate([specials, specials * dtype(0.5)]), 4)
    xs = [rng.permutation(pool) for _ in range(n)]
    for op in ("sum", "mean"):
        outs = run_all(backends, lambda b, op=op: b.allreduce(xs[b.rank], op))
        again = run_all(backends, lambda b, op=op: b.allreduce(xs[b.rank], op))
        assert {bits(o) for o in outs + again} == {bits(outs[0])}, op
        assert bits(outs[0]) == bits(model(xs, op == "mean")), op
        assert np.isnan(outs[0]).any()  # the NaN payloads were in play


def test_a_subgroup_in_its_own_order_doubles_among_its_members(
    make: Any, no_ring: list[int]
) -> None:
    backends = make(6, chunk_bytes=128)
    order = (5, 1, 3, 0, 4)  # creation order, not sorted: positions follow it
    for b in backends:
        b.create_group("five", list(order))
    xs = inputs(6, 300, np.float32, seed=7)

    def body(b: HostBackend) -> Any:
        if b.rank not in order:
            return None
        return b.allreduce(xs[b.rank], "mean", group="five")

    out = run_all(backends, body)
    want = model([xs[r] for r in order], mean=True)
    assert out[2] is None
    assert all(out[r].tobytes() == want.tobytes() for r in order)
    # The world, numbered on its own, is still in step on every rank afterwards.
    total = run_all(backends, lambda b: b.allreduce(xs[b.rank]))
    assert {t.tobytes() for t in total} == {model(xs, mean=False).tobytes()}


def test_the_threshold_picks_the_path_on_every_member_alike(
    make: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    backends = make(4, chunk_bytes=256)
    for b in backends:
        b.doubling_max_bytes = 400  # 100 float32
    paths: list[str] = []
    for name in ("allreduce", "ring"):
        real = getattr(hostdoubling if name == "allreduce" else hostring, name)

        def spy(*args: Any, real: Any = real, name: str = name) -> Any:
            paths.append(name)
            return real(*args)

        monkeypatch.setattr(hostdoubling if name == "allreduce" else hostring, name, spy)
    for size, path in [(100, "allreduce"), (101, "ring")]:
        paths.clear()
        xs = inputs(4, size, np.float32, seed=size)
        out = run_all(backends, lambda b, xs=xs: b.allreduce(xs[b.rank]))
        assert paths == [path] * 4
        assert {o.tobytes() for o in out} == {out[0].tobytes()}
        np.testing.assert_allclose(out[0], np.sum(xs, axis=0), rtol=1e-5, atol=1e-5)
    # Mixed sizes in one group keep its op numbering in step.
    out = run_all(backends, lambda b: (b.allreduce(np.ones(3)), b.allreduce(np.ones(500))))
    assert all(np.array_equal(a, np.full(3, 4.0)) and b.sum() == 2000 for a, b in out)


def _each(backends: list[HostBackend], fn: Any) -> list[Any]:
    """Like run_all, but every rank's outcome, result or exception."""
    return run_all(backends, lambda b: _catch(fn, b))


def _catch(fn: Any, b: HostBackend) -> Any:
    try:
        return fn(b)
    except CommError as exc:
        return exc


@pytest.mark.parametrize(("n", "dead"), [(4, 3), (5, 4), (5, 0)])
def test_a_dead_member_fails_the_call_on_every_other_member(make: Any, n: int, dead: int) -> None:
    backends = make(n, timeout=1.0)
    run_all(backends, lambda b: b.allreduce(np.ones(8)))  # everyone connected
    backends[dead].close()
    alive = [b for b in backends if b.rank != dead]
    out = _each(alive, lambda b: b.allreduce(np.ones(8)))
    for err in out:
        assert isinstance(err, CommError), err
        assert "allreduce #1 on group 'world'" in str(err)


class _DieAfter(FaultHooks):
    """Stops the rank after its ``chunks``-th message: it dies in the middle of a call."""

    armed = True

    def __init__(self, backend: HostBackend, chunks: int) -> None:
        self.backend, self.left = backend, chunks

    def after_chunk_sent(self) -> None:
        self.left -= 1
        if self.left == 0:
            self.backend.close()
            raise CommError("died")


@pytest.mark.parametrize(
    ("chunks", "failed"), [(3, [0, 1, 2]), (20, [1])], ids=["first-stage", "last-stage"]
)
def test_a_member_dying_mid_doubling_fails_the_call_of_those_waiting_for_it(
    make: Any, chunks: int, failed: list[int]
) -> None:
    # Rank 3 dies while it sends to rank 2 (stage 0) or to rank 1 (stage 1, the last). In the
    # last stage, ranks 0 and 2 have every contribution from each other: they finish.
    backends = make(4, chunk_bytes=64, timeout=1.0)  # 16 messages per stage of 1 KiB
    backends[3].faults = _DieAfter(backends[3], chunks)
    out = _each(backends, lambda b: b.allreduce(np.ones(256, np.float32)))
    assert str(out[3]) == "died"
    for rank in range(3):
        if rank in failed:
            assert isinstance(out[rank], CommError), out[rank]
            assert "allreduce #0 on group 'world'" in str(out[rank])
        else:
            assert np.array_equal(out[rank], np.full(256, 4.0, np.float32))


def test_a_mismatched_call_fails_loudly(make: Any) -> None:
    backends = make(4, timeout=2.0)
    out = _each(backends, lambda b: b.allreduce(np.ones(10, np.float64 if b.rank == 2 else "f4")))
    assert all(isinstance(err, CommError) for err in out), out
    mismatch = r"rank 2 called allreduce(<f8:10) but rank"
    assert any(mismatch in str(err) for err in out), out


def test_abort_unblocks_members_waiting_for_one_that_never_joins(make: Any) -> None:
    backends = make(5)  # no timeout: only the abort ends the wait
    waiting = backends[:4]
    outcome: list[BaseException] = []

    def body(b: HostBackend) -> None:
        try:
            b.allreduce(np.ones(16))
        except BaseException as exc:
            outcome.append(exc)

    threads = [threading.Thread(target=body, args=(b,)) for b in waiting]
    for t in threads:
        t.start()
    deadline = time.monotonic() + DEADLINE_S
    while not all(blocked_in(t, "take") for t in threads):
        assert time.monotonic() < deadline, "the members never blocked"
        time.sleep(0.002)
    for b in waiting:
        b.abort()
    for t in threads:
        t.join(DEADLINE_S)
    assert not any(t.is_alive() for t in threads)
    assert len(outcome) == 4 and all(isinstance(e, Interrupted) for e in outcome)


@pytest.mark.filterwarnings("ignore:(overflow|invalid value) encountered:RuntimeWarning")
def test_members_with_different_chunk_sizes_still_agree_on_nan_bits(
    make: Any, no_ring: list[int]
) -> None:
    # Each member adds what a partner sent in that partner's chunks; the bits of two NaNs
    # added must not depend on where those chunks end.
    backends = make(4, init=False)
    for b, chunk in zip(backends, [64, 200, 1 << 20, 96], strict=True):
        b.chunk_bytes = chunk
    members = {b.rank: b.endpoint for b in backends}
    for b in backends:
        b.init(1, members)
    rng = np.random.default_rng(11)
    pool = np.tile(special_values(np.float32), 40)
    xs = [rng.permutation(pool) for _ in range(4)]
    outs = run_all(backends, lambda b: b.allreduce(xs[b.rank]))
    assert {bits(o) for o in outs} == {bits(model(xs, mean=False))}
