"""DataParallelStep: one data-parallel training step, with the gradient reduction outside MindSpore.

MindSpore computes the forward pass, the backward pass and the optimizer update; the gradient
reduction between them is a plain numpy call, ``reduce_fn``, through which the active
``CommBackend``'s allreduce (mean) is plugged in. A step is three phases:

1. ``grads(*batch)``: loss and gradients with ``mindspore.value_and_grad`` (compiled with
   ``mindspore.jit`` when ``jit=True``), copied into **one contiguous float32 numpy buffer**
   (parameters in optimizer order, each flattened in C order; other float dtypes are cast).
2. ``reduce_fn(flat) -> flat``: called exactly once per step with that buffer; it must return an
   array of the same shape and dtype (the buffer may be reduced in place and returned).
3. ``apply(flat)``: the buffer is split back into per-parameter Tensors and the optimizer
   update runs (also jit-compiled), then the device is synchronised, so a step that returned is
   **committed** (docs/design.md §3).

Why the reduction is outside the grad function: a collective that fails *inside*
``value_and_grad`` leaves PyNative's grad state poisoned for the rest of the process. Here the
grad function only computes; if ``reduce_fn`` raises (``Interrupted`` during recovery, or any
error), nothing has been applied, no MindSpore state has changed, and the same step can simply
be run again after recovery.

Determinism: with the same parameter values and the same batch, the gradients and the update
are bit-identical in every fresh process. ``tests/e2e/test_mindspore_state.py`` checks two fresh
processes, and that the result equals ``nn.TrainOneStepCell`` and a plain ``value_and_grad``
loop bit for bit. By hand on MindSpore 2.10 CPU, PyNative and jit gave the same bits, as did
1, 2 and 4 CPU kernel threads, with or without the deterministic flag: CPU needs no flag.
``deterministic=True`` still calls ``mindspore.set_deterministic(True)`` once per process (it
may not be set twice), because Ascend kernels and HCCL need it (it sets
``HCCL_DETERMINISTIC=true``), and MindSpore wants it before ``mindspore.communication.init``.

Speed (MindSpore 2.10 CPU, this 2-core host while another test suite ran, Adam, batch 32, per
full step including the numpy round trip, median of 100 steps): MLP 784-256-10 about 1.5-3.5 ms
with jit and 16 ms in PyNative; MLP 64-32-10 about 0.9 ms with jit and 21 ms in PyNative.
The first jit step compiles (about 0.4 s). If jit compilation fails, the step logs a warning and
runs that phase in PyNative for good (``jit_enabled`` then reads False).

Warm-up (why a replaced rank stays bit-identical): on MindSpore 2.10 CPU the *first* execution of
a compiled graph in a process runs on one of MindSpore's ``ActorThread`` workers, whose MXCSR
has flush-to-zero and denormals-are-zero set; later executions run on the ``frontend_queue``
thread, which has neither (measured with a ``pyfunc`` probe that reads MXCSR; PyNative runs the
same way). A replacement rank loads repaired state and then executes its graphs for the first
time, so every subnormal in that state (Adam's ``beta1_power`` is one after about 830 steps)
read 0 in its first step while the survivors kept it: the replica diverged by a few bits.
So before its first real step with each batch signature (a new shape compiles a new
graph), ``grads`` runs both phases once on that batch and puts every
value back exactly (all Parameters of the network and the optimizer, and MindSpore's RNG
state, through :class:`MindSporeState`, whose load is bit-exact). Every real step of every
process then runs with the same floating-point environment. Cost: one extra step and one copy
of the state, once per process (compilation, which the first step pays anyway, dominates).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

import mindspore
import numpy as np
from mindspore import Tensor
from mindspore.common.dtype import _dtype_to_nptype  # its public alias logs a deprecation
from numpy.typing import NDArray

from ms_recover.errors import CommError
from ms_recover.mindspore.state import MindSporeState, device_sync

log = logging.getLogger(__name__)

FlatGrads = NDArray[np.float32]
ReduceFn = Callable[[FlatGrads], FlatGrads]
FLAT_DTYPE = np.dtype(np.float32)


def enable_determinism() -> None:
    """Turn on MindSpore's deterministic computing once (it may not be set twice)."""
    if mindspore.get_context("deterministic") != "ON":
        mindspore.set_deterministic(True)


