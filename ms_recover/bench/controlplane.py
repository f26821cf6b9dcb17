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
docs/design.md §8 holds stop-all at 16,384 ranks on 2,048 agents to 1 s.

On one 2-core host the simulated ranks share the CPU with the manager (decoding STOP and
encoding STOPPED for thousands of ranks), which a real cluster spreads over thousands of
machines, so these times are an upper bound; the manager thread's own CPU time in the window
is reported next to them, and so is the fake processes' (every thread: the simulated nodes'
share of the same cores).

The simulated members heartbeat at the job's default interval (``JobConfig.heartbeat_s``,
0.5 s) unless ``--heartbeat`` says otherwise; the output says which. Between formation and the
first fault the bench watches the running job for ``--idle`` seconds: the manager thread's CPU
as a share of one core, and the frames it received and sent per second (counters in
:class:`~ms_recover.manager.server.ManagerServer`). docs/design.md §8, up to 16,384 ranks on
2,048 agents and the default heartbeat: forms in <= 5 s, stop-all <= 0.3 s, manager CPU < 10 %
of one core between faults. At 65,536 ranks (8,192 agents): the same three, and the manager
thread's own CPU per stop-all <= 50 ms (the figure that does not depend on the simulated nodes
sharing the host); at 131,072 ranks: forms in <= 10 s, stop-all <= 0.5 s. The job secret is
set (signed frames, CURVE-encrypted control plane), as in production. A scale that does not
form within ``--form-timeout`` is a MISS row with that reason, and the bench goes on with the
next scale; a scale whose sockets exceed this process's open-file limit is MISS rows that say
so (one manager socket per node agent: heartbeat groups carry only the beats, every agent
still holds its own connection).
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import itertools
import multiprocessing as mp
import os
import resource
import secrets
import sys
import threading
import time
from typing import Any

from ms_recover.bench.fakecluster import FakeSpec, fake_main
from ms_recover.bench.table import Measure, Report, summary
from ms_recover.config import GROUP_FROM_NODES, JobConfig
from ms_recover.localrun.wait import Timeout, wait_for
from ms_recover.manager.server import ManagerServer
from ms_recover.observability.events import EventLog
from ms_recover.observability.schema import JobState
from ms_recover.protocol import messages as M
from ms_recover.protocol.codec import Codec
from ms_recover.protocol.transport import control_server_keys
from ms_recover.strategy import parse_strategies

TARGET_STOP_S = 0.3
TARGET_FORM_S = 5.0
TARGET_CPU_PCT = 10.0


@dataclasses.dataclass(frozen=True)
class Targets:
    """One scale's targets (None: no target for that row)."""

    form_s: float | None
    stop_s: float | None
    cpu_pct: float | None = None  # manager thread, between faults, % of one core
    stop_cpu_s: float | None = None  # manager thread CPU per stop-all


#: docs/design.md §8 up to 16,384 ranks; issue 30 ("8x the scale") at 65,536 and 131,072. The
#: manager thread's own CPU per stop-all does not depend on the simulated nodes sharing the host.
DESIGN_TARGETS = Targets(TARGET_FORM_S, TARGET_STOP_S, TARGET_CPU_PCT)
SCALE_TARGETS = {
    65536: Targets(5.0, 0.3, TARGET_CPU_PCT, 0.05),
    131072: Targets(10.0, 0.5),
}
DEFAULT_HEARTBEAT_S = float(
    next(f.default for f in dataclasses.fields(JobConfig) if f.name == "heartbeat_s")  # type: ignore[arg-type]
)
#: How long agents wait for a silent manager (``JobConfig.lost_manager_grace_s``) at the job's
#: defaults: the manager answers their heartbeats once per quarter of it, so the bench keeps it
#: at the default while its long phase timeout (large scales form slowly here) would not.
DEFAULT_GRACE_S = JobConfig().lost_manager_grace_s
FULL_RANKS = 16384
SIMULATED_RANKS = 65536
LARGEST_RANKS = 131072
FDS_PER_SOCKET = 2  # the TCP connection and the socket's mailbox
FD_SPARE = 512
MAX_RSS_BYTES = 3 << 30  # a shared 2-core CI host: a scale that needs more is reported, not run


