"""A local job whose manager is a separate process, so a test can SIGKILL and restart it.

The pods are :class:`~ms_recover.localrun.pods.LocalPods` (numpy trainer or MindSpore ranks);
the manager is ``ms-recover manager`` on a fixed ephemeral port, writing its events to one
JSONL file that every incarnation appends to. ``close()`` kills everything it started, by PID.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

from ms_recover.config import JobConfig
from ms_recover.localrun.pods import LocalPods
from ms_recover.localrun.wait import wait_for
from ms_recover.strategy import format_strategies


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class ManagedJob:
    def __init__(
        self, config: JobConfig, command: list[str], env: dict[str, str], out: str
    ) -> None:
        self.out = out
        self.events_path = os.path.join(out, "events.jsonl")
        self.config = config.replace(
            manager_port=free_port(), manager_host="127.0.0.1", pod_ip="127.0.0.1"
        )
        self.pods = LocalPods(self.config, command, env, os.path.join(out, "logs"))
        self.managers: list[subprocess.Popen[bytes]] = []

    @property
    def manager(self) -> subprocess.Popen[bytes]:
        return self.managers[-1]

    def start_manager(self) -> subprocess.Popen[bytes]:
        cfg = self.config
        argv = [
            sys.executable,
            "-m",
            "ms_recover.cli",
            "manager",
            "--host",
            "127.0.0.1",
            "--port",
            str(cfg.manager_port),
            "--job-id",
            cfg.job_id,
            "--node-nums",
            str(cfg.node_nums),
            "--proc-per-node",
            str(cfg.proc_per_node),
            "--strategy",
            format_strategies(cfg.strategies),
            "--events",
            self.events_path,
        ]
        log = open(os.path.join(self.out, f"manager_{len(self.managers)}.log"), "ab")  # noqa: SIM115
        with log:
            proc = subprocess.Popen(
                argv, env={**os.environ, **cfg.member_env()}, stdout=log, stderr=log
            )
        self.managers.append(proc)
        return proc

    def kill_manager(self) -> None:
        self.manager.send_signal(signal.SIGKILL)
        self.manager.wait(10)

    def events(self, kind: str | None = None, **match: Any) -> list[dict[str, Any]]:
        try:
            lines = Path(self.events_path).read_text().splitlines()
        except FileNotFoundError:
            return []
        found = [json.loads(line) for line in lines if line.strip()]
        return [
            e
            for e in found
            if (kind is None or e["event"] == kind) and all(e.get(k) == v for k, v in match.items())
        ]

    def rank_pids(self) -> dict[int, list[int]]:
        """Node -> the pids of its agent's children (the rank processes)."""
        found = {}
        for node, proc in self.pods.procs.items():
            path = Path(f"/proc/{proc.pid}/task/{proc.pid}/children")
            try:
                found[node] = sorted(int(p) for p in path.read_text().split())
            except OSError:
                found[node] = []
        return found

    def wait_event(self, kind: str, timeout_s: float, **match: Any) -> dict[str, Any]:
        found = wait_for(lambda: self.events(kind, **match), timeout_s, f"a {kind} event {match}")
        return found[0]  # type: ignore[no-any-return]

    def wait_end(self, timeout_s: float) -> int:
        """Supervise the pods until every one ended; returns the last manager's exit code."""
        assert self.pods.wait(timeout_s), f"pods still running after {timeout_s}s"
        return self.manager.wait(timeout_s)

    def __enter__(self) -> ManagedJob:
        self.start_manager()
        self.pods.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.pods.close()
        for proc in self.managers:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
