"""The small-allreduce rows of ``ms-recover bench allreduce`` at more than two ranks.

Groups of more than two members reduce buffers up to
:data:`~ms_recover.comm.host.doubling.DOUBLING_MAX_BYTES` by recursive doubling (``log2 n``
message latencies) instead of the ring (``2 (n - 1)``). What a user would get otherwise is the
ring, so the rows time both in the same rank processes, interleaved repetition by repetition,
each call after a barrier and an untimed call of its own kind (as the two-rank small sizes
are timed): target, recursive doubling takes less time than the ring.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ms_recover.bench.table import Measure
from ms_recover.errors import MsRecoverError

# (element counts, world) -> element count -> per rank, each kind's seconds per repetition
Times = Callable[[list[int], int], dict[int, list[dict[str, list[float]]]]]

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


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--doubling-world",
        type=int,
        default=WORLD,
        help="ranks of the recursive doubling vs ring rows, 0 skips them (default %(default)s)",
    )
    parser.add_argument(
        "--doubling-sizes",
        type=float,
        nargs="+",
        default=list(SIZES_MB),
        metavar="MB",
        help="sizes in MiB of float32 of those rows (default: 0.0353, 37 KB)",
    )


def problems(args: argparse.Namespace, count: Callable[[float], int]) -> list[str]:
    """What is wrong with the options (empty strings where nothing is); ``count``: elements
    of a size in MiB."""
    from ms_recover.comm.host.doubling import DOUBLING_MAX_BYTES  # zmq: only when checking

    if args.doubling_world == 0:
        return []
    top = DOUBLING_MAX_BYTES / (1 << 20)
    fits = all(0 < s and count(s) * 4 <= DOUBLING_MAX_BYTES for s in args.doubling_sizes)
    return [
        f"--doubling-world must be 0 (skip) or >= 3, got {args.doubling_world}"
        if args.doubling_world < 3
        else "",
        ""
        if fits
        else f"--doubling-sizes must be > 0 and <= {top:g} MiB (DOUBLING_MAX_BYTES), "
        f"got {args.doubling_sizes}",
    ]


def run(
    args: argparse.Namespace, count: Callable[[float], int], times: Times
) -> list[tuple[Result, dict[str, Any]]]:
    """Each size's result, with its samples per rank (none with ``--doubling-world 0``)."""
    world = args.doubling_world
    if not world:
        return []
    print(f"allreduce: recursive doubling vs ring, {world} ranks ...", flush=True)
    counts = {size: count(size) for size in dict.fromkeys(args.doubling_sizes)}
    per_count = times(list(dict.fromkeys(counts.values())), world)
    out = []
    for size, n in counts.items():
        samples = {kind: [r[kind] for r in per_count[n]] for kind in ("doubling", "ring")}
        out.append((result(size, n * 4, per_count[n]), samples))
    return out
