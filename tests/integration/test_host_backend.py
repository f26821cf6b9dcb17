"""HostBackend over real ZeroMQ on 127.0.0.1 ephemeral ports, one backend per thread."""

from __future__ import annotations

import contextlib
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest
import zmq
from zmq.utils.garbage import GarbageCollectorThread

from ms_recover.comm.grouplog import GroupLog
from ms_recover.comm.host import ring as hostring
from ms_recover.comm.host import stream as hoststream
from ms_recover.comm.host.auth import (
    USER,
    ZAP_ENDPOINT,
    DataCurve,
    Gatekeeper,
    configure_client,
    data_plane_password,
)
from ms_recover.comm.host.backend import HostBackend
from ms_recover.comm.host.lane import exchange as laneexchange
from ms_recover.comm.host.lane import small as lanesmall
from ms_recover.comm.host.lane.lanes import HELLO, HELLO_MAGIC, split_endpoint
from ms_recover.comm.host.wire import P2P, Header, WireStats
from ms_recover.errors import CommError, Interrupted
from tests.kit.floats import bit_diff, bits, finite_specials, special_values

pytestmark = pytest.mark.timeout(60)
DEADLINE_S = 20.0


def _threads() -> set[threading.Thread]:
    # pyzmq's zero-copy garbage-collector thread is process-wide and lives until exit.
    return {t for t in threading.enumerate() if not isinstance(t, GarbageCollectorThread)}


@pytest.fixture
def make() -> Iterator[Callable[..., list[HostBackend]]]:
    """Factory of initialized backends (epoch 1); closes them and checks no thread leaked."""
    before = _threads()
    made: list[HostBackend] = []

    def factory(n: int, init: bool = True, **kwargs: Any) -> list[HostBackend]:
        backends = [HostBackend(rank, n, **kwargs) for rank in range(n)]
        made.extend(backends)
        if init:
            members = {b.rank: b.endpoint for b in backends}
            for b in backends:
                b.init(1, members)
        return backends

    factory.made = made  # type: ignore[attr-defined]
    yield factory
    for b in made:
        b.close()
    deadline = time.monotonic() + 5
    while _threads() - before and time.monotonic() < deadline:
        time.sleep(0.01)
    assert _threads() - before == set(), "threads leaked"


def run_all(backends: list[HostBackend], fn: Callable[[HostBackend], Any]) -> list[Any]:
    """Run ``fn(backend)`` on one thread per backend; return results, re-raise the first error."""
    results: list[Any] = [None] * len(backends)
    errors: list[BaseException] = []

    def body(i: int) -> None:
        try:
            results[i] = fn(backends[i])
        except BaseException as exc:  # handed to the test thread
            errors.append(exc)

    threads = [threading.Thread(target=body, args=(i,)) for i in range(len(backends))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(DEADLINE_S)
    if any(t.is_alive() for t in threads):
        for b in backends:
            b.abort()
        for t in threads:
            t.join(DEADLINE_S)
        raise AssertionError("a rank did not finish before the deadline")
    if errors:
        raise errors[0]
    return results


def wait_for(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.002)


def blocked_in(thread: threading.Thread, function: str) -> bool:
    frame = sys._current_frames().get(thread.ident or -1)
    while frame is not None:
        if frame.f_code.co_name == function:
            return True
        frame = frame.f_back
    return False


def inputs(n: int, size: int, dtype: Any, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(size).astype(dtype) for _ in range(n)]


# -- allreduce -------------------------------------------------------------------------------


@pytest.mark.parametrize("n", [2, 3, 4])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_allreduce_matches_numpy_and_is_bit_identical(make: Any, n: int, dtype: Any) -> None:
    backends = make(n, chunk_bytes=256)
    for b in backends:
        b.doubling_max_bytes = 0  # the ring; recursive doubling: test_host_doubling.py
    for size in [1, n - 1, n, 7, 1001]:
        xs = inputs(n, size, dtype, seed=size)
        copies = [x.copy() for x in xs]
        for op, ref in [("sum", np.sum(xs, axis=0)), ("mean", np.mean(xs, axis=0))]:
            first = run_all(backends, lambda b, op=op, xs=xs: b.allreduce(xs[b.rank], op))
            again = run_all(backends, lambda b, op=op, xs=xs: b.allreduce(xs[b.rank], op))
            for out in first + again:
                assert out.dtype == dtype and out.shape == (size,)
                assert out.tobytes() == first[0].tobytes()
                np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5)
        for x, c in zip(xs, copies, strict=True):
            assert np.array_equal(x, c), "allreduce modified its input"


