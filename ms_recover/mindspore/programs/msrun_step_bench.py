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
import sys
import time

import mindspore
import numpy as np
from mindspore import Tensor, nn

from ms_recover.mindspore.programs import overhead_train
from ms_recover.mindspore.programs.allreduce_bench import serve


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m ms_recover.mindspore.programs.msrun_step_bench")
    p.add_argument("--counts", type=int, nargs=1, required=True, help="gradient elements")
    p.add_argument("--repeats", type=int, required=True, help="timed steps")
    p.add_argument("--out", required=True, help="directory for rank-<r>.jsonl")
    p.add_argument("--hidden", type=int, default=0, help="a wider MLP 64-H-H-8 (default: demo)")
    p.add_argument("--warmup", type=int, default=50)
    args = p.parse_args(argv)
    mindspore.set_device("CPU")
    mindspore.set_context(mode=mindspore.GRAPH_MODE)
    return serve(
        args.out,
        lambda rank, world: {str(args.counts[0]): _time_steps(args, rank, world)},
        lambda: mindspore.set_auto_parallel_context(
            parallel_mode="data_parallel", gradients_mean=True
        ),
    )


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


if __name__ == "__main__":
    sys.exit(main())
