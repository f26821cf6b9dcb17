"""The lane's latency path for small buffers (:mod:`ms_recover.comm.host.lane.small`).

It must give the general exchange's bits on both ranks (NaN payloads included) for every
dtype, op and destination; finish what one send and one read leave (a send or a read cut into
pieces, a header that arrives in parts); fail a call whose peer made another call; and wait
for the abort when the peer hangs up (see test_lane_out).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from ms_recover.comm.host.backend import HostBackend
from ms_recover.comm.host.lane import small as lanesmall
from ms_recover.errors import CommError
from tests.integration.test_host_backend import inputs, make, run_all
from tests.kit.floats import bits

__all__ = ["make"]  # the fixture, shared with test_host_backend
pytestmark = pytest.mark.timeout(60)
DTYPES = [np.float16, np.float32, np.float64, np.complex64, np.int32]


def _with_nans(xs: list[np.ndarray]) -> list[np.ndarray]:
    if xs[0].dtype.kind == "f":
        for r, x in enumerate(xs):
            raw = x.view(np.dtype(f"u{x.itemsize}"))
            raw[:2] = raw.dtype.type(np.iinfo(raw.dtype).max - 4 * r)  # NaNs, their payloads differ
    return xs


def _calls(backends: list[HostBackend], xs: list[np.ndarray], op: str) -> list[np.ndarray]:
    """Each rank's plain, out= and in-place results, in that order."""
    plain = run_all(backends, lambda b: b.allreduce(xs[b.rank], op))
    outs = [np.empty_like(x) for x in xs]
    run_all(backends, lambda b: b.allreduce(xs[b.rank], op, out=outs[b.rank]))
    bufs = [x.copy() for x in xs]
    run_all(backends, lambda b: b.allreduce(bufs[b.rank], op, out=bufs[b.rank]))
    return [*plain, *outs, *bufs]


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_the_small_path_gives_the_general_exchanges_bits(
    make: Any, monkeypatch: pytest.MonkeyPatch, dtype: Any
) -> None:
    backends = make(2)
    xs = _with_nans(inputs(2, 999, dtype, seed=2))
    keep = [bits(x) for x in xs]
    for op in ("sum", "mean") if np.dtype(dtype).kind in "fc" else ("sum",):
        small = _calls(backends, xs, op)
        with monkeypatch.context() as m:
            m.setattr(lanesmall, "SMALL_MAX_BYTES", 0)
            general = _calls(backends, xs, op)
        assert len({bits(r) for r in small + general}) == 1, (op, "one set of bits everywhere")
        assert [bits(x) for x in xs] == keep, "inputs that are not out are untouched"


def _pieces(monkeypatch: pytest.MonkeyPatch, most: int) -> None:
    """Every send and every read of the small path moves at most ``most`` bytes."""

    def cut(bufs: list[Any]) -> list[Any]:
        kept, left = [], most
        for buf in bufs:
            view = memoryview(buf).cast("B")[:left]
            kept.append(view)
            left -= len(view)
            if not left:
                break
        return kept

    real_send, real_read = lanesmall._send, lanesmall._read
    monkeypatch.setattr(lanesmall, "_send", lambda sock, bufs: real_send(sock, cut(bufs)))
    monkeypatch.setattr(lanesmall, "_read", lambda sock, bufs: real_read(sock, cut(bufs)))


@pytest.mark.parametrize("most", [7, 1000])  # 7: even the header comes in pieces
def test_sends_and_reads_in_pieces_give_the_same_bits(
    make: Any, monkeypatch: pytest.MonkeyPatch, most: int
) -> None:
    backends = make(2)
    xs = _with_nans(inputs(2, 1001, np.float64, seed=7))
    for op in ("sum", "mean"):
        whole = _calls(backends, xs, op)
        with monkeypatch.context() as m:
            _pieces(m, most)
            cut = _calls(backends, xs, op)
        assert len({bits(r) for r in whole + cut}) == 1, op


@pytest.mark.parametrize("most", [None, 7], ids=["whole", "in pieces"])
def test_a_small_call_whose_peer_made_another_call_fails_naming_both(
    make: Any, monkeypatch: pytest.MonkeyPatch, most: int | None
) -> None:
    if most is not None:
        _pieces(monkeypatch, most)
    backends = make(2)
    sizes = [10, 12]  # another signature: another header length too
    with pytest.raises(CommError, match=r"rank \d called allreduce\(<f8:1[02]\) but rank \d"):
        run_all(backends, lambda b: b.allreduce(np.ones(sizes[b.rank])))
