"""Host allreduce against MindSpore's CPU AllReduce and raw sockets moving the same bytes.

This is ``ms-recover bench allreduce``. docs/design.md §8 holds the host allreduce to three targets
on the same float32 tensors:

* at least 5x the bus bandwidth of MindSpore's own CPU AllReduce (every size);
* from 16 MiB up, at least 85 % of a **raw full-duplex socket exchange** of the same bytes:
  ``raw exchange time / allreduce time``. Bytes per direction: each rank's allreduce sends
  ``B = 2 (n-1)/n x bytes`` to its ring successor and receives ``B`` from its predecessor (two
  ranks: each sends its whole tensor to the other and receives the other's, ``B = bytes``,
  plus a ~40-byte header). The raw exchange moves exactly ``B`` bytes each way on the same
  pairs of ranks, at once, with nothing else: no header, no add, no framing. It is timed two
  ways, a sender thread (``sendall``) beside ``recv_into``, and one thread polling
  non-blocking sockets, and each repetition keeps the faster of the two: the ceiling is the
  best raw exchange, not a convenient one;
* up to 64 KiB (the demo's 37 KB gradient), at most 2x the time of a **one-way socket copy**
  of the same bytes (rank 0 ``sendall`` to rank 1, which answers one byte once it has all).
  Under 1 MiB every timed call (allreduce, raw exchange, copy alike) follows an untimed call
  of its own kind, so both ranks start it together (the peer already waits in ``recv``): a
  microsecond latency is not swamped by the ~0.1 ms skew between two ranks leaving the
  ZeroMQ barrier.

The raw socket rows run inside the same rank processes as the allreduce, interleaved with it
repetition by repetition (each after a barrier), so a loaded host slows both alike.

The raw exchange sends from and receives into buffers it keeps across repetitions. The plain
``allreduce(x)`` returns a new array each call (the bench drops it at once; two ranks reuse a
dropped result's memory, see :mod:`~ms_recover.comm.host.lane.buffers`); a training loop passes a
buffer it keeps, as the raw exchange does, so two more calls are timed against the same
baselines and targets: ``allreduce(x, out=buf)`` (another buffer, kept) and
``allreduce(g, "mean", out=g)`` (in place, as GraphStep reduces a gradient bucket; ``g`` holds
the mean of 1..world, so it stays put).

Five things are measured:

* **host**: each rank is its own process (multiprocessing ``spawn``) with a
  :class:`HostBackend` on a 127.0.0.1 ephemeral port;
* **MindSpore**: ``ops.AllReduce()`` on a local CPU cluster (mccl), formed as msrun forms
  one, with a scheduler process and one worker process per rank (see
  :mod:`ms_recover.bench.mscluster`). Forming it is flaky on a small host: it has a deadline
  and is retried. If it still does not form, its rows say "not measured" and the notes say
  why. ``--no-mindspore`` skips it;
* **raw sockets**: plain TCP between the rank processes (see above; no ZeroMQ, no numpy);
* **host, CURVE**: the host allreduce again with the data plane encrypted and authenticated by
  ZeroMQ CURVE (``MS_RECOVER_DATA_CURVE=1``), what it costs; no target applies to it (the
  targets hold with data-plane encryption off, the default). ``--no-curve`` skips it;
* **recursive doubling vs ring**: at ``--doubling-world`` ranks (default 4), small sizes timed
  both ways in the same processes (see :mod:`ms_recover.bench.doubling`); target: doubling
  takes less time than the ring.

Each allreduce result is checked once. A timed call starts after a barrier, a repetition
takes as long as its slowest rank, and the reported time is the median over repetitions
(sizes under 1 MiB run at least ``SMALL_REPEATS`` of them: each takes microseconds). Bus
bandwidth is ``2 * (n - 1) / n * bytes / time``: the traffic each rank's link carries in a
ring, the raw exchange's ``B / time``.
"""

from __future__ import annotations

import argparse
import dataclasses
import multiprocessing as mp
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ms_recover.bench import doubling, mscluster
from ms_recover.bench.rawsockets import RawRing
from ms_recover.bench.table import Measure, Report
from ms_recover.errors import ConfigError, MsRecoverError

