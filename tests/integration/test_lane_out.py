"""The two-rank lane writing the result where the caller wants it (``allreduce(out=)``).

Into another buffer the peer's values are received straight into ``out`` up to the ring's size
and into the lane's kept ring above it; in place (``out`` the input, as GraphStep reduces a
bucket) they land in the ring at any size, and a span is summed into the input only once this
rank has sent it. The one thread sends at most its lead past its adds. Every way gives the plain
allreduce's bits on both ranks, NaN payloads included, across frames, spans and reads cut
small, on the one-thread and the sender-thread path.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import numpy as np
import pytest

from ms_recover.comm.host.backend import HostBackend
from ms_recover.comm.host.lane import exchange as laneexchange
from ms_recover.comm.host.lane import frame as laneframe
from ms_recover.comm.host.lane import small as lanesmall
from ms_recover.comm.host.lane.buffers import POOL_MIN_BYTES, Results
from ms_recover.errors import Interrupted
from tests.integration.test_host_backend import (
    DEADLINE_S,
    blocked_in,
    inputs,
    lane_path,
    make,
    run_all,
    wait_for,
)
from tests.kit.floats import bits

__all__ = ["make"]  # the fixture, shared with test_host_backend
pytestmark = pytest.mark.timeout(60)
PATHS = pytest.mark.parametrize("threaded", [False, True], ids=["one-thread", "sender-thread"])


@pytest.fixture
def small_pieces(monkeypatch: pytest.MonkeyPatch) -> None:
    """Frames, spans and reads far smaller than the buffers, none dividing their sizes (on
    the general exchange: no call takes the small-buffer path)."""
    monkeypatch.setattr(lanesmall, "SMALL_MAX_BYTES", 0)
    monkeypatch.setattr(laneexchange, "FRAME_MAX_BYTES", 1000)  # 1001 doubles: 9 frames
    monkeypatch.setattr(laneexchange, "ADD_SPAN_BYTES", 56)  # 7 doubles, 14 float32
    monkeypatch.setattr(laneexchange, "RECV_MAX", 200)
    monkeypatch.setattr(laneexchange, "RING_BYTES", 170)  # in place: a ring of 3 spans


def _path(monkeypatch: pytest.MonkeyPatch, threaded: bool) -> None:
    """The general exchange, on one thread or with a sender thread."""
    monkeypatch.setattr(lanesmall, "SMALL_MAX_BYTES", 0)
    lane_path(monkeypatch, threaded)


def _nan_payloads(xs: list[np.ndarray]) -> list[np.ndarray]:
    quiet = np.array([0x7FF8000000000001, 0xFFF8000000000002], np.uint64)
    for r, x in enumerate(xs):
        x[:2] = (quiet + 4 * r).view(np.float64)
    return xs


def _each_into(
    backends: list[HostBackend], srcs: list[np.ndarray], outs: list[np.ndarray], op: str
) -> list[Any]:
    """Every rank's ``allreduce(srcs[rank], op, out=outs[rank])``, at once."""
    return run_all(backends, lambda b: b.allreduce(srcs[b.rank], op, out=outs[b.rank]))


def _counting_copies(m: pytest.MonkeyPatch) -> list[Any]:
    copies: list[Any] = []
    real = np.copyto
    m.setattr(np, "copyto", lambda *a, **k: copies.append(a) or real(*a, **k))
    return copies


