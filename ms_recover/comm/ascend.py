"""AscendBackend: the CommBackend for HCCL, through MindSpore's own fault-tolerance bindings.

**Status: never run on Ascend hardware.** This host has no NPU and no CANN. The backend is
covered only by contract tests (``tests/unit/test_ascend_contract.py``) against a fake of the
bindings below, plus a check that the fake's names and signatures match the MindSpore 2.10.0
wheel. Nothing here proves that HCCL behaves as assumed: treat the first hardware run as a test.
Constructing it where MindSpore's Ascend plugin is not loaded raises :class:`CommError`.

The calls follow the order MindSpore's own MindIO adapter uses
(``mindspore/train/callback/_train_fault_tolerance.py`` in the wheel):

* **abort / stop**: ``_stop_device(device_id)`` (``_tft_stop_callback``). Collectives in
  flight then fail with a ``RuntimeError`` mentioning ``ForceStopError``; they surface here as
  :class:`Interrupted`, and so does every later call until ``rebuild``.
* **rebuild** (``_tft_rebuild_groups``): ``_finalize_comm()``, ``_rebuild_group()``,
  ``set_is_arf(True)``, ``_pre_launch_send_recv(device_id)``. ``_rebuild_group`` takes no
  argument: it recreates every group MindSpore's CollectiveManager knows, under the same names.
  A restarted process knows none, so instead it calls ``init("hccl")`` and
  ``create_group(name, ranks)`` for each logged group it belongs to, in log order, then the
  same ``set_is_arf(True)`` and ``_pre_launch_send_recv``. After the first committed step,
  :meth:`AscendBackend.on_step_end` calls ``set_is_arf(False)`` (``_reset_arf_on_step_end``).
* **repair**: ``send_recv(params, src_rank, dst_rank)`` copies Parameters device to device; it
  is called on both ends and returns non-zero on failure (``_tft_repair_callback``). Named numpy
  state (``send`` / ``recv``) goes over the *host path*: another CommBackend given as
  ``host_path`` (the host backend's data plane).
* **collectives**: ``mindspore.mint.distributed.all_reduce / broadcast / barrier`` (in place;
  the ``mindspore.communication.comm_func`` versions are marked Deprecated in 2.10) on groups
  made by ``mindspore.communication.create_group``. The world group is ``hccl_world_group``.

Where each name lives in the MindSpore 2.10.0 wheel (pybind signatures are the first line of the
object's ``__doc__``; ``AscendBindings.PYBIND_SIGNATURES`` pins them and a test compares):

* ``mindspore/_c_expression.cpython-311-x86_64-linux-gnu.so`` (pybind; imported by
  ``mindspore/train/callback/_train_fault_tolerance.py``):

  - ``_stop_device(arg0: int) -> None``
  - ``_finalize_comm() -> None``
  - ``_rebuild_group() -> None``
  - ``set_is_arf(arg0: bool) -> None``
  - ``_pre_launch_send_recv(arg0: int) -> None``
  - ``send_recv(params: list[object], src_rank: int, dst_rank: int) -> int``
  - ``MSContext.get_instance().is_ascend_plugin_loaded() -> bool`` (availability check, as
    ``mindspore/communication/_comm_helper.py`` does for HCCL)

* ``mindspore/communication/management.py``: ``init(backend_name=None)``,
  ``create_group(group, rank_ids, options=None)``, ``release()``.
* ``mindspore/mint/distributed/distributed.py``: ``all_reduce(tensor, op='sum', group=None,
  async_op=False)``, ``broadcast(tensor, src, group=None, async_op=False)``,
  ``barrier(group=None, async_op=False, device_ids=None)``.

The process must run with ``MS_ENABLE_TFT`` containing ``ARF:1`` (the MindCluster operator
injects it): the C++ side reads it (``libmindspore_frontend.so``, the Ascend plugin), and this
is checked at construction. Ascend determinism needs ``mindspore.set_deterministic(True)``
(it sets ``HCCL_DETERMINISTIC=true``) before ``init``; see ``ms_recover.mindspore.step``.
"""

from __future__ import annotations

import importlib
import os
import threading
from collections.abc import Callable
from typing import Any, TypeVar

import numpy as np
from numpy.typing import NDArray

from ms_recover.comm.base import CommBackend, ReduceOp, check_out
from ms_recover.comm.grouplog import WORLD, GroupLog
from ms_recover.errors import CommError, Interrupted, RepairError

__all__ = ["HCCL_WORLD", "AscendBackend", "AscendBindings"]

