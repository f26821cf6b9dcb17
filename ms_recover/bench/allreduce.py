"""Host allreduce bus bandwidth against a raw loopback socket copy (``ms-recover bench allreduce``).

Each rank is its own process (multiprocessing ``spawn``) with a :class:`HostBackend` on a
127.0.0.1 ephemeral port. A timed allreduce starts after a barrier; the time of one repetition is
the slowest rank's, and the reported time is the median over repetitions. Bus bandwidth is
``2 * (n - 1) / n * bytes / time``, the traffic each rank's link carries in a ring, so it
compares directly with the baseline: one process copying the same bytes to another through a
plain TCP socket (``sendall`` / ``recv_into``, no ZeroMQ, no numpy).
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import socket
import statistics
import sys
import time
from typing import Any

import numpy as np

from ms_recover.errors import MsRecoverError

MB = 1 << 20
GB = 1e9
CHILD_TIMEOUT_S = 600.0


def _rank_main(
    rank: int,
    world: int,
    sizes_mb: list[float],
    repeats: int,
    chunk_bytes: int,
    io_threads: int,
    up: Any,
    down: Any,
    results: Any,
) -> None:
    from ms_recover.comm.host import HostBackend  # in the child: keep the parent light

    backend = HostBackend(
        rank, world, chunk_bytes=chunk_bytes, timeout=CHILD_TIMEOUT_S, io_threads=io_threads
    )
    try:
        up.put((rank, backend.endpoint))
        backend.init(1, down.get(timeout=CHILD_TIMEOUT_S))
        backend.barrier()
        for size in sizes_mb:
            x = np.full(max(1, int(size * MB) // 4), rank + 1, dtype=np.float32)
            out = backend.allreduce(x)  # warm-up, and a correctness check
            if out[0] != world * (world + 1) / 2:
                raise MsRecoverError(f"rank {rank}: allreduce gave {out[0]}")
            times = []
            for _ in range(repeats):
                backend.barrier()
                start = time.perf_counter()
                backend.allreduce(x)
                times.append(time.perf_counter() - start)
            results.put((rank, size, times))
    except BaseException as exc:  # reported to the parent, which raises
        results.put((rank, None, repr(exc)))
    finally:
        backend.close()


def _allreduce_times(
    sizes_mb: list[float], world: int, repeats: int, chunk_bytes: int, io_threads: int
) -> dict[float, float]:
    ctx = mp.get_context("spawn")
    up, results = ctx.Queue(), ctx.Queue()
    downs = [ctx.Queue() for _ in range(world)]
    procs = [
        ctx.Process(
            target=_rank_main,
            daemon=True,
            args=(r, world, sizes_mb, repeats, chunk_bytes, io_threads, up, downs[r], results),
        )
        for r in range(world)
    ]
    for proc in procs:
        proc.start()
    try:
        members = dict(up.get(timeout=CHILD_TIMEOUT_S) for _ in range(world))
        for down in downs:
            down.put(members)
        per_size: dict[float, list[list[float]]] = {size: [] for size in sizes_mb}
        for _ in range(world * len(sizes_mb)):
            rank, size, times = results.get(timeout=CHILD_TIMEOUT_S)
            if size is None:
                raise MsRecoverError(f"bench rank {rank} failed: {times}")
            per_size[size].append(times)
    finally:
        for proc in procs:
            proc.join(10)
            if proc.is_alive():
                proc.kill()
                proc.join()
    # One repetition takes as long as its slowest rank.
    return {
        size: statistics.median(max(ts) for ts in zip(*runs, strict=True))
        for size, runs in per_size.items()
    }


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


def run(
    sizes_mb: list[float], world: int, repeats: int, chunk_bytes: int = 1 << 20, io_threads: int = 2
) -> list[dict[str, Any]]:
    """Measure every size; one row per size (times in seconds, bandwidths in GB/s)."""
    if world < 2 or repeats < 1 or not sizes_mb or min(sizes_mb) <= 0:
        raise MsRecoverError(
            f"bench needs world >= 2, repeats >= 1 and sizes > 0; got world="
            f"{world}, repeats={repeats}, sizes={sizes_mb}"
        )
    reduce_times = _allreduce_times(sizes_mb, world, repeats, chunk_bytes, io_threads)
    nbytes = {size: max(1, int(size * MB) // 4) * 4 for size in sizes_mb}
    copy_times = _socket_copy_times(sorted(set(nbytes.values())), repeats)
    rows = []
    for size in sizes_mb:
        seconds, copy_bw = reduce_times[size], nbytes[size] / copy_times[nbytes[size]] / GB
        busbw = 2 * (world - 1) / world * nbytes[size] / seconds / GB
        rows.append(
            {
                "size_mb": size,
                "world": world,
                "seconds": seconds,
                "algbw_gbps": nbytes[size] / seconds / GB,
                "busbw_gbps": busbw,
                "socket_copy_gbps": copy_bw,
                "busbw_vs_copy": busbw / copy_bw,
            }
        )
    return rows


def format_table(rows: list[dict[str, Any]]) -> str:
    lines = [
        f"{'size MB':>8} {'world':>5} {'time ms':>9} {'algbw GB/s':>10} {'busbw GB/s':>10} "
        f"{'socket GB/s':>11} {'busbw/socket':>12}"
    ]
    for r in rows:
        lines.append(
            f"{r['size_mb']:>8g} {r['world']:>5} {r['seconds'] * 1e3:>9.2f} "
            f"{r['algbw_gbps']:>10.2f} {r['busbw_gbps']:>10.2f} "
            f"{r['socket_copy_gbps']:>11.2f} {r['busbw_vs_copy']:>11.0%}"
        )
    return "\n".join(lines)


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


def run_cli(args: argparse.Namespace) -> int:
    rows = run(
        args.sizes,
        args.world,
        args.repeats,
        chunk_bytes=args.chunk_kb * 1024,
        io_threads=args.io_threads,
    )
    print(format_table(rows))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="ms-recover bench allreduce", description=__doc__)
    configure(parser)
    return run_cli(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
