"""Deterministic data position: which samples a rank reads at a given step.

docs/design.md §3 requires the data position to be a pure function of (step, rank, world), so a rank
that is restarted, or repaired to step S, reads exactly the samples an uninterrupted run would
read at step S+1 without any data-loader state being copied.

The scheme is the usual data-parallel one:

* Steps are grouped into epochs of ``num_samples // global_batch`` steps (the incomplete last
  global batch of an epoch is dropped, so every step has a full global batch).
* Epoch ``e`` visits the samples in the order of a permutation drawn from
  ``numpy.random.default_rng(seed + e)`` (PCG64: the same on every platform and numpy >= 1.17).
* Global batch ``b`` of an epoch is the slice ``[b * global_batch, (b + 1) * global_batch)`` of
  that permutation, split into ``world`` contiguous, equal per-rank slices in rank order.

Also here: :func:`make_dataset`, a tiny synthetic, learnable classification set for demos and
tests. This module imports numpy only (no MindSpore, no zmq).
"""

from __future__ import annotations

import functools

import numpy as np
from numpy.typing import NDArray

from ms_recover.errors import ConfigError


def _check_positive(name: str, value: int) -> None:
    if int(value) != value or value < 1:
        raise ConfigError(f"{name} must be a positive integer, got {value!r}")


def steps_per_epoch(global_batch: int, num_samples: int) -> int:
    """Number of full global batches in one pass over ``num_samples`` samples (at least 1)."""
    _check_positive("global_batch", global_batch)
    _check_positive("num_samples", num_samples)
    if global_batch > num_samples:
        raise ConfigError(
            f"global_batch {global_batch} is larger than the dataset ({num_samples} samples)"
        )
    return num_samples // global_batch


@functools.lru_cache(maxsize=4)
def _epoch_permutation(num_samples: int, epoch_seed: int) -> NDArray[np.int64]:
    # Cached because every rank asks for the same epoch once per step; read-only so a caller
    # cannot corrupt the cached order for later steps.
    perm = np.random.default_rng(epoch_seed).permutation(num_samples)
    perm.setflags(write=False)
    return perm


def shard_indices(
    step: int, rank: int, world: int, global_batch: int, num_samples: int, seed: int
) -> NDArray[np.int64]:
    """Sample indices rank ``rank`` of ``world`` reads at global step ``step`` (0-based).

    Guarantees: a pure function of its arguments (same answer in every process and on every
    call); the ``world`` shards of one step are disjoint, have ``global_batch // world``
    indices each and together form that step's global batch; within an epoch no sample
    repeats. Returns a new int64 array the caller may modify.

    Raises ConfigError if a count is not positive, ``rank`` is outside ``[0, world)``,
    ``global_batch`` is not a multiple of ``world`` or exceeds ``num_samples``, or ``step`` is
    negative.
    """
    _check_positive("world", world)
    per_rank = _per_rank(global_batch, world)
    if not 0 <= rank < world:
        raise ConfigError(f"rank {rank} is outside [0, {world})")
    if int(step) != step or step < 0:
        raise ConfigError(f"step must be a non-negative integer, got {step!r}")
    epoch, batch = divmod(int(step), steps_per_epoch(global_batch, num_samples))
    perm = _epoch_permutation(int(num_samples), int(seed) + epoch)
    start = batch * global_batch + rank * per_rank
    return np.array(perm[start : start + per_rank], dtype=np.int64)


def _per_rank(global_batch: int, world: int) -> int:
    _check_positive("global_batch", global_batch)
    if global_batch % world:
        raise ConfigError(
            f"global_batch {global_batch} is not a multiple of the world size {world}"
        )
    return global_batch // world


def epoch_of(step: int, global_batch: int, num_samples: int) -> int:
    """The epoch that global step ``step`` belongs to."""
    return int(step) // steps_per_epoch(global_batch, num_samples)


def make_dataset(
    n: int, in_dim: int, classes: int, seed: int
) -> tuple[NDArray[np.float32], NDArray[np.int32]]:
    """A synthetic classification set: ``X`` float32 ``(n, in_dim)``, ``y`` int32 ``(n,)``.

    Each class has a random centre; a sample is its class centre plus unit Gaussian noise, so a
    small MLP learns it within a few hundred steps. Bit-identical for the same arguments on
    every platform (numpy PCG64).
    """
    for name, value in (("n", n), ("in_dim", in_dim), ("classes", classes)):
        _check_positive(name, value)
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((classes, in_dim)) * 2.0
    y = rng.integers(0, classes, size=n)
    x = centres[y] + rng.standard_normal((n, in_dim))
    return x.astype(np.float32), y.astype(np.int32)


def split_indices(
    step: int, index: int, world: int, global_batch: int, num_samples: int, seed: int
) -> NDArray[np.int64]:
    """Like :func:`shard_indices`, but ``global_batch`` need not be a multiple of ``world``.

    The step's global batch is cut into ``world`` contiguous slices whose sizes differ by at
    most one (the first ones larger), so a job that shrinks under elastic training still
    reads exactly the same global batch per step. Equals :func:`shard_indices` when
    ``world`` divides ``global_batch``.
    """
    _check_positive("world", world)
    if not 0 <= index < world:
        raise ConfigError(f"index {index} is outside [0, {world})")
    whole = shard_indices(step, 0, 1, global_batch, num_samples, seed)
    return np.array_split(whole, world)[index].copy()