@pytest.mark.parametrize(
    ("exchange_max", "lanes"),
    [(0, False), (1 << 20, False), (0, True)],
    ids=["ring", "exchange", "lane"],
)
def test_two_ranks_same_bits_on_every_path_nan_payloads_included(
    make: Any, exchange_max: int, lanes: bool
) -> None:
    backends = make(2, chunk_bytes=128, lanes=lanes)
    for b in backends:
        b.exchange_max_bytes = exchange_max
    xs = inputs(2, 1001, np.float32, seed=3)
    payloads = np.array([0x7FC00001, 0x7FC00002, 0xFFC00003], np.uint32)
    xs[0][:3] = payloads.view(np.float32)
    xs[1][:3] = (payloads + 8).view(np.float32)
    xs[0][3], xs[1][3] = np.float32(1e-45), np.float32(-0.0)
    for op in ("sum", "mean"):
        out = run_all(backends, lambda b, op=op: b.allreduce(xs[b.rank], op))
        assert out[0].tobytes() == out[1].tobytes()
        want = np.add(xs[0], xs[1])
        if op == "mean":
            want = want / np.float32(2)
        assert out[0][3:].tobytes() == want[3:].tobytes()
        assert np.isnan(out[0][:3]).all()


@pytest.mark.parametrize("block", [256, hostring.ADD_BLOCK_BYTES], ids=["blocks", "one-block"])
@pytest.mark.filterwarnings("ignore:(overflow|invalid value) encountered:RuntimeWarning")
def test_two_ranks_of_different_chunk_sizes_hold_the_same_nan_bits(
    make: Any, monkeypatch: pytest.MonkeyPatch, block: int
) -> None:
    # The ZeroMQ exchange once added each message as it came: the bits of two NaNs added then
    # depended on where the peer's chunks ended, so the two ranks disagreed.
    monkeypatch.setattr(hostring, "ADD_BLOCK_BYTES", block)
    backends = make(2, init=False, lanes=False)
    backends[0].chunk_bytes, backends[1].chunk_bytes = 64, 200
    members = {b.rank: b.endpoint for b in backends}
    for b in backends:
        b.init(1, members)
    rng = np.random.default_rng(11)
    pool = np.tile(special_values(np.float32), 40)
    xs = [rng.permutation(pool) for _ in range(2)]
    out = run_all(backends, lambda b: b.allreduce(xs[b.rank]))
    assert bits(out[0]) == bits(out[1])


@pytest.mark.parametrize("n", [2, 3])
@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
@pytest.mark.parametrize("finite", [True, False])
@pytest.mark.filterwarnings("ignore:(overflow|invalid value) encountered:RuntimeWarning")
def test_allreduce_of_special_values_has_the_same_bits_on_every_rank(
    make: Any, n: int, dtype: Any, finite: bool
) -> None:
    # Replica digests are compared bit for bit, so every rank must hold the same bits after a
    # reduction, for subnormals, signed zeros and NaN payloads too (the order in which NaNs
    # meet decides which payload survives: only the segment owner may compute it).
    backends = make(n, chunk_bytes=64)
    for b in backends:
        b.doubling_max_bytes = 0  # the ring; recursive doubling: test_host_doubling.py
    specials = finite_specials(dtype) if finite else special_values(dtype)
    rng = np.random.default_rng(n)
    pool = np.tile(np.concatenate([specials, specials * dtype(0.5)]), 4)  # several chunks
    xs = [rng.permutation(pool) for _ in range(n)]
    for op in ("sum", "mean"):
        outs = run_all(backends, lambda b, op=op: b.allreduce(xs[b.rank], op))
        assert {bits(o) for o in outs} == {bits(outs[0])}, op
        if finite and op == "sum" and n == 2:  # a 2-rank sum is one addition: numpy's bits
            assert bits(outs[0]) == bits(xs[0] + xs[1])


