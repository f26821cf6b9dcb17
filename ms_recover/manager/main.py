"""Run the job's recovery manager in the foreground until the job ends.

Every option falls back to the MindCluster environment (MINDX_TASK_ID, MS_SCHED_HOST, POD_IP,
MS_WORKER_NUM, MS_LOCAL_WORKER, MS_RECOVER_*) and then to the defaults. SIGTERM stops it
cleanly: the active manager hands over to a standby of ``MS_RECOVER_MANAGERS`` that answers
(docs/manager-takeover.md), and without one ends the job as asked (a final dump when ``dump``
is configured). Exit code: 0 when the job finished (or this manager handed over), 87 when
recovery gave up (exit strategy), 88 after a dump, 143 when the job was asked to stop (every
node's agent got SIGTERM: the job deleted or every node drained; or the manager's own SIGTERM
with no standby; after a final dump when ``dump`` is configured).
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import threading
import types
from collections.abc import Callable
from typing import Any

import zmq

from ms_recover import inputs
from ms_recover.config import JobConfig
from ms_recover.errors import ConfigError
from ms_recover.inputs import int_arg, seconds_arg
from ms_recover.manager.server import ManagerServer
from ms_recover.manager.takeover import Watch
from ms_recover.observability.events import EventLog
from ms_recover.observability.metrics import serve_metrics
from ms_recover.subhealth import parse_sub_healthy

log = logging.getLogger("ms_recover.manager")


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("--host", help="address to bind (env POD_IP / MS_SCHED_HOST, default 127.0.0.1)")
    p.add_argument(
        "--port",
        type=int_arg(0, 65535),
        help="port to bind (env MS_RECOVER_PORT, default 9601; 0 = any)",
    )
    p.add_argument("--job-id", help="job id (env MINDX_TASK_ID, default 'default')")
    p.add_argument("--node-nums", type=int, help="number of nodes (env MS_RECOVER_NODE_NUMS)")
    p.add_argument("--proc-per-node", type=int, help="ranks per node (env MS_LOCAL_WORKER)")
    p.add_argument(
        "--strategy",
        help="recover-strategy comma list: retry, recover-in-place, "
        "recover, elastic-training, dump, exit (env MS_RECOVER_STRATEGY)",
    )
    p.add_argument("--events", help="JSONL event log path (env MS_RECOVER_EVENTS)")
    p.add_argument(
        "--sub-healthy-strategy",
        help="what a flagged node meets, MindCluster's subHealthyStrategy label: ignore, "
        "graceExit, forceExit, hotSwitch (env MS_RECOVER_SUB_HEALTHY_STRATEGY, default ignore)",
    )
    p.add_argument(
        "--wait-reschedule-timeout",
        type=seconds_arg(),
        help="seconds to wait for a rescheduled pod (default 270)",
    )
    p.add_argument(
        "--require-secret",
        action="store_true",
        default=None,
        help="refuse to run without a job secret (env MS_RECOVER_REQUIRE_SECRET=1)",
    )
    p.add_argument(
        "--metrics-port",
        type=int_arg(1, 65535),
        default=None,
        help="serve Prometheus metrics on this port (env MS_RECOVER_METRICS_PORT; "
        "needs ms-recover[metrics])",
    )


def config_from_args(args: argparse.Namespace) -> JobConfig:
    return JobConfig.from_env(
        manager_port=args.port,
        job_id=args.job_id,
        node_nums=args.node_nums,
        proc_per_node=args.proc_per_node,
        strategies=args.strategy,
        events_path=args.events,
        wait_reschedule_timeout_s=args.wait_reschedule_timeout,
        require_secret=args.require_secret,
        sub_healthy=parse_sub_healthy(args.sub_healthy_strategy)
        if args.sub_healthy_strategy is not None
        else None,
    )


def run(args: argparse.Namespace) -> int:
    """Serve the job's manager until it ends; the SIGTERM handler the caller had is put back
    whichever way this returns (``cli.main`` may run inside another program, such as a test)."""
    previous = hold_sigterm()
    try:
        return _run(args)
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


def _run(args: argparse.Namespace) -> int:
    config = config_from_args(args)
    metrics_port = args.metrics_port or _env_port("MS_RECOVER_METRICS_PORT")
    host = args.host or config.pod_ip
    index = takeover_index(config, host)
    if index is not None:  # the node hosting a manager is the one that cannot move
        config = config.replace(sched_node_rank=config.node_rank)
    server = _listen(config, host)
    log.info("manager for %s listening on port %d", config.describe(), server.port)
    watch = None
    if index is not None:
        server.set_role("standby", 0, False)  # until the watch decides (docs/manager-takeover.md)
        watch = Watch(config, index, server)
        server.standbys = len(config.managers) - 1  # SIGTERM: hand over to one that answers
        server.successor_answering = watch.successor_answering
        watch.decide_start()
        watch.start()
    if metrics_port:
        try:
            serve_metrics(metrics_port, server.status, server.events)
        except OSError as exc:
            server.close()
            raise ConfigError(
                f"cannot serve metrics on port {metrics_port}: {exc.strerror or exc}; choose "
                "a free port in 1..65535 (--metrics-port / MS_RECOVER_METRICS_PORT)"
            ) from exc
        log.info("Prometheus metrics on port %d", metrics_port)
    try:
        return serve_in_foreground(server)
    finally:
        if watch is not None:
            watch.stop()


def takeover_index(config: JobConfig, host: str) -> int | None:
    """This manager's place in ``MS_RECOVER_MANAGERS`` (None without standbys): the entry
    equal to its own ``host:port``, else (the list names Services, the manager binds its
    POD_IP) the entry of its node: the i-th manager lives on node ``sched_node_rank + i``.
    ConfigError when neither fits."""
    if len(config.managers) < 2:
        return None
    me = f"{host}:{config.manager_port}"
    if me in config.managers:
        return config.managers.index(me)
    by_node = (config.node_rank - config.sched_node_rank) % config.node_nums
    if by_node < len(config.managers):
        return by_node
    raise ConfigError(
        f"this manager ({me}, node {config.node_rank}) is not in MS_RECOVER_MANAGERS "
        f"({','.join(config.managers)}); list every manager as host:port in takeover order, "
        f"the i-th on node {config.sched_node_rank}+i (MS_NODE_RANK)"
    )


def _listen(config: JobConfig, host: str) -> ManagerServer:
    """The bound server; ConfigError naming the address or file when it cannot start."""
    inputs.check_host("--host", host)
    try:
        events = EventLog(config.events_path)
    except OSError as exc:
        raise ConfigError(
            f"event log {config.events_path!r} cannot be opened for appending: "
            f"{exc.strerror or exc}; give a writable file path (--events / MS_RECOVER_EVENTS)"
        ) from exc
    try:
        return ManagerServer(config, events=events, bind=host)
    except ConfigError:  # the dump directory, checked at start
        events.close()
        raise
    except zmq.ZMQError as exc:
        events.close()
        raise ConfigError(
            f"cannot listen on {host}:{config.manager_port}: {exc.strerror}; --host must be an "
            "address or interface of this machine (or 0.0.0.0) and --port a free port (0: any)"
        ) from exc


_Handler = Callable[[int, types.FrameType | None], Any] | int | signal.Handlers | None
_TERM = threading.Event()  # a SIGTERM that came before serve_in_foreground took over


def hold_sigterm() -> _Handler:
    """Until :func:`serve_in_foreground`, a SIGTERM is remembered instead of killing the
    process. Called before binding: a supervisor (or a test) may send SIGTERM as soon as the
    port listens, and the manager must still stop cleanly with the job's exit code. Returns
    the handler it replaced."""
    _TERM.clear()
    return signal.signal(signal.SIGTERM, lambda signum, frame: _TERM.set())


def serve_in_foreground(server: ManagerServer) -> int:
    """Serve until the job ends; the exit code of the job. SIGTERM (the pod deleted or the
    node drained) makes an active manager hand over to a standby that answers, or else end
    the job cleanly (a final dump where ``dump`` is configured, then 143); a standby stops
    (:func:`~ms_recover.manager.takeover.on_sigterm`)."""

    def on_term(signum: int, frame: types.FrameType | None) -> None:
        server.sigterm("SIGTERM")

    signal.signal(signal.SIGTERM, on_term)
    if _TERM.is_set():  # it came while binding (see hold_sigterm)
        server.sigterm("SIGTERM")
    return server.serve()


def _env_port(name: str) -> int | None:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return None
    if not raw.isdigit() or not 0 < int(raw) < 65536:
        raise ConfigError(f"{name}={raw!r} is not a port number (1..65535)")
    return int(raw)
