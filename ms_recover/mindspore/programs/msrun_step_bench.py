"""One process of ``bench overhead``'s msrun baseline: MindSpore's own data-parallel step.

What a user runs instead of ms_recover on several ranks: msrun's cluster (formed here by
:mod:`ms_recover.bench.mscluster` with msrun's environment: a scheduler and one process per
rank), ``mindspore.communication.init()`` (mccl on CPU), ``set_auto_parallel_context(
parallel_mode="data_parallel", gradients_mean=True)`` and a GRAPH_MODE ``nn.TrainOneStepCell``,
which then reduces the gradients inside its graph with MindSpore's ``DistributedGradReducer``
(mccl AllReduce). The model and every rank's batches are those of
:mod:`~ms_recover.mindspore.programs.overhead_train` (the demo MLP, or 64-H-H-8 with
``--hidden H``): the same job as ``bench overhead``'s 2-rank GraphStep run.

Each rank runs ``--warmup`` steps, then times ``--repeats`` steps, each until its loss has been
read (as GraphStep returns). Events go to ``<out>/rank-<r>.jsonl`` in the format
:func:`ms_recover.bench.mscluster.parse_progress` reads: ``formed``, then ``result`` (times
under the gradient's element count, which must be the one ``--counts`` names) or ``error``.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import TextIO

import mindspore
import numpy as np
from mindspore import Tensor, nn, ops
from mindspore.communication import get_group_size, get_rank, init

from ms_recover import env as E
from ms_recover.mindspore.programs import overhead_train
from ms_recover.mindspore.programs.allreduce_bench import event_line


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m ms_recover.mindspore.programs.msrun_step_bench")
    p.add_argument("--counts", type=int, nargs=1, required=True, help="gradient elements")
    p.add_argument("--repeats", type=int, required=True, help="timed steps")
    p.add_argument("--out", required=True, help="directory for rank-<r>.jsonl")
    p.add_argument("--hidden", type=int, default=0, help="a wider MLP 64-H-H-8 (default: demo)")
    p.add_argument("--warmup", type=int, default=50)
    args = p.parse_args(argv)
    mindspore.set_context(mode=mindspore.GRAPH_MODE, device_target="CPU")
    if os.environ.get(E.ROLE) == E.ROLE_SCHED:
        init()  # serves the cluster; MindSpore ends the process when the workers have left
        return 0
    node = int(os.environ[E.NODE_ID])
    with open(os.path.join(args.out, f"rank-{node}.jsonl"), "a", encoding="utf-8") as events:
        try:
            init()
            rank, world = get_rank(), get_group_size()
            if rank != node:
                raise RuntimeError(f"MindSpore gave rank {rank} to MS_NODE_ID={node}")
            mindspore.set_auto_parallel_context(parallel_mode="data_parallel", gradients_mean=True)
            _emit(events, "formed", rank=rank, world=world)
            times = _time_steps(args, rank, world)
            _emit(events, "result", rank=rank, world=world, times={str(args.counts[0]): times})
        except Exception as exc:  # the parent reads the reason; the traceback is in the log
            first = (str(exc).strip().splitlines() or [""])[0]
            _emit(events, "error", error=f"{type(exc).__name__}: {first}"[:500])
            raise
    # As allreduce_bench: leaving while a peer's last AllReduce still needs this rank fails it.
    ops.AllReduce()(Tensor(np.ones(1, dtype=np.float32))).asnumpy()
    return 0


def _time_steps(args: argparse.Namespace, rank: int, world: int) -> list[float]:
    overhead_train.use_hidden(args.hidden)
    net, loss_fn, optimizer = overhead_train.build()
    count = sum(int(np.prod(p.shape)) for p in optimizer.parameters)
    if count != args.counts[0]:
        raise RuntimeError(f"the model has {count} gradient values, not {args.counts[0]}")
    cell = nn.TrainOneStepCell(nn.WithLossCell(net, loss_fn), optimizer)
    data = overhead_train.Data(rank, world)
    times = []
    for i in range(args.warmup + args.repeats):
        t = time.perf_counter()
        x, y = data.batch(i)
        float(cell(Tensor(x), Tensor(y)).asnumpy())
        if i >= args.warmup:
            times.append(time.perf_counter() - t)
    return times


def _emit(events: TextIO, event: str, **fields: object) -> None:
    events.write(event_line(event, **fields))
    events.flush()


if __name__ == "__main__":
    sys.exit(main())
