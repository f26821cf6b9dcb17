"""Rank program of the overhead benchmark: the demo's MindSpore step, with and without ms_recover.

Modes (all time whole loop iterations, so the loop's own bookkeeping is inside the numbers):

* ``plain``: no ms_recover at all: ``DataParallelStep`` with the identity reduce, a ``for`` loop;
* ``session``: under an agent, ``ms_recover.init()`` then ``session.steps()`` / ``guard()`` with
  ``session.allreduce`` as the reduce (the host allreduce when world > 1, a copy for one rank);
  with ``--graph-step`` (and ``--graph-mode``) the step is :class:`GraphStep` (the reduction an
  op inside its one compiled graph), the job ``bench overhead`` sets beside msrun's own
  data-parallel step (:mod:`~ms_recover.mindspore.programs.msrun_step_bench`);
  also times every allreduce call;
* ``interleaved``: under an agent, alternates single steps of the plain loop and of the session
  loop in one process (ABBA order, one ``DataParallelStep`` whose reduce is switched, so both
  run the same compiled graphs), and reads the CPU time of the session's heartbeat thread
  (``ms-recover-link-R``) over the session steps. A fourth arm is what a user would run
  without ms_recover: MindSpore's own ``nn.TrainOneStepCell`` on a second copy of the model
  (same seed, same batches), its ``construct`` compiled whole with ``mindspore.jit`` (one
  graph, as GRAPH_MODE compiles it).
  ``--graph-mode`` runs the process in GRAPH_MODE (the baseline the design names: a GRAPH_MODE
  ``TrainOneStepCell``) with the arms of :mod:`~ms_recover.mindspore.programs.overhead_graph`
  instead: TrainOneStepCell, a second one (the null arm), the op with an empty body, and
  :class:`GraphStep` with the identity reduce, ``on_failure="skip"``, the backend's allreduce
  and under the session (the last three one GraphStep, its reduce switched per arm; the others
  each its own graph), all on the session's model, in a random order each round.
  ``--hidden H`` swaps the demo MLP for a wider one (64-H-H-8).

Results go to ``OUT/<mode>_R.json``. Runs as a process only (it imports MindSpore).

    python -m ms_recover.mindspore.programs.overhead_train --mode plain --steps 2000 --out OUT
"""

from __future__ import annotations

import argparse
import json
import os
import threading
import time
from collections.abc import Callable
from typing import Any

import mindspore
import numpy as np
from mindspore import nn
from numpy.typing import NDArray

from ms_recover.mindspore.graphstep import GraphStep
from ms_recover.mindspore.programs import overhead_graph
from ms_recover.mindspore.programs.demo_train import (
    CLASSES,
    GLOBAL_BATCH,
    IN_DIM,
    SAMPLES,
    SEED,
)
from ms_recover.mindspore.programs.demo_train import build as build_demo
from ms_recover.mindspore.state import MindSporeState
from ms_recover.mindspore.step import DataParallelStep
from ms_recover.worker.sampler import make_dataset, shard_indices

MODES = ("plain", "session", "interleaved")
Flat = NDArray[np.float32]
_HIDDEN = {"width": 0}  # 0: the demo's MLP


def use_hidden(width: int) -> None:
    """Make :func:`build` return the wider MLP 64-H-H-8 (0: the demo's MLP)."""
    _HIDDEN["width"] = width


def build() -> tuple[nn.Cell, nn.Cell, nn.Optimizer]:
    """The demo's model, or with ``--hidden H`` a wider MLP 64-H-H-8 (same seed, same loss)."""
    width = _HIDDEN["width"]
    if not width:
        return build_demo()
    mindspore.set_seed(SEED)
    net = nn.SequentialCell(
        nn.Dense(IN_DIM, width),
        nn.ReLU(),
        nn.Dense(width, width),
        nn.ReLU(),
        nn.Dense(width, CLASSES),
    )
    loss_fn = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
    return net, loss_fn, nn.Adam(net.trainable_params(), learning_rate=1e-3)


class Data:
    """A rank's batches: the demo's dataset, ``GLOBAL_BATCH`` samples a step over all ranks."""

    def __init__(self, rank: int, world: int) -> None:
        self.x, self.y = make_dataset(SAMPLES, IN_DIM, CLASSES, SEED)
        self.rank, self.world = rank, world

    def batch(self, step: int) -> tuple[Any, Any]:
        idx = shard_indices(step, self.rank, self.world, GLOBAL_BATCH, SAMPLES, SEED)
        return self.x[idx], self.y[idx]


