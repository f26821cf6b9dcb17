"""Recursive doubling: the latency path of small allreduces in groups of more than two.

The ring takes ``2 (n - 1)`` message latencies; recursive doubling takes ``log2 n`` (two more
when ``n`` is not a power of two), each carrying the whole buffer, so it wins while a
message's latency outweighs its bytes: small buffers (see :data:`DOUBLING_MAX_BYTES`).

Positions are the group's own order ``0 .. n-1``; ``p`` is the largest power of two ``<= n``.

1. **Fold** (only when ``n`` is not a power of two): position ``i >= p`` sends its buffer to
   ``i - p``, which adds it to its own.
2. **Doubling** among positions ``0 .. p-1``: at stage ``k`` position ``i`` swaps its partial
   sum with ``i ^ 2**k`` and both compute ``lower + upper`` (the partial of the lower
   position first). By induction every position of a block of ``2**(k+1)`` holds the same
   bits after stage ``k``: both partners add the same two arrays in the same order, so NaN
   payloads agree too.
3. **MEAN** divides once, identically on every position below ``p``.
4. **Unfold**: ``i - p`` sends its final bits to ``i``, which keeps them (never recomputes).

Every partner (``i ^ 2**k`` and ``i ^ p = i - p``) is in
:func:`~ms_recover.comm.peers.group_targets`, so a rank has their endpoints. The path is
chosen from ``n`` and the buffer's size alone, which every member agrees on (the call's
signature carries the size), so all members take it for the same call. The result is
deterministic for a given ``n`` (it need not equal the ring's bits: the order of the sums
differs). A member that dies fails the call, with the link's timeout, on every member that
waits for it (directly or through a partner; members that already hold every contribution
finish), or they wait for the abort.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import zmq
from numpy.typing import NDArray

from ms_recover.comm.host.call import Call, take, values
from ms_recover.comm.host.link import Link

# Allreduces of at most this many bytes in groups of more than two take recursive doubling.
# Measured with `ms-recover bench allreduce --doubling-world 3|4|5` on 127.0.0.1 (2 cores,
# load 4-8), doubling / ring time: 64 KiB 0.54-0.58x, 256 KiB 0.83-0.84x, 512 KiB 1.23-1.43x,
# 1 MiB 1.5-1.9x at 3, 4 and 5 ranks alike: the crossover lies between 256 and 512 KiB.
DOUBLING_MAX_BYTES = 256 << 10


@dataclasses.dataclass(frozen=True)
class Plan:
    """The partners of one position (indexes into the group's order)."""

    fold_from: int | None  # the position this one adds in before doubling (and unfolds to)
    fold_to: int | None  # the position this one hands its buffer to (and gets the result from)
    stages: tuple[int, ...]  # the doubling partner at each stage

    def targets(self) -> set[int]:
        """Every position this one sends to."""
        out = set(self.stages)
        out.update(p for p in (self.fold_from, self.fold_to) if p is not None)
        return out


def plan(n: int, index: int) -> Plan:
    """The schedule of position ``index`` in a group of ``n >= 1`` (see the module docstring)."""
    if not 0 <= index < n:
        raise ValueError(f"position {index} is not in a group of {n}")
    p = 1 << (n.bit_length() - 1)
    if index >= p:
        return Plan(None, index - p, ())
    stages = tuple(index ^ (1 << k) for k in range(p.bit_length() - 1))
    return Plan(index + p if index + p < n else None, None, stages)


def allreduce(link: Link, call: Call, flat: NDArray[Any], mean: bool, chunk: int) -> NDArray[Any]:
    """Recursive-doubling allreduce of ``flat`` (``chunk``: bytes per message).

    Returns a new array, the same bits on every member; returns only once zmq no longer reads
    ``flat`` or the result, so the caller may overwrite either.
    """
    me = plan(call.n, call.index)
    if not flat.flags.aligned:  # numpy may take another loop, and other NaN bits, for it
        flat = flat.copy()
    sender = _Sender(link, call, max(1, chunk // flat.itemsize))
    if me.fold_to is not None:  # beyond the largest power of two: hand over, get the result
        sender.send(me.fold_to, flat, track=True)
        result = _receive(link, call, me.fold_to, flat, None)
        sender.wait()
        return result
    acc = flat
    if me.fold_from is not None:
        acc = _receive(link, call, me.fold_from, flat, True)
    for partner in me.stages:
        # The caller's buffer must outlive zmq's read of it; partial sums are never written
        # again once sent, so only ``flat`` needs tracking.
        sender.send(partner, acc, track=acc is flat)
        acc = _receive(link, call, partner, acc, call.index < partner)
    if acc is flat:  # a group of one position: nothing was added
        acc = flat.copy()
    if mean:
        np.divide(acc, call.n, out=acc)
    if me.fold_from is not None:
        sender.send(me.fold_from, acc, track=True)  # the result goes back to the caller
    sender.wait()
    return acc


class _Sender:
    """Sends whole buffers in chunks and waits for the tracked ones before the call returns."""

    def __init__(self, link: Link, call: Call, step: int) -> None:
        self._link, self._call, self._step = link, call, step
        self._tracked: list[tuple[int, zmq.MessageTracker]] = []

    def send(self, position: int, buf: NDArray[Any], track: bool) -> None:
        dst = self._call.ranks[position]
        for a in range(0, buf.size, self._step):
            tracker = self._link.send(dst, self._call.header(a), buf[a : a + self._step], track)
            if tracker is not None:
                self._tracked.append((dst, tracker))

    def wait(self) -> None:
        for dst, tracker in self._tracked:
            self._link.wait_sent([tracker], dst, str(self._call))


def _receive(
    link: Link, call: Call, position: int, mine: NDArray[Any], mine_first: bool | None
) -> NDArray[Any]:
    """The buffer of the member at ``position``, added to ``mine`` (``mine_first``: ``mine``
    is the left operand) or, with ``mine_first`` None, as received. Always a new array.

    The add runs once over the whole buffer, after every message has arrived: numpy's bits
    for two NaNs depend on where a call's vector loop ends, so adding message by message
    would tie the NaN payloads to the sender's chunk size, which ranks may set differently.
    """
    src = call.ranks[position]
    theirs = np.empty_like(mine)
    got = 0
    while got < mine.size:
        vals = values(call, take(link, call, src, got), mine.dtype, got, mine.size)
        theirs[got : got + vals.size] = vals  # also aligns them, as ``mine`` is
        got += vals.size
    if mine_first is None:
        return theirs
    out = np.empty_like(mine)
    if mine_first:
        np.add(mine, theirs, out=out)
    else:
        np.add(theirs, mine, out=out)
    return out
