"""The deterministic sampler: data position is a pure function of (step, rank, world)."""

from __future__ import annotations

import numpy as np
import pytest

from ms_recover.errors import ConfigError
from ms_recover.worker.sampler import (
    epoch_of,
    make_dataset,
    shard_indices,
    steps_per_epoch,
)

N, G, SEED = 100, 12, 7  # 8 full global batches per epoch, 4 samples dropped


def test_shards_of_one_step_partition_the_global_batch() -> None:
    for world in (1, 2, 3, 4, 6, 12):
        for step in (0, 5, 8, 17):
            shards = [shard_indices(step, r, world, G, N, SEED) for r in range(world)]
            assert all(len(s) == G // world for s in shards)
            union = np.concatenate(shards)
            assert len(set(union.tolist())) == G
            # The global batch (and its order) does not depend on the world size.
            np.testing.assert_array_equal(union, shard_indices(step, 0, 1, G, N, SEED))


def test_an_epoch_visits_distinct_samples_and_epochs_are_reshuffled() -> None:
    spe = steps_per_epoch(G, N)
    assert spe == 8
    epoch0 = np.concatenate([shard_indices(s, 0, 1, G, N, SEED) for s in range(spe)])
    epoch1 = np.concatenate([shard_indices(s, 0, 1, G, N, SEED) for s in range(spe, 2 * spe)])
    assert len(set(epoch0.tolist())) == spe * G
    assert len(set(epoch1.tolist())) == spe * G
    assert not np.array_equal(epoch0, epoch1)
    assert epoch_of(spe - 1, G, N) == 0 and epoch_of(spe, G, N) == 1


def test_pure_function_independent_of_call_history() -> None:
    later_first = shard_indices(13, 1, 4, G, N, SEED)
    for step in range(20):  # warms and evicts the permutation cache
        shard_indices(step, 0, 4, G, N, SEED + step)
    np.testing.assert_array_equal(shard_indices(13, 1, 4, G, N, SEED), later_first)
    out = shard_indices(13, 1, 4, G, N, SEED)
    out[:] = -1  # a caller mutating its copy must not change later answers
    np.testing.assert_array_equal(shard_indices(13, 1, 4, G, N, SEED), later_first)
    assert later_first.dtype == np.int64


def test_different_seeds_give_different_orders() -> None:
    a = shard_indices(0, 0, 1, G, N, 1)
    b = shard_indices(0, 0, 1, G, N, 2)
    assert not np.array_equal(a, b)


@pytest.mark.parametrize(
    ("args", "match"),
    [
        ((0, 0, 5, 12, 100, 0), "not a multiple of the world size 5"),
        ((0, 4, 4, 12, 100, 0), r"rank 4 is outside \[0, 4\)"),
        ((-1, 0, 1, 12, 100, 0), "step must be a non-negative integer"),
        ((0, 0, 1, 200, 100, 0), "larger than the dataset"),
        ((0, 0, 0, 12, 100, 0), "world must be a positive integer"),
        ((0, 0, 1, 0, 100, 0), "global_batch must be a positive integer"),
    ],
)
def test_invalid_arguments_name_the_value(args: tuple[int, ...], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        shard_indices(*args)


def test_make_dataset_shapes_dtypes_and_determinism() -> None:
    x, y = make_dataset(64, 5, 3, seed=11)
    assert x.shape == (64, 5) and x.dtype == np.float32
    assert y.shape == (64,) and y.dtype == np.int32
    assert set(np.unique(y).tolist()) <= {0, 1, 2}
    x2, y2 = make_dataset(64, 5, 3, seed=11)
    assert np.array_equal(x, x2) and np.array_equal(y, y2)
    assert not np.array_equal(x, make_dataset(64, 5, 3, seed=12)[0])
    with pytest.raises(ConfigError, match="classes must be a positive integer"):
        make_dataset(10, 2, 0, seed=0)
