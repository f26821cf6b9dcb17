"""A training program on the ``Model.train`` path: :func:`ms_recover.mindspore.fit.fit`.

The same MLP, optimizer and seed as :mod:`ms_recover.mindspore.programs.demo_train`, trained with
``mindspore.train.Model`` and a user callback instead of a hand-written loop. At the end each rank
writes ``OUT/rank_R.json`` in demo_train's format (SHA-256 of the whole state, committed step,
per-step losses), plus ``view``: the (cur_epoch_num, cur_step_num) a user callback saw at each
step, so a recovered run can be compared with an uninterrupted one bit for bit, and ``skipped``:
the step ranges this rank received by repair instead of running (``Session.skipped``).

    python -m ms_recover.mindspore.programs.fit_train --epochs 3 --samples 512 --out /tmp/run
"""

from __future__ import annotations

import argparse
import time

import mindspore
from mindspore.train import Callback, Model, RunContext

import ms_recover
from ms_recover.mindspore.fit import fit
from ms_recover.mindspore.programs.demo_train import CLASSES, GLOBAL_BATCH, IN_DIM, SEED, build
from ms_recover.mindspore.sharded import ShardedArrays
from ms_recover.mindspore.state import MindSporeState
from ms_recover.worker.record import write_rank_record
from ms_recover.worker.sampler import make_dataset


class StepRecorder(Callback):  # type: ignore[misc]
    """A user callback: records each step's local loss and what ``cb_params`` said about it."""

    def __init__(self, step_time: float = 0.0) -> None:
        self.step_time = step_time
        self.losses: dict[int, float] = {}
        self.view: dict[int, tuple[int, int]] = {}

    def on_train_step_end(self, run_context: RunContext) -> None:
        params = run_context.original_args()
        step = params.cur_step_num - 1  # global and 0-based
        self.losses[step] = float(params.net_outputs.asnumpy())
        self.view[step] = (params.cur_epoch_num, params.cur_step_num)
        if self.step_time:
            time.sleep(self.step_time)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument(
        "--samples",
        type=int,
        default=512,
        help=f"dataset size; steps per epoch = samples // {GLOBAL_BATCH}",
    )
    ap.add_argument("--out", required=True)
    ap.add_argument(
        "--step-time", type=float, default=0.0, help="extra seconds per step, to stretch a demo run"
    )
    args = ap.parse_args(argv)
    mindspore.set_context(mode=mindspore.PYNATIVE_MODE, device_target="CPU")
    net, loss_fn, optimizer = build()
    model = Model(net, loss_fn=loss_fn, optimizer=optimizer)
    session = ms_recover.init(state=MindSporeState(net, optimizer))
    x, y = make_dataset(args.samples, IN_DIM, CLASSES, SEED)
    recorder = StepRecorder(args.step_time)
    result = fit(
        model,
        args.epochs,
        ShardedArrays(x, y, global_batch=GLOBAL_BATCH, seed=SEED),
        callbacks=[recorder],
        session=session,
    )
    state = MindSporeState(net, optimizer).state_dict()
    write_rank_record(
        args.out,
        session,
        state,
        recorder.losses,
        segments=result.segments,
        view={str(k): v for k, v in sorted(recorder.view.items())},
    )
    session.finish()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
