"""The memory a two-rank lane allreduce writes into, kept across calls.

A raw socket exchange sends from and receives into buffers it keeps. Fresh memory is not free:
glibc hands a block of 32 MiB or more straight from the kernel and gives it back on free, so a
new 64 MiB array is new pages every time, each faulted in and zeroed (about as much CPU as the
allreduce's add). Two buffers are therefore kept per backend, training thread only:

* :class:`RecvBuffer`: where the peer's values land in an in-place call (``out`` the input)
  and in any call larger than ``laneexchange.RING_BYTES``: a ring of up to that, kept and
  reused;
* :class:`Results`: the result array of the last call without ``out`` from
  :data:`POOL_MIN_BYTES`, handed out again once nothing but the pool refers to it: the caller
  dropped the array and every view of it (a view, a memoryview, an array made from its buffer
  all hold a reference to it). An array the caller still holds is never written again; the
  next call then gets a new one (and the pool keeps that). So the pool is what malloc already
  is for smaller blocks: a block is reused only after it was freed.
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np
from numpy.typing import NDArray

POOL_MIN_BYTES = 4 << 20  # smaller results come from malloc's own free lists, warm anyway


class RecvBuffer:
    """A receive buffer kept across calls: grown to the largest size asked and then reused,
    so a call that receives into it allocates nothing and touches no fresh page."""

    def __init__(self) -> None:
        self._buf: NDArray[np.uint8] = np.empty(0, np.uint8)

    def like(self, flat: NDArray[Any], most: int) -> NDArray[Any]:
        """A 1-D array of ``flat``'s dtype over this buffer, of ``flat``'s size or ``most``
        elements if fewer (garbage contents)."""
        nbytes = min(flat.size, most) * flat.itemsize
        if self._buf.nbytes < nbytes:
            self._buf = np.empty(0, np.uint8)  # free the old one before the new one is made
            self._buf = np.empty(nbytes, np.uint8)
        return self._buf[:nbytes].view(flat.dtype)

    def release(self) -> None:
        self._buf = np.empty(0, np.uint8)


class Results:
    """New result arrays for calls without ``out``, the last large one recycled once free."""

    def __init__(self) -> None:
        self._owner: NDArray[np.uint8] | None = None

    def new_like(self, flat: NDArray[Any]) -> NDArray[Any]:
        """An array of ``flat``'s dtype and size (garbage contents) that nothing else refers
        to: the kept block if it is free and of this size, else a new one (then kept)."""
        if flat.nbytes < POOL_MIN_BYTES:
            return np.empty_like(flat)
        if self._owner is None or self._owner.nbytes != flat.nbytes or not self._free():
            self._owner = None  # let go of it first: if it was free, its pages go back now
            self._owner = np.empty(flat.nbytes, np.uint8)
        return self._owner.view(flat.dtype)

    def _free(self) -> bool:
        # Two references: the attribute and getrefcount's own argument. Every array or
        # memoryview over the block holds one more (numpy views refer to the owner itself).
        return sys.getrefcount(self._owner) == 2

    def release(self) -> None:
        self._owner = None


def lane_target(flat: NDArray[Any], out: NDArray[Any] | None, array: object) -> NDArray[Any] | None:
    """Where the lane writes the result: ``out`` (flattened) when it is the input (in place)
    or does not overlap it; None (a new array, copied into ``out`` afterwards) when it
    overlaps the input elsewhere (adding into it would change what is still to be sent)."""
    if out is None:
        return None
    if out is array:  # the common in-place call (GraphStep's): flat is out's own memory
        return flat
    target = out.reshape(-1)  # a view: out is C-contiguous, of flat's dtype and size
    if not np.may_share_memory(target, flat):  # cheap: compares bounds only
        return target
    if target.ctypes.data == flat.ctypes.data:  # same start, dtype, size, both contiguous
        return target
    return None
