"""CPU test kit for MindSpore's own fault tolerance on ms_recover's mindio_ttp.

MindSpore gates its TFT path to Ascend. This kit lifts exactly the gates listed in
:data:`LIFTS`, nothing more, so the rest of the path runs MindSpore's own code on CPU with real
mccl collectives: ``TftHandle.init``, ``TrainFaultTolerance``'s handler registration and
step reports, the TFT loop around ``Model.train``, and the handlers ``_tft_stop_callback``,
``_tft_clean_callback``, ``_tft_rebuild_groups`` (real ``_finalize_comm`` / ``_rebuild_group``),
``_tft_repair_callback``, ``_save_checkpoint_on_failure``, ``_rename_save_result`` and
``_tft_exit_cb``. :func:`foreign_handlers` proves that.

Each lift, and why:

* ``device target`` -- ``TftHandle.init`` returns early unless ``device_target`` is
  "Ascend"; :func:`ascend_answer` answers "Ascend" to that one question, only during the call.
* ``TrainFaultTolerance._check_init`` -- refuses a non-Ascend device after initialising the
  handle; :class:`CpuTrainFaultTolerance` initialises it the same way, without that refusal.
* ``optimizer wrapper`` -- MindSpore's ``TFTOptSubCls`` sums an int32 flag with AllReduce (no
  CPU kernel) and reports it with ``TensorReport`` (an Ascend event op);
  :func:`cpu_optimizer_wrapper` keeps the contract: ``tft_g_one_flag`` is 1 outside an update
  and the world size right after one (a float32 AllReduce, cast back).
* ``_stop_device`` -- stops the Ascend streams. A survivor blocked inside an mccl collective
  cannot be freed on CPU, so the stand-in raises ``ForceStopError`` in the training thread at
  its next safe point (:class:`SafePoint`, after the step's collectives), as the device stop
  makes the step fail with ``ForceStopError`` on Ascend.
* ``clean_tdt_channel`` -- clears the device data channel; CPU has none (data is fed from the
  host), and the call fails there. The stand-in does nothing.
* ``reset_params`` -- zeroes parameters on the device (accumulated gradients); unsupported on
  CPU. The stand-in zeroes them with ``set_data``.
* ``send_recv`` -- sends Parameters device to device over HCCL; unsupported on CPU. The
  stand-in copies them over ms_recover's host data plane (checksummed, bit-exact).
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator
from typing import Any

import numpy as np
from mindspore import Parameter, Tensor, nn, ops
from mindspore.common import dtype as mstype
from mindspore.train.callback import Callback
from mindspore.train.callback import _train_fault_tolerance as tft_mod
from mindspore.train.callback._train_fault_tolerance import TrainFaultTolerance
from mindspore.utils import _tft_handler
from mindspore.utils import utils as ms_utils

from ms_recover.comm.base import CommBackend
from ms_recover.worker import repair as packing

log = logging.getLogger("tests.kit.mindio_kit")

#: The gates lifted (the names patched or replaced), each documented in the module docstring.
LIFTS = (
    "device target",
    "TrainFaultTolerance._check_init",
    "optimizer wrapper",
    "_stop_device",
    "clean_tdt_channel",
    "reset_params",
    "send_recv",
)
#: The globals of ``_train_fault_tolerance`` the kit replaces (its handlers call them).
PATCHED = ("_stop_device", "clean_tdt_channel", "reset_params", "send_recv")


class _Kit:
    comm: CommBackend | None = None
    stop_requested = False
    rank = 0
    tags: dict[tuple[int, int], int] = {}


KIT = _Kit()


@contextlib.contextmanager
def ascend_answer() -> Iterator[None]:
    """``context.get_context("device_target")`` answers "Ascend" inside ``mindspore.utils``
    only, only for the duration of the block."""
    real = ms_utils.context

    class _Scoped:
        def __getattr__(self, name: str) -> Any:
            return getattr(real, name)

        @staticmethod
        def get_context(key: str) -> Any:
            return "Ascend" if key == "device_target" else real.get_context(key)

    ms_utils.context = _Scoped()
    try:
        yield
    finally:
        ms_utils.context = real


class CpuTrainFaultTolerance(TrainFaultTolerance):  # type: ignore[misc]
    """``TrainFaultTolerance`` without the Ascend-only refusal in ``_check_init``."""

    tft: Any

    def _check_init(self) -> None:
        if self.tft is None:
            with ascend_answer():
                _tft_handler.init(config=None)
            self.tft = _tft_handler.get_tft()


def cpu_optimizer_wrapper(origin_opt_cls: type) -> type:
    """The optimizer wrapper with MindSpore's flag contract and CPU kernels."""

    class CpuTFTOpt(origin_opt_cls):  # type: ignore[misc]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.depend = ops.Depend()
            self.allreduce_sum = ops.AllReduce()
            self.tft_g_one_flag = Parameter(Tensor([1], dtype=mstype.int32), name="tft_g_one_flag")

        def construct(self, gradients: Any, **kwargs: Any) -> Any:
            flag = self.depend(self.tft_g_one_flag, gradients)
            summed = self.allreduce_sum(ops.cast(flag, mstype.float32))
            ops.assign(self.tft_g_one_flag, ops.cast(summed, mstype.int32))
            grads = self.depend(gradients, self.tft_g_one_flag)
            return super().construct(grads, **kwargs)

    CpuTFTOpt.__name__ = f"CpuTFT{origin_opt_cls.__name__}"
    return CpuTFTOpt