HCCL_WORLD = "hccl_world_group"
_C = "mindspore._c_expression"
_MGMT = "mindspore.communication"
_DIST = "mindspore.mint.distributed"
_T = TypeVar("_T")


class AscendBindings:
    """The MindSpore functions AscendBackend calls, resolved lazily from the installed wheel.

    Each binding method has the name and signature of the MindSpore object it forwards to
    (``PYBIND_SIGNATURES`` pins the pybind ones), so a test fake with the same methods is
    checked against the real wheel. MindSpore is imported on first use, never at module import.
    """

    #: First line of ``__doc__`` of each pybind binding in MindSpore 2.10.0.
    PYBIND_SIGNATURES = {
        "_stop_device": "_stop_device(arg0: int) -> None",
        "_finalize_comm": "_finalize_comm() -> None",
        "_rebuild_group": "_rebuild_group() -> None",
        "set_is_arf": "set_is_arf(arg0: bool) -> None",
        "_pre_launch_send_recv": "_pre_launch_send_recv(arg0: int) -> None",
        "send_recv": "send_recv(params: list[object], src_rank: int, dst_rank: int) -> int",
    }
    #: Python-level functions: name -> module.
    PYTHON_FUNCTIONS = {
        "init": _MGMT,
        "create_group": _MGMT,
        "release": _MGMT,
        "all_reduce": _DIST,
        "broadcast": _DIST,
        "barrier": _DIST,
    }

    def _fn(self, name: str) -> Callable[..., Any]:
        module = self.PYTHON_FUNCTIONS.get(name, _C)
        try:
            return getattr(importlib.import_module(module), name)  # type: ignore[no-any-return]
        except (ImportError, AttributeError) as exc:
            raise CommError(f"MindSpore binding {module}.{name} is not available: {exc}") from exc

    def check_available(self) -> None:
        """Raise CommError unless every binding resolves and Ascend/HCCL can actually run."""
        for name in [*self.PYBIND_SIGNATURES, *self.PYTHON_FUNCTIONS]:
            self._fn(name)
        context = importlib.import_module(_C).MSContext.get_instance()
        if not context.is_ascend_plugin_loaded():
            raise CommError(
                "the Ascend backend needs MindSpore's Ascend plugin (an NPU with CANN); "
                "MSContext.is_ascend_plugin_loaded() is False on this host. "
                "Use the host backend on CPU."
            )
        tft = os.environ.get("MS_ENABLE_TFT", "")
        if "ARF:1" not in tft:
            raise CommError(
                f"the Ascend backend needs MS_ENABLE_TFT to contain 'ARF:1' (got {tft!r}); "
                "MindSpore only enables process-level rebuild with it"
            )

    # --- fault tolerance: mindspore._c_expression -------------------------------------------
    def _stop_device(self, device_id: int, /) -> None:
        self._fn("_stop_device")(device_id)

    def _finalize_comm(self) -> None:
        self._fn("_finalize_comm")()

    def _rebuild_group(self) -> None:
        self._fn("_rebuild_group")()

    def set_is_arf(self, flag: bool, /) -> None:
        self._fn("set_is_arf")(flag)

    def _pre_launch_send_recv(self, device_id: int, /) -> None:
        self._fn("_pre_launch_send_recv")(device_id)

    def send_recv(self, params: list[Any], src_rank: int, dst_rank: int) -> int:
        return int(self._fn("send_recv")(params, src_rank, dst_rank))

    # --- communication: mindspore.communication, mindspore.mint.distributed ------------------
    def init(self, backend_name: str | None = None) -> None:
        self._fn("init")(backend_name)

    def create_group(self, group: str, rank_ids: list[int], options: Any = None) -> None:
        self._fn("create_group")(group, rank_ids, options)

    def release(self) -> None:
        self._fn("release")()

    def all_reduce(
        self, tensor: Any, op: str = "sum", group: str | None = None, async_op: bool = False
    ) -> Any:
        return self._fn("all_reduce")(tensor, op, group, async_op)

    def broadcast(
        self, tensor: Any, src: int, group: str | None = None, async_op: bool = False
    ) -> Any:
        return self._fn("broadcast")(tensor, src, group, async_op)

    def barrier(
        self, group: str | None = None, async_op: bool = False, device_ids: Any = None
    ) -> Any:
        return self._fn("barrier")(group, async_op, device_ids)

    # --- helpers (not MindSpore bindings) ------------------------------------------------------
    def get_device_id(self) -> int:
        """This process's device, as MindSpore's own adapter reads it (``device_id`` context)."""
        return int(importlib.import_module("mindspore").get_context("device_id"))

    def to_tensor(self, array: NDArray[Any]) -> Any:
        """A MindSpore Tensor holding a copy of ``array``."""
        return importlib.import_module("mindspore").Tensor(np.asarray(array, order="C"))

    def to_numpy(self, tensor: Any) -> NDArray[Any]:
        """A numpy copy of ``tensor``."""
        return np.array(tensor.asnumpy(), copy=True)


