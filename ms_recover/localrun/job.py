"""LocalJob: a whole job on one machine: the manager (in a thread) plus one pod per node;
ManagerPodJob: the same with the manager a process of node 0's pod and a standby in node 1's.

Used by the tests and by ``ms-recover demo``. Everything binds 127.0.0.1 on ephemeral ports,
and :meth:`LocalJob.close` kills every process it started, by PID (process group), and joins
the manager thread.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from typing import Any

from ms_recover import env as E
from ms_recover.config import JobConfig
from ms_recover.localrun.pods import LocalPods
from ms_recover.localrun.wait import Timeout, wait_for
from ms_recover.manager.server import ManagerServer
from ms_recover.observability.events import Event, EventLog
from ms_recover.observability.status import query
from ms_recover.strategy import format_strategies


class LocalJob:
    def __init__(
        self,
        config: JobConfig,
        command: list[str],
        env: dict[str, str] | None = None,
        log_dir: str = "",
        reschedule_delay_s: float = 0.0,
        on_event: Callable[[Event], None] | None = None,
        spares: int = 0,
        spare_pods: int = 0,
    ) -> None:
        self.events = EventLog(config.events_path)
        if on_event is not None:
            self.events.subscribe(on_event)
        self.server = ManagerServer(
            config.replace(manager_port=0), events=self.events, bind="127.0.0.1"
        )
        self.config = config.replace(
            manager_port=self.server.port, manager_host="127.0.0.1", pod_ip="127.0.0.1"
        )
        if config.secret:  # the members learn it as from a Kubernetes Secret
            env = {**(env or {}), E.SECRET: config.secret.decode()}
        self.member_env = env
        self.pods = LocalPods(
            self.config,
            command,
            env,
            log_dir,
            reschedule_delay_s,
            spares=spares,
            spare_pods=spare_pods,
        )
        self.events.subscribe(self._on_hot_switch)
        self.events.subscribe(self._on_spare_promoted)
        #: Whether a hot switch's request for a new pod is served (a test of its timeout
        #: turns it off: no pod comes, as when a cluster has no free node).
        self.serve_backups = True
        self._thread: threading.Thread | None = None
        self.exit_code: int | None = None

    def start(self) -> LocalJob:
        self._thread = threading.Thread(target=self._serve, name="local-manager", daemon=True)
        self._thread.start()
        self.pods.start()
        return self

    def _serve(self) -> None:
        self.exit_code = self.server.serve(end_grace_s=0.5)

    def _on_hot_switch(self, e: Event) -> None:
        """The pod supervisor's part of a hot switch: a new pod for the node (at the next
        poll; this runs in the manager's thread)."""
        if e["event"] == "sub_health" and e.get("action") == "switch_requested":
            if self.serve_backups:
                self.pods.want_backup(int(e["node"]))

    def _on_spare_promoted(self, e: Event) -> None:
        """A spare pod took a lost node's place: the supervisor's map of which pod holds
        which node follows (this runs in the manager's thread)."""
        if e["event"] == "spare_promoted":
            self.pods.promoted(int(e["node_rank"]), int(e["pid"]))

    def wait(self, timeout_s: float) -> bool:
        """Supervise the pods until the job ended; False on timeout."""
        ok = self.pods.wait(timeout_s)
        if ok and self._thread is not None:
            self._thread.join(timeout=5)
        return ok

    def find(self, event: str, **match: Any) -> list[Event]:
        return [
            e for e in self.events.recent(event) if all(e.get(k) == v for k, v in match.items())
        ]

    def status(self) -> dict[str, Any]:
        return self.server.status()

    def close(self) -> None:
        self.pods.close()
        self.server.stop()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def __enter__(self) -> LocalJob:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()