def test_allreduce_multichunk_ints_shapes_and_edges(make: Any) -> None:
    backends = make(3, chunk_bytes=64)
    ints = [np.arange(12, dtype=np.int64).reshape(3, 4) * (r + 1) for r in range(3)]
    out = run_all(backends, lambda b: b.allreduce(ints[b.rank]))
    assert all(np.array_equal(o, ints[0] * 6) and o.shape == (3, 4) for o in out)
    big = inputs(3, 5000, np.float64)
    out = run_all(backends, lambda b: b.allreduce(big[b.rank]))
    np.testing.assert_allclose(out[1], np.sum(big, axis=0))
    fortran = np.asfortranarray(np.ones((5, 3), np.float32))
    out = run_all(backends, lambda b: b.allreduce(fortran))
    assert np.array_equal(out[0], 3 * fortran)
    empty = run_all(backends, lambda b: b.allreduce(np.zeros((0, 3), np.float32)))
    assert all(e.shape == (0, 3) for e in empty)
    scalar = run_all(backends, lambda b: b.allreduce(np.array(2.5), "mean"))
    assert all(s.shape == () and s == 2.5 for s in scalar)


def test_ranks_may_use_different_chunk_sizes(make: Any) -> None:
    backends = make(3, init=False)
    for b, chunk in zip(backends, [64, 200, 1 << 20], strict=True):
        b.chunk_bytes = chunk
    members = {b.rank: b.endpoint for b in backends}
    for b in backends:
        b.init(1, members)
    xs = inputs(3, 999, np.float64)
    out = run_all(backends, lambda b: (b.allreduce(xs[b.rank]), b.broadcast(xs[b.rank], 0)))
    assert out[0][0].tobytes() == out[1][0].tobytes() == out[2][0].tobytes()
    assert all(np.array_equal(o[1], xs[0]) for o in out)


def test_mismatched_calls_fail_loudly(make: Any) -> None:
    backends = make(2)
    with pytest.raises(CommError, match=r"rank \d called allreduce\(<f\d:10\) but rank \d called"):
        run_all(backends, lambda b: b.allreduce(np.ones(10, [np.float32, np.float64][b.rank])))


def test_refused_call_keeps_ranks_in_step(make: Any) -> None:
    backends = make(2)
    with pytest.raises(CommError, match=r"broadcast root 5 is not in group 'world'"):
        backends[0].broadcast(np.ones(3), root=5)
    out = run_all(backends, lambda b: b.allreduce(np.ones(3)))
    assert np.array_equal(out[0], [2.0, 2.0, 2.0])


def test_allreduce_rejects_bad_op_and_dtype(make: Any) -> None:
    (b,) = make(1)
    assert np.array_equal(b.allreduce(np.arange(3.0)), np.arange(3.0))
    with pytest.raises(CommError, match="not one of: sum, mean"):
        b.allreduce(np.ones(3), "max")
    with pytest.raises(CommError, match="int64"):
        b.allreduce(np.ones(3, np.int64), "mean")


# -- broadcast, barrier ----------------------------------------------------------------------


def test_broadcast_from_any_root(make: Any) -> None:
    backends = make(4, chunk_bytes=128)
    xs = inputs(4, 777, np.float32)
    for root in (0, 2):
        out = run_all(backends, lambda b, root=root: b.broadcast(xs[b.rank].reshape(7, 111), root))
        assert all(np.array_equal(o, xs[root].reshape(7, 111)) for o in out)
        assert not np.shares_memory(out[root], xs[root])


def test_barrier_returns_only_after_everyone_entered(make: Any) -> None:
    backends = make(5)
    entered: list[int] = []
    lock = threading.Lock()

    def body(b: HostBackend) -> int:
        if b.rank == 4:  # the last one in enters only when the others are already waiting
            wait_for(lambda: len(entered) == 4, "four ranks in the barrier")
        with lock:
            entered.append(b.rank)
        b.barrier()
        return len(entered)

    for _ in range(3):
        entered.clear()
        assert run_all(backends, body) == [5] * 5


# -- send / recv -----------------------------------------------------------------------------