def _identity(flat: FlatGrads) -> FlatGrads:
    return flat


class _Layout:
    """Where each parameter's gradient lives in the flat buffer."""

    def __init__(self, params: Sequence[Any]) -> None:
        self.shapes = [tuple(int(d) for d in p.shape) for p in params]
        self.dtypes = [np.dtype(_dtype_to_nptype(p.dtype)) for p in params]
        sizes = [int(np.prod(s, dtype=np.int64)) for s in self.shapes]
        self.offsets = np.concatenate([[0], np.cumsum(sizes, dtype=np.int64)]).tolist()
        self.size = int(self.offsets[-1])

    def flatten(self, grads: Sequence[Any]) -> FlatGrads:
        flat = np.empty(self.size, dtype=FLAT_DTYPE)
        for i, grad in enumerate(grads):
            flat[self.offsets[i] : self.offsets[i + 1]] = grad.asnumpy().reshape(-1)
        return flat

    def split(self, flat: FlatGrads) -> tuple[Tensor, ...]:
        # Tensor(ndarray) copies, so the caller may reuse ``flat`` once apply() has returned.
        return tuple(
            Tensor(
                flat[self.offsets[i] : self.offsets[i + 1]].reshape(shape).astype(dtype, copy=False)
            )
            for i, (shape, dtype) in enumerate(zip(self.shapes, self.dtypes, strict=True))
        )


class _JitOrEager:
    """One jit-compiled function that falls back to PyNative if it does not compile.

    The first call decides: if the compiled call raises and the eager call succeeds, the
    failure was the compiler's, so the phase stays eager for good (with a warning). If the
    eager call fails too, the step itself is wrong: that error propagates and jit stays on.
    Compilation fails before anything executes, so nothing runs twice.
    """

    def __init__(self, what: str, eager: Callable[..., Any], jit: bool) -> None:
        self.what = what
        self.eager = eager
        self.fn = mindspore.jit(eager) if jit else eager
        self.jit = jit
        self._decided = not jit

    def __call__(self, *args: Any, eager_args: tuple[Any, ...] | None = None) -> Any:
        if self._decided:
            return self.fn(*args)
        try:
            result = self.fn(*args)
        except Exception as exc:
            result = self.eager(*(args if eager_args is None else eager_args))
            log.warning(
                "jit compilation of the %s failed (%s); it runs in PyNative", self.what, exc
            )
            self.fn, self.jit = self.eager, False
        self._decided = True
        return result


