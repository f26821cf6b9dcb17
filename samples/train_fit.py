"""A MindSpore ``Model.train`` script that survives rank and node failures with ms_recover.

The ``Model.train`` counterpart of ``train.py``: the same model and data, trained by
``ms_recover.mindspore.fit`` in place of ``model.train(...)``. ``fit`` reports every step, stops
at a step boundary when the manager asks, and enters ``Model.train`` again at the resume step.
Launched on every node by ``ms-recover agent -- python train_fit.py``; run alone
(``python train_fit.py``) it trains as a plain single-process job.

``fit`` runs in PyNative mode, without dataset sinking, AMP or loss scaling (see the docstring
of ``ms_recover/mindspore/fit.py``).
"""

import argparse

import mindspore
from mindspore import nn
from mindspore.train import Callback, Model

import ms_recover
from ms_recover.mindspore import MindSporeState, ShardedArrays, fit, fit_warm_up

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=3)
parser.add_argument("--global-batch", type=int, default=64)
args = parser.parse_args()

mindspore.set_device("CPU")
mindspore.set_context(mode=mindspore.PYNATIVE_MODE)
mindspore.set_seed(0)  # every rank starts from the same weights
net = nn.SequentialCell(nn.Dense(32, 64), nn.ReLU(), nn.Dense(64, 4))
loss_fn = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
optimizer = nn.Adam(net.trainable_params(), learning_rate=1e-3)
model = Model(net, loss_fn=loss_fn, optimizer=optimizer)

x, y = ms_recover.make_dataset(4096, 32, 4, seed=0)
# Each rank's batches are a pure function of (step, rank, world): a resumed rank reads what an
# uninterrupted run would.
data = ShardedArrays(x, y, global_batch=args.global_batch, seed=0)


class PrintLoss(Callback):
    """A user callback, as with model.train: it sees global step numbers."""

    def on_train_step_end(self, run_context):
        params = run_context.original_args()
        step = params.cur_step_num - 1
        if session.rank == 0 and step % 50 == 0:
            print(f"step {step} loss {float(params.net_outputs.asnumpy()):.4f}", flush=True)


# Join the job. A restarted rank returns from here with its state repaired from a replica; a
# pre-warmed spare (`ms-recover agent --spares 1`) compiles fit's step before it waits.
session = ms_recover.init(state=MindSporeState(net, optimizer), warm_up=fit_warm_up(model, data))
fit(model, args.epochs, data, callbacks=[PrintLoss()], session=session)
session.finish()