def test_send_recv_named_arrays_keep_dtype_shape_and_order(make: Any) -> None:
    backends = make(2, chunk_bytes=100)
    state = {
        "w": np.arange(1000, dtype=np.float32).reshape(10, 100),
        "b16": np.linspace(0, 1, 7).astype(np.float16),
        "step": np.array(42, dtype=np.int64),
        "mask": np.array([True, False, True]),
        "empty": np.zeros((0, 4), np.uint8),
        "cplx": np.array([1 + 2j, 3 - 4j]),
        "names": np.array(["ab", "cde"]),
        "strided": np.arange(40, dtype=np.int16)[::3],
        "fortran": np.asfortranarray(np.arange(6.0).reshape(2, 3)),
    }
    state.update({f"tiny{i}": np.full(3, i, np.int32) for i in range(50)})

    def body(b: HostBackend) -> Any:
        if b.rank == 0:
            b.send(state, 1, tag="repair")
            b.send({"x": np.ones(2)}, 0, tag="self")  # sending to oneself works too
            return b.recv(0, tag="self")
        return b.recv(0, tag="repair")

    mine, got = run_all(backends, body)
    assert np.array_equal(mine["x"], np.ones(2))
    assert list(got) == list(state)
    for name, value in state.items():
        assert got[name].dtype == value.dtype and got[name].shape == value.shape, name
        assert np.array_equal(got[name], value), name


def test_send_recv_keeps_every_float_bit_pattern(make: Any) -> None:
    backends = make(2, chunk_bytes=64)
    state = {str(np.dtype(d)): special_values(d) for d in (np.float16, np.float32, np.float64)}
    state["beta1_power"] = np.asarray(special_values(np.float32)[4])  # a 0-d subnormal

    def body(b: HostBackend) -> Any:
        if b.rank == 0:
            b.send(state, 1, tag="repair")
            return None
        return b.recv(0, tag="repair")

    _, got = run_all(backends, body)
    assert bit_diff(got, state) == []


def test_tags_are_separate_channels(make: Any) -> None:
    backends = make(2)

    def body(b: HostBackend) -> Any:
        if b.rank == 0:
            b.send({"v": np.array([1])}, 1, tag="a")
            b.send({"v": np.array([2])}, 1, tag="b")
            return None
        return b.recv(0, tag="b")["v"][0], b.recv(0, tag="a")["v"][0]

    assert run_all(backends, body)[1] == (2, 1)


# -- groups ----------------------------------------------------------------------------------


def test_subgroups_have_their_own_rings(make: Any) -> None:
    backends = make(4, chunk_bytes=64)
    for b in backends:
        b.create_group("even", [0, 2])
        b.create_group("odd", [3, 1])
    xs = inputs(4, 300, np.float64)

    def body(b: HostBackend) -> Any:
        name = "even" if b.rank % 2 == 0 else "odd"
        return b.allreduce(xs[b.rank], group=name), b.broadcast(
            xs[b.rank], 3, "odd"
        ) if name == "odd" else None

    out = run_all(backends, body)
    np.testing.assert_allclose(out[0][0], xs[0] + xs[2])
    np.testing.assert_allclose(out[3][0], xs[1] + xs[3])
    assert out[0][0].tobytes() == out[2][0].tobytes()
    assert np.array_equal(out[1][1], xs[3])
    with pytest.raises(CommError, match=r"'even' \(ranks \[0, 2\]\) but is not a member"):
        backends[1].allreduce(xs[1], group="even")
    with pytest.raises(CommError, match="unknown group 'nope'"):
        backends[1].barrier("nope")
    with pytest.raises(CommError, match=r"\[7\] are not in the world"):
        backends[1].create_group("bad", [1, 7])
    assert backends[1].group_log.names() == ["even", "odd"]


# -- abort, timeout --------------------------------------------------------------------------


@pytest.mark.parametrize("call", ["allreduce", "recv", "barrier"])
def test_abort_unblocks_a_rank_whose_peer_never_joins(make: Any, call: str) -> None:
    b0, _ = make(2)
    ops = {
        "allreduce": lambda: b0.allreduce(np.ones(10)),
        "recv": lambda: b0.recv(1),
        "barrier": b0.barrier,
    }
    outcome: list[BaseException] = []

    def body() -> None:
        try:
            ops[call]()
        except BaseException as exc:
            outcome.append(exc)

    thread = threading.Thread(target=body)
    thread.start()
    # ZeroMQ waits in Link.take; a two-rank allreduce waits on its lane in Lanes.wait.
    wait_for(lambda: blocked_in(thread, "take") or blocked_in(thread, "wait"), "the rank to block")
    aborted_at = time.monotonic()
    b0.abort()
    thread.join(DEADLINE_S)
    assert not thread.is_alive() and isinstance(outcome[0], Interrupted)
    assert time.monotonic() - aborted_at < 2.0  # ~ms in practice; generous for loaded CI
    with pytest.raises(Interrupted):
        b0.barrier()


