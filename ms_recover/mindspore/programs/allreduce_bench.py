"""One process of the MindSpore CPU cluster that ``ms-recover bench allreduce`` times.

:mod:`ms_recover.bench.mscluster` starts this program the way msrun would, once as the
scheduler and once per worker. Both call ``mindspore.set_device("CPU")`` and
``mindspore.communication.init()`` (backend mccl). The scheduler serves the cluster inside
``init()`` and exits when the workers have left.

A worker (rank ``MS_NODE_ID``) contributes ``rank + 1``. For each element count it runs one
warm-up ``ops.AllReduce()`` (sum) and checks that every element of the result is
``world * (world + 1) / 2``. It then runs ``--repeats`` timed calls, each after a barrier. A
timed call ends when ``asnumpy()`` returns: that waits for the result, and on CPU the array
shares the tensor's memory, so no copy is timed. The barrier is a one-element AllReduce,
because ``ops.Barrier`` is Ascend only. A last barrier after the report keeps a rank from
leaving while a peer's last AllReduce still needs it.

Events go to ``<out>/rank-<r>.jsonl``, one JSON object a line (:func:`event_line`, the format
:func:`ms_recover.bench.mscluster.parse_progress` reads): ``formed``, then ``result`` or
``error``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable
from typing import Any, TextIO

import mindspore
import numpy as np
from mindspore import Tensor, ops
from mindspore.communication import get_group_size, get_rank, init

from ms_recover import env as E


def event_line(event: str, **fields: Any) -> str:
    """One line of this worker's event file."""
    return json.dumps({"event": event, **fields}, sort_keys=True) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m ms_recover.mindspore.programs.allreduce_bench")
    p.add_argument("--counts", type=int, nargs="+", required=True, help="float32 elements")
    p.add_argument("--repeats", type=int, required=True, help="timed calls per count")
    p.add_argument("--out", required=True, help="directory for rank-<r>.jsonl")
    args = p.parse_args(argv)
    mindspore.set_device("CPU")
    return serve(
        args.out,
        lambda rank, world: {
            str(n): _time_allreduce(n, rank, world, args.repeats) for n in args.counts
        },
    )


def serve(
    out: str,
    work: Callable[[int, int], dict[str, list[float]]],
    joined: Callable[[], None] | None = None,
) -> int:
    """One process of a MindSpore CPU cluster program (this one, ``msrun_step_bench``).

    The scheduler serves the cluster inside ``init()`` and MindSpore ends it when the workers
    have left. A worker joins, calls ``joined`` (a context to set once the cluster formed),
    reports ``formed``, runs ``work(rank, world)`` (times by element count) and reports
    ``result``, or ``error`` with the first line of the reason (the traceback is in its log).
    """
    if os.environ.get(E.ROLE) == E.ROLE_SCHED:
        init()  # serves the cluster; MindSpore ends the process when the workers have left
        return 0
    node = int(os.environ[E.NODE_ID])
    with open(os.path.join(out, f"rank-{node}.jsonl"), "a", encoding="utf-8") as events:
        try:
            init()
            rank, world = get_rank(), get_group_size()
            if rank != node:
                raise RuntimeError(f"MindSpore gave rank {rank} to MS_NODE_ID={node}")
            if joined is not None:
                joined()
            _emit(events, "formed", rank=rank, world=world)
            _emit(events, "result", rank=rank, world=world, times=work(rank, world))
        except Exception as exc:  # the parent reads the reason; the traceback is in the log
            first = (str(exc).strip().splitlines() or [""])[0]
            _emit(events, "error", error=f"{type(exc).__name__}: {first}"[:500])
            raise
    # Leaving while a peer still waits for the acknowledgements of its last AllReduce's sends
    # fails that AllReduce on the peer (mccl: "RingAllReduce wait sending ... failed"). Once
    # this barrier returns, every rank has finished its timed calls and reported.
    _barrier()
    return 0


def _time_allreduce(count: int, rank: int, world: int, repeats: int) -> list[float]:
    """Seconds of each of ``repeats`` sum-AllReduces of ``count`` float32, after a checked one."""
    allreduce = ops.AllReduce()
    x = Tensor(np.full(count, rank + 1, dtype=np.float32))
    _check(allreduce(x).asnumpy(), world)
    times = []
    for _ in range(repeats):
        _barrier()
        start = time.perf_counter()
        allreduce(x).asnumpy()
        times.append(time.perf_counter() - start)
    return times


def _barrier() -> None:
    """Returns once every rank has called it: a one-element AllReduce, waited for."""
    ops.AllReduce()(Tensor(np.ones(1, dtype=np.float32))).asnumpy()


def _check(out: Any, world: int) -> None:
    expected = world * (world + 1) / 2
    bad = np.flatnonzero(out != expected)
    if bad.size:
        i = int(bad[0])
        raise RuntimeError(
            f"AllReduce of {out.size} elements is wrong at {bad.size} of them; element {i} "
            f"is {out[i]}, expected {expected}"
        )


def _emit(events: TextIO, event: str, **fields: Any) -> None:
    events.write(event_line(event, **fields))
    events.flush()


if __name__ == "__main__":
    sys.exit(main())
