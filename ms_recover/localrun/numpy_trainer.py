"""A small deterministic data-parallel trainer in numpy, run as real rank processes.

It exercises the whole recovery path without MindSpore: a softmax classifier trained with
momentum SGD, gradients averaged by the session's allreduce, data positioned by
(step, rank, world). Two uninterrupted runs, or a run recovered from faults, end with
bit-identical weights, which each rank writes to ``OUT/rank_R.npz`` with its SHA-256.

    python -m ms_recover.localrun.numpy_trainer --steps 40 --out /tmp/run [--subgroup]
"""

from __future__ import annotations

import argparse
import atexit
import os
import time
from typing import Any

import numpy as np
from numpy.typing import NDArray

import ms_recover
from ms_recover.errors import RepairError
from ms_recover.localrun.worlds import WorldSchedule
from ms_recover.worker.record import write_rank_record
from ms_recover.worker.sampler import make_dataset, split_indices

IN_DIM, CLASSES, SAMPLES, GLOBAL_BATCH, SEED = 64, 8, 4096, 64, 7


class NumpyModel:
    """Weights, bias and their momentum buffers; implements the StateProvider protocol."""

    def __init__(self, seed: int = SEED, lr: float = 0.1, momentum: float = 0.9) -> None:
        rng = np.random.default_rng(seed)
        self.arrays = {
            "w": (rng.standard_normal((IN_DIM, CLASSES)) * 0.01).astype(np.float32),
            "b": np.zeros(CLASSES, np.float32),
            "m.w": np.zeros((IN_DIM, CLASSES), np.float32),
            "m.b": np.zeros(CLASSES, np.float32),
        }
        self.lr, self.momentum = np.float32(lr), np.float32(momentum)

    def state_dict(self) -> dict[str, NDArray[Any]]:
        return {k: v.copy() for k, v in self.arrays.items()}

    def load_state_dict(self, arrays: dict[str, NDArray[Any]]) -> None:
        if set(arrays) != set(self.arrays):
            raise RepairError(
                f"state names differ: got {sorted(arrays)}, have {sorted(self.arrays)}"
            )
        for name, value in arrays.items():
            mine = self.arrays[name]
            if value.shape != mine.shape or value.dtype != mine.dtype:
                raise RepairError(
                    f"parameter {name!r}: got {value.shape}/{value.dtype}, "
                    f"have {mine.shape}/{mine.dtype}"
                )
        for name, value in arrays.items():
            self.arrays[name][...] = value

    def grads(self, x: NDArray[Any], y: NDArray[Any], global_batch: int) -> NDArray[Any]:
        """This rank's share of the global-batch gradient, flattened ``[w, b, loss]``.

        Each rank contributes sum-over-its-samples / global_batch, so an allreduce SUM gives
        the global mean whatever the number of ranks: the math survives elastic resizing.
        """
        logits = x @ self.arrays["w"] + self.arrays["b"]
        logits -= logits.max(axis=1, keepdims=True)
        p = np.exp(logits)
        p /= p.sum(axis=1, keepdims=True)
        loss = -np.log(p[np.arange(len(y)), y] + np.float32(1e-12)).sum()
        p[np.arange(len(y)), y] -= 1.0
        scale = np.float32(global_batch)
        flat: NDArray[Any] = np.concatenate(
            [(x.T @ p).reshape(-1) / scale, p.sum(axis=0) / scale, [loss / scale]]
        )
        return flat.astype(np.float32)

    def apply(self, flat: NDArray[Any]) -> None:
        split = IN_DIM * CLASSES
        bias = flat[split : split + CLASSES]
        for name, grad in (("w", flat[:split].reshape(IN_DIM, CLASSES)), ("b", bias)):
            buf = self.arrays["m." + name]
            buf *= self.momentum
            buf += grad
            self.arrays[name] -= self.lr * buf


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--out", required=True)
    ap.add_argument("--subgroup", action="store_true", help="also reduce in an even/odd sub-group")
    ap.add_argument("--step-time", type=float, default=0.0, help="extra seconds per step")
    ap.add_argument(
        "--slices",
        type=int,
        default=1,
        help="spend --step-time in this many short sleeps (device work as many short kernels: "
        "a rank stopped part of the time then takes longer, as a slow device would)",
    )
    ap.add_argument(
        "--mark",
        action="store_true",
        help="write the step being run to OUT/step_R at each step (a harness reads when a "
        "fault it injects from outside began)",
    )
    ap.add_argument(
        "--after-finish",
        action="store_true",
        help="write OUT/rank_R.after after session.finish() returns, and OUT/rank_R.atexit "
        "from an atexit handler (a clean end must let both run)",
    )
    ap.add_argument(
        "--no-finish",
        action="store_true",
        help="leave without session.finish(), as a script that forgets it does",
    )
    args = ap.parse_args(argv)
    model = NumpyModel()
    session = ms_recover.init(state=model)
    x_all, y_all = make_dataset(SAMPLES, IN_DIM, CLASSES, SEED)
    rank, world = session.rank, session.world_size
    if args.subgroup and not session.reboot:
        session.comm.create_group("parity0", [r for r in range(world) if r % 2 == 0])
        session.comm.create_group("parity1", [r for r in range(world) if r % 2 == 1])

    losses: dict[int, float] = {}
    worlds = WorldSchedule.from_env(session)  # only a reference run of an elastic one has one

    mark = os.path.join(args.out, f"step_{rank}") if args.mark else ""
    if mark:
        os.makedirs(args.out, exist_ok=True)

    def step_fn(step: int) -> None:
        if mark:
            with open(mark, "w") as fh:
                fh.write(str(step))
        idx = split_indices(step, *worlds.where(step), GLOBAL_BATCH, SAMPLES, SEED)
        grad = worlds.allreduce(step, model.grads(x_all[idx], y_all[idx], GLOBAL_BATCH), "sum")
        losses[step] = float(grad[-1])
        if args.subgroup:
            session.comm.allreduce(np.ones(4, np.float32), "sum", group=f"parity{rank % 2}")
        model.apply(grad)
        for _ in range(max(1, args.slices) if args.step_time else 0):
            time.sleep(args.step_time / max(1, args.slices))  # a workload knob, not a wait

    session.run(step_fn, args.steps)
    os.makedirs(args.out, exist_ok=True)
    arrays: dict[str, Any] = model.arrays  # numpy 2's stubs type savez's keywords narrowly
    np.savez(os.path.join(args.out, f"rank_{rank}.npz"), **arrays)
    write_rank_record(args.out, session, model.arrays, losses, steps=args.steps)
    if args.after_finish:
        atexit.register(_touch, os.path.join(args.out, f"rank_{rank}.atexit"))
    if args.no_finish:
        return 0
    session.finish()
    if args.after_finish:
        _touch(os.path.join(args.out, f"rank_{rank}.after"))
    return 0


def _touch(path: str) -> None:
    with open(path, "w") as fh:
        fh.write(f"{os.getpid()}\n")


if __name__ == "__main__":
    raise SystemExit(main())