MB = 1 << 20
GB = 1e9
CHILD_TIMEOUT_S = 600.0
VS_MINDSPORE_X = 5.0
VS_EXCHANGE_PCT = 85.0  # of a raw full-duplex exchange, from EXCHANGE_MIN_BYTES up
EXCHANGE_MIN_BYTES = 16 * MB
VS_COPY_X = 2.0  # times a one-way socket copy, up to SMALL_MAX_BYTES
SMALL_MAX_BYTES = 64 << 10
SMALL_REPEATS = 200
SETTINGS = (
    "world",
    "repeats",
    "chunk_kb",
    "io_threads",
    "mindspore",
    "curve",
    "ms_form_timeout",
    "ms_tries",
    "ms_timeout",
    "doubling_world",
)


@dataclasses.dataclass(frozen=True)
class SizeResult:
    """The times of one tensor size, in seconds (``mindspore_s`` None: not measured)."""

    size_mb: float
    nbytes: int
    host_s: float
    copy_s: float
    mindspore_s: float | None
    curve_s: float | None = None  # the host allreduce with CURVE on the data plane
    exchange_s: float | None = None  # raw full-duplex exchange of the same bytes
    out_s: float | None = None  # allreduce(x, out=buf), buf reused across calls
    inplace_s: float | None = None  # allreduce(x, "mean", out=x), as a training step calls it
    threaded_calls: int = 0  # timed host calls (any kind) that sent from a helper thread
    timed_calls: int = 0  # timed host calls of the three kinds, per rank


# The host allreduce as a training loop calls it, each against the same raw baselines:
# (row label, SizeResult field).
HOST_KINDS = frozenset({"host", "out", "inplace"})  # the host allreduce's timed kinds
OUT_VARIANTS = (
    ("host allreduce(out=buf)", "out_s"),
    ("host allreduce(mean, out=x)", "inplace_s"),
)