@PATHS
@pytest.mark.usefixtures("small_pieces")
@pytest.mark.parametrize("size", [1001, 1000, 126, 125, 7])  # 125 doubles: one frame
def test_out_and_in_place_give_the_plain_bits_on_both_ranks(
    make: Any, monkeypatch: pytest.MonkeyPatch, threaded: bool, size: int
) -> None:
    _path(monkeypatch, threaded)
    backends = make(2)
    xs = _nan_payloads(inputs(2, size, np.float64, seed=size))
    keep = [x.tobytes() for x in xs]
    for op in ("sum", "mean"):
        plain = run_all(backends, lambda b, op=op: b.allreduce(xs[b.rank], op))
        assert len({bits(p) for p in plain}) == 1
        want = xs[0] + xs[1] if op == "sum" else (xs[0] + xs[1]) / 2
        assert plain[0][2:].tobytes() == want[2:].tobytes()
        outs = [np.full_like(x, 7.0) for x in xs]
        bufs = [x.copy() for x in xs]
        with monkeypatch.context() as m:
            copies = _counting_copies(m)
            got = _each_into(backends, xs, outs, op)
            mine = _each_into(backends, bufs, bufs, op)
        assert copies == [], "the lane writes into out itself: nothing is copied"
        assert [g is o for g, o in zip(got, outs, strict=True)] == [True, True]
        assert [m is u for m, u in zip(mine, bufs, strict=True)] == [True, True]
        assert {bits(a) for a in outs + bufs} == {bits(plain[0])}, op
        assert [x.tobytes() for x in xs] == keep, "an input that is not out is untouched"


@PATHS
@pytest.mark.usefixtures("small_pieces")
def test_in_place_sums_a_span_into_the_input_only_once_it_was_sent(
    make: Any, monkeypatch: pytest.MonkeyPatch, threaded: bool
) -> None:
    # Rank 0 holds its sends back until its ring is full of rank 1's values: summing them
    # into its input at once would send rank 1 sums instead of rank 0's values.
    _path(monkeypatch, threaded)
    real_send = laneexchange._Exchange._send

    def send_late(self: laneexchange._Exchange) -> bool:
        if self.lanes.rank == 0 and self.got < self.total and self._room():
            return False
        return real_send(self)

    monkeypatch.setattr(laneexchange._Exchange, "_send", send_late)
    backends = make(2)
    xs = _nan_payloads(inputs(2, 1001, np.float64, seed=3))
    want = xs[0] + xs[1]
    bufs = [x.copy() for x in xs]
    _each_into(backends, bufs, bufs, "sum")
    assert bits(bufs[0]) == bits(bufs[1]), "both ranks hold the same bits"
    assert bufs[0][2:].tobytes() == want[2:].tobytes()


@pytest.mark.usefixtures("small_pieces")
def test_out_overlapping_the_input_elsewhere_still_gets_the_plain_bits(make: Any) -> None:
    backends = make(2)
    xs = _nan_payloads(inputs(2, 1001, np.float64, seed=4))
    plain = run_all(backends, lambda b: b.allreduce(xs[b.rank]))
    bases = [np.concatenate([x, np.zeros(3)]) for x in xs]
    srcs, outs = [b[:1001] for b in bases], [b[3:] for b in bases]  # out starts 3 further on
    got = _each_into(backends, srcs, outs, "sum")
    assert [g is o for g, o in zip(got, outs, strict=True)] == [True, True]
    assert bits(outs[0]) == bits(outs[1]) == bits(plain[0])


@pytest.mark.parametrize(
    ("threaded", "size"),
    [(False, 1 << 16), (True, 1 << 16), (False, 1000)],
    ids=["one-thread", "sender-thread", "small-path"],
)
def test_an_in_place_call_whose_peer_dies_waits_for_the_abort(
    make: Any, monkeypatch: pytest.MonkeyPatch, threaded: bool, size: int
) -> None:
    if size * 8 > lanesmall.SMALL_MAX_BYTES:
        _path(monkeypatch, threaded)
    b0, b1 = make(2)
    run_all([b0, b1], lambda b: b.allreduce(np.ones(8)))  # the lane is connected
    grads = np.ones(size)
    outcome: list[BaseException] = []

    def body() -> None:
        try:
            b0.allreduce(grads, "mean", out=grads)
        except BaseException as exc:
            outcome.append(exc)

    thread = threading.Thread(target=body)
    thread.start()
    b1.close()  # the peer goes away under the call
    wait_for(lambda: blocked_in(thread, "wait_for_abort"), "the call to wait for the abort")
    b0.abort()
    thread.join(DEADLINE_S)
    assert not thread.is_alive() and isinstance(outcome[0], Interrupted)


