"""A pre-warmed spare for :func:`~ms_recover.mindspore.fit.fit`: its train cell, compiled ahead.

A spare (``ms-recover agent --spares N``) runs the training script up to ``ms_recover.init()``
and waits there for a rank. With ``init(warm_up=fit_warm_up(model, dataset))`` (``fit`` passes
it itself when it builds the session) the spare builds the
:class:`~ms_recover.mindspore.fit.DataParallelTrainCell` that ``fit`` would build after
``init``, runs :meth:`~ms_recover.mindspore.step.DataParallelStep.warm_up` on one batch of the
data, and keeps the cell here (:class:`PreparedCells`, by ``Model``); once the spare has taken a
rank, ``fit`` trains with that same cell, whose graphs are compiled and warm, so its first step
compiles nothing (``mindspore.jit`` caches a graph per function object and input signature: a
new cell would compile again).

The batch is rank 0's first batch of epoch 0 in the job's full world
(``dataset(0, 0, world_size)``), read from a Dataset object of its own that is then dropped:
``fit`` calls ``dataset`` again for the data it trains on, so the warm-up advances no iterator
``fit`` uses. Only the batch's shapes and dtypes matter; a rank whose batch has another shape
(another rank of an uneven split, a shrunk world) compiles that shape at its first step, as
without a warm-up. ``DataParallelStep.warm_up`` restores every value it touched (parameters,
optimizer moments, MindSpore's RNG) bit for bit.
"""

from __future__ import annotations

import weakref
from typing import Any

import mindspore.dataset as msds
from mindspore import Tensor

from ms_recover.errors import ConfigError
from ms_recover.mindspore.sharded import STEP_COLUMN, DatasetFn


def first_batch(dataset: DatasetFn, world: int) -> tuple[Tensor, ...]:
    """Rank 0's first batch of epoch 0 for a world of ``world``, without the step column.

    Read from a fresh ``dataset(0, 0, world)`` whose iterator is stopped at once; ConfigError
    if that is not a Dataset or yields nothing.
    """
    data = dataset(0, 0, world)
    if not isinstance(data, msds.Dataset):
        raise ConfigError(
            f"dataset(0, 0, {world}) must return a mindspore.dataset.Dataset, "
            f"got {type(data).__name__}"
        )
    names = data.get_col_names()
    rows = data.create_tuple_iterator(num_epochs=1)
    try:
        batch = next(rows, None)
    finally:
        rows.stop()  # end the pipeline's threads: the spare may wait a long time
    if batch is None:
        raise ConfigError(f"dataset(0, 0, {world}) yielded no batch to warm up on")
    return tuple(batch[:-1] if names[-1] == STEP_COLUMN else batch)


class PreparedCells:
    """Train cells compiled ahead by a spare, by ``Model``, until ``fit`` takes them.

    Held weakly: a ``Model`` that is dropped drops its cell. ``take`` hands a cell out once.
    """

    def __init__(self) -> None:
        self._cells: weakref.WeakKeyDictionary[Any, tuple[Any, bool]] = weakref.WeakKeyDictionary()

    def put(self, model: Any, cell: Any, jit: bool) -> None:
        self._cells[model] = (cell, jit)

    def take(self, model: Any, jit: bool) -> Any | None:
        """The cell prepared for ``model`` with the same ``jit`` setting, or None."""
        cell, prepared_jit = self._cells.pop(model, (None, jit))
        return cell if prepared_jit == jit else None
