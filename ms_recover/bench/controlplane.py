"""Manager stop-all at scale (``ms-recover bench controlplane``): fault -> every STOPPED recorded.

A real :class:`~ms_recover.manager.server.ManagerServer` (ZeroMQ ROUTER on 127.0.0.1, in a
thread of this process) serves a job of N simulated ranks on N/8 simulated agents. Every
simulated agent and rank is its own DEALER socket and TCP connection, speaking the real
authenticated protocol, played by a few fake processes (:mod:`ms_recover.bench.fakecluster`;
enough of them to stay under the open-file limit). The job forms (registration, rebuild,
repair, resume) and then, per repeat:

1. one simulated agent reports a rank killed by SIGKILL (``t0``: wall time just before sending);
2. the manager detects it, bumps the epoch and sends STOP to every survivor;
3. each simulated rank answers STOPPED at once;
4. the measure ends at ``round.stop_done``, the manager's wall time when its decision step saw
   every survivor's STOPPED recorded for the new epoch.

The killed rank's agent holds its restart until the end (a real restart takes seconds), so
the stop phase is measured alone. The first fault hits a running job. Each further repeat is a
new fault injected as soon as the previous stop-all was acknowledged: the manager escalates
exactly as for the first (new epoch, STOP to every survivor, wait for every STOPPED) without a
full rebuild in between, which at full scale costs tens of seconds (see below). After the last
repeat the restarts are released and the round is let to finish (re-registration, REBUILD to
every rank, repair, resume); its phases are reported.
DESIGN.md §8 holds stop-all at 16,384 ranks on 2,048 agents to 1 s.

On one 2-core host the simulated ranks share the CPU with the manager (decoding STOP and
encoding STOPPED for thousands of ranks), which a real cluster spreads over thousands of
machines, so these times are an upper bound; the manager thread's own CPU time in the window
is reported next to them. The simulated members heartbeat every 15 s (silence limit 60 s):
the job default of 0.5 s would mean 37,000 heartbeats a second at full scale, and the manager
reads no heartbeat while it sends the formation's REBUILD to every rank (one message of every
rank's endpoint per rank, about 15 s at 16,384 ranks here), so a shorter limit declares ranks
silent during formation.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import resource
import sys
import threading
import time
from typing import Any

from ms_recover.bench.fakecluster import FakeSpec, fake_main
from ms_recover.bench.table import Measure, Report, summary
from ms_recover.config import JobConfig
from ms_recover.manager.model import JobState
from ms_recover.manager.server import ManagerServer
from ms_recover.observability.events import EventLog
from ms_recover.strategy import parse_strategies
from ms_recover.testing.wait import wait_for

TARGET_S = 1.0
FULL_RANKS = 16384
FDS_PER_SOCKET = 2  # the TCP connection and the socket's mailbox
FD_SPARE = 512


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--ranks",
        type=int,
        nargs="+",
        default=[1024, 4096, FULL_RANKS],
        help="simulated ranks, one run per value (default: 1024 4096 16384)",
    )
    p.add_argument("--ranks-per-agent", type=int, default=8, help="ranks per simulated node")
    p.add_argument("--repeats", type=int, default=3, help="faults per scale (default 3)")
    p.add_argument(
        "--heartbeat",
        type=float,
        default=15.0,
        help="heartbeat interval of the simulated members in s (default 15)",
    )
    p.add_argument(
        "--fakes",
        type=int,
        default=0,
        help="fake processes (default: as few as the open-file limit allows, >= 2)",
    )
    p.add_argument("--timeout", type=float, default=300.0, help="per-wait deadline in s")
    p.add_argument("--json", metavar="PATH", help="also write the result as JSON")


def run(args: argparse.Namespace) -> int:
    bad = [n for n in args.ranks if n < 2 * args.ranks_per_agent or n % args.ranks_per_agent]
    if bad or args.repeats < 1:
        print(
            f"ms-recover bench controlplane: --ranks must be multiples of --ranks-per-agent "
            f"({args.ranks_per_agent}) with at least 2 agents, --repeats >= 1; bad: {bad}",
            file=sys.stderr,
        )
        return 2
    limit = _raise_fd_limit()
    scales, skipped = [], []
    for n in sorted(set(args.ranks)):
        if n + n // args.ranks_per_agent + FD_SPARE > limit:
            skipped.append(n)
        else:
            scales.append(_run_scale(n, args, limit))
    return _report(args, scales, skipped, limit).emit(args.json)


def _raise_fd_limit() -> int:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY:
        hard = 1 << 20
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return int(hard)


def _thread_cpu(thread: threading.Thread) -> float:
    assert thread.ident is not None
    return time.clock_gettime(time.pthread_getcpuclockid(thread.ident))


class _Scale:
    """One job of ``ranks`` simulated ranks: the manager, the fakes, and the measurements."""

    def __init__(self, ranks: int, args: argparse.Namespace, fd_limit: int) -> None:
        self.ranks, self.per = ranks, args.ranks_per_agent
        self.nodes = ranks // self.per
        self.timeout = args.timeout
        self.config = JobConfig(
            job_id=f"bench-cp-{os.getpid()}-{ranks}",
            node_nums=self.nodes,
            proc_per_node=self.per,
            heartbeat_s=args.heartbeat,
            hang_timeout_s=3600.0,
            phase_timeout_s=900.0,
            wait_reschedule_timeout_s=900.0,
            max_tries=1_000_000,
            manager_port=0,
            strategies=parse_strategies("recover-in-place,exit"),
        )
        self.events = EventLog()
        self.server = ManagerServer(self.config, events=self.events, bind="127.0.0.1")
        sockets = ranks + self.nodes
        per_fake = max(1, (fd_limit - FD_SPARE) // FDS_PER_SOCKET)
        self.n_fakes = max(args.fakes, 2, -(-sockets // per_fake))
        self.thread: threading.Thread | None = None
        self.procs: list[Any] = []
        self.conns: list[Any] = []
        self.owner: dict[int, int] = {}  # node -> fake index

    def start(self) -> float:
        """Start the manager and the fakes; seconds until the job runs."""
        t0 = time.monotonic()
        self.thread = self.server.start_thread()
        ctx = mp.get_context("spawn")
        cfg = self.config
        endpoint = f"tcp://127.0.0.1:{self.server.port}"
        for i in range(self.n_fakes):
            nodes = tuple(
                range(i * self.nodes // self.n_fakes, (i + 1) * self.nodes // self.n_fakes)
            )
            self.owner.update({n: i for n in nodes})
            spec = FakeSpec(
                endpoint,
                cfg.job_id,
                cfg.effective_secret(),
                nodes,
                self.per,
                cfg.heartbeat_s,
                cfg.max_frame_bytes,
            )
            parent, child = ctx.Pipe()
            proc = ctx.Process(
                target=fake_main, args=(spec, child), daemon=True, name=f"ms-recover-fake-{i}"
            )
            proc.start()
            child.close()
            self.procs.append(proc)
            self.conns.append(parent)
        for conn in self.conns:
            self._reply(conn, "ready")
        self._wait(lambda: self.server.model.state is JobState.RUNNING, "the job to run")
        return time.monotonic() - t0

    def _reply(self, conn: Any, what: str) -> Any:
        if not conn.poll(self.timeout):
            raise TimeoutError(f"no {what!r} from a fake process within {self.timeout:g}s")
        got, value = conn.recv()
        assert got == what, (got, what)
        return value

    def _wait(self, cond: Any, what: str) -> Any:
        return wait_for(cond, self.timeout, what, poll_s=0.002)

    def stop_all(self, rank: int) -> dict[str, Any]:
        """Inject one rank fault; seconds until every survivor's STOPPED was recorded."""
        m, thread = self.server.model, self.thread
        assert thread is not None
        epoch0, state0 = m.epoch, m.state.value
        cpu0 = _thread_cpu(thread)
        conn = self.conns[self.owner[self.config.node_of(rank)]]
        conn.send(("fault", rank))
        t0 = self._reply(conn, "fault")

        def stopped() -> Any:
            rnd = m.round
            return rnd is not None and rnd.epoch > epoch0 and rnd.stop_done > 0 and rnd

        rnd = self._wait(stopped, f"every STOPPED of epoch {epoch0 + 1}")
        cpu = _thread_cpu(thread) - cpu0
        fault = next(e for e in reversed(self.events.recent("fault")) if e["rank"] == rank)
        survivors = sum(1 for r, i in m.ranks.items() if r not in rnd.replace_ranks and not i.done)
        return {
            "rank": rank,
            "from_state": state0,
            "stop_all_s": rnd.stop_done - t0,
            "fault_event_s": fault["ts"] - t0,
            "manager_cpu_s": cpu,
            "survivors": survivors,
        }

    def finish_round(self) -> dict[str, Any]:
        """Release the held restarts and let the recovery finish; its recovery event."""
        m = self.server.model
        for conn in self.conns:
            conn.send(("release", None))
        for conn in self.conns:
            self._reply(conn, "release")
        self._wait(
            lambda: self.events.recent("recovery") and m.state is JobState.RUNNING,
            "the recovery to finish",
        )
        return dict(self.events.recent("recovery")[-1])

    def close(self) -> None:
        # The manager closes first, so TIME_WAIT lands on its side, not on ephemeral ports.
        self.server.stop()
        if self.thread is not None:
            self.thread.join(timeout=30)
        for conn in self.conns:
            try:
                conn.send(("quit", None))
            except (BrokenPipeError, OSError):
                pass
        for proc in self.procs:
            proc.join(timeout=30)
            if proc.is_alive():
                proc.kill()
                proc.join()
        for conn in self.conns:
            conn.close()


