"""The model, batches and reduction shared by test_graph_step.py and its GRAPH_MODE child.

Numpy initial weights, so the start depends neither on MindSpore's initialisers nor the mode.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from mindspore import nn

from ms_recover.mindspore.state import MindSporeState
from ms_recover.worker.sampler import make_dataset, shard_indices

X, Y = make_dataset(256, 16, 4, seed=0)


def build() -> tuple[Any, Any, Any]:
    net = nn.SequentialCell(nn.Dense(16, 32), nn.ReLU(), nn.Dense(32, 4))
    opt = nn.Adam(net.trainable_params(), 1e-2)
    state = MindSporeState(net, opt)
    rng = np.random.default_rng(5)
    state.load_state_dict(
        {
            k: (rng.standard_normal(v.shape) * 0.3).astype(v.dtype)
            if k.startswith(("0.", "2."))
            else v
            for k, v in state.state_dict().items()
        }
    )
    return net, nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean"), opt


def batch(step: int) -> tuple[np.ndarray, np.ndarray]:
    idx = shard_indices(step, 0, 1, 32, len(X), seed=0)
    return X[idx], Y[idx]


def scaled(flat: np.ndarray) -> np.ndarray:
    # Not the identity: shows that the op feeds the reduced buffer, not the raw gradients, on.
    return flat * np.float32(0.75)
