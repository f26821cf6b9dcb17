"""A training program on the ``Model.train`` path: :func:`ms_recover.mindspore.fit.fit`.

The same MLP, optimizer and seed as :mod:`ms_recover.mindspore.programs.demo_train`, trained with
``mindspore.train.Model`` and a user callback instead of a hand-written loop. At the end each rank
writes ``OUT/rank_R.json`` in demo_train's format (SHA-256 of the whole state, committed step,
per-step losses), plus ``view``: the (cur_epoch_num, cur_step_num) a user callback saw at each
step, so a recovered run can be compared with an uninterrupted one bit for bit, ``skipped``:
the step ranges this rank received by repair instead of running (``Session.skipped``), and
``graphs``: how many graphs the process had compiled when training began, after its first step
and at the end (a pre-warmed spare compiled its graphs before it took the rank:
``init(warm_up=fit_warm_up(...))``).

    python -m tests.kit.fit_train --epochs 3 --samples 512 --out /tmp/run
"""

from __future__ import annotations

import argparse
import time

import mindspore
from mindspore.graph.api import ms_compile_cache
from mindspore.train import Callback, Model, RunContext

import ms_recover
from ms_recover.mindspore.fit import fit, fit_warm_up
from ms_recover.mindspore.programs.demo_train import CLASSES, GLOBAL_BATCH, IN_DIM, SEED, build
from ms_recover.mindspore.sharded import ShardedArrays
from ms_recover.mindspore.state import MindSporeState
from ms_recover.worker.record import write_rank_record
from ms_recover.worker.sampler import make_dataset


def compiled_graphs() -> int:
    """Graphs ``mindspore.jit`` compiled in this process so far (MindSpore 2.10's cache of them)."""
    return len(ms_compile_cache)


class StepRecorder(Callback):  # type: ignore[misc]
    """A user callback: records each step's local loss and what ``cb_params`` said about it,
    and the graphs compiled before training, after the first step and by the last."""

    def __init__(self, step_time: float = 0.0) -> None:
        self.step_time = step_time
        self.losses: dict[int, float] = {}
        self.view: dict[int, tuple[int, int]] = {}
        self.graphs: dict[str, int] = {}

    def on_train_begin(self, run_context: RunContext) -> None:
        self.graphs.setdefault("at_start", compiled_graphs())

    def on_train_step_end(self, run_context: RunContext) -> None:
        params = run_context.original_args()
        step = params.cur_step_num - 1  # global and 0-based
        self.losses[step] = float(params.net_outputs.asnumpy())
        self.view[step] = (params.cur_epoch_num, params.cur_step_num)
        self.graphs.setdefault("after_first_step", compiled_graphs())
        self.graphs["at_end"] = compiled_graphs()
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
    mindspore.set_device("CPU")
    mindspore.set_context(mode=mindspore.PYNATIVE_MODE)
    net, loss_fn, optimizer = build()
    model = Model(net, loss_fn=loss_fn, optimizer=optimizer)
    x, y = make_dataset(args.samples, IN_DIM, CLASSES, SEED)
    data = ShardedArrays(x, y, global_batch=GLOBAL_BATCH, seed=SEED)
    # A pre-warmed spare compiles fit's step on the first batch before it waits for a rank.
    session = ms_recover.init(
        state=MindSporeState(net, optimizer), warm_up=fit_warm_up(model, data)
    )
    recorder = StepRecorder(args.step_time)
    result = fit(model, args.epochs, data, callbacks=[recorder], session=session)
    state = MindSporeState(net, optimizer).state_dict()
    write_rank_record(
        args.out,
        session,
        state,
        recorder.losses,
        segments=result.segments,
        view={str(k): v for k, v in sorted(recorder.view.items())},
        graphs=recorder.graphs,
    )
    session.finish()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