def test_the_in_place_receive_buffer_is_kept_grown_and_released(make: Any) -> None:
    backends = make(2)
    spare = backends[0]._lane_spare
    bufs = [np.full(1000, r + 1.0, np.float32) for r in range(2)]
    _each_into(backends, bufs, bufs, "sum")
    kept = spare._buf
    assert kept.nbytes == 4000 and np.array_equal(bufs[0], np.full(1000, 3.0))
    _each_into(backends, bufs, bufs, "sum")
    smaller = [b[:10].copy() for b in bufs]
    _each_into(backends, smaller, smaller, "sum")
    assert spare._buf is kept, "reused, not allocated again"
    bigger = [np.ones(2000) for _ in range(2)]
    _each_into(backends, bigger, bigger, "sum")
    assert spare._buf.nbytes == 16000 and np.array_equal(bigger[1], np.full(2000, 2.0))
    backends[0].close()
    assert spare._buf.nbytes == 0


@PATHS
def test_a_large_in_place_call_waits_in_a_ring_not_a_copy_of_its_size(
    make: Any, monkeypatch: pytest.MonkeyPatch, threaded: bool
) -> None:
    _path(monkeypatch, threaded)
    monkeypatch.setattr(laneexchange, "ADD_SPAN_BYTES", 1000)
    monkeypatch.setattr(laneexchange, "RING_BYTES", 4500)  # four whole spans: 4000 bytes
    backends = make(2)
    xs = inputs(2, 100_003, np.float64, seed=9)
    bufs = [x.copy() for x in xs]
    _each_into(backends, bufs, bufs, "mean")
    assert [b._lane_spare._buf.nbytes for b in backends] == [4000, 4000]
    assert bufs[0].tobytes() == bufs[1].tobytes() == ((xs[0] + xs[1]) / 2).tobytes()


@pytest.mark.parametrize(("dtype", "raw"), [(np.float16, np.uint16), (np.float32, np.uint32)])
@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_halving_is_dividing_by_two_bit_for_bit(dtype: Any, raw: Any) -> None:
    step = 1 if raw is np.uint16 else 4099  # every float16; float32 across its whole range
    values = np.arange(0, np.iinfo(raw).max + 1, step, dtype=np.uint64).astype(raw).view(dtype)
    halved = values.copy()
    laneframe.halve(halved)
    assert halved.tobytes() == np.divide(values, 2).tobytes()
    wide = np.array([np.inf + 1j, complex(np.nan, 3), 5e-324 + 0j], np.complex128)
    split = wide.copy()
    laneframe.halve(split)
    assert split.tobytes() == np.divide(wide, 2).tobytes()


HOLDERS = {
    "the array": lambda a: a,
    "a view": lambda a: a.reshape(2, -1)[1],
    "a memoryview": memoryview,
    "an array over its buffer": lambda a: np.frombuffer(a, np.uint8),
}


