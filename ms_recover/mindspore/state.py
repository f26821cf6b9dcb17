"""MindSporeState: a rank's MindSpore training state as named numpy arrays, and back.

It implements :class:`ms_recover.worker.state.StateProvider` over every ``Parameter`` of the
network and of the optimizer: weights, non-trainable buffers (e.g. BatchNorm moving statistics),
optimizer moments (``moment1.<name>``, ``moment2.<name>``, ``moments.<name>``, ...), step
counters (``global_step``) and optimizer scalars (``beta1_power``, ``learning_rate``, ...).

Guarantees:

* **Stable names.** An entry is named by ``Parameter.name``, which MindSpore derives from the
  attribute path of the cell that owns it, so the same model code gives the same names in every
  process. A Parameter reachable from both the network and the optimizer is listed once. Two
  *different* Parameters with one name raise :class:`RepairError` at construction.
* **Copies out.** ``state_dict`` returns C-contiguous copies (``Tensor.asnumpy`` may hand back
  a view of a buffer MindSpore keeps reusing).
* **All or nothing in.** ``load_state_dict`` checks every name, shape and dtype first and
  raises one :class:`RepairError` naming each offending entry with both shapes and dtypes;
  only when everything matches does it write anything.
* **In place.** Values are written with ``mindspore.ops.assign`` into the *existing*
  Parameter objects, and the call returns after the device has finished writing. Measured on
  MindSpore 2.10 (CPU): ``Parameter.set_data`` and ``Parameter.assign_value`` swap the
  Parameter's buffer, and a graph that ``mindspore.jit`` compiled earlier keeps reading the old
  buffer, silently ignoring the load. ``ops.assign`` writes into the buffer the compiled graphs
  use, so jit-compiled train steps and the optimizer see the loaded values.

* **Bit-exact.** Loading and reading back keep every bit, subnormals, signed zeros,
  infinities and NaN payloads included. But on MindSpore 2.10 CPU a compiled graph's *first*
  execution in a process runs with flush-to-zero and denormals-are-zero, so a replacement that
  loads state and then runs its step for the first time would compute with its subnormals
  read as 0. :class:`~ms_recover.mindspore.step.DataParallelStep` warms its graphs up and
  restores the state first; a hand-written train step should do the same (run it once, then
  ``load_state_dict`` the state it had) before its first real step.

Optional entries: ``include_rng=True`` adds MindSpore's default generator state
(``mindspore.get_rng_state``) as ``__rng__/default``; ``extra`` is any other StateProvider
(data iterator, numpy RNG, ...) whose entries appear under ``__extra__/``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import mindspore
import numpy as np
from mindspore import Parameter, Tensor, ops
from mindspore.common.dtype import _dtype_to_nptype  # its public alias logs a deprecation
from mindspore.graph.api import _pynative_executor  # mindspore.common.api is deprecated
from numpy.typing import NDArray

from ms_recover.errors import RepairError
from ms_recover.mindspore.checkpoint import write_ckpt
from ms_recover.worker import repair
from ms_recover.worker.state import StateProvider

RNG_KEY = "__rng__/default"
EXTRA_PREFIX = "__extra__/"
_MAX_LISTED = 8


def device_sync(device_target: str = "") -> None:
    """Return once every operation this process queued in MindSpore has finished.

    ``mindspore.runtime.synchronize`` is not supported on CPU (MindSpore 2.10 logs an error and
    returns); the PyNative executor's sync drains the op queue, including graph launches.
    ``device_target``: the context's, if the caller knows it (a step reads it once when it
    builds its graphs): ``mindspore.get_context`` costs ~45 us, 4 % of the demo's step.
    """
    _pynative_executor.sync()
    if (device_target or mindspore.get_context("device_target")) != "CPU":
        mindspore.runtime.synchronize()


def _np_dtype(param: Parameter) -> np.dtype[Any]:
    dtype: np.dtype[Any] = np.dtype(_dtype_to_nptype(param.dtype))
    return dtype


def _describe(shape: tuple[int, ...], dtype: np.dtype[Any]) -> str:
    return f"{tuple(int(d) for d in shape)} {dtype}"


class MindSporeState:
    """Named state of one MindSpore network (and optimizer) for repair; see the module doc."""

    def __init__(
        self,
        net: Any,
        optimizer: Any | None = None,
        extra: StateProvider | None = None,
        include_rng: bool = False,
    ) -> None:
        cells = [net] if optimizer is None else [net, optimizer]
        self._params = self._collect(cells)
        for name in self._params:
            if name == RNG_KEY or name.startswith(EXTRA_PREFIX):
                raise RepairError(f"parameter name {name!r} collides with a reserved state name")
        self._extra = extra
        self._include_rng = include_rng

    @staticmethod
    def _collect(cells: Iterable[Any]) -> dict[str, Parameter]:
        params: dict[str, Parameter] = {}
        for cell in cells:
            for param in cell.get_parameters():
                seen = params.get(param.name)
                if seen is None:
                    params[param.name] = param
                elif seen is not param:
                    raise RepairError(
                        f"parameter name {param.name!r} is used by two different Parameters "
                        f"({_describe(seen.shape, _np_dtype(seen))} and "
                        f"{_describe(param.shape, _np_dtype(param))}); give them unique names"
                    )
        return params

    @property
    def parameters(self) -> dict[str, Parameter]:
        """Name -> the live Parameter object (for device-side repair such as HCCL send_recv)."""
        return dict(self._params)

    def names(self) -> list[str]:
        """Every entry name, in state_dict order (network first, then optimizer, then extras)."""
        return list(self.state_dict_spec())

    def state_dict_spec(self) -> dict[str, tuple[tuple[int, ...], np.dtype[Any]]]:
        """Name -> (shape, numpy dtype) of every entry (extras are read through their provider)."""
        spec = self._own_spec()
        if self._extra is not None:
            for name, arr in self._extra.state_dict().items():
                spec[EXTRA_PREFIX + name] = (tuple(arr.shape), arr.dtype)
        return spec

    def _own_spec(self) -> dict[str, tuple[tuple[int, ...], np.dtype[Any]]]:
        spec = {n: (tuple(p.shape), _np_dtype(p)) for n, p in self._params.items()}
        if self._include_rng:
            rng = mindspore.get_rng_state().asnumpy()
            spec[RNG_KEY] = (tuple(rng.shape), rng.dtype)
        return spec

    def state_dict(self) -> dict[str, NDArray[Any]]:
        """Every entry as a C-contiguous numpy copy, in a stable order."""
        return self._arrays(copy=True)

    def digest(self) -> str:
        """:func:`repair.digest <ms_recover.worker.repair.digest>` of :meth:`state_dict`, the
        same string, without copying the state first: ``asnumpy`` hands out the Parameters'
        own buffers on CPU, read at once (a wide MLP's 13.5 MB digest: 6.1 -> 3.3 ms)."""
        return repair.digest(self._arrays(copy=False))

    def _arrays(self, copy: bool) -> dict[str, NDArray[Any]]:
        out = {
            name: np.array(p.asnumpy(), order="C", copy=copy) for name, p in self._params.items()
        }
        if self._include_rng:
            out[RNG_KEY] = np.array(mindspore.get_rng_state().asnumpy(), order="C", copy=copy)
        if self._extra is not None:
            for name, arr in self._extra.state_dict().items():
                out[EXTRA_PREFIX + name] = np.asarray(arr, order="C")
        return out

    def load_state_dict(self, arrays: dict[str, NDArray[Any]]) -> None:
        """Load every entry in place, or nothing: RepairError lists each mismatch first."""
        problems = self._mismatches(arrays)
        if problems:
            listed = "; ".join(problems[:_MAX_LISTED])
            more = (
                f"; and {len(problems) - _MAX_LISTED} more" if len(problems) > _MAX_LISTED else ""
            )
            raise RepairError(
                f"state does not match this model ({len(problems)} problems): {listed}{more}"
            )
        if self._extra is not None:
            # The extra provider validates before it loads (StateProvider contract), so a
            # failure here still leaves every Parameter untouched.
            prefix = len(EXTRA_PREFIX)
            self._extra.load_state_dict(
                {k[prefix:]: v for k, v in arrays.items() if k.startswith(EXTRA_PREFIX)}
            )
        for name, param in self._params.items():
            ops.assign(param, Tensor(np.asarray(arrays[name], order="C")))
        if self._include_rng:
            mindspore.set_rng_state(Tensor(np.asarray(arrays[RNG_KEY], order="C")))
        # Assignments run asynchronously; the caller may reuse or free the source arrays and
        # report the state as repaired as soon as this returns.
        device_sync()

    def save_checkpoint(self, path: str) -> None:
        """Write ``state_dict()`` (same names, including optimizer moments, step counters and
        extras) to exactly ``path`` with ``mindspore.save_checkpoint``; not fsynced.

        ``mindspore.load_checkpoint(path)`` (or ``checkpoint.read_ckpt``) gives it back bit
        for bit. See :mod:`ms_recover.mindspore.checkpoint` for what MindSpore does to paths.
        """
        write_ckpt(self.state_dict(), path)

    def _mismatches(self, arrays: dict[str, NDArray[Any]]) -> list[str]:
        # Extras are checked by their own provider; everything else is checked here.
        spec = self._own_spec()
        ours = {
            k: v for k, v in arrays.items() if self._extra is None or not k.startswith(EXTRA_PREFIX)
        }
        problems = [
            f"missing {name!r} (expected {_describe(*spec[name])})"
            for name in spec
            if name not in ours
        ]
        for name, value in ours.items():
            got = (tuple(np.shape(value)), np.asarray(value).dtype)
            if name not in spec:
                problems.append(f"unexpected {name!r} ({_describe(*got)})")
            elif got != spec[name]:
                problems.append(
                    f"{name!r}: expected {_describe(*spec[name])}, got {_describe(*got)}"
                )
        return problems