class AscendBackend(CommBackend):
    """CommBackend over HCCL for one rank; see the module doc.

    ``device_id`` defaults to MindSpore's ``device_id`` context, read when first needed (as
    MindSpore's TrainFaultTolerance does), since msrun / the operator set it per local rank.

    Thread safety: :meth:`abort` may be called from any thread; the other methods are called
    from the training thread.
    """

    def __init__(
        self,
        rank: int,
        world_size: int,
        device_id: int | None = None,
        bindings: AscendBindings | None = None,
        host_path: CommBackend | None = None,
    ) -> None:
        super().__init__(rank, world_size)
        self._device_id = device_id
        self.bindings = bindings if bindings is not None else AscendBindings()
        self.bindings.check_available()
        self.host_path = host_path
        self._lock = threading.Lock()
        self._aborted = False
        self._initialized = False
        self._closed = False
        self._arf_set = False
        self._created: set[str] = set()

    @property
    def device_id(self) -> int:
        if self._device_id is None:
            self._device_id = self.bindings.get_device_id()
        return self._device_id

    @property
    def endpoint(self) -> str:
        # HCCL endpoints are negotiated through MindSpore's scheduler; only the host path has
        # one to publish.
        return self.host_path.endpoint if self.host_path is not None else f"hccl:{self.rank}"

    # --- lifecycle -----------------------------------------------------------------------------
    def init(self, epoch: int, members: dict[int, str]) -> None:
        self._guard("init", lambda: self.bindings.init("hccl"), check_abort=False)
        self._initialized = True
        self.epoch = epoch
        if self.host_path is not None:
            self.host_path.init(epoch, members)

    def abort(self) -> None:
        """Stop the device once per epoch (``_stop_device``); every call raises Interrupted."""
        with self._lock:
            if self._aborted:
                return
            self._aborted = True
        if self.host_path is not None:
            self.host_path.abort()
        if self._initialized:
            try:
                self.bindings._stop_device(self.device_id)
            except Exception as exc:
                raise CommError(f"_stop_device({self.device_id}) failed: {exc}") from exc

    def rebuild(self, epoch: int, members: dict[int, str], group_log: GroupLog) -> None:
        """Recreate every communicator at ``epoch`` in MindIO's order (see the module doc)."""
        if self._initialized and epoch <= self.epoch:
            raise CommError(f"rebuild to epoch {epoch} is not newer than epoch {self.epoch}")
        log = GroupLog(list(group_log))
        b = self.bindings
        if self._initialized:
            self._guard("_finalize_comm", b._finalize_comm, check_abort=False)
            self._guard("_rebuild_group", b._rebuild_group, check_abort=False)
        else:
            self._guard("init", lambda: b.init("hccl"), check_abort=False)
            self._initialized = True
        for name, ranks in log:
            if name not in self._created:
                self._create(name, ranks, check_abort=False)
        self._guard("set_is_arf", lambda: b.set_is_arf(True), check_abort=False)
        self._guard(
            "_pre_launch_send_recv",
            lambda: b._pre_launch_send_recv(self.device_id),
            check_abort=False,
        )
        with self._lock:
            self.epoch, self.group_log = epoch, log
            self._aborted, self._arf_set = False, True
        if self.host_path is not None:
            self.host_path.rebuild(epoch, members, group_log)

    def on_step_end(self) -> None:
        """Call after each committed step: clears MindSpore's ARF flag after a rebuild."""
        if self._arf_set:
            self._guard("set_is_arf", lambda: self.bindings.set_is_arf(False), check_abort=False)
            self._arf_set = False

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self.host_path is not None:
            self.host_path.close()
        if self._initialized:
            self._guard("release", self.bindings.release, check_abort=False)

    # --- groups and collectives ------------------------------------------------------------------
    def _make_group(self, name: str, ranks: tuple[int, ...]) -> None:
        self._create(name, ranks, check_abort=True)

    def _create(self, name: str, ranks: tuple[int, ...], check_abort: bool) -> None:
        # HCCL creates a communicator only on its members; the log still records every group.
        if self.rank in ranks:
            create = self.bindings.create_group
            self._guard(f"create_group {name!r}", lambda: create(name, list(ranks)), check_abort)
            self._created.add(name)

    def allreduce(
        self,
        array: NDArray[Any],
        op: ReduceOp | str = ReduceOp.SUM,
        group: str = WORLD,
        out: NDArray[Any] | None = None,
    ) -> NDArray[Any]:
        if out is not None:
            check_out(np.asarray(array), out)
        op, name = ReduceOp(op), self._hccl_group(group)
        self._check_live(f"all_reduce on {group!r}")
        tensor = self.bindings.to_tensor(array)
        # HCCL has no mean: sum, then divide on the host (same bits on every rank).
        self._guard(
            f"all_reduce on {group!r}", lambda: self.bindings.all_reduce(tensor, "sum", name)
        )
        result = self.bindings.to_numpy(tensor)
        if op is ReduceOp.MEAN:
            result = (result / self._group_size(group)).astype(result.dtype, copy=False)
        if out is None:
            return result
        np.copyto(out, result.reshape(out.shape))  # the device result comes back to the host
        return out

    def broadcast(self, array: NDArray[Any], root: int, group: str = WORLD) -> NDArray[Any]:
        name = self._hccl_group(group)
        self._check_live(f"broadcast on {group!r}")
        tensor = self.bindings.to_tensor(array)
        self._guard(f"broadcast on {group!r}", lambda: self.bindings.broadcast(tensor, root, name))
        return self.bindings.to_numpy(tensor)

    def barrier(self, group: str = WORLD) -> None:
        name = self._hccl_group(group)
        self._guard(f"barrier on {group!r}", lambda: self.bindings.barrier(name))

    def repair_params(self, params: list[Any], src: int, dst: int) -> None:
        """Copy MindSpore Parameters from rank ``src`` to ``dst`` on device (both ranks call).

        Raises RepairError if MindSpore reports failure, Interrupted if aborted.
        """
        rc = self._guard(
            f"send_recv {src}->{dst}", lambda: self.bindings.send_recv(list(params), src, dst)
        )
        if rc != 0:
            raise RepairError(
                f"send_recv of {len(params)} parameters from rank {src} to rank "
                f"{dst} returned {rc} (expected 0)"
            )

    def add_peers(self, endpoints: dict[int, str]) -> None:
        """HCCL reaches peers by rank id; named arrays go over the host path, which does not."""
        if self.host_path is not None:
            self.host_path.add_peers(endpoints)

    def send(self, arrays: dict[str, NDArray[Any]], dst: int, tag: str = "") -> None:
        self._check_live("send")
        self._require_host_path("send").send(arrays, dst, tag)

    def recv(self, src: int, tag: str = "") -> dict[str, NDArray[Any]]:
        self._check_live("recv")
        return self._require_host_path("recv").recv(src, tag)

    # --- internals -------------------------------------------------------------------------------
    def _hccl_group(self, group: str) -> str:
        if group == WORLD:
            return HCCL_WORLD
        self.group_log.ranks_of(group)  # raises CommError naming the known groups
        return group

    def _group_size(self, group: str) -> int:
        return self.world_size if group == WORLD else len(self.group_log.ranks_of(group))

    def _require_host_path(self, what: str) -> CommBackend:
        if self.host_path is None:
            raise CommError(
                f"{what} of named numpy arrays needs a host_path backend on Ascend; "
                "use repair_params() for device-side Parameter repair"
            )
        return self.host_path

    def _check_live(self, what: str) -> None:
        if self._aborted:
            raise Interrupted(
                f"{what}: communicators were aborted at epoch {self.epoch}; waiting for rebuild"
            )
        if self._closed:
            raise CommError(f"{what}: the Ascend backend is closed")

    def _guard(self, what: str, fn: Callable[[], _T], check_abort: bool = True) -> _T:
        """Run one MindSpore call: an abort becomes Interrupted, any other failure CommError."""
        if check_abort:
            self._check_live(what)
        try:
            return fn()
        except Exception as exc:
            if check_abort and (self._aborted or "ForceStopError" in str(exc)):
                raise Interrupted(f"{what} was interrupted by abort at epoch {self.epoch}") from exc
            raise CommError(f"{what} failed at epoch {self.epoch}: {exc}") from exc
