"""The small-allreduce rows of ``ms-recover bench allreduce`` at more than two ranks.

Groups of more than two members reduce buffers up to
:data:`~ms_recover.comm.hostdoubling.DOUBLING_MAX_BYTES` by recursive doubling (``log2 n``
message latencies) instead of the ring (``2 (n - 1)``). What a user would get otherwise is the
ring, so the rows time both in the same rank processes, interleaved repetition by repetition,
each call after a barrier and an untimed call of its own kind (as the two-rank small sizes
are timed): target, recursive doubling takes less time than the ring.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from ms_recover.bench.table import Measure
from ms_recover.errors import MsRecoverError

WORLD = 4  # the default world of these rows (--doubling-world)
SIZES_MB = (0.0353,)  # the demo's 37 KB gradient (--doubling-sizes)
REPEATS = 200
VS_RING_X = 1.0  # doubling time / ring time must be below this


@dataclasses.dataclass(frozen=True)
class Result:
    """Median seconds (slowest rank per repetition) of both paths at one size."""

    size_mb: float
    nbytes: int
    doubling_s: float
    ring_s: float
    runs: int  # repetitions behind each median


def time_rank(backend: Any, n: int, repeats: int) -> dict[str, list[float]]:
    """This rank's seconds per repetition of both paths on ``n`` float32 elements."""
    rank, world = backend.rank, backend.world_size
    x = np.full(n, rank + 1, dtype=np.float32)
    if x.nbytes > backend.doubling_max_bytes:
        raise MsRecoverError(
            f"{x.nbytes} bytes take the ring, not recursive doubling (up to "
            f"{backend.doubling_max_bytes} bytes)"
        )

    def ring() -> Any:
        # The threshold is switched on every rank alike, so all take the ring together.
        saved, backend.doubling_max_bytes = backend.doubling_max_bytes, 0
        try:
            return backend.allreduce(x)
        finally:
            backend.doubling_max_bytes = saved

    kinds = {"doubling": lambda: backend.allreduce(x), "ring": ring}
    expected = world * (world + 1) / 2
    for kind, call in kinds.items():  # warm-up, and a correctness check of both
        if not np.all(call() == expected):
            raise MsRecoverError(f"rank {rank}: the {kind} allreduce is not {expected}")
    times: dict[str, list[float]] = {k: [] for k in kinds}
    for _ in range(max(repeats, REPEATS)):
        for kind, call in kinds.items():
            backend.barrier()
            call()  # untimed: the timed call then starts on every rank together
            start = time.perf_counter()
            call()
            times[kind].append(time.perf_counter() - start)
    return times


def result(size_mb: float, nbytes: int, ranks: Sequence[dict[str, list[float]]]) -> Result:
    def median(kind: str) -> float:
        per_rep = zip(*(r[kind] for r in ranks), strict=True)
        return float(statistics.median(max(ts) for ts in per_rep))

    runs = len(ranks[0]["doubling"])
    return Result(size_mb, nbytes, median("doubling"), median("ring"), runs)


def measures(r: Result, world: int) -> list[Measure]:
    """Both times and the target row, named by size and world."""
    head = f"{r.size_mb:g} MiB, {world} ranks:"
    how = f"median of {r.runs}, slowest of {world} ranks"
    return [
        Measure(f"{head} recursive doubling allreduce", r.doubling_s * 1e3, "ms", note=how),
        Measure(f"{head} ring allreduce", r.ring_s * 1e3, "ms", note=how),
        Measure(
            f"{head} recursive doubling / ring time",
            r.doubling_s / r.ring_s,
            "x",
            "<",
            VS_RING_X,
            note=f"{r.doubling_s * 1e3:.3f} vs {r.ring_s * 1e3:.3f} ms, same processes, "
            "interleaved",
        ),
    ]