def test_close_lets_queued_data_reach_a_slower_peer(make: Any) -> None:
    b0, b1 = make(2)
    b1.send({"last": np.arange(5)}, 0, tag="bye")  # small: queued as a copy, send returns
    b1.close()
    assert np.array_equal(b0.recv(1, tag="bye")["last"], np.arange(5))
    with pytest.raises(CommError, match="closed"):
        b1.barrier()


def test_receive_timeout_names_the_peer(make: Any) -> None:
    b0, _ = make(2, timeout=0.2)
    with pytest.raises(CommError, match="nothing from rank 1"):
        b0.recv(1, tag="never")


# -- rebuild ---------------------------------------------------------------------------------


def test_rebuild_with_a_replaced_rank_and_a_logged_group(make: Any) -> None:
    backends = make(3, chunk_bytes=128)
    for b in backends:
        b.create_group("pair", [2, 0])
    xs = inputs(3, 500, np.float32)
    run_all(backends, lambda b: b.allreduce(xs[b.rank]))
    survivors = backends[:2]
    old_endpoints = [b.endpoint for b in survivors]
    for b in survivors:
        b.abort()  # the STOP of the recovery
    backends[2].close()
    (fresh,) = [HostBackend(2, 3, chunk_bytes=128)]
    make.made.append(fresh)
    assert fresh.endpoint != backends[2].endpoint
    world = [*survivors, fresh]
    members = {b.rank: b.endpoint for b in world}
    log = GroupLog(list(backends[0].group_log))

    def body(b: HostBackend) -> Any:
        b.rebuild(2, members, log)
        total = b.allreduce(xs[b.rank])
        pair = b.allreduce(xs[b.rank], "mean", group="pair") if b.rank != 1 else None
        return total, pair

    out = run_all(world, body)
    assert [b.endpoint for b in survivors] == old_endpoints
    assert all(b.epoch == 2 and b.group_log == log for b in world)
    np.testing.assert_allclose(out[1][0], np.sum(xs, axis=0), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(out[2][1], (xs[0] + xs[2]) / 2, rtol=1e-5, atol=1e-6)
    assert out[0][1].tobytes() == out[2][1].tobytes()
    with pytest.raises(CommError, match="not newer"):
        world[0].rebuild(2, members, log)


def test_a_peer_that_rebuilt_first_is_buffered_not_dropped(make: Any) -> None:
    backends = make(2)
    members = {b.rank: b.endpoint for b in backends}
    ahead, behind = backends
    ahead.rebuild(2, members, GroupLog())
    ahead.send({"early": np.arange(3)}, 1, tag="x")
    behind.rebuild(2, members, GroupLog())
    assert np.array_equal(behind.recv(0, tag="x")["early"], np.arange(3))


# -- hostile and stale traffic ---------------------------------------------------------------


def _raw_messages(epoch: int, tag: str, value: np.ndarray) -> list[list[bytes]]:
    manifest, views = hoststream.flatten({"v": value})
    head = Header(epoch, 0, P2P, tag, "p2p", 0, "manifest").encode()
    msgs = [[head, manifest]]
    for offset, chunk, _ in hoststream.chunks(views, 1 << 20):
        msgs.append([Header(epoch, 0, P2P, tag, "p2p", offset, "data").encode(), chunk.tobytes()])
    return msgs


@pytest.fixture
def raw() -> Iterator[Callable[[str], zmq.Socket[bytes]]]:
    ctx = zmq.Context()
    socks: list[zmq.Socket[bytes]] = []

    def dealer(
        endpoint: str, password: bytes | None = None, user: bytes = USER
    ) -> zmq.Socket[bytes]:
        sock: zmq.Socket[bytes] = ctx.socket(zmq.DEALER)
        sock.linger = 0
        if password is not None:
            configure_client(sock, password)
            sock.plain_username = user
        sock.connect(split_endpoint(endpoint)[0])  # the ZeroMQ part, without the lane
        socks.append(sock)
        return sock

    yield dealer
    for sock in socks:
        sock.close()
    ctx.term()


def test_stale_epoch_frames_are_dropped_and_newer_ones_kept(make: Any, raw: Any) -> None:
    _, b1 = make(2)
    sock = raw(b1.endpoint)  # one connection, so the receiver sees these in order
    for msg in _raw_messages(0, "t", np.array([-1.0])) + _raw_messages(3, "t", np.array([3.0])):
        sock.send_multipart(msg)
    for msg in _raw_messages(1, "t", np.array([1.0])):
        sock.send_multipart(msg)
    assert b1.recv(0, tag="t")["v"][0] == 1.0
    assert b1.stats.stale_dropped == 2 and b1.stats.future_buffered == 2
    b1.rebuild(3, {0: "tcp://127.0.0.1:1", 1: b1.endpoint}, GroupLog())
    assert b1.recv(0, tag="t")["v"][0] == 3.0


def test_garbage_frames_do_not_crash_the_receiver(make: Any, raw: Any) -> None:
    _, b1 = make(2)
    sock = raw(b1.endpoint)
    garbage = [
        [b"junk"],
        [b"\xc1", b""],
        [b"\x93\x01\x02\x03", b""],
        [b"a", b"b", b"c"],
        [Header(1, 0, P2P, "t", "p2p", 0, "manifest").encode()[:-3], b""],
        [b"\x98\x09\x01\x00\xa0\xa1t\xa3p2p\x00\xa8manifest", b""],
    ]  # wrong version
    for msg in garbage:
        sock.send_multipart(msg)
    for msg in _raw_messages(1, "t", np.array([7.0])):
        sock.send_multipart(msg)
    assert b1.recv(0, tag="t")["v"][0] == 7.0
    assert b1.stats.malformed_dropped == len(garbage)


def test_malformed_manifest_is_a_comm_error(make: Any, raw: Any) -> None:
    _, b1 = make(2)
    sock = raw(b1.endpoint)
    sock.send_multipart([Header(1, 0, P2P, "t", "p2p", 0, "manifest").encode(), b"\x01\x02"])
    with pytest.raises(CommError, match="malformed transfer manifest"):
        b1.recv(0, tag="t")


# -- authentication --------------------------------------------------------------------------

PASSWORD = data_plane_password(b"job secret", "job-a")


def test_ranks_with_the_job_password_talk(make: Any) -> None:
    backends = make(3, password=PASSWORD, chunk_bytes=256)
    xs = inputs(3, 1000, np.float32)
    outs = run_all(backends, lambda b: b.allreduce(xs[b.rank]))
    assert all(o.tobytes() == outs[0].tobytes() for o in outs)
    assert all(b.stats.refused_connections == 0 for b in backends)


def test_peers_without_the_job_password_are_refused_and_logged(
    make: Any, raw: Any, caplog: pytest.LogCaptureFixture
) -> None:
    _, b1 = make(2, password=PASSWORD)
    intruders = [
        raw(b1.endpoint),  # no credentials at all
        raw(b1.endpoint, data_plane_password(b"job secret", "job-b")),  # another job's
        raw(b1.endpoint, data_plane_password(b"other secret", "job-a")),  # a wrong secret
        raw(b1.endpoint, PASSWORD, user=b"someone"),  # the password under another user
    ]
    for sock in intruders:
        for msg in _raw_messages(1, "t", np.array([-1.0])):
            # Without blocking: once its handshake is refused a DEALER may have no pipe for a
            # while, and a blocking send then waits for one (CI met a send that never
            # returned). Refusal happens at the handshake, whether anything was queued or not.
            with contextlib.suppress(zmq.Again):
                sock.send_multipart(msg, zmq.NOBLOCK)
    wait_for(lambda: b1.stats.refused_connections >= len(intruders), "four refusals")
    assert b1.stats.delivered == 0
    refusals = [r.getMessage() for r in caplog.records if "refused a data-plane" in r.message]
    assert any("no data-plane credentials" in m for m in refusals)
    assert any("PLAIN with a wrong password" in m for m in refusals)
    assert any("PLAIN with unknown credentials" in m for m in refusals)
    sock = raw(b1.endpoint, PASSWORD)
    for msg in _raw_messages(1, "t", np.array([7.0])):
        sock.send_multipart(msg)
    assert b1.recv(0, tag="t")["v"][0] == 7.0
    assert b1.stats.delivered == 2  # manifest and one data chunk, from the one good peer


def test_the_gatekeeper_speaks_zap() -> None:
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    router = ctx.socket(zmq.ROUTER)
    gate = Gatekeeper(ctx, router, PASSWORD, 0, WireStats())
    client = ctx.socket(zmq.REQ)
    client.connect(ZAP_ENDPOINT)
    try:
        request = [b"1.0", b"7", b"", b"10.0.0.9", b"", b"PLAIN", USER]
        for creds, status in (([PASSWORD], b"200"), ([b"nope"], b"400"), ([], b"400")):
            client.send_multipart(request + creds)
            assert client.recv_multipart()[:3] == [b"1.0", b"7", status]
        client.send_multipart([b"1.0", b"8"])  # malformed: answered, not fatal
        assert client.recv_multipart()[:3] == [b"1.0", b"8", b"500"]
        assert gate.stats.refused_connections == 2
    finally:
        client.close(linger=0)
        gate.close()
        router.close(linger=0)
        ctx.term()


# -- the two-rank lane -----------------------------------------------------------------------


def _lane(backend: HostBackend) -> tuple[str, int]:
    lane = split_endpoint(backend.endpoint)[1]
    assert lane is not None, "a backend without CURVE advertises a lane"
    return lane


def test_a_lane_dialer_without_the_job_secret_is_refused(make: Any) -> None:
    b0, b1 = make(2, password=PASSWORD)
    xs = inputs(2, 1000, np.float32)
    outs: list[Any] = []
    waiting = threading.Thread(target=lambda: outs.append(b1.allreduce(xs[1])))
    waiting.start()  # rank 1 waits for rank 0 to dial, serving its lane meanwhile
    intruders = [socket.create_connection(_lane(b1), timeout=DEADLINE_S) for _ in range(2)]
    try:
        intruders[0].sendall(b"GET / HTTP/1.0\r\n\r\n" + bytes(40))  # not a hello at all
        intruders[1].sendall(HELLO.pack(HELLO_MAGIC, 1, 1, 0, 1, bytes(16)))  # "rank 0"
        challenge = intruders[1].recv(64)  # the acceptor answers the hello ...
        intruders[1].sendall(bytes(32))  # ... but refuses a proof made without the secret
        wait_for(lambda: b1.stats.refused_connections >= 2, "two refusals")
    finally:
        for sock in intruders:
            sock.close()
    mine = b0.allreduce(xs[0])  # the real rank 0 still gets through
    waiting.join(DEADLINE_S)
    assert len(challenge) == 48 and b1.stats.refused_connections == 2
    assert mine.tobytes() == outs[0].tobytes() == (xs[0] + xs[1]).tobytes()


def test_lane_ranks_of_another_secret_do_not_exchange(make: Any) -> None:
    (b0,) = [HostBackend(0, 2, password=data_plane_password(b"other", "job-a"), timeout=2.0)]
    (b1,) = [HostBackend(1, 2, password=PASSWORD, timeout=2.0)]
    make.made.extend([b0, b1])
    members = {0: b0.endpoint, 1: b1.endpoint}
    for b in (b0, b1):
        b.init(1, members)
    with pytest.raises(CommError) as err:
        run_all([b0, b1], lambda b: b.allreduce(np.ones(4, np.float32)))
    assert "failed to prove" in str(err.value) or "nothing" in str(err.value)
    assert b1.stats.refused_connections >= 1


def lane_path(monkeypatch: pytest.MonkeyPatch, threaded: bool) -> None:
    """The general exchange on its one thread, or (``threaded``) with its sender thread: every
    call of 64 bytes or more then counts as preempted at its first turn, so it switches (and
    the rank's next calls start threaded)."""
    monkeypatch.setattr(laneexchange, "THREAD_MIN_BYTES", 64 if threaded else 1 << 40)
    if threaded:
        monkeypatch.setattr(laneexchange, "PREEMPTED_MS", -1.0)
        monkeypatch.setattr(laneexchange, "PREEMPTED_SHARE", -1.0)


@pytest.mark.parametrize("threaded", [False, True], ids=["one-thread", "sender-thread"])
def test_a_lane_peer_that_dies_leaves_the_call_waiting_for_the_abort(
    make: Any, monkeypatch: pytest.MonkeyPatch, threaded: bool
) -> None:
    lane_path(monkeypatch, threaded)
    b0, b1 = make(2)
    run_all([b0, b1], lambda b: b.allreduce(np.ones(8)))  # the lane is connected
    outcome: list[BaseException] = []

    def body() -> None:
        try:
            b0.allreduce(np.ones(1 << 16))
        except BaseException as exc:
            outcome.append(exc)

    thread = threading.Thread(target=body)
    thread.start()
    b1.close()  # the peer goes away: its connection is closed under the call
    wait_for(lambda: blocked_in(thread, "wait_for_abort"), "the call to wait for the abort")
    assert not outcome, "a peer that hung up is not an error of this rank"
    b0.abort()
    thread.join(DEADLINE_S)
    assert not thread.is_alive() and isinstance(outcome[0], Interrupted)


def test_with_curve_there_is_no_lane() -> None:
    curve = DataCurve.derive(b"job secret", "job-a")
    b = HostBackend(0, 2, password=PASSWORD, curve=curve)
    try:
        assert split_endpoint(b.endpoint)[1] is None and "?lane=" not in b.endpoint
    finally:
        b.close()


@pytest.mark.parametrize("threaded", [False, True], ids=["one-thread", "sender-thread"])
def test_a_lane_message_of_many_frames_and_spans_has_the_same_bits(
    make: Any, monkeypatch: pytest.MonkeyPatch, threaded: bool
) -> None:
    monkeypatch.setattr(lanesmall, "SMALL_MAX_BYTES", 0)  # 8 KB: the general exchange
    lane_path(monkeypatch, threaded)
    monkeypatch.setattr(laneexchange, "FRAME_MAX_BYTES", 1000)  # 8 frames of 125 doubles
    monkeypatch.setattr(laneexchange, "ADD_SPAN_BYTES", 64)  # many partial adds
    monkeypatch.setattr(laneexchange, "RECV_MAX", 200)  # payloads read in pieces
    backends = make(2)
    xs = inputs(2, 1001, np.float64, seed=5)
    xs[0][:2] = np.array([0x7FF8000000000001, 0xFFF8000000000002], np.uint64).view(np.float64)
    xs[1][:2] = np.array([0x7FF8000000000003, 0x7FF8000000000004], np.uint64).view(np.float64)
    for op in ("sum", "mean"):
        first = run_all(backends, lambda b, op=op: b.allreduce(xs[b.rank], op))
        again = run_all(backends, lambda b, op=op: b.allreduce(xs[b.rank], op))
        assert len({bits(o) for o in first + again}) == 1, "same bits on both ranks and reruns"
        want = xs[0] + xs[1] if op == "sum" else (xs[0] + xs[1]) / 2
        assert first[0][2:].tobytes() == want[2:].tobytes()


def test_a_lane_hello_of_an_older_epoch_is_dropped(make: Any) -> None:
    b0, b1 = make(2)
    members = {b.rank: b.endpoint for b in (b0, b1)}
    for b in (b0, b1):
        b.rebuild(2, members, GroupLog())
    outs: list[Any] = []
    waiting = threading.Thread(target=lambda: outs.append(b1.allreduce(np.ones(3))))
    waiting.start()  # rank 1 serves its lane while it waits for rank 0
    late = socket.create_connection(_lane(b1), timeout=DEADLINE_S)
    try:
        late.sendall(HELLO.pack(HELLO_MAGIC, 1, 1, 0, 1, bytes(16)))  # rank 0 of epoch 1
        wait_for(lambda: b1.stats.stale_dropped >= 1, "the stale hello to be dropped")
        assert late.recv(64) == b"", "closed without an answer"
    finally:
        late.close()
    assert np.array_equal(b0.allreduce(np.ones(3)), [2.0, 2.0, 2.0])
    waiting.join(DEADLINE_S)
    assert np.array_equal(outs[0], [2.0, 2.0, 2.0]) and b1.stats.refused_connections == 0
