"""The ring allreduce and the two-member exchange of the host data plane, over ZeroMQ.

* :func:`ring`: ring reduce-scatter then ring all-gather, streamed chunk by chunk: a chunk is
  forwarded as soon as it has been reduced (or received), so both phases pipeline. Segment
  ``j`` is always summed in the same order (starting at member ``j``, around the ring), so the
  result is bit-for-bit reproducible, and the all-gather copies final bits, so every member
  ends with identical bits. MEAN divides each final segment once, at its owner.
* :func:`exchange`: two members send each other their whole buffer once, and each adds the
  lower rank's values first (same bits on both, NaN payloads included, whatever chunk size
  each uses).

Both return only once zmq no longer reads the caller's ``flat`` (tracked sends are waited
for), so the caller may overwrite it. All-gather forwards re-send the received zmq frame.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import zmq
from numpy.typing import NDArray

from ms_recover.comm.host.call import Call, take, values
from ms_recover.comm.host.link import Link

ADD_BLOCK_BYTES = 64 << 10  # exchange: the peer's values are added in blocks of this size


def exchange(link: Link, call: Call, flat: NDArray[Any], mean: bool, chunk: int) -> NDArray[Any]:
    """Two members: each sends its whole buffer once and adds the peer's as it arrives.

    One message latency instead of the ring's two. Both members add in the same order
    (the lower rank's values first), so both hold the same bits, NaN payloads included.
    ``chunk`` bounds each message in bytes.
    """
    peer = call.peer(1)
    step = max(1, chunk // flat.itemsize)
    trackers = [
        link.send(peer, call.header(a), flat[a : a + step], track=True)
        for a in range(0, flat.size, step)
    ]
    theirs, out = np.empty_like(flat), np.empty_like(flat)
    low_first = call.rank < peer
    block = max(1, ADD_BLOCK_BYTES // flat.itemsize)
    got = added = 0
    while got < flat.size:
        vals = values(call, take(link, call, peer, got), flat.dtype, got, flat.size)
        theirs[got : got + vals.size] = vals
        got += vals.size
        # Add on a fixed grid of blocks, never message by message: numpy's bits for two NaNs
        # depend on where a call's vector loop ends, and the peer's messages end where its
        # chunk size says, which may differ from ours.
        while added < flat.size and min(added + block, flat.size) <= got:
            a, b = added, min(added + block, flat.size)
            first, second = (flat[a:b], theirs[a:b]) if low_first else (theirs[a:b], flat[a:b])
            np.add(first, second, out=out[a:b])
            added = b
    if mean:
        np.divide(out, 2, out=out)
    link.wait_sent([t for t in trackers if t is not None], peer, str(call))
    return out


def ring(link: Link, call: Call, flat: NDArray[Any], mean: bool, chunk: int) -> NDArray[Any]:
    """Ring allreduce of ``flat`` over the ``call.n`` members (see the module docstring)."""
    n, right = call.n, call.peer(1)
    bounds = segments(flat.size, n)
    step = max(1, chunk // flat.itemsize)
    out = np.empty_like(flat)
    # Own segment first. It is read from the caller's array: its final value comes back
    # around the ring only after the right peer has received it, so no tracking is needed.
    for a in range(bounds[call.index], bounds[call.index + 1], step):
        link.send(right, call.header(a), flat[a : min(a + step, bounds[call.index + 1])])
    trackers: list[zmq.MessageTracker] = []
    last = 2 * n - 3
    for t in range(last + 1):
        seg = (call.index - t - 1) % n
        got, end = bounds[seg], bounds[seg + 1]
        while got < end:
            frame = take(link, call, call.peer(-1), got)
            vals = values(call, frame, flat.dtype, got, end)
            stop = got + vals.size
            dst = out[got:stop]
            if t < n - 1:  # reduce-scatter: add our contribution, forward the partial sum
                np.add(flat[got:stop], vals, out=dst)
                if t == n - 2 and mean:
                    np.divide(dst, n, out=dst)
                # The owned segment never comes back to us: track it (see module doc).
                tracker = link.send(right, call.header(got), dst, track=t == n - 2)
                if tracker is not None:
                    trackers.append(tracker)
            else:  # all-gather: keep the final bits, forward the very same frame
                dst[...] = vals
                if t < last:
                    link.send(right, call.header(got), frame)
            got = stop
    link.wait_sent(trackers, right, str(call))
    return out


def segments(size: int, n: int) -> list[int]:
    """Boundaries of ``n`` near-equal segments of ``size`` elements (``n + 1`` entries)."""
    base, extra = divmod(size, n)
    return [k * base + min(k, extra) for k in range(n + 1)]