@pytest.mark.parametrize("hold", HOLDERS)
def test_a_result_block_anything_refers_to_is_not_handed_out_again(hold: str) -> None:
    pool = Results()
    flat = np.ones(POOL_MIN_BYTES // 4, np.float32)
    first = pool.new_like(flat)
    first[:] = 1.0
    block, keep = first.ctypes.data, HOLDERS[hold](first)
    del first
    other = pool.new_like(flat)
    other[:] = 5.0
    assert other.ctypes.data != block
    assert np.all(np.frombuffer(keep, np.float32) == 1.0), "what the caller holds is untouched"


def test_a_result_block_nothing_refers_to_is_reused() -> None:
    pool = Results()
    flat = np.ones(POOL_MIN_BYTES // 4, np.float32)
    first = pool.new_like(flat)
    block = first.ctypes.data
    del first
    again = pool.new_like(flat)
    assert again.ctypes.data == block and again.dtype == flat.dtype and again.shape == flat.shape
    del again
    assert pool.new_like(flat[:-1]).ctypes.data != block, "another size: a new block"
    assert pool.new_like(flat[:10]).base is None, "small results are plain new arrays"
    pool.release()
    assert pool._owner is None


def test_results_without_out_that_the_caller_keeps_are_never_overwritten(make: Any) -> None:
    backends = make(2)
    n = POOL_MIN_BYTES // 4 + 3
    xs = [np.full(n, r + 1.0, np.float32) for r in range(2)]
    kept = run_all(backends, lambda b: b.allreduce(xs[b.rank]))
    ys = [np.full(n, 10.0 * (r + 1), np.float32) for r in range(2)]
    again = run_all(backends, lambda b: b.allreduce(ys[b.rank]))
    assert all(np.array_equal(k, np.full(n, 3.0)) for k in kept), "still the first results"
    assert all(np.array_equal(a, np.full(n, 30.0)) for a in again)
    blocks = {a.ctypes.data for a in again}
    del kept, again
    reused = run_all(backends, lambda b: b.allreduce(xs[b.rank]))
    assert {r.ctypes.data for r in reused} == blocks, "dropped results: their blocks reused"
    assert all(np.array_equal(r, np.full(n, 3.0)) for r in reused)


@pytest.mark.usefixtures("small_pieces")
def test_a_full_ring_waiting_for_sends_that_never_come_stops_at_the_abort(
    make: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Rank 0's sends never go out, so its ring fills with rank 1's values and stays full.
    _path(monkeypatch, threaded=True)
    real_send = laneexchange._Exchange._send
    monkeypatch.setattr(
        laneexchange._Exchange,
        "_send",
        lambda self: False if self.lanes.rank == 0 else real_send(self),
    )
    backends = make(2)
    bufs = [np.ones(1001) for _ in range(2)]
    outcome: list[BaseException] = []

    def body(b: HostBackend) -> None:
        try:
            b.allreduce(bufs[b.rank], out=bufs[b.rank])
        except BaseException as exc:
            outcome.append(exc)

    threads = [threading.Thread(target=body, args=(b,)) for b in backends]
    for t in threads:
        t.start()
    wait_for(lambda: blocked_in(threads[0], "_wait_sent"), "rank 0 to wait for its sends")
    for b in backends:
        b.abort()
    for t in threads:
        t.join(DEADLINE_S)
    assert not any(t.is_alive() for t in threads)
    assert [type(e) for e in outcome] == [Interrupted, Interrupted]


@pytest.mark.usefixtures("small_pieces")
def test_in_place_through_another_view_of_the_input_is_in_place_too(make: Any) -> None:
    backends = make(2)
    xs = _nan_payloads(inputs(2, 1001, np.float64, seed=6))
    plain = run_all(backends, lambda b: b.allreduce(xs[b.rank], "mean"))
    bufs = [x.reshape(7, 143) for x in (x.copy() for x in xs)]
    views = [b.view() for b in bufs]  # other objects over the same memory
    got = run_all(backends, lambda b: b.allreduce(bufs[b.rank], "mean", out=views[b.rank]))
    assert [g is v for g, v in zip(got, views, strict=True)] == [True, True]
    assert {bits(v.reshape(-1)) for v in views} == {bits(plain[0])}
    assert [b._lane_spare._buf.nbytes for b in backends] == [168, 168], "the ring was used"


@pytest.mark.usefixtures("small_pieces")
def test_a_large_call_into_other_memory_lands_in_the_ring_a_small_one_in_the_result(
    make: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The ring is 3 spans of 7 doubles (168 bytes): 21 doubles fit, 1001 do not.
    landed: list[bool] = []  # per call: the peer's values landed in the result itself
    real_target = laneexchange._Exchange.target

    def target(self: laneexchange._Exchange, into: Any, spare: Any) -> None:
        real_target(self, into, spare)
        landed.append(np.shares_memory(self.recv, self.out))

    monkeypatch.setattr(laneexchange._Exchange, "target", target)
    backends = make(2)
    for size, straight in ((21, True), (1001, False)):
        xs = _nan_payloads(inputs(2, size, np.float64, seed=size))
        for op in ("sum", "mean"):
            landed.clear()
            plain = run_all(backends, lambda b, op=op, xs=xs: b.allreduce(xs[b.rank], op))
            outs = [np.full_like(x, 7.0) for x in xs]
            _each_into(backends, xs, outs, op)
            assert landed == [straight] * 4, (size, op)
            assert {bits(a) for a in [*plain, *outs]} == {bits(plain[0])}
            want = xs[0] + xs[1] if op == "sum" else (xs[0] + xs[1]) / 2
            assert plain[0][2:].tobytes() == want[2:].tobytes()
        ring = [b._lane_spare._buf.nbytes for b in backends]
        assert ring == ([0, 0] if straight else [168, 168]), "the ring only from above its size"


@pytest.mark.usefixtures("small_pieces")
@pytest.mark.parametrize("op", ["sum", "mean"])
@pytest.mark.parametrize("into", ["out", "in place"])
def test_one_thread_never_sends_more_than_its_lead_past_its_adds(
    make: Any, monkeypatch: pytest.MonkeyPatch, op: str, into: str
) -> None:
    _path(monkeypatch, threaded=False)
    monkeypatch.setattr(laneexchange, "SEND_AHEAD_BYTES", 0)  # the lead is its floor: 2 spans
    leads: list[int] = []
    real_send = laneexchange._Exchange._send

    def send(self: laneexchange._Exchange) -> bool:
        moved = real_send(self)
        leads.append(self.sent - self.added * self.flat.itemsize)
        return moved

    monkeypatch.setattr(laneexchange._Exchange, "_send", send)
    backends = make(2)
    xs = _nan_payloads(inputs(2, 1001, np.float64, seed=8))
    plain = run_all(backends, lambda b: b.allreduce(xs[b.rank], op))
    leads.clear()
    bufs = [x.copy() for x in xs]
    outs = bufs if into == "in place" else [np.empty_like(x) for x in xs]
    _each_into(backends, bufs, outs, op)
    assert 0 < max(leads) <= 2 * 56, "at most 2 spans of 56 bytes past the adds"
    assert {bits(o) for o in outs} == {bits(plain[0])}


@pytest.mark.usefixtures("small_pieces")
@pytest.mark.parametrize("into", ["out", "in place"])
def test_a_call_preempted_midway_goes_on_with_a_sender_thread_and_the_same_bits(
    make: Any, monkeypatch: pytest.MonkeyPatch, into: str
) -> None:
    _path(monkeypatch, threaded=False)
    backends = make(2)
    xs = _nan_payloads(inputs(2, 1001, np.float64, seed=9))
    plain = run_all(backends, lambda b: b.allreduce(xs[b.rank]))  # one thread throughout
    monkeypatch.setattr(laneexchange, "THREAD_MIN_BYTES", 64)
    looks: list[laneexchange._Preemption] = []  # one per lost() call, each call's own watch
    preempted = [True]

    def lost(self: laneexchange._Preemption) -> bool:
        looks.append(self)
        return preempted[0] and looks.count(self) > 1  # a call's first look (first turn): no

    switched: list[tuple[int, int]] = []  # (rank, payload bytes sent) at the switch
    real_threaded = laneexchange._Exchange._threaded

    def threaded(self: laneexchange._Exchange, deadline: Any, what: str) -> Any:
        switched.append((self.lanes.rank, self.sent))
        return real_threaded(self, deadline, what)

    monkeypatch.setattr(laneexchange._Preemption, "lost", lost)
    monkeypatch.setattr(laneexchange._Exchange, "_threaded", threaded)

    def each(src: list[np.ndarray]) -> list[np.ndarray]:
        outs = src if into == "in place" else [np.empty_like(x) for x in src]
        _each_into(backends, src, outs, "sum")
        return outs

    midway = each([x.copy() for x in xs])
    assert sorted(r for r, _ in switched) == [0, 1] and all(sent > 0 for _, sent in switched)
    assert {bits(o) for o in midway} == {bits(plain[0])}
    assert all(b._lanes.preempted_until > time.monotonic() for b in backends)
    switched.clear()
    held = each([x.copy() for x in xs])
    assert sorted(switched) == [(0, 0), (1, 0)], "while the hold lasts, threaded at once"
    assert {bits(o) for o in held} == {bits(plain[0])}
    switched.clear()
    looks.clear()
    preempted[0] = False
    for b in backends:
        b._lanes.preempted_until = 0.0  # the hold is over
    again = each([x.copy() for x in xs])
    assert switched == [] and len(looks) >= 2, "watched again, on one thread"
    assert {bits(o) for o in again} == {bits(plain[0])}
