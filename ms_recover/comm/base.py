"""CommBackend: the collective-communication interface every backend implements.

Contract shared by all backends:

* Every call names a group; ``"world"`` always exists after :meth:`init` / :meth:`rebuild`.
* :meth:`abort` may be called from any thread. Every call blocked in it, on this rank, raises
  :class:`~ms_recover.errors.Interrupted` promptly; further calls raise it too until
  :meth:`rebuild`.
* :meth:`rebuild` tears down every communicator and creates the world group and then every group
  of the log, in order, under the new epoch. Traffic from older epochs is dropped.
* Results of reductions are deterministic: the same inputs on the same world give the same bits.
"""

from __future__ import annotations

import abc
import enum
from collections.abc import Callable
from typing import Any

import numpy as np
from numpy.typing import NDArray

from ms_recover.comm.grouplog import WORLD, GroupLog
from ms_recover.errors import CommError
from ms_recover.faulthooks import NO_FAULTS, FaultHooks


class ReduceOp(str, enum.Enum):
    SUM = "sum"
    MEAN = "mean"


def check_out(array: NDArray[Any], out: object) -> NDArray[Any]:
    """``out`` if it can receive the allreduce of ``array``, else CommError naming what is
    expected (an ndarray of the same shape and dtype, C-contiguous and writeable)."""
    if (
        isinstance(out, np.ndarray)
        and out.dtype == array.dtype
        and out.shape == array.shape
        and out.flags.c_contiguous
        and out.flags.writeable
    ):
        return out  # checked on every call: the messages below are made only for a refusal
    want = f"a writeable C-contiguous {array.dtype} ndarray of shape {array.shape}"
    if not isinstance(out, np.ndarray):
        raise CommError(f"allreduce out= must be {want}, got {type(out).__name__}")
    got = f"{out.dtype} array of shape {out.shape}"
    if out.dtype != array.dtype or out.shape != array.shape:
        raise CommError(f"allreduce out= must be {want}, got a {got}")
    flaw = "not C-contiguous" if not out.flags.c_contiguous else "read-only"
    raise CommError(f"allreduce out= must be {want}, got a {flaw} {got}")


def same_buffer(a: NDArray[Any], b: NDArray[Any]) -> bool:
    """Whether ``a`` and ``b`` are the very same memory (start, shape, dtype and strides)."""
    if a is b:  # the common case (out= the input): no attribute read at all
        return True
    return bool(
        a.ctypes.data == b.ctypes.data
        and a.shape == b.shape
        and a.dtype == b.dtype
        and a.strides == b.strides
    )


class CommBackend(abc.ABC):
    """Abstract communicator for one rank."""

    def __init__(self, rank: int, world_size: int) -> None:
        self.rank = rank
        self.world_size = world_size
        self.epoch = 0
        self.group_log = GroupLog()
        # Called after a user-created group exists, so the worker can mirror it to the manager.
        self.on_group_created: Callable[[str, tuple[int, ...]], None] | None = None
        # Fault-injection points (the worker sets its own); the default does nothing.
        self.faults: FaultHooks = NO_FAULTS

    @property
    @abc.abstractmethod
    def endpoint(self) -> str:
        """Where peers reach this rank's data plane (exchanged through the manager)."""

    @abc.abstractmethod
    def init(self, epoch: int, members: dict[int, str]) -> None:
        """Create the world group over ``members`` (rank -> endpoint) at ``epoch``.

        An empty endpoint marks a member this rank does not send to
        (:mod:`~ms_recover.comm.peers`)."""

    @abc.abstractmethod
    def _make_group(self, name: str, ranks: tuple[int, ...]) -> None:
        """Backend-specific creation of one group (called by create_group and rebuild)."""

    def create_group(self, name: str, ranks: list[int] | tuple[int, ...]) -> None:
        """Create a sub-group, record it in the group log and notify ``on_group_created``."""
        key = tuple(int(r) for r in ranks)
        # Validate on a copy, build, and only then log: a group the backend refused to build
        # must not stay in the log (a retry would be taken for a no-op).
        if GroupLog(list(self.group_log)).add(name, key):
            self._make_group(name, key)
            self.group_log.add(name, key)
            if self.on_group_created is not None:
                self.on_group_created(name, key)

    @abc.abstractmethod
    def allreduce(
        self,
        array: NDArray[Any],
        op: ReduceOp | str = ReduceOp.SUM,
        group: str = WORLD,
        out: NDArray[Any] | None = None,
    ) -> NDArray[Any]:
        """Reduce ``array`` over the group; every member gets the same result.

        ``out`` (optional): a writeable C-contiguous array of ``array``'s shape and dtype,
        ``array`` itself included, that receives the result and is returned (checked by
        :func:`check_out` before anything is sent). A call that raises may have written part
        of ``out``: its contents are then undefined (GraphStep discards them: a failed
        reduction applies nothing). Without ``out``, a new array is returned and ``array`` is
        untouched; with ``out`` not ``array``, ``array`` is untouched."""

    @abc.abstractmethod
    def broadcast(self, array: NDArray[Any], root: int, group: str = WORLD) -> NDArray[Any]:
        """Return root's ``array`` on every member (``array`` gives shape/dtype elsewhere)."""

    @abc.abstractmethod
    def barrier(self, group: str = WORLD) -> None:
        """Return once every member of the group has entered the barrier."""

    @abc.abstractmethod
    def send(self, arrays: dict[str, NDArray[Any]], dst: int, tag: str = "") -> None:
        """Send named arrays to ``dst`` (point to point, world group)."""

    @abc.abstractmethod
    def recv(self, src: int, tag: str = "") -> dict[str, NDArray[Any]]:
        """Receive the named arrays ``src`` sent with the same tag."""

    @abc.abstractmethod
    def abort(self) -> None:
        """Interrupt every blocked and future call until rebuild (thread-safe)."""

    @abc.abstractmethod
    def rebuild(self, epoch: int, members: dict[int, str], group_log: GroupLog) -> None:
        """Recreate the world group and every logged group at ``epoch``."""

    def add_peers(self, endpoints: dict[int, str]) -> None:  # noqa: B027 - a hook
        """Learn more members' data endpoints (rank -> endpoint) within this epoch: a repair
        pair, or the peers of a group created since the build. Backends that reach peers by
        rank id (Ascend, local) need none: the default does nothing."""

    def on_step_end(self) -> None:  # noqa: B027 - a hook: doing nothing is the default
        """Called after every committed step (the Ascend backend clears MindSpore's ARF flag)."""

    @abc.abstractmethod
    def close(self) -> None:
        """Release every socket / communicator. Idempotent."""