def element_count(size_mb: float) -> int:
    """float32 elements in a tensor of ``size_mb`` MiB (at least one)."""
    return max(1, int(size_mb * MB) // 4)


def slowest_median(runs: Sequence[Sequence[float]]) -> float:
    """Median over repetitions of the slowest rank's time (``runs``: per rank, per repetition)."""
    return float(statistics.median(max(ts) for ts in zip(*runs, strict=True)))


def busbw_gbps(nbytes: int, world: int, seconds: float) -> float:
    return 2 * (world - 1) / world * nbytes / seconds / GB


def size_measures(r: SizeResult, world: int, repeats: int) -> list[Measure]:
    """The rows of one size: bandwidths, and both §8 targets with their verdicts."""
    host = busbw_gbps(r.nbytes, world, r.host_s)
    copy = r.nbytes / r.copy_s / GB
    ms = None if r.mindspore_s is None else busbw_gbps(r.nbytes, world, r.mindspore_s)
    runs = repeats if r.nbytes >= MB else max(repeats, SMALL_REPEATS)  # as _time_size runs
    how = f"median of {runs}, slowest of {world} ranks"
    head = f"{r.size_mb:g} MiB:"
    return [
        Measure(
            f"{head} host allreduce busbw", host, "GB/s", note=f"{r.host_s * 1e3:.2f} ms, {how}"
        ),
        Measure(
            f"{head} MindSpore AllReduce busbw",
            ms,
            "GB/s",
            note="not measured"
            if r.mindspore_s is None
            else f"{r.mindspore_s * 1e3:.2f} ms, median of {repeats}, slowest of {world} ranks",
        ),
        Measure(
            f"{head} host / MindSpore busbw",
            None if ms is None else host / ms,
            "x",
            ">=",
            VS_MINDSPORE_X,
            note="not measured: no MindSpore time" if ms is None else "",
        ),
        Measure(f"{head} loopback socket copy", copy, "GB/s", note=f"{r.copy_s * 1e3:.3f} ms"),
        _copy_ratio(r, head),
        *_exchange_measures(r, world, how, head),
        *_variant_measures(r, head),
        *_curve_measures(r, world, how, head),
    ]


def _variant_measures(r: SizeResult, head: str) -> list[Measure]:
    """The allreduce into a buffer the caller keeps (``out=``) against the same baselines
    and targets as the plain call: the raw exchange reuses its buffers across calls too."""
    rows: list[Measure] = []
    small, big = r.nbytes <= SMALL_MAX_BYTES, r.nbytes >= EXCHANGE_MIN_BYTES
    for label, field in OUT_VARIANTS:
        seconds = getattr(r, field)
        if seconds is None:
            continue
        note = f"{seconds * 1e3:.3f} ms"
        if small:
            ratio = seconds / r.copy_s
            rows.append(
                Measure(
                    f"{head} {label} time / socket copy time",
                    ratio,
                    "x",
                    "<=",
                    VS_COPY_X,
                    note=f"{note} vs {r.copy_s * 1e3:.3f} ms",
                )
            )
        if r.exchange_s is not None:
            pct = r.exchange_s / seconds * 100
            rows.append(
                Measure(
                    f"{head} {label} / raw exchange",
                    pct,
                    "%",
                    ">=" if big else "",
                    VS_EXCHANGE_PCT if big else None,
                    note=note
                    if big
                    else f"{note}; target only from {EXCHANGE_MIN_BYTES // MB} MiB",
                )
            )
    return rows


def _copy_ratio(r: SizeResult, head: str) -> Measure:
    """The small-allreduce target: time against a one-way copy, up to SMALL_MAX_BYTES."""
    small = r.nbytes <= SMALL_MAX_BYTES
    return Measure(
        f"{head} host allreduce time / socket copy time",
        r.host_s / r.copy_s,
        "x",
        "<=" if small else "",
        VS_COPY_X if small else None,
        note=f"{r.host_s * 1e3:.3f} vs {r.copy_s * 1e3:.3f} ms"
        + ("" if small else f"; target only up to {SMALL_MAX_BYTES >> 10} KiB"),
    )


def _exchange_measures(r: SizeResult, world: int, how: str, head: str) -> list[Measure]:
    """The raw full-duplex exchange and the large-allreduce target against it."""
    if r.exchange_s is None:
        return []
    big = r.nbytes >= EXCHANGE_MIN_BYTES
    per_direction = 2 * (world - 1) / world * r.nbytes
    return [
        Measure(
            f"{head} raw full-duplex socket exchange",
            per_direction / r.exchange_s / GB,
            "GB/s",
            note=f"{r.exchange_s * 1e3:.3f} ms, {how}; {per_direction / MB:.4g} MiB each way",
        ),
        Measure(
            f"{head} host allreduce / raw exchange",
            r.exchange_s / r.host_s * 100,
            "%",
            ">=" if big else "",
            VS_EXCHANGE_PCT if big else None,
            note=_threaded_note(r) if big else f"target only from {EXCHANGE_MIN_BYTES // MB} MiB",
        ),
    ]


def _threaded_note(r: SizeResult) -> str:
    """How many timed calls a preempted rank sent from a helper thread (see laneexchange)."""
    return (
        f"{r.threaded_calls} of {r.timed_calls} timed calls (plain, out=, in place) sent from "
        "a helper thread (a preempted rank's; the rank with most), the rest in lockstep"
    )


def _curve_measures(r: SizeResult, world: int, how: str, head: str) -> list[Measure]:
    if r.curve_s is None:
        return []
    curve = busbw_gbps(r.nbytes, world, r.curve_s)
    return [
        Measure(
            f"{head} host allreduce busbw, CURVE",
            curve,
            "GB/s",
            note=f"{r.curve_s * 1e3:.2f} ms, {how}; {r.curve_s / r.host_s:.1f}x the time "
            "without encryption (MS_RECOVER_DATA_CURVE=1, off by default)",
        )
    ]


def build_report(
    results: Sequence[SizeResult],
    world: int,
    repeats: int,
    outcome: mscluster.Outcome,
    settings: Mapping[str, Any],
    samples: Mapping[str, Any],
    small: Sequence[doubling.Result] = (),
    small_world: int = 0,
) -> Report:
    """The §8 table: one block of rows per size, and why MindSpore was not measured, if not."""
    rep = Report(
        "allreduce",
        f"ms-recover bench allreduce: host allreduce vs MindSpore CPU AllReduce (mccl) and "
        f"raw loopback sockets moving the same bytes, {world} ranks, float32",
    )
    for r in results:
        rep.add(*size_measures(r, world, repeats))
    for d in small:
        rep.add(*doubling.measures(d, small_world))
    rep.settings = dict(settings)
    rep.samples = {**samples, "mindspore_tries": list(outcome.tries)}
    rep.notes = [
        "busbw = 2 (n-1)/n x bytes / time; time = median over repetitions of the slowest "
        "rank, each repetition started after a barrier.",
        f"Every process shares this host's {os.cpu_count()} CPUs.",
    ]
    rep.notes.append(
        "raw exchange: each rank sends 2 (n-1)/n x bytes to its ring successor while it "
        "receives as many from its predecessor (2 ranks: the whole tensor each way, as the "
        "allreduce does); the faster of a threaded and a polled exchange per repetition."
    )
    if outcome.times is None:
        rep.notes.append(f"MindSpore CPU AllReduce not measured: {outcome.reason}")
    elif outcome.tries:
        earlier = "; ".join(outcome.tries)
        rep.notes.append(f"MindSpore cluster formed on try {len(outcome.tries) + 1}: {earlier}")
    return rep


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--sizes",
        type=float,
        nargs="+",
        default=[0.0353, 1.0, 16.0, 64.0],
        metavar="MB",
        help="tensor sizes in MiB of float32 (default: 0.0353 (37 KB) 1 16 64)",
    )
    parser.add_argument("--world", type=int, default=2, help="ranks, one process each")
    parser.add_argument("--repeats", type=int, default=5, help="timed runs per size")
    parser.add_argument("--chunk-kb", type=int, default=1024, help="host backend chunk size")
    parser.add_argument("--io-threads", type=int, default=2, help="ZeroMQ I/O threads per rank")
    parser.add_argument(
        "--mindspore",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="also time MindSpore's CPU AllReduce, the 5x target's baseline (default on)",
    )
    parser.add_argument(
        "--curve",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="also time the host allreduce with CURVE encryption on the data plane (default on)",
    )
    parser.add_argument(
        "--ms-form-timeout",
        type=float,
        default=120.0,
        help="seconds for the MindSpore cluster to form, per try (default %(default)s)",
    )
    parser.add_argument(
        "--ms-tries", type=int, default=3, help="tries to form the MindSpore cluster (default 3)"
    )
    parser.add_argument(
        "--ms-timeout",
        type=float,
        default=600.0,
        help="seconds for the formed MindSpore cluster to report (default %(default)s)",
    )
    doubling.configure(parser)
    parser.add_argument("--workdir", help="MindSpore cluster logs go here (default: a temp dir)")
    parser.add_argument("--json", metavar="PATH", help="also write the result as JSON")


