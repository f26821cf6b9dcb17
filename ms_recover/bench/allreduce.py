"""Host allreduce bus bandwidth against MindSpore's CPU AllReduce and a raw socket copy.

This is ``ms-recover bench allreduce``. DESIGN.md §8 holds the host allreduce to two targets on
the same float32 tensors:

* at least 5x the bus bandwidth of MindSpore's own CPU AllReduce;
* at least 50 % of a raw loopback socket copy.

Three things are measured:

* **host**: each rank is its own process (multiprocessing ``spawn``) with a
  :class:`HostBackend` on a 127.0.0.1 ephemeral port;
* **MindSpore**: ``ops.AllReduce()`` on a local CPU cluster (mccl), formed as msrun forms
  one, with a scheduler process and one worker process per rank (see
  :mod:`ms_recover.bench.mscluster`). Forming it is flaky on a small host: it has a deadline
  and is retried. If it still does not form, its rows say "not measured" and the notes say
  why. ``--no-mindspore`` skips it;
* **socket copy**: one process copies the same bytes to another through a plain TCP socket
  (``sendall`` / ``recv_into``; no ZeroMQ, no numpy);
* **host, CURVE**: the host allreduce again with the data plane encrypted and authenticated by
  ZeroMQ CURVE (``MS_RECOVER_DATA_CURVE=1``), what it costs; no target applies to it (the
  targets hold with data-plane encryption off, the default). ``--no-curve`` skips it.

Each allreduce result is checked once. A timed call starts after a barrier, a repetition
takes as long as its slowest rank, and the reported time is the median over repetitions. Bus
bandwidth is ``2 * (n - 1) / n * bytes / time``: the traffic each rank's link carries in a
ring. It compares directly with the socket copy's ``bytes / time``.
"""

from __future__ import annotations

import argparse
import dataclasses
import multiprocessing as mp
import os
import socket
import statistics
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ms_recover.bench import mscluster
from ms_recover.bench.table import Measure, Report
from ms_recover.errors import ConfigError, MsRecoverError

MB = 1 << 20
GB = 1e9
CHILD_TIMEOUT_S = 600.0
VS_MINDSPORE_X = 5.0
VS_COPY_PCT = 50.0
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
    how = f"median of {repeats}, slowest of {world} ranks"
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
            else f"{r.mindspore_s * 1e3:.2f} ms, {how}",
        ),
        Measure(
            f"{head} host / MindSpore busbw",
            None if ms is None else host / ms,
            "x",
            ">=",
            VS_MINDSPORE_X,
            note="not measured: no MindSpore time" if ms is None else "",
        ),
        Measure(f"{head} loopback socket copy", copy, "GB/s", note=f"{r.copy_s * 1e3:.2f} ms"),
        Measure(f"{head} host busbw / socket copy", host / copy * 100, "%", ">=", VS_COPY_PCT),
        *_curve_measures(r, world, how, head),
    ]


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
) -> Report:
    """The §8 table: one block of rows per size, and why MindSpore was not measured, if not."""
    rep = Report(
        "allreduce",
        f"ms-recover bench allreduce: host allreduce (ZeroMQ ring) vs MindSpore CPU "
        f"AllReduce (mccl) and a loopback socket copy, {world} ranks, float32",
    )
    for r in results:
        rep.add(*size_measures(r, world, repeats))
    rep.settings = dict(settings)
    rep.samples = {**samples, "mindspore_tries": list(outcome.tries)}
    rep.notes = [
        "busbw = 2 (n-1)/n x bytes / time; time = median over repetitions of the slowest "
        "rank, each repetition started after a barrier.",
        f"Every process shares this host's {os.cpu_count()} CPUs.",
    ]
    if world >= (os.cpu_count() or 1):
        rep.notes.append(
            "With no spare core per rank, each rank's core both sends and receives every byte "
            "of its ring link, twice the per-core work of the one-way socket copy: about 50 % "
            "of it is the ceiling on such a host."
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
        default=[1.0, 16.0, 64.0],
        metavar="MB",
        help="tensor sizes in MiB of float32 (default: 1 16 64)",
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
    parser.add_argument("--workdir", help="MindSpore cluster logs go here (default: a temp dir)")
    parser.add_argument("--json", metavar="PATH", help="also write the result as JSON")


def run(args: argparse.Namespace) -> int:
    sizes = list(dict.fromkeys(args.sizes))  # one measurement per distinct size
    _validate(args, sizes)
    counts = {size: element_count(size) for size in sizes}
    distinct = list(dict.fromkeys(counts.values()))
    print(f"allreduce: host backend, {args.world} ranks ...", flush=True)
    host = _allreduce_times(
        distinct, args.world, args.repeats, args.chunk_kb * 1024, args.io_threads
    )
    curve: dict[int, list[list[float]]] = {}
    if args.curve:
        print(f"allreduce: host backend with CURVE, {args.world} ranks ...", flush=True)
        curve = _allreduce_times(
            distinct, args.world, args.repeats, args.chunk_kb * 1024, args.io_threads, True
        )
    print("allreduce: loopback socket copy ...", flush=True)
    copy = _socket_copy_times([n * 4 for n in distinct], args.repeats)
    workdir, outcome = _mindspore(args, distinct)
    ms = outcome.times or {}
    results = [
        SizeResult(
            size,
            n * 4,
            slowest_median(host[n]),
            copy[n * 4],
            slowest_median(ms[n]) if n in ms else None,
            slowest_median(curve[n]) if n in curve else None,
        )
        for size, n in counts.items()
    ]
    settings = {k: getattr(args, k) for k in SETTINGS} | {"sizes_mb": sizes, "workdir": workdir}
    samples = {
        "host_s": {str(s): host[n] for s, n in counts.items()},
        "mindspore_s": {str(s): ms.get(n) for s, n in counts.items()},
        "socket_copy_s": {str(s): copy[n * 4] for s, n in counts.items()},
        "host_curve_s": {str(s): curve.get(n) for s, n in counts.items()},
    }
    report = build_report(results, args.world, args.repeats, outcome, settings, samples)
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
) -> None:
    from ms_recover.comm.host import HostBackend  # in the child: keep the parent light
    from ms_recover.comm.hostauth import DataCurve, data_plane_password

    secret = b"bench allreduce"  # the keys of a job with a secret and data-plane CURVE on
    backend = HostBackend(
        rank,
        world,
        chunk_bytes=chunk_bytes,
        timeout=CHILD_TIMEOUT_S,
        io_threads=io_threads,
        password=data_plane_password(secret, "bench") if curve else None,
        curve=DataCurve.derive(secret, "bench") if curve else None,
    )
    try:
        up.put((rank, backend.endpoint))
        backend.init(1, down.get(timeout=CHILD_TIMEOUT_S))
        backend.barrier()
        expected = world * (world + 1) / 2
        for n in counts:
            x = np.full(n, rank + 1, dtype=np.float32)
            out = backend.allreduce(x)  # warm-up, and a correctness check
            if not np.all(out == expected):
                bad = int(np.flatnonzero(out != expected)[0])
                raise MsRecoverError(f"rank {rank}: element {bad} is {out[bad]}, not {expected}")
            times = []
            for _ in range(repeats):
                backend.barrier()
                start = time.perf_counter()
                backend.allreduce(x)
                times.append(time.perf_counter() - start)
            results.put((rank, n, times))
    except BaseException as exc:  # reported to the parent, which raises
        results.put((rank, None, repr(exc)))
    finally:
        backend.close()


