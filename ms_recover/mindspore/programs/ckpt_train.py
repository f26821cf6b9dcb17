"""Rank program of the recovery benchmark's baseline: the demo job, restartable from a checkpoint.

It is :mod:`ms_recover.mindspore.programs.demo_train` (same seeded MLP, data, batch and Adam step,
same launcher and host data plane), plus what a job-level restart needs: rank 0 saves the whole
state (weights and optimizer moments) with ``mindspore.save_checkpoint`` every ``--ckpt-every``
steps, and at start every rank loads the latest checkpoint with ``mindspore.load_checkpoint`` and
continues at the step after it. Each process writes ``OUT/timing_R_PID.json`` once it has
committed its first step: wall-clock times of interpreter start, MindSpore imported, model built,
checkpoint loaded, job joined and first step done.

    python -m ms_recover.bench.ckpt_train --steps 100000 --out OUT --ckpt-dir CKPT

That launcher notes the time of the first line of Python and only then imports this module
(importing the ``ms_recover.mindspore`` package imports MindSpore), so "MindSpore imported"
keeps its meaning. This module is a benchmark's rank program, run only as a process.
"""

from __future__ import annotations

import time

T_START = time.time()  # first line of Python, before any heavy import

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
from typing import Any  # noqa: E402

CKPT_NAME = "latest.ckpt"
STEP_KEY = "bench_step"


def save(mindspore: Any, arrays: dict[str, Any], step: int, ckpt_dir: str) -> None:
    """Write the checkpoint atomically: a reader sees the previous one or this one."""
    tmp = os.path.join(ckpt_dir, f"saving.{os.getpid()}.ckpt")
    mindspore.save_checkpoint(
        [{"name": n, "data": mindspore.Tensor(a)} for n, a in arrays.items()],
        tmp,
        append_dict={STEP_KEY: step},
    )
    os.replace(tmp, os.path.join(ckpt_dir, CKPT_NAME))


def load(mindspore: Any, ckpt_dir: str) -> tuple[dict[str, Any], int]:
    """The latest checkpoint's arrays and step, or ({}, -1) when there is none."""
    path = os.path.join(ckpt_dir, CKPT_NAME)
    if not os.path.exists(path):
        return {}, -1
    params = mindspore.load_checkpoint(path)
    step = int(params.pop(STEP_KEY).asnumpy())
    return {name: p.asnumpy() for name, p in params.items()}, step


def main(argv: list[str] | None = None, started: float = T_START) -> int:
    """Run the program; ``started``: when the process's first line of Python ran."""
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--steps", type=int, default=100_000)
    ap.add_argument("--out", required=True)
    ap.add_argument("--ckpt-dir", required=True)
    ap.add_argument("--ckpt-every", type=int, default=100)
    args = ap.parse_args(argv)
    times = {"start": started}

    import mindspore

    times["imported"] = time.time()
    import ms_recover
    from ms_recover.mindspore.programs.demo_train import (
        CLASSES,
        GLOBAL_BATCH,
        IN_DIM,
        SAMPLES,
        SEED,
        build,
    )
    from ms_recover.mindspore.state import MindSporeState
    from ms_recover.mindspore.step import DataParallelStep
    from ms_recover.worker.sampler import make_dataset, shard_indices

    mindspore.set_device("CPU")
    mindspore.set_context(mode=mindspore.PYNATIVE_MODE)
    net, loss_fn, optimizer = build()
    state = MindSporeState(net, optimizer)
    times["built"] = time.time()
    arrays, loaded = load(mindspore, args.ckpt_dir)
    if arrays:
        state.load_state_dict(arrays)
    times["loaded"] = time.time()
    session = ms_recover.init(state=state)
    if loaded >= 0:
        session.commit(loaded)  # continue at the step after the checkpoint
    times["joined"] = time.time()
    step = DataParallelStep(
        net, loss_fn, optimizer, reduce_fn=lambda flat: session.allreduce(flat, "mean")
    )
    x_all, y_all = make_dataset(SAMPLES, IN_DIM, CLASSES, SEED)
    rank, world = session.rank, session.world_size
    os.makedirs(args.out, exist_ok=True)
    first = True
    for s in session.steps(args.steps):
        with session.guard():
            step(*_batch(x_all, y_all, shard_indices(s, rank, world, GLOBAL_BATCH, SAMPLES, SEED)))
            if rank == 0 and (s + 1) % args.ckpt_every == 0:
                save(mindspore, state.state_dict(), s, args.ckpt_dir)
            if first:
                first = False
                times["first_step"] = time.time()
                _write(
                    args.out,
                    rank,
                    {"rank": rank, "loaded_step": loaded, "first_step": s, "times": times},
                )
    session.finish()
    return 0


def _batch(x_all: Any, y_all: Any, idx: Any) -> tuple[Any, Any]:
    return x_all[idx], y_all[idx]


def _write(out: str, rank: int, record: dict[str, Any]) -> None:
    path = os.path.join(out, f"timing_{rank}_{os.getpid()}.json")
    with open(path + ".tmp", "w") as fh:
        json.dump(record, fh)
    os.replace(path + ".tmp", path)


if __name__ == "__main__":
    raise SystemExit(main())