def run(args: argparse.Namespace) -> int:
    sizes = list(dict.fromkeys(args.sizes))  # one measurement per distinct size
    _validate(args, sizes)
    counts = {size: element_count(size) for size in sizes}
    distinct = list(dict.fromkeys(counts.values()))
    print(f"allreduce: host backend and raw sockets, {args.world} ranks ...", flush=True)
    host = _allreduce_times(
        distinct, args.world, args.repeats, args.chunk_kb * 1024, args.io_threads
    )
    curve: dict[int, list[dict[str, list[float]]]] = {}
    if args.curve:
        print(f"allreduce: host backend with CURVE, {args.world} ranks ...", flush=True)
        curve = _allreduce_times(
            distinct, args.world, args.repeats, args.chunk_kb * 1024, args.io_threads, True
        )
    small = doubling.run(
        args,
        element_count,
        lambda counts, world: _allreduce_times(
            counts, world, args.repeats, args.chunk_kb * 1024, args.io_threads, small=True
        ),
    )
    workdir, outcome = _mindspore(args, distinct)
    ms = outcome.times or {}

    def kind(runs: list[dict[str, list[float]]], name: str) -> list[list[float]]:
        return [r[name] for r in runs]

    results = [
        SizeResult(
            size,
            n * 4,
            slowest_median(kind(host[n], "host")),
            slowest_median(kind(host[n], "copy")),
            slowest_median(ms[n]) if n in ms else None,
            slowest_median(kind(curve[n], "host")) if n in curve else None,
            slowest_median(best_exchange(host[n])),
            slowest_median(kind(host[n], "out")),
            slowest_median(kind(host[n], "inplace")),
            int(max(r["threaded_calls"][0] for r in host[n])),
            int(host[n][0]["timed_calls"][0]),
        )
        for size, n in counts.items()
    ]
    settings = {k: getattr(args, k) for k in SETTINGS} | {"sizes_mb": sizes, "workdir": workdir}
    settings["doubling_sizes_mb"] = args.doubling_sizes if args.doubling_world else []
    samples = {
        "host_s": {str(s): kind(host[n], "host") for s, n in counts.items()},
        "host_out_s": {str(s): kind(host[n], "out") for s, n in counts.items()},
        "host_inplace_mean_s": {str(s): kind(host[n], "inplace") for s, n in counts.items()},
        "mindspore_s": {str(s): ms.get(n) for s, n in counts.items()},
        "socket_copy_s": {str(s): kind(host[n], "copy") for s, n in counts.items()},
        "raw_exchange_threaded_s": {str(s): kind(host[n], "threaded") for s, n in counts.items()},
        "raw_exchange_polled_s": {str(s): kind(host[n], "polled") for s, n in counts.items()},
        "host_curve_s": {
            str(s): kind(curve[n], "host") if n in curve else None for s, n in counts.items()
        },
    }
    samples["doubling_s"] = {str(d.size_mb): s["doubling"] for d, s in small}
    samples["ring_s"] = {str(d.size_mb): s["ring"] for d, s in small}
    report = build_report(
        results,
        args.world,
        args.repeats,
        outcome,
        settings,
        samples,
        [d for d, _ in small],
        args.doubling_world,
    )
    return report.emit(args.json)


