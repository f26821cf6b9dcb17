"""Datasets for :func:`ms_recover.mindspore.fit`: a batch is a pure function of (step, rank, world).

``fit`` takes a function ``dataset(first_epoch, rank, world) -> mindspore.dataset.Dataset``
(:data:`DatasetFn`), so that it can re-position the data at any resume step and for any world.
:class:`ShardedArrays` is one over in-memory arrays; its batches end with the column
:data:`STEP_COLUMN`, which ``fit`` checks against the step it runs.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

import mindspore.dataset as msds
import numpy as np
from numpy.typing import NDArray

from ms_recover.errors import ConfigError
from ms_recover.worker.sampler import shard_indices, steps_per_epoch

DatasetFn = Callable[[int, int, int], Any]
"""``dataset(first_epoch, rank, world) -> mindspore.dataset.Dataset``, as ``fit`` takes it."""

STEP_COLUMN = "ms_recover_step"
"""A dataset whose last column has this name carries each batch's global step; fit checks it."""


class _EpochSource:
    """GeneratorDataset source: its k-th pass yields epoch ``first_epoch + k`` of one rank.

    A pass takes its epoch number at its first batch, not when ``iter()`` is called:
    ``GeneratorDataset`` calls ``iter(source)`` once at construction only to validate it
    (measured on MindSpore 2.10), and that pass must not use up an epoch. MindSpore may start
    the pass after the last one early; that pass is never consumed.
    """

    def __init__(
        self,
        arrays: Sequence[NDArray[Any]],
        first_epoch: int,
        rank: int,
        world: int,
        global_batch: int,
        seed: int,
    ) -> None:
        self.arrays, self.rank, self.world = arrays, rank, world
        self.global_batch, self.seed = global_batch, seed
        self.num_samples = len(arrays[0])
        self.spe = steps_per_epoch(global_batch, self.num_samples)
        self._next_epoch = first_epoch

    def __len__(self) -> int:
        return self.spe

    def __iter__(self) -> Iterator[tuple[NDArray[Any], ...]]:
        epoch, self._next_epoch = self._next_epoch, self._next_epoch + 1
        for step in range(epoch * self.spe, (epoch + 1) * self.spe):
            idx = shard_indices(
                step, self.rank, self.world, self.global_batch, self.num_samples, self.seed
            )
            yield (*(a[idx] for a in self.arrays), np.array(step, dtype=np.int64))


class ShardedArrays:
    """A ``dataset`` for :func:`fit` over in-memory arrays (e.g. ``x, y``).

    ``ShardedArrays(x, y, global_batch=64, seed=1)(first_epoch, rank, world)`` returns a
    ``GeneratorDataset`` whose batch for global step ``s`` is
    ``tuple(a[shard_indices(s, rank, world, global_batch, len(x), seed)] for a in arrays)``:
    ``global_batch // world`` samples per rank, the same bits in every process. Each row ends
    with the column :data:`STEP_COLUMN` (the global step, int64), which :func:`fit` checks
    against the step it runs and strips before the network sees the batch.
    """

    def __init__(
        self,
        *arrays: NDArray[Any],
        global_batch: int,
        seed: int,
        names: Sequence[str] | None = None,
    ) -> None:
        if not arrays or len({len(a) for a in arrays}) != 1:
            raise ConfigError(
                f"ShardedArrays needs one or more arrays of the same length, got "
                f"lengths {[len(a) for a in arrays]}"
            )
        self.arrays = arrays
        self.global_batch, self.seed = global_batch, seed
        self.names = list(names) if names else [f"column_{i}" for i in range(len(arrays))]
        self.names.append(STEP_COLUMN)
        if len(self.names) != len(arrays) + 1:
            raise ConfigError(f"ShardedArrays: {len(self.names)} names for {len(arrays)} arrays")
        self.steps_per_epoch = steps_per_epoch(global_batch, len(arrays[0]))

    def __call__(self, first_epoch: int, rank: int, world: int) -> msds.GeneratorDataset:
        # Fail here, on the caller's thread, rather than inside MindSpore's pipeline thread.
        shard_indices(
            first_epoch * self.steps_per_epoch,
            rank,
            world,
            self.global_batch,
            len(self.arrays[0]),
            self.seed,
        )
        source = _EpochSource(self.arrays, first_epoch, rank, world, self.global_batch, self.seed)
        return msds.GeneratorDataset(
            source,
            column_names=self.names,
            shuffle=False,
            num_parallel_workers=1,
            python_multiprocessing=False,
        )