class SafePoint(Callback):  # type: ignore[misc]
    """Raises ``ForceStopError`` in the training thread once the stop stand-in was called.
    Put it after the ``TrainFaultTolerance`` callback."""

    def on_train_step_end(self, run_context: Any) -> None:
        self._check()

    def on_train_step_begin(self, run_context: Any) -> None:
        self._check()

    @staticmethod
    def _check() -> None:
        if KIT.stop_requested:
            KIT.stop_requested = False
            raise RuntimeError("ForceStopError: stopped by ms_recover (CPU stand-in)")


def _stop_device(device_id: int) -> None:
    KIT.stop_requested = True


def _clean_tdt_channel() -> int:
    return 0


def _reset_params(params: list[Parameter]) -> int:
    for p in params:
        p.set_data(Tensor(np.zeros(p.shape, dtype=mstype._dtype_to_nptype(p.dtype))))
    return 0


def _send_recv(params: list[Parameter], src: int, dst: int) -> int:
    comm = KIT.comm
    if comm is None:
        log.error("send_recv stand-in: no data plane attached")
        return 1
    # Both ends count the copies of this (src, dst) pair, so their tags agree.
    n = KIT.tags[(src, dst)] = KIT.tags.get((src, dst), 0) + 1
    tag = f"ttp-repair.{src}.{dst}.{n}"
    if KIT.rank == src:
        comm.send(packing.pack({p.name: p.asnumpy() for p in params}, 0), dst, tag)
        return 0
    arrays, _ = packing.unpack(comm.recv(src, tag), src)
    for p in params:
        if p.name not in arrays:
            log.error("send_recv stand-in: rank %d sent no %s", src, p.name)
            return 1
        p.set_data(Tensor(arrays[p.name]))
    return 0


def install(rank: int, comm: CommBackend | None) -> None:
    """Lift the gates in this process; ``comm`` (a host backend) carries ``send_recv``."""
    from ms_recover.integrations.mindio import framework

    KIT.rank, KIT.comm = rank, comm
    framework.STATE.data_plane = comm
    tft_mod._stop_device = _stop_device
    tft_mod.clean_tdt_channel = _clean_tdt_channel
    tft_mod.reset_params = _reset_params
    tft_mod.send_recv = _send_recv


def foreign_handlers() -> dict[str, str]:
    """Registered handlers that are not MindSpore's own functions (name -> qualname)."""
    from ms_recover.integrations.mindio import framework

    proc = framework.STATE.processor
    if proc is None:
        return {"*": "no processor"}
    own = {
        "save_ckpt": tft_mod._save_checkpoint_on_failure,
        "rename": tft_mod._rename_save_result,
        "exit": tft_mod._tft_exit_cb,
        "stop": tft_mod._tft_stop_callback,
        "clean": tft_mod._tft_clean_callback,
        "repair": tft_mod._tft_repair_callback,
        "rebuild_group": tft_mod._tft_rebuild_groups,
    }
    return {
        name: getattr(fn, "__qualname__", repr(fn))
        for name, (fn, _) in proc.handlers.items()
        if name in own and fn is not own[name]
    } | {name: "missing" for name in own if name not in proc.handlers}


def net_params(net: nn.Cell) -> dict[str, np.ndarray[Any, Any]]:
    return {p.name: p.asnumpy() for p in net.get_parameters()}


def env_flag(name: str) -> str:
    return os.environ.get(name, "")