def _mindspore(args: argparse.Namespace, counts: list[int]) -> tuple[str, mscluster.Outcome]:
    """The MindSpore baseline's times, or why there are none; and where its logs are."""
    if not args.mindspore:
        return "", mscluster.Outcome(None, "skipped (--no-mindspore)")
    workdir = args.workdir or tempfile.mkdtemp(prefix="ms-recover-bench-allreduce-")
    print(
        f"allreduce: MindSpore CPU cluster, {args.world} ranks (logs in {workdir}) ...", flush=True
    )
    plan = mscluster.Plan(tuple(counts), args.world, args.repeats)
    limits = mscluster.Limits(args.ms_form_timeout, args.ms_timeout, args.ms_tries)
    return workdir, mscluster.measure(plan, Path(workdir), limits)


def _validate(args: argparse.Namespace, sizes: list[float]) -> None:
    problems = [
        f"--world must be >= 2, got {args.world}" if args.world < 2 else "",
        f"--repeats must be >= 1, got {args.repeats}" if args.repeats < 1 else "",
        f"--sizes must be > 0, got {sizes}" if min(sizes) <= 0 else "",
        f"--chunk-kb must be >= 1, got {args.chunk_kb}" if args.chunk_kb < 1 else "",
        f"--io-threads must be >= 1, got {args.io_threads}" if args.io_threads < 1 else "",
        f"--ms-tries must be >= 1, got {args.ms_tries}" if args.ms_tries < 1 else "",
        f"--ms-form-timeout must be > 0, got {args.ms_form_timeout}"
        if args.ms_form_timeout <= 0
        else "",
        f"--ms-timeout must be > 0, got {args.ms_timeout}" if args.ms_timeout <= 0 else "",
        *doubling.problems(args, element_count),
    ]
    if any(problems):
        raise ConfigError("bench allreduce: " + "; ".join(p for p in problems if p))


def _rank_main(
    rank: int,
    world: int,
    counts: list[int],
    repeats: int,
    chunk_bytes: int,
    io_threads: int,
    up: Any,
    down: Any,
    results: Any,
    curve: bool = False,
    small: bool = False,
) -> None:
    backend = _backend(rank, world, chunk_bytes, io_threads, curve)
    raw = RawRing(rank, world)
    try:
        up.put((rank, backend.endpoint, raw.port))
        members, ports = down.get(timeout=CHILD_TIMEOUT_S)
        backend.init(1, members)
        raw.connect(ports)
        backend.barrier()
        for n in counts:
            if small:
                results.put((rank, n, doubling.time_rank(backend, n, repeats)))
            else:
                results.put((rank, n, _time_size(backend, raw, n, repeats, curve)))
    except BaseException as exc:  # reported to the parent, which raises
        results.put((rank, None, repr(exc)))
    finally:
        raw.close()
        backend.close()


def _backend(rank: int, world: int, chunk_bytes: int, io_threads: int, curve: bool) -> Any:
    from ms_recover.comm.host.auth import DataCurve, data_plane_password
    from ms_recover.comm.host.backend import HostBackend  # in the child: keep the parent light

    secret = b"bench allreduce"  # the keys of a job with a secret (and CURVE if asked)
    return HostBackend(
        rank,
        world,
        chunk_bytes=chunk_bytes,
        timeout=CHILD_TIMEOUT_S,
        io_threads=io_threads,
        password=data_plane_password(secret, "bench"),  # authenticated, as ms_recover.init
        curve=DataCurve.derive(secret, "bench") if curve else None,
    )