SHAPE_NOTE = {
    False: "Ranks behind node agents (docs/design.md §1c): each simulated agent is one socket to "
    "the manager and stands for its ranks at every scale (no socket per rank: the rank -> agent "
    "hop is local to a node, not the manager's load, and the open-file limit here is 20,000); "
    "it relays their messages in batches and folds their heartbeats into its own.",
    True: "--direct: every simulated rank has its own socket to the manager, the shape before "
    "the node relay (ranks launched by msrun, without a relaying agent, still connect so).",
}


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--ranks",
        type=int,
        nargs="+",
        default=[1024, 4096, FULL_RANKS, SIMULATED_RANKS, LARGEST_RANKS],
        help="simulated ranks, one run per value (default: 1024 4096 16384 65536 131072)",
    )
    p.add_argument(
        "--direct",
        action="store_true",
        help="the shape before the node relay: every simulated rank its own DEALER to the "
        "manager (rows end in '(direct)'; bounded by the open-file limit)",
    )
    p.add_argument(
        "--no-secret",
        action="store_true",
        help="no job secret: frames signed with the job id's key and no CURVE, the setting "
        "before the 65,536-rank targets (rows end in '(no secret)'; not production's)",
    )
    p.add_argument(
        "--group-nodes",
        type=int,
        default=0,
        help="nodes per heartbeat group (JobConfig.group_nodes; docs/design.md §1c): 0, the "
        "job default, groups of about sqrt(nodes) from 256 nodes on; 1: none (rows then end "
        "in '(no groups)')",
    )
    p.add_argument("--ranks-per-agent", type=int, default=8, help="ranks per simulated node")
    p.add_argument("--repeats", type=int, default=3, help="faults per scale (default 3)")
    p.add_argument(
        "--heartbeat",
        type=float,
        default=DEFAULT_HEARTBEAT_S,
        help="heartbeat interval of the simulated members in s (default: the job default, "
        "%(default)s)",
    )
    p.add_argument(
        "--form-timeout",
        type=float,
        default=60.0,
        help="a scale that has not formed within this many s is a MISS (default %(default)s)",
    )
    p.add_argument(
        "--idle",
        type=float,
        default=3.0,
        help="s of running job watched for manager CPU and message rate (default %(default)s)",
    )
    p.add_argument(
        "--fakes",
        type=int,
        default=0,
        help="fake processes (default: as few as the open-file limit allows, >= 2)",
    )
    p.add_argument("--timeout", type=float, default=120.0, help="per-wait deadline in s")
    p.add_argument("--json", metavar="PATH", help="also write the result as JSON")


def run(args: argparse.Namespace) -> int:
    bad = [n for n in args.ranks if n < 2 * args.ranks_per_agent or n % args.ranks_per_agent]
    if bad or args.repeats < 1 or not args.form_timeout > 0 or not args.idle > 0:
        print(
            f"ms-recover bench controlplane: --ranks must be multiples of --ranks-per-agent "
            f"({args.ranks_per_agent}) with at least 2 agents, --repeats >= 1, --form-timeout "
            f"and --idle > 0; bad ranks: {bad}",
            file=sys.stderr,
        )
        return 2
    limit = _raise_fd_limit()
    default = "the job default" if args.heartbeat == DEFAULT_HEARTBEAT_S else "NOT the job default"
    print(
        f"controlplane: heartbeat {args.heartbeat:g} s ({default}, {DEFAULT_HEARTBEAT_S:g} s); "
        f"agents' manager-silence grace {DEFAULT_GRACE_S:g} s (the job default, not the "
        "bench's 900 s phase timeout)"
    )
    beat_us = beat_cost_us()
    scales, skipped = [], []
    for n in sorted(set(args.ranks)):
        sockets = n // args.ranks_per_agent + (n if args.direct else 0)
        if sockets + FD_SPARE > limit:  # the manager's: one file per connection (fakes: per_fake)
            skipped.append(n)
            scales.append(not_run(n, args.ranks_per_agent, args.direct, limit, not args.no_secret))
        else:
            scales.append(_run_scale(n, args, limit))
    return _report(args, scales, skipped, limit, beat_us).emit(args.json)