def _run_scale(ranks: int, args: argparse.Namespace, fd_limit: int) -> dict[str, Any]:
    scale = _Scale(ranks, args, fd_limit)
    print(
        f"controlplane: {ranks} ranks on {scale.nodes} agents ({scale.n_fakes} fake processes) ...",
        flush=True,
    )
    try:
        formation = scale.start()
        samples = []
        for i in range(args.repeats):
            node = (1 + i * 7919) % scale.nodes
            samples.append(scale.stop_all(node * scale.per + i % scale.per))
        final = scale.finish_round()
    finally:
        scale.close()
    return {
        "ranks": ranks,
        "agents": scale.nodes,
        "fake_processes": scale.n_fakes,
        "formation_s": formation,
        "repeats": samples,
        "stop_all": summary(s["stop_all_s"] for s in samples),
        "manager_cpu": summary(s["manager_cpu_s"] for s in samples),
        "fault_event": summary(s["fault_event_s"] for s in samples),
        "final_round": {
            "ok": final["ok"],
            "phases": final["phases"],
            "replaced": final["replaced"],
        },
    }


def _extrapolate(scales: list[dict[str, Any]]) -> float | None:
    """Least-squares line through (ranks, median stop-all), evaluated at full scale."""
    pts = [(s["ranks"], s["stop_all"]["median"]) for s in scales]
    if len(pts) < 2:
        return None
    n = len(pts)
    mx, my = sum(x for x, _ in pts) / n, sum(y for _, y in pts) / n
    slope = sum((x - mx) * (y - my) for x, y in pts) / sum((x - mx) ** 2 for x, _ in pts)
    return float(my + slope * (FULL_RANKS - mx))