class ManagerPodJob(LocalJob):
    """A :class:`LocalJob` whose manager lives in node 0's pod, as the scheduler pod's does in
    Kubernetes, with a standby manager in the next node's pod (unless ``standby`` is False;
    docs/manager-takeover.md):
    losing node 0 loses its manager, and the standby takes over. The managers write one JSONL
    event log that this job tails into :attr:`events` (listeners see each event as it comes).
    ``status()`` asks the active manager; :attr:`exit_code` is the job's, from ``job_end``."""

    #: The pods' supervisor (msrun's in :class:`~ms_recover.localrun.msrunjob.MsrunManagerPodJob`).
    PODS: type[LocalPods] = LocalPods

    def __init__(
        self,
        config: JobConfig,
        command: list[str],
        env: dict[str, str] | None = None,
        log_dir: str = "",
        reschedule_delay_s: float = 0.0,
        on_event: Callable[[Event], None] | None = None,
        spares: int = 0,
        standby: bool = True,
    ) -> None:
        self.events = EventLog()
        if on_event is not None:
            self.events.subscribe(on_event)
        self.log_dir = log_dir or tempfile.mkdtemp(prefix="ms-recover-job-")
        self.events_path = config.events_path or os.path.join(self.log_dir, "events.jsonl")
        hosts = manager_nodes(config, standby)
        ports = {node: free_port() for node in hosts}
        self.config = config.replace(
            manager_port=ports[hosts[0]],
            manager_host="127.0.0.1",
            pod_ip="127.0.0.1",
            managers=tuple(f"127.0.0.1:{ports[n]}" for n in hosts),
            events_path="",
        )
        if config.secret:
            env = {**(env or {}), E.SECRET: config.secret.decode()}
        self.member_env = env
        argv = {n: self.manager_argv(ports[n]) for n in hosts}
        self.pods = self.PODS(
            self.config, command, env, log_dir, reschedule_delay_s, spares=spares, managers=argv
        )
        self.events.subscribe(self._on_hot_switch)  # the pod supervisor's part of a hot switch
        self.serve_backups = True
        self._tail: threading.Thread | None = None
        self._tail_stop = threading.Event()
        self._offset = 0
        self._exit_code: int | None = None

    def manager_argv(self, port: int) -> list[str]:
        cfg = self.config
        return [
            *(sys.executable, "-m", "ms_recover.cli", "manager", "--host", "127.0.0.1"),
            *("--port", str(port), "--job-id", cfg.job_id, "--node-nums", str(cfg.node_nums)),
            *("--proc-per-node", str(cfg.proc_per_node), "--events", self.events_path),
            *("--strategy", format_strategies(cfg.strategies)),
        ]

    @property
    def exit_code(self) -> int | None:
        ends = self.events.recent("job_end")
        return int(ends[-1]["exit_code"]) if ends else self._exit_code

    @exit_code.setter
    def exit_code(self, value: int | None) -> None:
        self._exit_code = value

    def start(self) -> ManagerPodJob:
        self._tail = threading.Thread(target=self._follow, name="local-events", daemon=True)
        self._tail.start()
        self.pods.start()
        return self

    def _follow(self) -> None:
        while not self._tail_stop.wait(0.05):
            self._read_new()
        self._read_new()

    def _read_new(self) -> None:
        """Replay the complete lines the managers appended since the last read."""
        try:
            with open(self.events_path, "rb") as fh:
                fh.seek(self._offset)
                chunk = fh.read()
        except FileNotFoundError:
            return
        end = chunk.rfind(b"\n") + 1
        self._offset += end
        for line in chunk[:end].splitlines():
            with contextlib.suppress(ValueError):
                record = json.loads(line)
                if isinstance(record, dict) and "event" in record:
                    self.events.replay(record)

    def wait(self, timeout_s: float) -> bool:
        """Supervise the pods until the job ended, then give the managers a few seconds to
        leave on their own; False on timeout."""
        deadline = time.monotonic() + timeout_s
        if not self.pods.wait(timeout_s):
            return False
        with contextlib.suppress(Timeout):
            wait_for(self._managers_gone, max(0.1, min(5.0, deadline - time.monotonic())), "")
        self._read_new()
        return True

    def _managers_gone(self) -> bool:
        self.pods.poll()
        return not self.pods.managers

    def status(self) -> dict[str, Any]:
        """The active manager's status (the first that answers as active)."""
        for host_port in self.config.managers:
            host, _, port = host_port.rpartition(":")
            got = query(self.config.replace(manager_host=host, manager_port=int(port)), 1.0)
            if got is not None and got.get("manager", {}).get("role") == "active":
                return got
        return {}

    def close(self) -> None:
        self.pods.close()
        self._tail_stop.set()
        if self._tail is not None:
            self._tail.join(timeout=5)

    def __enter__(self) -> ManagerPodJob:
        return self.start()


def manager_nodes(config: JobConfig, standby: bool = True) -> list[int]:
    """The nodes whose pods hold a manager: the scheduler's node, then the next one (its
    standby), when the job has more than one node and wants a ``standby``."""
    first = config.sched_node_rank
    if config.node_nums < 2 or not standby:
        return [first]
    return [first, (first + 1) % config.node_nums]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
