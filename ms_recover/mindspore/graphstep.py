"""GraphStep: one data-parallel training step as ONE compiled MindSpore graph.

The same step as :class:`~ms_recover.mindspore.step.DataParallelStep` (same arguments), but
forward, backward, the gradient reduction and the optimizer update are one graph: MindSpore's
own ``nn.TrainOneStepCell`` whose ``grad_reducer`` (the slot where ``DistributedGradReducer``
goes under msrun) is a compiled custom op (:mod:`~ms_recover.mindspore.graphop`) that reduces
the gradients in place, where the backward pass wrote them, and hands the optimizer a token to
wait for. ``reduce_fn`` is called once per bucket (:func:`~ms_recover.mindspore.graphop.
plan_buckets`: each gradient of at least ``inplace_bytes`` alone, in its own buffer; the
smaller ones gathered in optimizer order), in the same order on every rank, every step; a
model whose gradients are all small (the demo's) has one bucket, the whole flat buffer in
optimizer order, as ``DataParallelStep`` hands it. The bits are ``DataParallelStep``'s
whenever the reduction of an element does not depend on where the buffer is cut (the identity,
a scaling, the 2-rank host allreduce; a ring over more ranks may add in another order, still
the same on every rank and every rerun). No numpy flatten/split, no device sync between two
graphs, and no copy at all of an in-place bucket that ``reduce_fn`` reduces in place: under a
session, ``reduce_fn=lambda flat: session.allreduce(flat, "mean", out=flat)`` (the result
written into the bucket; at one rank there is then nothing to copy at all).

Works in GRAPH_MODE (the cell is compiled as a graph) and in PyNative (its ``construct`` is
wrapped in ``mindspore.jit``). Prefer GRAPH_MODE under a session: on MindSpore 2.10 CPU in
PyNative, waiting for a jit graph's scalar loss takes 10-40 ms whenever another Python thread
wakes up (the session's heartbeat thread does), for a plain ``TrainOneStepCell`` as much as for
this step (measured; ``DataParallelStep``'s two functional graphs see about 1 ms of it);
GRAPH_MODE has no such stall.

A reduction that raises on any bucket, the last included (``Interrupted`` during recovery,
``CommError``, anything), fails the op; MindSpore aborts the graph before the optimizer ran (the
op is ordered before every write of the optimizer, which all consume its token or follow it in
the side-effect chain), so nothing was applied (the gradients it had already reduced in place
are the graph's own temporaries), and the same exception object is raised to the caller.
MindSpore refuses to run a graph again after one of its kernels failed, so the next call
builds and compiles a fresh graph (and warms it up, below): a failed step costs one
recompilation, and the step can simply be run again, as ``retry`` requires.

Warm-up (as ``DataParallelStep`` on branch ``exact``): on MindSpore 2.10 CPU a graph's first
execution runs with flush-to-zero set, so before its first real step with each batch signature
the step runs once with the identity reduction (never a collective: a replacement rank must not
call one its peers do not) and puts every value back bit for bit (``MindSporeState`` with the
RNG state). The reduction itself always runs with the floating-point environment of the thread
that built the step, whatever MindSpore thread executes the op.
"""

from __future__ import annotations

import logging
from typing import Any

import mindspore
import numpy as np
from mindspore import Parameter, Tensor, nn, ops

from ms_recover.errors import MsRecoverError
from ms_recover.mindspore.graphop import INPLACE_BYTES, Bucket, FlatGrads, ReduceSlot, noop_func
from ms_recover.mindspore.state import MindSporeState, device_sync
from ms_recover.mindspore.step import ReduceFn, _Layout, enable_determinism

log = logging.getLogger(__name__)


def _identity(flat: FlatGrads) -> FlatGrads:
    return flat


class _LossCell(nn.Cell):  # type: ignore[misc]
    """``loss_fn(net(*inputs), label)`` for a batch ``(*inputs, label)``."""

    def __init__(self, net: Any, loss_fn: Any) -> None:
        super().__init__(auto_prefix=False)
        self.net = net
        self.loss_fn = loss_fn

    def construct(self, *batch: Any) -> Any:
        return self.loss_fn(self.net(*batch[:-1]), batch[-1])


ON_FAILURE = ("abort", "skip")


def _reduce_op(func: str) -> Any:
    op = ops.Custom(
        func,
        out_shape=lambda *_: (1,),
        out_dtype=lambda *_: mindspore.float32,
        func_type="aot",
    )
    # No "side_effect_mem": that attribute ordered the op in the graph's side-effect chain,
    # but cost about 1-2 % of a 7-8 ms step on this host. The chain is joined instead by one
    # tiny Assign of the token (_HostGradReducer); the skip branch consumes the token itself.
    return op