class DataParallelStep:
    """``step(*batch) -> loss`` for one rank; see the module doc for the phases and guarantees.

    ``batch`` is ``(*inputs, label)``: the loss is ``loss_fn(net(*inputs), label)``. Gradients
    are taken with respect to ``optimizer.parameters`` (the Parameters it updates).
    ``reduce_fn`` defaults to the identity (a single-rank run).
    """

    def __init__(
        self,
        net: Any,
        loss_fn: Any,
        optimizer: Any,
        reduce_fn: ReduceFn | None = None,
        jit: bool = True,
        deterministic: bool = True,
    ) -> None:
        if deterministic:
            enable_determinism()
        self.net = net
        self.optimizer = optimizer
        self.reduce_fn: ReduceFn = reduce_fn or _identity
        params = tuple(optimizer.parameters)
        self.param_names = [p.name for p in params]
        self.layout = _Layout(params)

        def forward(*batch: Any) -> Any:
            return loss_fn(net(*batch[:-1]), batch[-1])

        def update(grads: Any) -> Any:
            return optimizer(grads)

        grad_fn = mindspore.value_and_grad(forward, None, optimizer.parameters)
        self._grad = _JitOrEager("forward/backward", grad_fn, jit)
        self._update = _JitOrEager("optimizer update", update, jit)
        self._target = mindspore.get_context("device_target")  # read once (see device_sync)
        self._warmed: set[tuple[tuple[tuple[int, ...], Any], ...]] = set()

    @property
    def jit_enabled(self) -> bool:
        """True while both phases run compiled graphs (False after a jit fallback)."""
        return self._grad.jit and self._update.jit

    @property
    def num_elements(self) -> int:
        """Length of the flat gradient buffer handed to ``reduce_fn``."""
        return self.layout.size

    def __call__(self, *batch: Any) -> float:
        """Run one full step and return the local (unreduced) loss.

        If ``reduce_fn`` raises, the exception propagates and nothing was applied.
        """
        loss, flat = self.grads(*batch)
        self.apply(self.reduce_fn(flat))
        return loss

    def grads(self, *batch: Any) -> tuple[float, FlatGrads]:
        """Loss and the flat float32 gradient buffer for ``batch``; changes no state.

        The first call with each new batch signature (shapes and dtypes: a new one compiles a
        new graph) warms both phases up on ``batch`` (see the module doc) and restores every
        value before computing the real gradients.
        """
        tensors = self._warm(batch)
        loss, grads = self._grad(*tensors)
        # Read the gradients before the loss: reading the scalar loss first costs about 10 ms
        # per step on MindSpore 2.10 CPU (measured), reading it last costs nothing.
        flat = self.layout.flatten(grads)
        return float(loss.asnumpy()), flat

    def warm_up(self, *batch: Any) -> None:
        """Compile and run both phases once on ``batch``, then restore every value bit for bit.

        What the first step with a new batch signature does anyway; called ahead (a spare,
        before it waits for a rank: ``ms_recover.init(warm_up=...)``), it takes the compile
        off that step. Only the shapes and dtypes of ``batch`` matter; a later step with the
        same signature compiles nothing. No collective runs (``reduce_fn`` is not called).
        """
        self._warm(batch)

    def _warm(self, batch: tuple[Any, ...]) -> tuple[Tensor, ...]:
        tensors = tuple(b if isinstance(b, Tensor) else Tensor(b) for b in batch)
        signature = tuple((tuple(t.shape), t.dtype) for t in tensors)
        if signature not in self._warmed:
            self._warm_up(tensors)
            self._warmed.add(signature)
        return tensors

    def _warm_up(self, tensors: tuple[Tensor, ...]) -> None:
        """Execute both compiled phases once, then restore the state bit for bit."""
        state = MindSporeState(self.net, self.optimizer, include_rng=True)
        saved = state.state_dict()
        _, grads = self._grad(*tensors)
        self.apply(self.layout.flatten(grads))
        state.load_state_dict(saved)

    def apply(self, flat: FlatGrads) -> None:
        """Apply a reduced flat gradient buffer with the optimizer; returns once committed.

        Raises CommError, before touching any state, if ``flat`` is not a float32 array of
        ``num_elements`` values (e.g. a ``reduce_fn`` that returned something else).
        """
        self._check_flat(flat)
        grads = self.layout.split(flat)
        # mutable(): a plain tuple of Tensors is a graph constant and would recompile the update
        # graph on every step (measured: about 40 ms per step instead of 1.5 ms).
        arg = mindspore.mutable(grads) if self._update.jit else grads
        self._update(arg, eager_args=(grads,))
        device_sync(self._target)

    def _check_flat(self, flat: Any) -> None:
        want = (self.layout.size,)
        if isinstance(flat, np.ndarray) and flat.shape == want and flat.dtype == FLAT_DTYPE:
            return
        got = f"{flat.shape} {flat.dtype}" if isinstance(flat, np.ndarray) else type(flat).__name__
        raise CommError(
            f"the reduced gradient buffer must be a {want} {FLAT_DTYPE} array, got {got}"
        )