def _plain_block(step: DataParallelStep, data: Data, first: int, n: int) -> list[float]:
    """Per-iteration times of ``n`` plain steps."""
    times, t = [], time.perf_counter()
    for s in range(first, first + n):
        step(*data.batch(s))
        now = time.perf_counter()
        times.append(now - t)
        t = now
    return times


def _session_block(session: Any, step: Callable[..., float], data: Data, n: int) -> list[float]:
    """Per-iteration times of ``n`` steps through ``session.steps``, ``guard`` and commit."""
    times, t = [], time.perf_counter()
    for s in session.steps(session.next_step + n):
        with session.guard():
            step(*data.batch(s))
        now = time.perf_counter()
        times.append(now - t)
        t = now
    # The loop above measured n - 1 full iterations plus the first; the last commit and the
    # safe point that ends the generator ran after the last timestamp: count them too.
    times[-1] += time.perf_counter() - t
    return times


def _link_cpu(rank: int) -> Callable[[], float]:
    thread = next((t for t in threading.enumerate() if t.name == f"ms-recover-link-{rank}"), None)
    if thread is None or thread.ident is None:
        return lambda: float("nan")
    clock = time.pthread_getcpuclockid(thread.ident)
    return lambda: time.clock_gettime(clock)


def _timed(fn: Callable[[Flat], Flat], into: list[float]) -> Callable[[Flat], Flat]:
    def reduce(flat: Flat) -> Flat:
        t = time.perf_counter()
        out = fn(flat)
        into.append(time.perf_counter() - t)
        return out

    return reduce


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--mode", choices=MODES, required=True)
    ap.add_argument("--steps", type=int, default=2000, help="timed steps (per kind)")
    ap.add_argument("--warmup", type=int, default=100)
    ap.add_argument("--out", required=True)
    ap.add_argument("--hidden", type=int, default=0, help="a wider MLP 64-H-H-8 (default: demo)")
    ap.add_argument(
        "--graph-mode", action="store_true", help="GRAPH_MODE; TrainOneStepCell and GraphStep only"
    )
    ap.add_argument(
        "--graph-step",
        action="store_true",
        help="session mode: GraphStep (with --graph-mode) instead of DataParallelStep",
    )
    args = ap.parse_args(argv)
    if args.graph_step and not (args.graph_mode and args.mode == "session"):
        ap.error("--graph-step needs --mode session and --graph-mode")
    use_hidden(args.hidden)
    mode = mindspore.GRAPH_MODE if args.graph_mode else mindspore.PYNATIVE_MODE
    mindspore.set_device("CPU")
    mindspore.set_context(mode=mode)
    net, loss_fn, optimizer = build()
    result: dict[str, Any] = {"mode": args.mode}
    if args.mode == "plain":
        plain = DataParallelStep(net, loss_fn, optimizer)
        data = Data(0, 1)
        _plain_block(plain, data, 0, args.warmup)
        result.update(
            rank=0, world=1, step_times=_plain_block(plain, data, args.warmup, args.steps)
        )
    else:
        import ms_recover

        session = ms_recover.init(state=MindSporeState(net, optimizer))
        data = Data(session.rank, session.world_size)
        reduce_times: list[float] = []
        kind: type[GraphStep] | type[DataParallelStep]
        kind = GraphStep if args.graph_step else DataParallelStep
        # GraphStep's buckets are reduced where they lie (out=); DataParallelStep's flat
        # buffer stays the input of a plain allreduce, as before.
        out = args.graph_step
        step = kind(
            net,
            loss_fn,
            optimizer,
            reduce_fn=_timed(
                lambda f: session.allreduce(f, "mean", out=f if out else None), reduce_times
            ),
        )
        result.update(rank=session.rank, world=session.world_size, graph_step=args.graph_step)
        if args.mode == "session":
            _session_block(session, step, data, args.warmup)
            reduce_times.clear()
            result["step_times"] = _session_block(session, step, data, args.steps)
            result["allreduce_times"] = reduce_times
            result["elements"] = step.num_elements
        else:
            assert isinstance(step, DataParallelStep)  # --graph-step is session mode only
            result.update(_interleave(session, step, data, args, (net, loss_fn, optimizer)))
        _write(args.out, result)  # before finish(): the job ends, and its agent kills its ranks
        session.finish()
        return 0
    _write(args.out, result)
    return 0


def _write(out: str, result: dict[str, Any]) -> None:
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, f"{result['mode']}_{result['rank']}.json"), "w") as fh:
        json.dump(result, fh)


