"""MindSpore integration: the only package of ms_recover that imports MindSpore.

* :class:`~ms_recover.mindspore.state.MindSporeState`: a network's and optimizer's state as
  named arrays, for repair;
* :class:`~ms_recover.mindspore.step.DataParallelStep`: one train step whose gradient allreduce
  runs through ms_recover's backend (for a hand-written loop);
* :class:`~ms_recover.mindspore.graphstep.GraphStep`: the same step as one compiled graph, the
  reduction a custom op inside it (same arguments, same bits);
* :func:`~ms_recover.mindspore.fit.fit`: the same for ``mindspore.train.Model.train`` users,
  with :class:`~ms_recover.mindspore.sharded.ShardedArrays` to position data by (step, rank, world),
  and :func:`~ms_recover.mindspore.fit.fit_warm_up` to compile a spare's step before it waits.
"""

from ms_recover.mindspore.fit import DataParallelTrainCell, FitResult, fit, fit_warm_up
from ms_recover.mindspore.graphstep import GraphStep
from ms_recover.mindspore.sharded import STEP_COLUMN, ShardedArrays
from ms_recover.mindspore.state import MindSporeState
from ms_recover.mindspore.step import DataParallelStep

__all__ = [
    "STEP_COLUMN",
    "DataParallelStep",
    "DataParallelTrainCell",
    "FitResult",
    "GraphStep",
    "MindSporeState",
    "ShardedArrays",
    "fit",
    "fit_warm_up",
]
