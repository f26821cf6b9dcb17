"""LocalBackend: the backend of a one-rank job (no peers, no sockets).

Used when a script runs without a manager, as a plain single job: every collective is the
identity, which is exactly what a world of one computes.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numpy.typing import NDArray

from ms_recover.comm.base import CommBackend, ReduceOp, check_out, same_buffer
from ms_recover.comm.grouplog import WORLD, GroupLog
from ms_recover.errors import CommError, Interrupted


class LocalBackend(CommBackend):
    def __init__(self) -> None:
        super().__init__(rank=0, world_size=1)
        self._aborted = False

    @property
    def endpoint(self) -> str:
        return "local"

    def init(self, epoch: int, members: dict[int, str]) -> None:
        self.epoch = epoch

    def _make_group(self, name: str, ranks: tuple[int, ...]) -> None:
        if ranks != (0,):
            raise CommError(
                f"group {name!r} with ranks {list(ranks)} needs ranks outside a "
                "one-rank job (valid: [0])"
            )

    def _check(self, group: str) -> None:
        if self._aborted:
            raise Interrupted("communicator aborted")
        if group != WORLD:
            self.group_log.ranks_of(group)

    def allreduce(
        self,
        array: NDArray[Any],
        op: ReduceOp | str = ReduceOp.SUM,
        group: str = WORLD,
        out: NDArray[Any] | None = None,
    ) -> NDArray[Any]:
        """The identity: a copy, or ``out`` holding ``array`` (nothing copied when it is)."""
        self._check(group)
        ReduceOp(op)
        if out is None:
            return np.array(array, copy=True)
        src = np.asarray(array)
        check_out(src, out)
        if not same_buffer(out, src):
            np.copyto(out, src)
        return out

    def broadcast(self, array: NDArray[Any], root: int, group: str = WORLD) -> NDArray[Any]:
        self._check(group)
        return np.array(array, copy=True)

    def barrier(self, group: str = WORLD) -> None:
        self._check(group)

    def send(self, arrays: dict[str, NDArray[Any]], dst: int, tag: str = "") -> None:
        raise CommError(f"a one-rank job has no peer {dst} to send to")

    def recv(self, src: int, tag: str = "") -> dict[str, NDArray[Any]]:
        raise CommError(f"a one-rank job has no peer {src} to receive from")

    def abort(self) -> None:
        self._aborted = True

    def rebuild(self, epoch: int, members: dict[int, str], group_log: GroupLog) -> None:
        self.epoch, self._aborted = epoch, False
        self.group_log = group_log

    def close(self) -> None:
        self._aborted = True