def _raise_fd_limit() -> int:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY:
        hard = 1 << 20
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return int(hard)


def _rss_bytes() -> int:
    """This process's resident memory (Linux; 0 where /proc is missing)."""
    try:
        with open("/proc/self/statm") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def _thread_cpu(thread: threading.Thread) -> float:
    assert thread.ident is not None
    return time.clock_gettime(time.pthread_getcpuclockid(thread.ident))


class JobEnded(Exception):
    """The simulated job ended (the manager chose ``exit``) before it ran."""


class _Scale:
    """One job of ``ranks`` simulated ranks: the manager, the fakes, and the measurements."""

    def __init__(self, ranks: int, args: argparse.Namespace, fd_limit: int) -> None:
        self.ranks, self.per = ranks, args.ranks_per_agent
        self.nodes: int = ranks // self.per
        self.timeout = args.timeout
        self.config = JobConfig(
            job_id=f"bench-cp-{os.getpid()}-{ranks}",
            node_nums=self.nodes,
            proc_per_node=self.per,
            heartbeat_s=args.heartbeat,
            hang_timeout_s=3600.0,
            phase_timeout_s=900.0,
            manager_grace_s=DEFAULT_GRACE_S,
            wait_reschedule_timeout_s=900.0,
            max_tries=1_000_000,
            manager_port=0,
            strategies=parse_strategies("recover-in-place,exit"),
            # As in production: a job secret, so the control plane is CURVE-encrypted.
            secret=b"" if args.no_secret else secrets.token_hex(16).encode(),
            group_nodes=args.group_nodes,
        )
        self.events = EventLog()
        self.server = ManagerServer(self.config, events=self.events, bind="127.0.0.1")
        self.relay = not args.direct
        sockets = self.nodes if self.relay else ranks + self.nodes
        per_fake = max(1, (fd_limit - FD_SPARE) // FDS_PER_SOCKET)
        self.n_fakes: int = max(args.fakes, 2, -(-sockets // per_fake))
        self.thread: threading.Thread | None = None
        self.procs: list[Any] = []
        self.conns: list[Any] = []
        self.owner: dict[int, int] = {}  # node -> fake index

    def start(self, form_s: float) -> float:
        """Start the manager and the fakes; seconds until the job runs (Timeout after
        ``form_s``)."""
        t0 = time.monotonic()
        deadline = t0 + form_s
        self.thread = self.server.start_thread()
        ctx = mp.get_context("spawn")
        cfg = self.config
        endpoint = f"tcp://127.0.0.1:{self.server.port}"
        size = cfg.group_size if self.relay else 1

        def edge(i: int) -> int:  # slices of whole heartbeat groups: a fake holds its leaders
            return min(self.nodes, -(-(i * self.nodes // self.n_fakes) // size) * size)

        for i in range(self.n_fakes):
            nodes = tuple(range(edge(i), edge(i + 1)))
            self.owner.update({n: i for n in nodes})
            spec = FakeSpec(
                endpoint,
                cfg.job_id,
                cfg.effective_secret(),
                nodes,
                self.per,
                cfg.heartbeat_s,
                cfg.max_frame_bytes,
                self.relay,
                cfg.agent_heartbeat_s,
                cfg.rank_report_s,
                control_server_keys(cfg.secret, cfg.job_id)[0] if cfg.control_curve else b"",
                size,
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
            self._reply(conn, "ready", max(0.0, deadline - time.monotonic()))
        wait_for(self._formed, max(0.0, deadline - time.monotonic()), "the job", poll_s=0.002)
        return time.monotonic() - t0

    def _formed(self) -> bool:
        state = self.server.model.state
        if state in (JobState.EXITING, JobState.FINISHED):
            raise JobEnded(f"the job ended while forming ({state.value}: {self.end_reason()})")
        rss = _rss_bytes()
        if rss > MAX_RSS_BYTES:  # frames queued for slow simulated agents: stop before the host
            raise JobEnded(
                f"the manager process grew to {rss >> 20} MiB while forming (limit "
                f"{MAX_RSS_BYTES >> 20} MiB): the formation REBUILD sent every rank's endpoint "
                "to every node"
            )
        return state is JobState.RUNNING

    def end_reason(self) -> str:
        """The manager's last exit decision's reason, if it made one."""
        exits = [e for e in self.events.recent("decision") if e.get("strategy") == "exit"]
        return str(exits[-1].get("reason", "")) if exits else "no exit decision recorded"

    def progress(self) -> dict[str, Any]:
        """How far the job got (read without the manager's lock: a snapshot for the report)."""
        m = self.server.model
        return {
            "state": m.state.value,
            "ranks_registered": sum(1 for info in list(m.ranks.values()) if info.registered),
            "frames_in": self.server.frames_in,
            "frames_out": _frames_out(self.server),
            "exit_reason": self.end_reason(),
        }

    def idle(self, window_s: float) -> dict[str, Any]:
        """The running job, no fault: manager thread CPU share and frames per second, over at
        least ``window_s`` from the end of one decision that judged every rank to the end of
        another (:attr:`Cadence.judged <ms_recover.manager.cadence.Cadence.judged>`): those
        take up to 1/40 of the thread in one piece every few seconds at scale (200 ms every
        8 s at 65,536 ranks), so a window that does not span whole periods of them reads
        their share as either nothing or several times its size."""
        assert self.thread is not None
        srv = self.server
        judged = srv.cadence.judged
        self._wait(lambda: srv.cadence.judged > judged, "a decision that judges every rank")
        cpu0, t0 = _thread_cpu(self.thread), time.time()
        in0, out0, relayed0 = srv.frames_in, _frames_out(srv), srv.relay.items_in
        first = srv.cadence.judged
        time.sleep(window_s)  # a measurement window, not a wait for a condition
        judged = srv.cadence.judged
        self._wait(lambda: srv.cadence.judged > judged, "a decision that judges every rank")
        # the window ends as the last judging decision ends: no share of the next one in it
        cpu, wall = _thread_cpu(self.thread) - cpu0, time.time() - t0
        return {
            "window_s": wall,
            "judged": srv.cadence.judged - first,
            "cpu_pct": cpu / wall * 100,
            "in_per_s": (srv.frames_in - in0) / wall,
            "out_per_s": (_frames_out(srv) - out0) / wall,
            "relayed_per_s": (srv.relay.items_in - relayed0) / wall,
            "state": srv.model.state.value,
        }

    def _reply(self, conn: Any, what: str, timeout: float | None = None) -> Any:
        timeout = self.timeout if timeout is None else timeout
        if not conn.poll(timeout):
            raise Timeout(f"no {what!r} from a fake process within {timeout:g}s")
        got, value = conn.recv()
        assert got == what, (got, what)
        return value

    def nodes_cpu(self) -> float:
        """CPU seconds the fake processes (every thread) have used so far: the work of the
        simulated nodes, which shares this host's cores with the manager."""
        for conn in self.conns:
            conn.send(("stats", None))
        return sum(float(self._reply(conn, "stats")["cpu_s"]) for conn in self.conns)

    def _wait(self, cond: Any, what: str) -> Any:
        return wait_for(cond, self.timeout, what, poll_s=0.002)

    def stop_all(self, rank: int) -> dict[str, Any]:
        """Inject one rank fault; seconds until every survivor's STOPPED was recorded."""
        m, thread = self.server.model, self.thread
        assert thread is not None
        epoch0, state0 = m.epoch, m.state.value
        nodes0 = self.nodes_cpu()
        cpu0 = _thread_cpu(thread)
        conn = self.conns[self.owner[self.config.node_of(rank)]]
        conn.send(("fault", rank))
        t0 = self._reply(conn, "fault")

        def stopped() -> Any:
            rnd = m.round
            return rnd is not None and rnd.epoch > epoch0 and rnd.stop_done > 0 and rnd

        rnd = self._wait(stopped, f"every STOPPED of epoch {epoch0 + 1}")
        cpu = _thread_cpu(thread) - cpu0
        nodes = self.nodes_cpu() - nodes0
        fault = next(e for e in reversed(self.events.recent("fault")) if e["rank"] == rank)
        survivors = sum(1 for r, i in m.ranks.items() if r not in rnd.replace_ranks and not i.done)
        return {
            "rank": rank,
            "from_state": state0,
            "stop_all_s": rnd.stop_done - t0,
            "fault_event_s": fault["ts"] - t0,
            "manager_cpu_s": cpu,
            "nodes_cpu_s": nodes,
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
        # The manager froze this process's heap (ManagerServer._freeze_when_running): let the
        # collector reclaim this scale's job before the next one is measured.
        gc.unfreeze()
        gc.collect()


def _run_scale(ranks: int, args: argparse.Namespace, fd_limit: int) -> dict[str, Any]:
    """One scale's samples; a scale that does not form (or stop) in time comes back with
    ``failed`` set to the reason instead of raising."""
    scale = _Scale(ranks, args, fd_limit)
    print(
        f"controlplane: {ranks} ranks on {scale.nodes} agents ({scale.n_fakes} fake processes) ...",
        flush=True,
    )
    result: dict[str, Any] = {
        "ranks": ranks,
        "agents": scale.nodes,
        "fake_processes": scale.n_fakes,
        "relay": scale.relay,
        "secret": not args.no_secret,
        # Nodes per heartbeat group (1: none), and whether --group-nodes 1 turned them off.
        "group_size": scale.config.group_size if scale.relay else 1,
        "groups_off": args.group_nodes == 1,
        "heartbeat_s": args.heartbeat,
        "failed": "",
        "formation_s": None,
        "idle": None,
        "repeats": [],
    }
    samples: list[dict[str, Any]] = result["repeats"]
    try:
        try:
            result["formation_s"] = scale.start(args.form_timeout)
        except Timeout:
            result["failed"] = (
                f"did not form within {args.form_timeout:g} s at heartbeat {args.heartbeat:g} s"
            )
            result["at_deadline"] = scale.progress()
            return _summarise(result)
        except JobEnded as exc:
            result["failed"] = f"did not form at heartbeat {args.heartbeat:g} s: {exc}"
            result["at_deadline"] = scale.progress()
            return _summarise(result)
        result["idle"] = scale.idle(args.idle)
        for i in range(args.repeats):
            node = (1 + i * 7919) % scale.nodes
            samples.append(scale.stop_all(node * scale.per + i % scale.per))
        final = scale.finish_round()
        result["final_round"] = {
            "ok": final["ok"],
            "phases": final["phases"],
            "replaced": final["replaced"],
        }
    except Timeout as exc:
        result["failed"] = f"formed, then timed out at heartbeat {args.heartbeat:g} s: {exc}"
    finally:
        scale.close()
    return _summarise(result)


def _summarise(result: dict[str, Any]) -> dict[str, Any]:
    samples = result["repeats"]
    result["stop_all"] = summary(s["stop_all_s"] for s in samples)
    result["manager_cpu"] = summary(s["manager_cpu_s"] for s in samples)
    result["nodes_cpu"] = summary(s["nodes_cpu_s"] for s in samples)
    result["fault_event"] = summary(s["fault_event_s"] for s in samples)
    return result


def _extrapolate(scales: list[dict[str, Any]]) -> float | None:
    """Least-squares line through (ranks, median stop-all), evaluated at full scale."""
    pts = [(s["ranks"], s["stop_all"]["median"]) for s in scales if s["stop_all"]["n"]]
    if len(pts) < 2:
        return None
    n = len(pts)
    mx, my = sum(x for x, _ in pts) / n, sum(y for _, y in pts) / n
    slope = sum((x - mx) * (y - my) for x, y in pts) / sum((x - mx) ** 2 for x, _ in pts)
    return float(my + slope * (FULL_RANKS - mx))


def _agent_beat(heartbeat_s: float) -> float:
    """The agents' heartbeat period at this heartbeat and the default liveness."""
    return JobConfig(heartbeat_s=heartbeat_s).agent_heartbeat_s


def _frames_out(srv: ManagerServer) -> int:
    """Frames the manager sent: direct ones and the relay's per-node batches."""
    return srv.frames_out + srv.relay.frames_out


def beat_cost_us(batches: int = 5, per_batch: int = 2000) -> float:
    """This host's cost of the manager's commonest frame: one agent heartbeat (no steps)
    through :meth:`ManagerServer.dispatch`, in-process (no socket), median of ``batches``
    batches, in microseconds. The manager's CPU between faults is about the agents' beat rate
    times this (plus the socket's receive), so it says how fast this host runs that path."""
    cfg = JobConfig(job_id="beat", node_nums=2, proc_per_node=8, manager_port=0, secret=b"x")
    srv = ManagerServer(cfg, events=EventLog(), bind="127.0.0.1")
    try:
        codec = Codec(cfg.job_id, cfg.effective_secret())
        agent = [b"a0", *codec.encode(M.AgentHello(0, "127.0.0.1", [0], 1, True), 0, "agent:0", 1)]
        srv.dispatch(agent)
        seq = itertools.count(2)
        times = []
        for _ in range(batches):
            beats = [
                [b"a0", *codec.encode(M.AgentHeartbeat(0), 0, "agent:0", next(seq))]
                for _ in range(per_batch)
            ]
            t0 = time.perf_counter()
            for frames in beats:
                srv.dispatch(frames)
            times.append((time.perf_counter() - t0) / per_batch * 1e6)
        if srv.drops.total or srv.errors.total:
            raise RuntimeError(f"calibration heartbeats dropped: {srv.drops.total}")
        return sorted(times)[batches // 2]
    finally:
        srv.close()


def targets_of(ranks: int) -> Targets | None:
    """The targets of a scale: docs/design.md §8's up to 16,384 ranks, issue 30's at 65,536 and
    131,072; None elsewhere (a simulation for context)."""
    if ranks <= FULL_RANKS:
        return DESIGN_TARGETS
    return SCALE_TARGETS.get(ranks)


def _target(limit: float | None, op: str, ranks: int) -> dict[str, Any]:
    if limit is not None:
        return {"op": op, "limit": limit}
    if targets_of(ranks) is None:
        return {
            "note": f"no target at {ranks} ranks (targets: up to {FULL_RANKS}, and at "
            f"{', '.join(map(str, SCALE_TARGETS))})"
        }
    return {}


def _windowed(row: Measure, idle: dict[str, Any]) -> Measure:
    """``row`` with the idle window it was measured over in its note."""
    if "judged" not in idle:
        return row
    window = f"{idle['window_s']:.1f} s window, {idle['judged']} decisions judging every rank"
    return dataclasses.replace(row, note=f"{row.note}; {window}" if row.note else window)


def scale_rows(s: dict[str, Any]) -> list[Measure]:
    """One scale's rows; names depend on the scale only, so runs compare row by row."""
    n = s["ranks"]
    aim = targets_of(n) or Targets(None, None)
    label = f"{n} ranks / {s['agents']} agents" + ("" if s.get("relay", True) else " (direct)")
    label += "" if s.get("secret", True) else " (no secret)"
    label += " (no groups)" if s.get("groups_off") else ""
    failed = s["failed"]
    formed = s["formation_s"] is not None
    idle = s["idle"] or {}
    stop, cpu, nodes = s["stop_all"], s["manager_cpu"], s.get("nodes_cpu", {})
    why = failed if failed and (not formed or not stop["n"]) else ""
    return [
        Measure(
            f"{label}: formation (connect -> running)",
            s["formation_s"],
            "s",
            failed="" if formed else failed,
            **_target(aim.form_s, "<=", n),
        ),
        _windowed(
            Measure(
                f"{label}: manager CPU between faults",
                idle.get("cpu_pct"),
                "% of a core",
                failed="" if formed else failed,
                **_target(aim.cpu_pct, "<", n),
            ),
            idle,
        ),
        Measure(f"{label}: manager frames received", idle.get("in_per_s"), "/s"),
        Measure(f"{label}: manager frames sent", idle.get("out_per_s"), "/s"),
        Measure(f"{label}: rank messages relayed to the manager", idle.get("relayed_per_s"), "/s"),
        Measure(
            f"{label}: stop-all (median)",
            stop["median"],
            "s",
            failed=why,
            **_target(aim.stop_s, "<=", n),
        ),
        Measure(f"{label}: stop-all (max)", stop["max"], "s"),
        Measure(
            f"{label}: manager thread CPU during stop-all",
            cpu["median"],
            "s",
            failed=why if aim.stop_cpu_s is not None else "",
            **_target(aim.stop_cpu_s, "<=", n),
        ),
        Measure(
            f"{label}: simulated nodes' CPU during stop-all",
            nodes.get("median"),
            "s",
            note=f"{s.get('fake_processes', '?')} fake processes standing for {s['agents']} "
            "nodes, every thread: a cluster spreads this over its nodes",
        ),
        Measure(
            f"{label}: rebuild phase of the final round",
            s.get("final_round", {}).get("phases", {}).get("rebuild"),
            "s",
        ),
    ]


def not_run(
    ranks: int, per_agent: int, direct: bool, fd_limit: int, secret: bool = True
) -> dict[str, Any]:
    """A scale this process cannot open the sockets for: its rows, each with the reason."""
    agents = ranks // per_agent
    sockets = agents + (ranks if direct else 0)
    result: dict[str, Any] = {
        "ranks": ranks,
        "agents": agents,
        "relay": not direct,
        "secret": secret,
        "failed": f"not run: {sockets} connections need {sockets + FD_SPARE} open files in the "
        f"manager's process, which may open {fd_limit} (one connection per node agent: "
        "heartbeat groups carry only the beats, every agent still holds its own connection)",
        "formation_s": None,
        "idle": None,
        "repeats": [],
    }
    return _summarise(result)


def _groups(group_nodes: int) -> str:
    if group_nodes:
        return f"groups of {group_nodes} nodes"
    return f"about sqrt(nodes) nodes per group from {GROUP_FROM_NODES} nodes on"


def _report(
    args: argparse.Namespace,
    scales: list[dict[str, Any]],
    skipped: list[int],
    fd_limit: int,
    beat_us: float,
) -> Report:
    default = "the job default" if args.heartbeat == DEFAULT_HEARTBEAT_S else "not the job default"
    rep = Report(
        "controlplane",
        f"ms-recover bench controlplane: real ManagerServer, simulated peers over ZeroMQ/TCP, "
        f"heartbeat {args.heartbeat:g} s ({default})",
    )
    rep.add(
        Measure(
            "this host: one agent heartbeat handled by the manager (in-process)",
            beat_us,
            "us",
            note="ManagerServer.dispatch, median of 5 x 2000; CPU between faults ~ beats/s x this",
        )
    )
    for s in scales:
        rep.add(*scale_rows(s))
    if not any(s["ranks"] >= FULL_RANKS for s in scales):
        rep.add(
            Measure(
                f"stop-all at {FULL_RANKS} ranks, extrapolated",
                _extrapolate(scales),
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
        "heartbeat_is_job_default": args.heartbeat == DEFAULT_HEARTBEAT_S,
        "manager_grace_s": DEFAULT_GRACE_S,
        "form_timeout_s": args.form_timeout,
        "idle_window_s": args.idle,
        "fd_limit": fd_limit,
        "shape": "direct" if args.direct else "relay",
        "job_secret": not args.no_secret,
        "curve": not args.no_secret,
        "transport": (
            "one ZeroMQ DEALER socket + TCP connection per simulated agent and rank, on 127.0.0.1"
            if args.direct
            else "one ZeroMQ DEALER socket + TCP connection per simulated agent, on 127.0.0.1; "
            "each agent stands for its ranks (no socket per rank) and relays for them"
        ),
    }
    rep.samples = {"scales": scales}
    rep.notes = [
        f"Heartbeat {args.heartbeat:g} s: {default} ({DEFAULT_HEARTBEAT_S:g} s). Simulated "
        f"agents beat every {_agent_beat(args.heartbeat):.3g} s, as real agents do "
        "(JobConfig.agent_heartbeat_s: three beats per silence window of heartbeat x liveness; "
        "a lost node is still declared one silence window after its last beat), ranks every "
        "heartbeat (to their agent).",
        f"Agents' manager-silence grace {DEFAULT_GRACE_S:g} s, the job default "
        "(JobConfig.lost_manager_grace_s; the bench's phase timeout is 900 s, which would "
        "otherwise be the grace): the manager answers an agent's heartbeat once per quarter "
        f"of it, about every {DEFAULT_GRACE_S / 4:g} s.",
        SHAPE_NOTE[bool(args.direct)],
        (
            "--group-nodes 1: no heartbeat groups, every simulated agent beats to the manager."
            if args.group_nodes == 1
            else "Heartbeat groups (docs/design.md §1c) where the job has them "
            f"({_groups(args.group_nodes)}; group size per scale in the samples): a member "
            "agent's beat goes to its leader, "
            "which sends the manager one batch per quarter beat. The member -> leader hop is "
            "between nodes, not the manager's load: the fakes keep it in-process."
        ),
        (
            "--no-secret: no job secret, so frames are signed with the job id's key and the "
            "control plane is not encrypted (not production's setting)."
            if args.no_secret
            else "The job secret is set, as in production: every frame is signed with it and "
            "the control plane is CURVE-encrypted (each simulated node's connection does the "
            "CURVE handshake and encrypts, on the same cores as the manager)."
        ),
        "Simulated agents and ranks run in a few local processes and answer at once; they share "
        "this host's cores with the manager, so the times are an upper bound for the manager.",
        f"'Between faults': the running job watched for at least {args.idle:g} s before the "
        "first fault, from the end of one decision that judged every rank (their silence and "
        "timing reports: at most 1/40 of the manager thread, in one piece every few seconds at "
        "scale) to the end of another, so the window holds whole periods of them; "
        "frames counted in ManagerServer.dispatch (received) and sent (one per direct recipient, "
        "one per node batch); 'rank messages relayed' counts the rank messages and folded "
        "heartbeats those frames carried in.",
        "Repeat 1 stops a running job; later repeats are a new fault right after the previous "
        "stop-all (a new epoch, STOP to every survivor again), without a rebuild in between.",
        "Each REBUILD carries the world as rank ranges and only the data endpoints of the peers "
        "that rank sends to (ring successor, barrier and recursive-doubling partners, its "
        "groups: ms_recover.comm.peers), about 2 log2(N) of them, so formation is N log N.",
    ]
    for s in scales:
        if s.get("at_deadline"):
            got = s["at_deadline"]
            rep.notes.append(
                f"{s['ranks']} ranks when formation gave up: job {got['state']}, "
                f"{got['ranks_registered']} of {s['ranks']} ranks registered, "
                f"{got['frames_in']} frames received, {got['frames_out']} sent; "
                f"manager's exit reason: {got['exit_reason']}."
            )
    if skipped:
        rep.notes.append(
            f"Skipped {skipped}: more sockets than the open-file limit ({fd_limit}) "
            "allows in one manager process."
        )
    return rep