def _report(
    args: argparse.Namespace, scales: list[dict[str, Any]], skipped: list[int], fd_limit: int
) -> Report:
    rep = Report(
        "controlplane",
        "ms-recover bench controlplane: fault -> every survivor's "
        "STOPPED recorded by the manager (real ManagerServer, simulated peers over "
        "ZeroMQ/TCP)",
    )
    for s in scales:
        full = s["ranks"] >= FULL_RANKS
        label = f"{s['ranks']} ranks / {s['agents']} agents"
        rep.add(
            Measure(
                f"stop-all, {label}, median of {s['stop_all']['n']}",
                s["stop_all"]["median"],
                "s",
                "<=" if full else "",
                TARGET_S if full else None,
                "" if full else f"target applies at {FULL_RANKS} ranks",
            ),
            Measure(f"stop-all, {label}, max", s["stop_all"]["max"], "s"),
            Measure("  manager thread CPU in that window", s["manager_cpu"]["median"], "s"),
            Measure(
                "  rebuild phase of the final round", s["final_round"]["phases"]["rebuild"], "s"
            ),
            Measure("  job formation (connect -> running)", s["formation_s"], "s"),
        )
    if not any(s["ranks"] >= FULL_RANKS for s in scales):
        guess = _extrapolate(scales)
        rep.add(
            Measure(
                f"stop-all at {FULL_RANKS} ranks, extrapolated",
                guess,
                "s",
                note="not measured: a straight line through the medians above",
            )
        )
    rep.settings = {
        "ranks": [s["ranks"] for s in scales],
        "skipped_ranks": skipped,
        "ranks_per_agent": args.ranks_per_agent,
        "repeats": args.repeats,
        "heartbeat_s": args.heartbeat,
        "fd_limit": fd_limit,
        "transport": "one ZeroMQ DEALER socket + TCP connection per simulated agent "
        "and rank, on 127.0.0.1",
    }
    rep.samples = {"scales": scales}
    rep.notes = [
        "Simulated agents and ranks run in a few local processes and answer at once; they share "
        "this host's cores with the manager, so the times are an upper bound for the manager.",
        "The manager thread CPU row is the manager's own work in the window (decode, decide, "
        "encode, send), independent of how fast the simulated peers are.",
        "Repeat 1 stops a running job; later repeats are a new fault right after the previous "
        "stop-all (a new epoch, STOP to every survivor again), without a rebuild in between.",
        "Formation's REBUILD grows with the square of the job (every rank's endpoint to every "
        "rank); a recovery's REBUILD carries the world as rank ranges and, to survivors, only "
        "the endpoints registered since their last rebuild.",
    ]
    if skipped:
        rep.notes.append(
            f"Skipped {skipped}: more sockets than the open-file limit ({fd_limit}) "
            "allows in one manager process."
        )
    return rep
