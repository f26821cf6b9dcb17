"""``allreduce(..., out=)``: the result written into a buffer the caller gives, the input
itself included (GraphStep's buckets), on HostBackend over real ZeroMQ and on LocalBackend.

One rank with ``out`` the input copies nothing but still enters the call (numbered, abortable);
two or more ranks give the bits of a plain allreduce on every rank, NaN payloads included,
with zero-copy frames large enough that zmq really sends from the caller's buffer.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from ms_recover.comm.base import check_out
from ms_recover.comm.grouplog import GroupLog
from ms_recover.comm.local import LocalBackend
from ms_recover.errors import CommError, Interrupted
from tests.integration.test_host_backend import inputs, make, run_all

__all__ = ["make"]  # the fixture, shared with test_host_backend
pytestmark = pytest.mark.timeout(60)
# pyzmq copies frames below 64 KiB; these chunks are sent zero-copy from the input itself.
ZERO_COPY_CHUNK = 1 << 17


def with_nan_payloads(xs: list[np.ndarray]) -> list[np.ndarray]:
    payloads = np.array([0x7FC00001, 0x7FC00002, 0xFFC00003], np.uint32)
    for r, x in enumerate(xs):
        x[:3] = (payloads + 8 * r).view(np.float32)
        x[-3:] = (payloads + 16 * r).view(np.float32)
    return xs


def test_one_rank_in_place_copies_nothing_but_still_enters_the_call(
    make: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    (b,) = make(1)
    x = inputs(1, 1000, np.float32)[0].reshape(10, 100)
    want = x.tobytes()
    copies: list[Any] = []
    real_copyto = np.copyto
    monkeypatch.setattr(np, "copyto", lambda *a, **k: copies.append(a) or real_copyto(*a, **k))
    seq = b._seq["world"]
    for op in ("sum", "mean"):
        got = b.allreduce(x, op, out=x)
        assert got is x and got.tobytes() == want
    assert copies == [] and b._seq["world"] == seq + 2  # numbered like any other call
    read_only = x.copy()
    read_only.flags.writeable = False
    with pytest.raises(CommError, match="got a read-only float32 array"):
        b.allreduce(read_only, "mean", out=read_only)  # in place, still checked
    ints = np.arange(6)
    with pytest.raises(CommError, match="allreduce mean of dtype int64 is not supported"):
        b.allreduce(ints, "mean", out=ints)
    assert b._seq["world"] == seq + 2  # refused before it was numbered
    b.abort()
    with pytest.raises(Interrupted):  # the entry still runs: an aborted comm refuses it
        b.allreduce(x, "mean", out=x)


def test_one_rank_in_place_after_an_abort_a_rebuild_and_a_close(make: Any) -> None:
    """The one-rank in-place path reads one flag for "neither aborted nor closed": a rebuild
    makes the rank usable again, a close refuses every call, and a bad op is named."""
    (b,) = make(1)
    x = np.ones(8, np.float32)
    b.abort()
    with pytest.raises(Interrupted):
        b.allreduce(x, "mean", out=x)
    b.rebuild(b.epoch + 1, {0: b.endpoint}, GroupLog())
    seq = b._seq["world"]
    assert b.allreduce(x, "mean", out=x) is x and b._seq["world"] == seq + 1
    with pytest.raises(CommError, match="reduce op 'avg' is not one of: sum, mean"):
        b.allreduce(x, "avg", out=x)
    assert b._seq["world"] == seq + 1
    b.close()
    with pytest.raises(CommError, match="closed"):
        b.allreduce(x, "mean", out=x)


def test_one_rank_into_another_buffer_leaves_the_input_alone(make: Any) -> None:
    (b,) = make(1)
    x = inputs(1, 1000, np.float64)[0]
    keep = x.copy()
    out = np.full_like(x, np.nan)
    assert b.allreduce(x, "mean", out=out) is out
    assert out.tobytes() == keep.tobytes() and x.tobytes() == keep.tobytes()
    view = np.zeros(12, np.float32).reshape(3, 4)
    strided = np.arange(24, dtype=np.float32).reshape(3, 8)[:, ::2]  # a non-contiguous input
    assert b.allreduce(strided, out=view) is view and np.array_equal(view, strided)


@pytest.mark.parametrize(("n", "path"), [(2, "exchange"), (2, "ring"), (3, "ring")])
@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")
def test_in_place_gives_a_plain_allreduce_bits_on_every_rank(make: Any, n: int, path: str) -> None:
    backends = make(n, chunk_bytes=ZERO_COPY_CHUNK)
    for b in backends:
        b.exchange_max_bytes = 1 << 24 if path == "exchange" else 0
    xs = with_nan_payloads(inputs(n, 300_001, np.float32, seed=n))
    for op in ("sum", "mean"):
        plain = run_all(backends, lambda b, op=op: b.allreduce(xs[b.rank], op))
        bufs = [x.copy() for x in xs]
        got = run_all(
            backends, lambda b, op=op, bufs=bufs: b.allreduce(bufs[b.rank], op, out=bufs[b.rank])
        )
        for r in range(n):
            assert got[r] is bufs[r]
            assert bufs[r].tobytes() == plain[0].tobytes(), f"rank {r} {op}"
        assert np.isnan(bufs[0][:3]).all() and np.isnan(bufs[0][-3:]).all()
        # Into a separate buffer: the input stays as it was.
        outs = [np.empty_like(x) for x in xs]
        keep = [x.tobytes() for x in xs]
        run_all(backends, lambda b, op=op, outs=outs: b.allreduce(xs[b.rank], op, out=outs[b.rank]))
        assert [o.tobytes() for o in outs] == [plain[0].tobytes()] * n
        assert [x.tobytes() for x in xs] == keep


def test_a_wrong_out_is_refused_naming_what_is_expected_and_the_ranks_stay_in_step(
    make: Any,
) -> None:
    backends = make(2)
    x = np.ones((4, 5), np.float32)
    expected = r"out= must be a writeable C-contiguous float32 ndarray of shape \(4, 5\)"
    read_only = np.zeros((4, 5), np.float32)
    read_only.flags.writeable = False
    bad = [
        (np.zeros((4, 5), np.float64), r"got a float64 array of shape \(4, 5\)"),
        (np.zeros(20, np.float32), r"got a float32 array of shape \(20,\)"),
        (np.zeros((5, 4), np.float32).T, r"got a not C-contiguous float32 array"),
        (read_only, r"got a read-only float32 array"),
        ([0.0] * 20, "got list"),
    ]
    for out, got in bad:
        with pytest.raises(CommError, match=expected + ".*" + got):
            backends[0].allreduce(x, out=out)  # type: ignore[arg-type]
        with pytest.raises(CommError, match=expected):
            LocalBackend().allreduce(x, out=out)  # type: ignore[arg-type]
    # Refused before the call was numbered: both ranks still agree on the next one.
    res = run_all(backends, lambda b: b.allreduce(x, out=np.empty_like(x)))
    assert all(np.array_equal(r, 2 * x) for r in res)


def test_local_backend_out() -> None:
    comm = LocalBackend()
    x = np.arange(6, dtype=np.float32)
    assert comm.allreduce(x, "mean", out=x) is x and np.array_equal(x, np.arange(6))
    out = np.zeros_like(x)
    assert comm.allreduce(x, out=out) is out and np.array_equal(out, x)
    comm.abort()
    with pytest.raises(Interrupted):
        comm.allreduce(x, out=x)


def test_check_out_accepts_exactly_the_matching_buffer() -> None:
    x = np.zeros((2, 3), np.int32)
    out = np.empty((2, 3), np.int32)
    assert check_out(x, out) is out and check_out(x, x) is x
