"""A MindFormers-style ``Model.train`` job under MindSpore's own TFT, on CPU with the kit.

Run as a rank of a local msrun-style cluster (MS_ROLE, MS_SCHED_*, MS_WORKER_NUM, MS_NODE_ID)
with ``ms-recover shim-path`` first on PYTHONPATH, ``MS_ENABLE_TFT`` and ``MS_TFT_IP`` /
``MS_TFT_PORT``. Data parallel: a small dense network, momentum SGD, gradients reduced by
MindSpore's own in-graph AllReduce on mccl.

``--fault RANK:STEP:KIND`` (KIND ``hcce`` or ``unknown``) prelocks every rank at STEP (the
survivors wait in ``tft_pause_train``: on CPU a survivor inside an mccl collective cannot be
freed) and, on RANK, zeroes the weights after STEP's update and raises the error from the step.

Each rank appends ``{"step", "sha256"}`` per finished step to ``OUT/steps_R.jsonl`` and writes
``OUT/rank_R.json`` (final SHA-256 of every parameter, repair step, handler trace) at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from typing import Any

import mindspore as ms
import numpy as np
from mindspore import nn
from mindspore.communication import get_rank, init
from mindspore.train import Model
from mindspore.train.callback import Callback

from ms_recover.config import JobConfig
from ms_recover.worker.bootstrap import make_backend
from ms_recover.worker.repair import sha256_of
from tests.kit import mindio_kit as kit

IN_DIM, OUT_DIM, SAMPLES, BATCH = 16, 4, 512, 16


class Net(nn.Cell):  # type: ignore[misc]
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Dense(IN_DIM, 32, weight_init="normal")
        self.relu = nn.ReLU()
        self.fc2 = nn.Dense(32, OUT_DIM, weight_init="normal")

    def construct(self, x: Any) -> Any:
        return self.fc2(self.relu(self.fc1(x)))


class Fault(Callback):  # type: ignore[misc]
    """Before the TFT callback: on the faulty rank, damage the state and fail the step."""

    def __init__(self, rank: int, step: int, kind: str, net: nn.Cell) -> None:
        super().__init__()
        self.rank, self.step, self.kind, self.net = rank, step, kind, net
        self.fired = False

    def on_train_step_end(self, run_context: Any) -> None:
        cb = run_context.original_args()
        if self.fired or get_rank() != self.rank or cb.cur_step_num != self.step:
            return
        self.fired = True
        for p in self.net.trainable_params():
            p.set_data(ms.Tensor(np.zeros(p.shape, np.float32)))
        if self.kind == "hcce":
            raise RuntimeError(f"HCCEError: injected link failure at step {self.step}")
        raise RuntimeError(f"injected unknown error at step {self.step}")


class Record(Callback):  # type: ignore[misc]
    """After the TFT callback: the state digest of every finished step."""

    def __init__(self, net: nn.Cell, path: str) -> None:
        super().__init__()
        self.net, self.path = net, path

    def on_train_step_end(self, run_context: Any) -> None:
        step = run_context.original_args().cur_step_num
        with open(self.path, "a") as fh:
            fh.write(json.dumps({"step": step, "sha256": sha256_of(kit.net_params(self.net))}))
            fh.write("\n")


def dataset(rank: int, world: int) -> Any:
    rng = np.random.default_rng(11)
    x = rng.standard_normal((SAMPLES, IN_DIM)).astype(np.float32)
    y = rng.integers(0, OUT_DIM, SAMPLES).astype(np.int32)
    ds = ms.dataset.NumpySlicesDataset(
        {"x": x, "y": y}, shuffle=False, num_shards=world, shard_id=rank
    )
    return ds.batch(BATCH, drop_remainder=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--fault", default="", help="RANK:STEP:KIND (hcce or unknown)")
    ap.add_argument("--ckpt", default="", help="TrainFaultTolerance ckpt_save_path")
    args = ap.parse_args()
    ms.set_device("CPU")
    ms.set_context(mode=ms.GRAPH_MODE)
    if os.environ.get("MS_ROLE") == "MS_SCHED":
        init()  # serves the cluster; MindSpore ends the process when the workers have left
        return 0
    ms.set_seed(5)
    init()
    rank, world = get_rank(), int(os.environ["MS_WORKER_NUM"])
    ms.set_auto_parallel_context(parallel_mode="data_parallel", gradients_mean=True)
    cfg = JobConfig.from_env()
    kit.install(rank, make_backend(cfg, rank))
    net = Net()
    opt = kit.cpu_optimizer_wrapper(nn.Momentum)(net.trainable_params(), 0.05, 0.9)
    model = Model(net, nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean"), opt)
    os.makedirs(args.out, exist_ok=True)
    tft = kit.CpuTrainFaultTolerance(ckpt_save_path=args.ckpt or os.path.join(args.out, "ckpt"))
    from ms_recover.integrations.mindio import framework

    proc = framework.STATE.processor
    assert proc is not None
    callbacks: list[Callback] = []
    if args.fault:
        frank, fstep, kind = args.fault.split(":")
        proc.set_limit_step(int(fstep))
        callbacks.append(Fault(int(frank), int(fstep), kind, net))
    callbacks += [tft, kit.SafePoint(), Record(net, os.path.join(args.out, f"steps_{rank}.jsonl"))]
    foreign = kit.foreign_handlers()
    controller_here = framework.STATE.controller is not None  # gone once training ended
    started = time.time()
    model.train(1, dataset(rank, world), callbacks=callbacks, dataset_sink_mode=False)
    record = {
        "rank": rank,
        "sha256": sha256_of(kit.net_params(net)),
        "repair_step": proc.repair_step,
        "trace": proc.trace,
        "foreign_handlers": foreign,
        "controller_here": controller_here,
        "lifts": list(kit.LIFTS),
        "train_s": time.time() - started,
    }
    with open(os.path.join(args.out, f"rank_{rank}.json"), "w") as fh:
        json.dump(record, fh)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
