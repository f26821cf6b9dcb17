"""What a lane allreduce puts on the wire, how a member checks the peer's, and the fixed-order add.

A lane message is frames ``[FRAME header, group, meta, payload]``; the header carries the
group's op sequence number and the payload's offset and size. Epoch and sender are the
connection's (see :mod:`~ms_recover.comm.host.lane.lanes`). Both members of a call build the same
header for the same frame, so a member checks the peer's by comparing it with its own; a
header of another call (a different group, sequence or signature) fails the call with
CommError naming both calls. Used by :mod:`~ms_recover.comm.host.lane.exchange` and
:mod:`~ms_recover.comm.host.lane.small`.
"""

from __future__ import annotations

import struct
from typing import Any

import numpy as np
from numpy.typing import NDArray

from ms_recover.errors import CommError

FRAME = struct.Struct("<4sHHQQQ")  # magic, group length, meta length, seq, offset, nbytes
FRAME_MAGIC = b"msrD"
Label = tuple[str, int, str]  # a call's (group, seq, signature)


def header(label: Label, offset: int, nbytes: int) -> bytes:
    """The header of the frame of ``label``'s call that carries ``nbytes`` from ``offset``."""
    group, seq, meta = label
    g, m = group.encode(), meta.encode()
    return FRAME.pack(FRAME_MAGIC, len(g), len(m), seq, offset, nbytes) + g + m


def describe(label: Label, peer: int) -> str:
    """A call as its waits and errors name it."""
    return f"allreduce #{label[1]} on group {label[0]!r} with rank {peer}"


def frame_error(
    head: bytes | bytearray, label: Label, peer: int, rank: int, want: tuple[int, int, int]
) -> CommError | None:
    """Why ``head``, a header from ``peer`` (complete, or at least its fixed part), is not the
    next frame of ``label``'s call on ``rank``; None if it is. ``want``: the frame's expected
    payload offset and size, and the message's total payload bytes."""
    magic, glen, mlen, seq, offset, nbytes = FRAME.unpack_from(head)
    if magic != FRAME_MAGIC:
        return CommError(f"rank {peer} sent a malformed lane frame ({magic!r})")
    g, m = label[0].encode(), label[2].encode()
    size = FRAME.size + glen + mlen
    group = bytes(head[FRAME.size : FRAME.size + glen]).decode(errors="replace")
    meta = bytes(head[FRAME.size + glen : size]).decode(errors="replace")
    if (group, seq, meta) != label or (glen, mlen) != (len(g), len(m)):
        where = "" if (group, seq) == label[:2] else f" as op #{seq} of {group!r}"
        return CommError(
            f"group {label[0]!r} op #{label[1]}: rank {peer} called "
            f"allreduce({meta}){where} but rank {rank} called allreduce({label[2]})"
        )
    if (offset, nbytes) != want[:2]:
        return CommError(
            f"allreduce #{label[1]}: rank {peer} sent {nbytes} bytes at offset "
            f"{offset}; expected offset {want[0]} of {want[2]}"
        )
    return None


def add_in_order(
    mine: NDArray[Any], theirs: NDArray[Any], out: NDArray[Any], low_first: bool, mean: bool
) -> None:
    """``out = mine + theirs`` (halved for a mean), the lower rank's values first: both
    members get the same bits, NaN payloads included. ``low_first``: the peer is the lower."""
    if low_first:
        np.add(theirs, mine, out=out)
    else:
        np.add(mine, theirs, out=out)
    if mean:
        halve(out)


def halve(values: NDArray[Any]) -> None:
    """``values /= 2`` in place, bit for bit. A real float times 0.5 is the same correctly
    rounded value as divided by 2 (NaN payloads, infinities and subnormals included) and costs
    about half as much; complex division is not a plain scaling in numpy, so it divides."""
    if values.dtype.kind == "f":
        np.multiply(values, 0.5, out=values)
    else:
        np.divide(values, 2, out=values)


def output(flat: NDArray[Any], into: NDArray[Any] | None) -> tuple[NDArray[Any], bool]:
    """Where a call's result goes (``into``, or a new array if None) and whether that is
    ``flat``'s own memory (in place: then it must start where ``flat`` does)."""
    out = np.empty_like(flat) if into is None else into
    inplace = into is flat or (
        into is not None and np.may_share_memory(into, flat)  # cheap: bounds only
    )
    if inplace and into is not flat and out.ctypes.data != flat.ctypes.data:
        raise AssertionError("a lane exchange into memory that overlaps its input elsewhere")
    return out, inplace
