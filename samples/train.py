"""A MindSpore training script that survives rank and node failures with ms_recover.

Launched on every node by ``ms-recover agent -- python train.py`` (see train_start.sh).
Run it alone (``python train.py``) and it trains as a plain single-process job.
"""

import argparse
import os

import mindspore
from mindspore import nn

import ms_recover
from ms_recover.mindspore.graphstep import GraphStep
from ms_recover.mindspore.state import MindSporeState
from ms_recover.worker.sampler import make_dataset, shard_indices

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=1000)
parser.add_argument("--global-batch", type=int, default=64)
args = parser.parse_args()

mindspore.set_device("CPU")
mindspore.set_context(mode=mindspore.GRAPH_MODE)
mindspore.set_seed(0)  # every rank starts from the same weights
net = nn.SequentialCell(nn.Dense(32, 64), nn.ReLU(), nn.Dense(64, 4))
loss_fn = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
optimizer = nn.Adam(net.trainable_params(), learning_rate=1e-3)

# One compiled graph per step; the gradient allreduce is a custom op inside it, reducing each
# bucket in place. on_failure="skip": an allreduce interrupted by a peer's failure skips the
# optimizer inside the graph ("abort", the default, fails the graph instead, which MindSpore
# answers with a fixed 3 s wait and a recompile on every surviving rank).
train_step = GraphStep(
    net,
    loss_fn,
    optimizer,
    reduce_fn=lambda grads: session.allreduce(grads, "mean", out=grads),
    on_failure="skip",
)
x, y = make_dataset(4096, 32, 4, seed=0)


def warm_up():
    # Runs only in a pre-warmed spare (`ms-recover agent --spares 1`, or the agent's default
    # standby once a rank showed it has a warm_up) before it waits for a rank: the step
    # compiles now, not during a recovery. Any batch of the real shape will do
    # (the spare's environment has the job's RANK_SIZE); every value is put back afterwards.
    per_rank = args.global_batch // int(os.environ.get("RANK_SIZE", "1"))
    train_step.warm_up(x[:per_rank], y[:per_rank])


# Join the job. A restarted rank returns from here with its state repaired from a replica.
session = ms_recover.init(state=MindSporeState(net, optimizer), warm_up=warm_up)

for step in session.steps(args.steps):  # recovery happens between steps
    with session.guard():  # a step interrupted by a fault is redone after recovery
        idx = shard_indices(step, session.rank, session.world_size, args.global_batch, len(x), 0)
        loss = train_step(x[idx], y[idx])
        if session.rank == 0 and step % 100 == 0:
            print(f"step {step} loss {loss:.4f}", flush=True)
session.finish()