class _HostGradReducer(nn.Cell):  # type: ignore[misc]
    """The ``grad_reducer`` of a TrainOneStepCell: the gradients reduced in place by one op
    call, handed on only through its token, so the optimizer runs after the op or not at all."""

    def __init__(self, func: str, slot: int) -> None:
        super().__init__()
        self.op = _reduce_op(func)
        self.slot = Tensor(np.int64(slot))
        self.token = Parameter(Tensor(np.zeros(1, np.float32)), "msr_token", requires_grad=False)

    def construct(self, grads: Any) -> Any:
        token = self.op(self.slot, *grads)
        # The Assign is a side effect that consumes the token: every later write in program
        # order (the optimizer's step counters too, which do not consume the gradients) runs
        # after it, so after the op; if the op fails, none of them has run.
        token = ops.depend(token, ops.assign(self.token, token))
        return ops.depend(grads, token)


class _SkipOnFailure(nn.TrainOneStepCell):  # type: ignore[misc]
    """A TrainOneStepCell whose optimizer runs only if the op's token says every bucket was
    reduced (``on_failure="skip"``): a failed reduction fails no kernel, so MindSpore neither
    waits its fixed 3 s nor needs the graph compiled again. Costs a branch in the graph
    (MindSpore's control-flow actors: 0.3-0.4 ms a step on this host)."""

    def __init__(self, network: Any, optimizer: Any, func: str, slot: int) -> None:
        super().__init__(network, optimizer)
        self.reduce_op = _reduce_op(func)
        self.slot = Tensor(np.int64(slot))

    def construct(self, *inputs: Any) -> Any:
        loss = self.network(*inputs)
        grads = self.grad_no_sens(self.network, self.weights)(*inputs)
        failed = self.reduce_op(self.slot, *grads)
        grads = ops.depend(grads, failed)
        if failed[0] < 0.5:
            loss = ops.depend(loss, self.optimizer(grads))
        return loss


def floor_cell(net: Any, loss_fn: Any, optimizer: Any) -> Any:
    """A ``TrainOneStepCell`` whose ``grad_reducer`` is GraphStep's op with an empty body
    (no callback, nothing reduced, the gradients untouched): the fixed cost of the op itself,
    which ``bench overhead`` reports as the floor of any in-graph reduction. Not a training
    step for a job: it reduces nothing."""
    cell = nn.TrainOneStepCell(_LossCell(net, loss_fn), optimizer)
    cell.grad_reducer = _HostGradReducer(noop_func(), 0)
    if mindspore.get_context("mode") != mindspore.GRAPH_MODE:
        cell.construct = mindspore.jit(cell.construct)
    return cell


def _tensors(batch: tuple[Any, ...]) -> tuple[tuple[Tensor, ...], Any]:
    """The batch as Tensors, and its signature (each item's shape and dtype), in one pass.

    A numpy array's signature is numpy's own shape and dtype (C attributes; a Tensor's are
    Python properties, several calls each step, slow after the graph: caches cold). The
    same array always makes the same Tensor, so its signature stands for the Tensor's; a
    batch of Tensors of the same shapes has another signature and one warm-up more."""
    tensors, signature = [], []
    for b in batch:
        if type(b) is np.ndarray:
            tensors.append(Tensor(b))
            signature.append((b.shape, b.dtype))
        else:
            t = b if isinstance(b, Tensor) else Tensor(b)
            tensors.append(t)
            signature.append((tuple(t.shape), t.dtype))
    return tuple(tensors), tuple(signature)


