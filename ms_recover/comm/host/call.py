"""One collective call of the host data plane: its label, its checked frames, its arguments.

:class:`Call` says where the calling rank sits in the group and labels every frame it sends;
:func:`take` receives the next frame of a call from one peer and checks that the peer made the
same call (kind and signature), so a mismatch fails loudly instead of mixing up buffers.
The remaining helpers check and normalize an allreduce's arguments. The algorithms that use
them live in :mod:`.ring` and :mod:`.doubling`;
:class:`~ms_recover.comm.host.backend.HostBackend` numbers the calls.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import zmq
from numpy.typing import NDArray

from ms_recover.comm.base import ReduceOp
from ms_recover.comm.host.link import Link
from ms_recover.comm.host.wire import Header
from ms_recover.errors import CommError


@dataclasses.dataclass(slots=True)
class Call:
    """One collective call on one rank: where it sits in the group and how to label frames.

    Not frozen, but never changed once made: a frozen dataclass costs about 2 us more to build,
    on every collective (GraphStep makes one per bucket per step)."""

    epoch: int
    rank: int
    group: str
    ranks: tuple[int, ...]
    seq: int
    kind: str
    meta: str

    @property
    def n(self) -> int:
        return len(self.ranks)

    @property
    def index(self) -> int:
        return self.ranks.index(self.rank)

    def peer(self, shift: int) -> int:
        return self.ranks[(self.index + shift) % self.n]

    def header(self, offset: int) -> Header:
        return Header(self.epoch, self.rank, self.group, self.seq, self.kind, offset, self.meta)

    def __str__(self) -> str:
        return f"{self.kind} #{self.seq} on group {self.group!r}"


def take(link: Link, call: Call, src: int, offset: int) -> zmq.Frame:
    """The next frame of ``call`` from ``src``; checks both ranks made the same call."""
    key = (call.epoch, src, call.group, call.seq)
    header, frame = link.take(key, f"{call} from rank {src}")
    if header.kind != call.kind or header.meta != call.meta:
        raise CommError(
            f"group {call.group!r} op #{call.seq}: rank {src} called "
            f"{header.kind}({header.meta}) but rank {call.rank} called "
            f"{call.kind}({call.meta})"
        )
    if header.offset != offset:
        raise CommError(f"{call}: rank {src} sent offset {header.offset}, expected {offset}")
    return frame


def values(
    call: Call, frame: zmq.Frame, dtype: np.dtype[Any], start: int, end: int
) -> NDArray[Any]:
    """The elements of ``frame``, which must fit between ``start`` and ``end``."""
    try:
        out = np.frombuffer(frame.buffer, dtype=dtype)
    except ValueError as exc:
        raise CommError(f"{call}: payload of {len(frame.buffer)} bytes is not {dtype}") from exc
    if out.size == 0 or start + out.size > end:
        raise CommError(f"{call}: {out.size} elements at {start} overrun segment end {end}")
    return out


def contiguous(array: NDArray[Any]) -> NDArray[Any]:
    array = np.asarray(array)
    return array if array.flags.c_contiguous else np.ascontiguousarray(array)


def signature(array: NDArray[Any]) -> str:
    """What every member's frames carry: peers whose dtype or size differ fail loudly."""
    return f"{array.dtype.str}:{array.size}"


# ReduceOp members are str: one dict answers both "mean" and ReduceOp.MEAN, without the
# enum's lookup machinery (a few microseconds on every allreduce).
_REDUCE_OPS: dict[str, ReduceOp] = {o.value: o for o in ReduceOp}


# The dtype kinds each op reduces (keyed as _REDUCE_OPS), for check_reducible and the
# backends' fast paths.
REDUCIBLE_KINDS: dict[str, str] = {
    o.value: "fc" if o is ReduceOp.MEAN else "fciu" for o in ReduceOp
}


def reduce_op(op: ReduceOp | str) -> ReduceOp:
    try:
        return _REDUCE_OPS[op]
    except (KeyError, TypeError):
        valid = ", ".join(o.value for o in ReduceOp)
        raise CommError(f"reduce op {op!r} is not one of: {valid}") from None


def check_reducible(dtype: np.dtype[Any], op: ReduceOp) -> None:
    if dtype.kind not in REDUCIBLE_KINDS[op]:
        valid = "float or complex" if op is ReduceOp.MEAN else "float, complex or integer"
        raise CommError(
            f"allreduce {op.value} of dtype {dtype} is not supported; dtype must be {valid}"
        )
