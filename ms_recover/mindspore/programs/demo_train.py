"""The demo's training program: a small MLP trained data-parallel with real MindSpore.

Each rank computes forward, backward and the Adam update in MindSpore (jit-compiled); the
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
from ms_recover.mindspore.graphstep import GraphStep
from ms_recover.mindspore.state import MindSporeState
from ms_recover.mindspore.step import DataParallelStep
from ms_recover.testing.worlds import WorldSchedule
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
        "--graph-step",
        action="store_true",
        help="run each step as one compiled graph with the allreduce inside it (GraphStep, in "
        "GRAPH_MODE) instead of DataParallelStep's two graphs; same bits",
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

    kind = GraphStep if args.graph_step else DataParallelStep
    step = kind(net, loss_fn, optimizer, reduce_fn=reduce)
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
            if args.step_time:
                time.sleep(args.step_time)
    state = MindSporeState(net, optimizer).state_dict()
    write_rank_record(args.out, session, state, losses)
    session.finish()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