class GraphStep:
    """``step(*batch) -> loss`` for one rank, as one compiled graph; see the module doc.

    ``batch`` is ``(*inputs, label)``; gradients are taken with respect to
    ``optimizer.parameters`` (all float32). ``reduce_fn`` defaults to the identity (one
    rank); it may be replaced between steps. ``inplace_bytes``: a gradient at least this large
    is a bucket of its own, reduced in its own buffer. ``on_failure``: ``"abort"`` (a failed
    reduction fails the op: MindSpore then waits a fixed 3 s before it raises, and the graph is
    compiled again) or ``"skip"`` (the graph branches around the optimizer instead: a failed
    step costs nothing extra, every step costs the branch: 0.3-0.4 ms on this host, +50 % of
    the demo's step; ``bench overhead``'s (gs) rows).
    """

    def __init__(
        self,
        net: Any,
        loss_fn: Any,
        optimizer: Any,
        reduce_fn: ReduceFn | None = None,
        deterministic: bool = True,
        inplace_bytes: int = INPLACE_BYTES,
        on_failure: str = "abort",
    ) -> None:
        if on_failure not in ON_FAILURE:
            raise MsRecoverError(
                f"GraphStep on_failure={on_failure!r}; valid: " + ", ".join(ON_FAILURE)
            )
        self.on_failure = on_failure
        if deterministic:
            enable_determinism()
        params = tuple(optimizer.parameters)
        wrong = [f"{p.name} ({p.dtype})" for p in params if p.dtype != mindspore.float32]
        if wrong:
            raise MsRecoverError(
                "GraphStep reduces float32 gradients only; not float32: " + ", ".join(wrong)
            )
        self.net = net
        self.loss_fn = loss_fn
        self.optimizer = optimizer
        self._reduce_fn: ReduceFn = reduce_fn or _identity
        self.param_names = [p.name for p in params]
        self.layout = _Layout(params)
        self._warming = False
        # The op calls reduce_fn itself (no wrapper: a Python frame per bucket costs several
        # times more inside the graph than outside); warm-up swaps in the identity.
        self._slot = ReduceSlot(
            [int(np.prod(s, dtype=np.int64)) for s in self.layout.shapes],
            self._reduce_fn,
            inplace_bytes,
        )
        self._cell: Any = None
        # The device target to sync after a step (read once when the cell is built), or None:
        # in GRAPH_MODE on CPU, cell() returns once the whole graph ran (measured: a reduction
        # that sleeps 0.2 s holds cell() as long), and reading the loss, ordered after the
        # optimizer, is all the waiting a step needs; the sync cost 5-9 us a step there.
        self._sync: str | None = ""
        self._warmed: set[Any] = set()  # the batch signatures (_tensors) warmed up

    @property
    def reduce_fn(self) -> ReduceFn:
        """Called on each bucket, every step; may be replaced between steps."""
        return self._reduce_fn

    @reduce_fn.setter
    def reduce_fn(self, fn: ReduceFn) -> None:
        self._reduce_fn = fn
        if not self._warming:
            self._slot.reduce_fn = fn

    @property
    def jit_enabled(self) -> bool:
        """Always True: the step is one compiled graph (kept for DataParallelStep's API)."""
        return True

    @property
    def num_elements(self) -> int:
        """Number of gradient values; ``reduce_fn`` gets them bucket by bucket (``buckets``)."""
        return self.layout.size

    @property
    def buckets(self) -> list[Bucket]:
        """The buckets ``reduce_fn`` is called on each step, in order."""
        return list(self._slot.buckets)

    def __call__(self, *batch: Any) -> float:
        """Run one full step and return the local (unreduced) loss; returns once committed.

        If ``reduce_fn`` raises, that exception propagates and nothing was applied.
        """
        tensors, signature = _tensors(batch)
        cell = self._cell
        if cell is None or signature not in self._warmed:
            cell = self._ready(tensors, signature)
        return self._run(cell, tensors)

    def warm_up(self, *batch: Any) -> None:
        """Build, compile and run the graph once on ``batch`` with the identity reduction, then
        restore every value bit for bit (what the first step with a new signature does);
        called ahead by a spare (``ms_recover.init(warm_up=...)``), it takes the compile off
        that step. Only the shapes and dtypes of ``batch`` matter."""
        self._ready(*_tensors(batch))

    def _ready(self, tensors: tuple[Tensor, ...], signature: Any) -> Any:
        """The built cell, warmed up once for this batch signature."""
        cell = self._cell if self._cell is not None else self._build()
        if signature not in self._warmed:
            self._warm_up(cell, tensors)
            self._warmed.add(signature)
        return cell

    def close(self) -> None:
        """Release the op's slot; the step must not be called afterwards."""
        self._slot.close()

    def _build(self) -> Any:
        loss_cell = _LossCell(self.net, self.loss_fn)
        cell: Any
        if self.on_failure == "skip":
            cell = _SkipOnFailure(loss_cell, self.optimizer, self._slot.flag_func, self._slot.index)
        else:
            cell = nn.TrainOneStepCell(loss_cell, self.optimizer)
            cell.grad_reducer = _HostGradReducer(self._slot.func, self._slot.index)
        graph = mindspore.get_context("mode") == mindspore.GRAPH_MODE
        if not graph:
            cell.construct = mindspore.jit(cell.construct)
        target = mindspore.get_context("device_target")  # read once (see device_sync)
        self._sync = None if graph and target == "CPU" else target
        self._cell = cell
        self._warmed.clear()
        return cell

    def _run(self, cell: Any, tensors: tuple[Tensor, ...]) -> float:
        try:
            loss = cell(*tensors)
            if self._sync is not None:
                device_sync(self._sync)
            value = float(loss.asnumpy())
        except Exception as exc:
            # The graph is unusable after a failed kernel; the next call compiles a new one.
            self._cell = None
            error = self._slot.take_error()
            if error is None:
                raise
            log.info("in-graph reduction failed (%s); nothing was applied", type(error).__name__)
            raise error from exc
        error = self._slot.take_error()  # on_failure="skip": the graph skipped the optimizer
        if error is not None:
            log.info("in-graph reduction failed (%s); nothing was applied", type(error).__name__)
            raise error
        return value

    def _warm_up(self, cell: Any, tensors: tuple[Tensor, ...]) -> None:
        """Execute the graph once with the identity reduction, then restore the state exactly."""
        state = MindSporeState(self.net, self.optimizer, include_rng=True)
        saved = state.state_dict()
        self._warming, self._slot.reduce_fn = True, _identity
        try:
            self._run(cell, tensors)
        finally:
            self._warming, self._slot.reduce_fn = False, self._reduce_fn
        state.load_state_dict(saved)
