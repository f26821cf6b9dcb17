"""The GRAPH_MODE arms of the overhead benchmark's interleaved job (``--graph-mode``).

Every arm is one training step on ONE model, the session's (its Parameters and the
optimizer's moments are the same memory for every arm), on the same batches; ``graph``,
``gcomm`` and ``gsession`` are ONE GraphStep (one compiled graph) whose reduce is switched
before each arm's steps, every other arm its own graph:

* ``cell``: MindSpore's own ``nn.TrainOneStepCell`` (GRAPH_MODE compiles it whole), what a
  user runs without ms_recover; every row is relative to it;
* ``null``: a second, identical ``TrainOneStepCell`` (its own graph): reads about 0, and
  shows what the method itself resolves;
* ``plain``: ``DataParallelStep`` with the identity reduce (the demo's size only);
* ``floor``: a ``TrainOneStepCell`` whose grad_reducer is GraphStep's op with an empty body;
* ``graph``: :class:`GraphStep`, identity reduce;
* ``gskip``: GraphStep with ``on_failure="skip"``, identity reduce;
* ``gcomm``: GraphStep reducing with the backend's allreduce directly (no session);
* ``gfresh``: ``graph`` on the batches ``gsession`` takes, a new one on every call (the arms
  above repeat their untimed step's batch; ``gsession`` cannot: each of its calls is the
  session's next step), so ``gsession`` - ``gfresh`` is the session alone;
* ``gsession``: GraphStep under ``session.steps()`` / ``guard()`` with
  ``session.allreduce(flat, "mean", out=flat)`` (the op path of a many-rank job).

Each round runs the arms in a fresh random order (seeded by the round: the same on every
rerun), so no arm always follows the same one; each arm runs two steps a round and only the
second is timed, so every arm, the plain cell included, is timed right after a step of its own
graph, never straight after another arm's. Every arm returns once its step has finished (the
loss is read).

Why one model and not a copy per arm: where a copy's buffers land in memory moves its step
time by itself. Identical TrainOneStepCells on three copies of the wide MLP differed by 5-18 %
(paired, this 2-core host, load 3-4), on one shared model by 1-2.5 %; the targets are 2 and
10 %. Why one GraphStep for (g), (gc) and (gb): the same holds for a graph's own buffers.
Two identical GraphSteps on the demo MLP differed by 6-7 % of its step (117 and 134 us, paired,
in one process), more than the session costs, so (gb) - (g) on two graphs measured mostly
where their buffers landed; on one graph it is the reduction and the session alone.
"""

from __future__ import annotations

import argparse
import random
import time
from collections.abc import Callable
from typing import Any

import mindspore
import numpy as np
from mindspore import nn
from numpy.typing import NDArray

from ms_recover.mindspore.graphstep import GraphStep, floor_cell
from ms_recover.mindspore.step import DataParallelStep

Flat = NDArray[np.float32]
ORDER_SEED = 13


def interleave(
    session: Any,
    steps: Any,
    step: DataParallelStep,
    data: Any,
    args: argparse.Namespace,
    model: tuple[Any, Any, Any],
    link_cpu: Callable[[], float],
) -> dict[str, Any]:
    """Run ``args.warmup`` untimed and ``args.steps`` timed rounds of every arm; return each
    arm's timed steps (``<arm>_times``) and the heartbeat thread's CPU over the gsession
    steps. ``steps``: the running ``session.steps()``; ``model``: ``(net, loss_fn,
    optimizer)``, the session's, which ``step`` trains too."""
    net, loss_fn, optimizer = model

    def session_reduce(flat: Flat) -> Flat:
        return session.allreduce(flat, "mean", out=flat)  # type: ignore[no-any-return]

    def comm_reduce(flat: Flat) -> Flat:
        return session.comm.allreduce(flat, "mean", out=flat)  # type: ignore[no-any-return]

    shared = GraphStep(*model)
    graphs = {
        "graph": shared,
        "gskip": GraphStep(*model, on_failure="skip"),
        "gcomm": shared,
        "gfresh": shared,
        "gsession": shared,
    }
    reduces = {
        "graph": _identity,
        "gcomm": comm_reduce,
        "gfresh": _identity,
        "gsession": session_reduce,
    }
    fresh = [0]  # gfresh's batches: the steps the session hands out, in the same order
    cells = {
        "cell": nn.TrainOneStepCell(nn.WithLossCell(net, loss_fn), optimizer),
        "null": nn.TrainOneStepCell(nn.WithLossCell(net, loss_fn), optimizer),
        "floor": floor_cell(*model),
    }
    step.reduce_fn = _identity

    def run(kind: str, i: int) -> None:
        if kind in cells:
            x, y = data.batch(i)
            loss = cells[kind](mindspore.Tensor(x), mindspore.Tensor(y))
            float(loss.asnumpy())  # a user's loop: no ms_recover call (not even device_sync)
        elif kind == "gsession":
            s = next(steps)
            with session.guard():
                graphs[kind](*data.batch(s))
        elif kind == "gfresh":
            graphs[kind](*data.batch(fresh[0]))
            fresh[0] += 1
        elif kind == "plain":
            step(*data.batch(i))
        else:
            graphs[kind](*data.batch(i))

    order = ["cell", "null", "floor", "graph", "gskip", "gcomm", "gfresh", "gsession"]
    if not args.hidden:
        order.insert(2, "plain")  # DataParallelStep too at the demo's size, for the comparison
    times: dict[str, list[float]] = {kind: [] for kind in order}
    link_s = 0.0
    for i in range(args.warmup + args.steps):
        random.Random(ORDER_SEED * 1_000_003 + i).shuffle(order)
        for kind in order:
            if kind in reduces:
                shared.reduce_fn = reduces[kind]
            run(kind, i)  # untimed: the arm's own model and graph are warm again
            cpu0 = link_cpu()
            t = time.perf_counter()
            run(kind, i)
            dt = time.perf_counter() - t
            if i >= args.warmup:
                times[kind].append(dt)
                if kind == "gsession":
                    link_s += link_cpu() - cpu0
    shared.close()
    graphs["gskip"].close()
    return {
        **{f"{kind}_times": t for kind, t in times.items()},
        "graph_elements": graphs["graph"].num_elements,
        "link_cpu_s": link_s,
    }


def _identity(flat: Flat) -> Flat:
    return flat