def _interleave(
    session: Any,
    step: DataParallelStep,
    data: Data,
    args: argparse.Namespace,
    model: tuple[Any, Any, Any],
) -> dict[str, Any]:
    """The interleaved job: the GRAPH_MODE arms (:mod:`.overhead_graph`) or the PyNative ones,
    then the direct cost of ms_recover's per-step calls, timed alone."""
    link_cpu = _link_cpu(session.rank)
    steps = session.steps(1 << 62)
    if args.graph_mode:
        got = overhead_graph.interleave(session, steps, step, data, args, model, link_cpu)
    else:
        got = _interleave_pynative(session, steps, step, data, args, link_cpu)
    # The direct cost of ms_recover's per-step calls, isolated from the step: one empty
    # iteration of steps()/guard() (commit and safe point included) and one allreduce call on
    # a buffer of the gradient's size. These commit empty steps, so they come last.
    flat = np.ones(step.num_elements, np.float32)
    got["calls"] = {
        "allreduce_s": _median_call(lambda: session.allreduce(flat, "mean")),
        "loop_s": _median_call(lambda: _empty_iteration(session, steps)),
        # The replica check: a commit every digest_every_steps also digests the whole state
        # (the median above hides it: it is one commit in that many).
        "digest_s": _median_call(session._digest, 200),
        "digest_every_steps": session.config.digest_every_steps,
    }
    steps.close()
    return {**got, "hidden": args.hidden, "graph_mode": args.graph_mode}


def _interleave_pynative(
    session: Any,
    steps: Any,
    step: DataParallelStep,
    data: Data,
    args: argparse.Namespace,
    link_cpu: Callable[[], float],
) -> dict[str, Any]:
    """Alternate single steps of the cell, (a), (a') and (b) on one DataParallelStep (one set
    of graphs), in the order cell, a, a', b and then b, a', a, cell, so that each pair is
    compared both ways round.

    (a) is the step with the identity reduce, called directly; (a') the same with the
    backend's allreduce (``session.comm.allreduce``: the data plane without the session);
    (b) is one iteration of ``session.steps()`` (which commits the previous (b) step and
    passes the safe point) with ``guard()`` and ``session.allreduce`` as the reduce.
    """
    session_reduce = step.reduce_fn
    cell = _train_one_step_cell()
    order = ("cell", "plain", "backend", "session")
    times: dict[str, list[float]] = {kind: [] for kind in order}
    link_s = 0.0
    for i in range(args.warmup + args.steps):
        for kind in order if i % 2 == 0 else order[::-1]:
            cpu0 = link_cpu()
            t = time.perf_counter()
            if kind == "cell":
                x, y = data.batch(i)
                # The loss is not read: in PyNative a jit graph's loss read stalls 10-40 ms
                # while the heartbeat thread runs, which would flatter every arm against it.
                cell(mindspore.Tensor(x), mindspore.Tensor(y))
            elif kind == "plain":
                step.reduce_fn = _identity
                step(*data.batch(i))
            elif kind == "backend":
                step.reduce_fn = lambda flat: session.comm.allreduce(flat, "mean")
                step(*data.batch(i))
            else:
                step.reduce_fn = session_reduce
                s = next(steps)
                with session.guard():
                    step(*data.batch(s))
            dt = time.perf_counter() - t
            if i >= args.warmup:
                times[kind].append(dt)
                if kind == "session":
                    link_s += link_cpu() - cpu0
    return {
        **{f"{kind}_times": t for kind, t in times.items()},
        "graph_elements": step.num_elements,
        "link_cpu_s": link_s,
    }


def _train_one_step_cell() -> Any:
    """Plain MindSpore: ``nn.TrainOneStepCell`` on its own copy of the demo model, one graph."""
    net, loss_fn, optimizer = build()
    cell = nn.TrainOneStepCell(nn.WithLossCell(net, loss_fn), optimizer)
    if mindspore.get_context("mode") != mindspore.GRAPH_MODE:  # GRAPH_MODE compiles the cell
        cell.construct = mindspore.jit(cell.construct)
    return cell


def _empty_iteration(session: Any, steps: Any) -> None:
    next(steps)
    with session.guard():
        pass


def _median_call(fn: Callable[[], Any], n: int = 2000) -> float:
    times = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    times.sort()
    return times[n // 2]


def _identity(flat: Flat) -> Flat:
    return flat


if __name__ == "__main__":
    raise SystemExit(main())
