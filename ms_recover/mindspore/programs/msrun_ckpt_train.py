"""Rank program of ``bench recovery``'s msrun baseline: the demo job as plain MindSpore + msrun.

What a user runs instead of ms_recover: ``msrun --worker_num W ... python -m
ms_recover.mindspore.programs.msrun_ckpt_train``. No ms_recover session, shim or manager: the
demo's MLP (same sizes, seed, data, batch and Adam), ``mindspore.communication.init()`` (mccl on
CPU), data-parallel ``nn.TrainOneStepCell`` in GRAPH_MODE (MindSpore inserts its own
``DistributedGradReducer``), and rank 0 saving the whole state (weights and Adam moments) with
``mindspore.save_checkpoint`` every ``--ckpt-every`` steps. At start every rank loads the latest
checkpoint and continues at the step after it.

Files in ``--out`` (every write atomic):

* ``timing_R_PID.json`` once this process committed its first step: ``rank``, ``pid``,
  ``loaded_step`` (-1: none), ``first_step`` and wall times ``start`` / ``first_step``;
* ``progress_R.json`` every ``PROGRESS_EVERY`` steps: ``rank``, ``pid``, ``step``, ``t``.

msrun also runs this module as the cluster's scheduler (``MS_ROLE=MS_SCHED``): it then only
serves the cluster inside ``init()``.
"""

from __future__ import annotations

import time

T_START = time.time()  # first line of Python, before any heavy import

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
from typing import Any  # noqa: E402

# The demo's sizes (ms_recover.mindspore.programs.demo_train; a unit test holds them equal). They
# are repeated, not imported, so this program loads no ms_recover module besides the sampler.
IN_DIM, HIDDEN, CLASSES, SAMPLES, GLOBAL_BATCH, SEED = 64, 128, 8, 8192, 64, 1234
CKPT_NAME = "latest.ckpt"
STEP_KEY = "bench_step"
PROGRESS_EVERY = 10


def write_json(path: str, record: dict[str, Any]) -> None:
    with open(path + ".tmp", "w") as fh:
        json.dump(record, fh)
    os.replace(path + ".tmp", path)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=100_000)
    ap.add_argument("--out", required=True)
    ap.add_argument("--ckpt-dir", required=True)
    ap.add_argument("--ckpt-every", type=int, default=100)
    args = ap.parse_args(argv)

    import mindspore as ms
    from mindspore import nn
    from mindspore.communication import get_group_size, get_rank, init

    from ms_recover.worker.sampler import make_dataset, shard_indices  # numpy only

    ms.set_device("CPU")
    ms.set_context(mode=ms.GRAPH_MODE)
    if os.environ.get("MS_ROLE") == "MS_SCHED":
        init()  # serves the cluster; MindSpore ends the process when the workers have left
        return 0
    init()
    rank, world = get_rank(), get_group_size()
    ms.set_auto_parallel_context(parallel_mode="data_parallel", gradients_mean=True)
    ms.set_seed(SEED)
    net = nn.SequentialCell(nn.Dense(IN_DIM, HIDDEN), nn.ReLU(), nn.Dense(HIDDEN, CLASSES))
    loss_fn = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
    optimizer = nn.Adam(net.trainable_params(), learning_rate=1e-3)
    train = nn.TrainOneStepCell(nn.WithLossCell(net, loss_fn), optimizer)
    ckpt = os.path.join(args.ckpt_dir, CKPT_NAME)
    loaded = -1
    if os.path.exists(ckpt):
        params = ms.load_checkpoint(ckpt)
        loaded = int(params.pop(STEP_KEY).asnumpy())
        ms.load_param_into_net(train, params)
    x_all, y_all = make_dataset(SAMPLES, IN_DIM, CLASSES, SEED)
    os.makedirs(args.out, exist_ok=True)
    pid = os.getpid()
    for s in range(loaded + 1, args.steps):
        idx = shard_indices(s, rank, world, GLOBAL_BATCH, SAMPLES, SEED)
        train(ms.Tensor(x_all[idx]), ms.Tensor(y_all[idx]))
        if rank == 0 and (s + 1) % args.ckpt_every == 0:
            tmp = os.path.join(args.ckpt_dir, f"saving.{pid}.ckpt")
            ms.save_checkpoint(train, tmp, append_dict={STEP_KEY: s})
            os.replace(tmp, ckpt)  # a reader sees the previous checkpoint or this one
        if s == loaded + 1:
            record = {"rank": rank, "pid": pid, "loaded_step": loaded, "first_step": s}
            record["times"] = {"start": T_START, "first_step": time.time()}
            write_json(os.path.join(args.out, f"timing_{rank}_{pid}.json"), record)
        if s % PROGRESS_EVERY == 0:
            write_json(
                os.path.join(args.out, f"progress_{rank}.json"),
                {"rank": rank, "pid": pid, "step": s, "t": time.time()},
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