def _time_size(
    backend: Any, raw: RawRing, n: int, repeats: int, curve: bool
) -> dict[str, list[float]]:
    """Each kind's seconds per repetition on this rank, interleaved repetition by repetition."""
    rank, world = backend.rank, backend.world_size
    expected = world * (world + 1) / 2
    x = np.full(n, rank + 1, dtype=np.float32)
    _check(rank, backend.allreduce(x), expected)  # warm-up, and a correctness check
    ring_bytes = int(2 * (world - 1) / world * x.nbytes)
    kinds: dict[str, Any] = {"host": lambda: backend.allreduce(x)}
    if not curve:
        buf = np.empty_like(x)
        grads = np.full(n, rank + 1, dtype=np.float32)  # the mean of 1..world stays put
        _check(rank, backend.allreduce(x, out=buf), expected)
        _check(rank, backend.allreduce(grads, "mean", out=grads), expected / world)
        kinds |= {
            "out": lambda: backend.allreduce(x, out=buf),
            "inplace": lambda: backend.allreduce(grads, "mean", out=grads),
            "threaded": lambda: raw.exchange(ring_bytes, threaded=True),
            "polled": lambda: raw.exchange(ring_bytes, threaded=False),
            "copy": lambda: raw.copy(x.nbytes),
        }
    times: dict[str, list[float]] = {k: [] for k in kinds}
    runs = repeats if x.nbytes >= MB else max(repeats, SMALL_REPEATS)
    threaded = 0  # timed host calls that a preempted rank sent from a helper thread
    for i in range(runs + 1):  # the first round warms the raw sockets up
        for kind, call in kinds.items():
            backend.barrier()
            if x.nbytes < MB:  # an untimed call of the same kind first: the timed one then
                call()  # starts on both ranks together, free of the barrier's exit skew
            before = backend.stats.lane_threaded
            start = time.perf_counter()
            call()
            if i:
                times[kind].append(time.perf_counter() - start)
                threaded += backend.stats.lane_threaded - before
    times["threaded_calls"] = [threaded]
    times["timed_calls"] = [runs * len(HOST_KINDS.intersection(kinds))]
    return times


def _check(rank: int, out: Any, expected: float) -> None:
    if not np.all(out == expected):
        bad = int(np.flatnonzero(out != expected)[0])
        raise MsRecoverError(f"rank {rank}: element {bad} is {out[bad]}, not {expected}")


def _allreduce_times(
    counts: list[int],
    world: int,
    repeats: int,
    chunk_bytes: int,
    io_threads: int,
    curve: bool = False,
    small: bool = False,
) -> dict[int, list[dict[str, list[float]]]]:
    """Element count -> per rank, each kind's seconds per repetition (see _time_size)."""
    ctx = mp.get_context("spawn")
    up, results = ctx.Queue(), ctx.Queue()
    downs = [ctx.Queue() for _ in range(world)]
    procs = [
        ctx.Process(
            target=_rank_main,
            daemon=True,
            args=(
                *(r, world, counts, repeats, chunk_bytes, io_threads),
                *(up, downs[r], results, curve, small),
            ),
        )
        for r in range(world)
    ]
    for proc in procs:
        proc.start()
    try:
        hello = [up.get(timeout=CHILD_TIMEOUT_S) for _ in range(world)]
        members = {rank: endpoint for rank, endpoint, _ in hello}
        ports = {rank: port for rank, _, port in hello}
        for down in downs:
            down.put((members, ports))
        per_count: dict[int, list[dict[str, list[float]]]] = {n: [] for n in counts}
        for _ in range(world * len(counts)):
            rank, n, times = results.get(timeout=CHILD_TIMEOUT_S)
            if n is None:
                raise MsRecoverError(f"bench rank {rank} failed: {times}")
            per_count[n].append(times)
    finally:
        for proc in procs:
            proc.join(10)
            if proc.is_alive():
                proc.kill()
                proc.join()
    return per_count


def best_exchange(ranks: Sequence[Mapping[str, Sequence[float]]]) -> list[list[float]]:
    """Per rank, per repetition: the faster of the threaded and the polled raw exchange, each
    taken as its slowest rank's time first (so a repetition's two ways are compared whole)."""
    threaded = [max(ts) for ts in zip(*(r["threaded"] for r in ranks), strict=True)]
    polled = [max(ts) for ts in zip(*(r["polled"] for r in ranks), strict=True)]
    return [[min(a, b) for a, b in zip(threaded, polled, strict=True)]]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="ms-recover bench allreduce", description=__doc__)
    configure(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