def _allreduce_times(
    counts: list[int],
    world: int,
    repeats: int,
    chunk_bytes: int,
    io_threads: int,
    curve: bool = False,
) -> dict[int, list[list[float]]]:
    """Element count -> each rank's seconds per repetition of the host allreduce."""
    ctx = mp.get_context("spawn")
    up, results = ctx.Queue(), ctx.Queue()
    downs = [ctx.Queue() for _ in range(world)]
    procs = [
        ctx.Process(
            target=_rank_main,
            daemon=True,
            args=(r, world, counts, repeats, chunk_bytes, io_threads, up, downs[r], results, curve),
        )
        for r in range(world)
    ]
    for proc in procs:
        proc.start()
    try:
        members = dict(up.get(timeout=CHILD_TIMEOUT_S) for _ in range(world))
        for down in downs:
            down.put(members)
        per_count: dict[int, list[list[float]]] = {n: [] for n in counts}
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


def _copy_receiver(sizes: list[int], repeats: int, port_q: Any) -> None:
    with socket.create_server(("127.0.0.1", 0)) as server:
        port_q.put(server.getsockname()[1])
        conn, _ = server.accept()
        with conn:
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            buf = memoryview(bytearray(max(sizes)))
            for size in sizes:
                for _ in range(repeats + 1):
                    got = 0
                    while got < size:
                        got += conn.recv_into(buf[got:size])
                    conn.sendall(b"k")


def _socket_copy_times(sizes: list[int], repeats: int) -> dict[int, float]:
    """Median time to copy each size from this process to a child over loopback TCP."""
    ctx = mp.get_context("spawn")
    port_q = ctx.Queue()
    proc = ctx.Process(target=_copy_receiver, args=(sizes, repeats, port_q), daemon=True)
    proc.start()
    out: dict[int, float] = {}
    try:
        with socket.create_connection(("127.0.0.1", port_q.get(timeout=CHILD_TIMEOUT_S))) as conn:
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            data = memoryview(bytearray(max(sizes)))
            for size in sizes:
                times = []
                for _ in range(repeats + 1):  # the first one warms up
                    start = time.perf_counter()
                    conn.sendall(data[:size])
                    conn.recv(1)
                    times.append(time.perf_counter() - start)
                out[size] = statistics.median(times[1:])
    finally:
        proc.join(10)
        if proc.is_alive():
            proc.kill()
            proc.join()
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="ms-recover bench allreduce", description=__doc__)
    configure(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
