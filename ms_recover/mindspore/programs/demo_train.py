"""The demo's training program: a small MLP trained data-parallel with real MindSpore.

Each rank computes forward, backward and the Adam update in MindSpore (jit-compiled
``DataParallelStep`` in PyNative; ``--graph-step`` for one GRAPH_MODE graph, ``GraphStep``); the
gradients are averaged over the global batch by ms_recover's host allreduce; samples are
chosen by (step, position in the data-parallel world, its size), so the math survives an
elastic shrink. At the end each rank writes ``OUT/rank_R.json`` with the SHA-256 of its
whole state (weights and optimizer moments), so runs can be compared bit for bit.

    python -m ms_recover.mindspore.programs.demo_train --steps 40 --out /tmp/run
"""

from __future__ import annotations

import argparse
import os
import time

import mindspore
import numpy as np
from mindspore import nn
from numpy.typing import NDArray

import ms_recover
from ms_recover.env import RANK_SIZE
from ms_recover.localrun.worlds import WorldSchedule
from ms_recover.mindspore.graphstep import GraphStep
from ms_recover.mindspore.state import MindSporeState
from ms_recover.mindspore.step import DataParallelStep
from ms_recover.worker.record import write_rank_record
from ms_recover.worker.sampler import make_dataset, split_indices

IN_DIM, HIDDEN, CLASSES, SAMPLES, GLOBAL_BATCH, SEED = 64, 128, 8, 8192, 64, 1234


def build() -> tuple[nn.Cell, nn.Cell, nn.Optimizer]:
    """The same initial weights in every process (seeded)."""
    mindspore.set_seed(SEED)
    net = nn.SequentialCell(nn.Dense(IN_DIM, HIDDEN), nn.ReLU(), nn.Dense(HIDDEN, CLASSES))
    loss_fn = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
    return net, loss_fn, nn.Adam(net.trainable_params(), learning_rate=1e-3)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--out", required=True)
    ap.add_argument(
        "--step-time", type=float, default=0.0, help="extra seconds per step, to stretch a demo run"
    )
    ap.add_argument(
        "--slices",
        type=int,
        default=1,
        help="spend --step-time in this many short sleeps (device work as short kernels: a "
        "rank stopped part of the time takes longer over them, as on a slow device)",
    )
    steps = ap.add_mutually_exclusive_group()
    steps.add_argument(
        "--graph-step",
        dest="graph_step",
        action="store_true",
        default=False,
        help="run each step as one compiled graph with the allreduce inside it (GraphStep, in "
        "GRAPH_MODE, on_failure='skip') instead of DataParallelStep's two graphs; same bits",
    )
    steps.add_argument(
        "--dp-step",
        dest="graph_step",
        action="store_false",
        help="DataParallelStep's two graphs in PyNative (the default)",
    )
    args = ap.parse_args(argv)
    # GraphStep runs in GRAPH_MODE: in PyNative, waiting for a jit graph's loss stalls for
    # 10-40 ms whenever another Python thread (the session's heartbeat) wakes up.
    mode = mindspore.GRAPH_MODE if args.graph_step else mindspore.PYNATIVE_MODE
    mindspore.set_device("CPU")
    mindspore.set_context(mode=mode)
    net, loss_fn, optimizer = build()
    share = {"n": 0, "step": 0}  # this rank's samples in the current step, and the step

    def reduce(flat: NDArray[np.float32]) -> NDArray[np.float32]:
        # Each rank's mean gradient weighted by its share of the global batch, then summed:
        # the global-batch mean, whatever the (elastic) number of ranks.
        scaled = flat * np.float32(share["n"] / GLOBAL_BATCH)
        return worlds.allreduce(share["step"], scaled, "sum")

    step: GraphStep | DataParallelStep
    if args.graph_step:
        # "skip": a reduction interrupted by a peer's failure skips the optimizer inside the
        # graph; "abort" would fail the graph, which MindSpore answers with a fixed 3 s wait
        # and a recompile on every survivor (measured: MTTR 6.2 s instead of a few tenths).
        step = GraphStep(net, loss_fn, optimizer, reduce_fn=reduce, on_failure="skip")
    else:
        step = DataParallelStep(net, loss_fn, optimizer, reduce_fn=reduce)
    x_all, y_all = make_dataset(SAMPLES, IN_DIM, CLASSES, SEED)

    def warm_up() -> None:
        # A spare compiles on the batch shape of a rank of the whole world (its environment
        # has the job's RANK_SIZE); a rank of a shrunk world compiles its shape when it runs.
        idx = split_indices(0, 0, int(os.environ.get(RANK_SIZE, "1")), GLOBAL_BATCH, SAMPLES, SEED)
        step.warm_up(x_all[idx], y_all[idx])

    session = ms_recover.init(state=MindSporeState(net, optimizer), warm_up=warm_up)
    worlds = WorldSchedule.from_env(session)  # only a reference run of an elastic one has one
    losses: dict[int, float] = {}
    for s in session.steps(args.steps):
        with session.guard():
            idx = split_indices(s, *worlds.where(s), GLOBAL_BATCH, SAMPLES, SEED)
            share["n"], share["step"] = len(idx), s
            losses[s] = step(x_all[idx], y_all[idx])
            for _ in range(max(1, args.slices) if args.step_time else 0):
                time.sleep(args.step_time / max(1, args.slices))
    state = MindSporeState(net, optimizer).state_dict()
    write_rank_record(args.out, session, state, losses)
    session.finish()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
