"""LocalPods: a local stand-in for Kubernetes, one agent process per "pod".

Each agent runs in its own session (process group), so killing the group loses the whole node,
as a node failure would. When an agent exits with :data:`~ms_recover.exitcodes.RESCHEDULE`,
or dies from a signal, the pod is recreated: a new agent with the same node rank starts after
``reschedule_delay_s``. Any other exit code ends that pod, as ``restartPolicy: Never`` would.

Pods never outlive the process that runs LocalPods (the demo, a test): each agent asks the
kernel to SIGKILL it when the thread that started it dies (``MS_RECOVER_DIE_WITH_PID``), and
its ranks die with it. So start pods from a thread that lives as long as the job.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time

from ms_recover import env as E
from ms_recover import exitcodes
from ms_recover.config import JobConfig
from ms_recover.strategy import format_strategies


class LocalPods:
    def __init__(
        self,
        config: JobConfig,
        command: list[str],
        env: dict[str, str] | None = None,
        log_dir: str = "",
        reschedule_delay_s: float = 0.0,
        max_restarts: int = 5,
        spares: int = 0,
    ):
        self.config = config
        self.command = command
        self.spares = spares
        # Agents and ranks see the manager's timing, as every container of a pod spec would.
        self.env = {**os.environ, **config.member_env(), **(env or {})}
        self.env[E.DIE_WITH] = str(os.getpid())
        self.log_dir = log_dir
        self.delay = reschedule_delay_s
        self.max_restarts = max_restarts
        self.procs: dict[int, subprocess.Popen[bytes]] = {}
        self.exit_codes: dict[int, int] = {}
        self.restarts: dict[int, int] = {}
        self._due: dict[int, float] = {}
        self._groups: set[int] = set()  # every pod's process group, for close()
        self.history: list[tuple[float, int, str]] = []  # (time, node, what)

    def agent_argv(self, node: int) -> list[str]:
        cfg = self.config
        argv = [
            sys.executable,
            "-m",
            "ms_recover.cli",
            "agent",
            "--node-rank",
            str(node),
            "--node-nums",
            str(cfg.node_nums),
            "--proc-per-node",
            str(cfg.proc_per_node),
            "--host",
            cfg.manager_host,
            "--port",
            str(cfg.manager_port),
            "--job-id",
            cfg.job_id,
            "--strategy",
            format_strategies(cfg.strategies),
        ]
        if self.log_dir:
            argv += ["--log-dir", self.log_dir]
        if self.spares:
            argv += ["--spares", str(self.spares)]
        return argv + ["--", *self.command]

    def start(self) -> None:
        for node in range(self.config.node_nums):
            self._launch(node)

    def _launch(self, node: int) -> None:
        out = None
        if self.log_dir:
            os.makedirs(self.log_dir, exist_ok=True)
            out = open(os.path.join(self.log_dir, f"agent_{node}.log"), "ab")  # noqa: SIM115
        try:
            self.procs[node] = subprocess.Popen(
                self.agent_argv(node), env=self.env, stdout=out, stderr=out, start_new_session=True
            )
        finally:
            if out is not None:
                out.close()
        self._groups.add(self.procs[node].pid)
        self.history.append((time.time(), node, f"pod started (agent pid {self.procs[node].pid})"))

    def poll(self) -> None:
        """Reap exited agents and recreate pods that must be rescheduled."""
        now = time.monotonic()
        for node, proc in list(self.procs.items()):
            code = proc.poll()
            if code is None:
                continue
            del self.procs[node]
            reschedule = code == exitcodes.RESCHEDULE or code < 0
            self.history.append((time.time(), node, f"pod exited ({_describe(code)})"))
            if reschedule and self.restarts.get(node, 0) < self.max_restarts:
                self.restarts[node] = self.restarts.get(node, 0) + 1
                self._due[node] = now + self.delay
            else:
                self.exit_codes[node] = code
        for node, due in list(self._due.items()):
            if now >= due:
                del self._due[node]
                self._launch(node)

    def reschedule_now(self) -> list[int]:
        """Start every pod waiting to be rescheduled at the next :meth:`poll`, whatever its
        delay (a test decides when a lost pod comes back); returns their nodes."""
        due = sorted(self._due)
        for node in due:
            self._due[node] = 0.0
        return due

    @property
    def finished(self) -> bool:
        return not self.procs and not self._due

    def wait(self, timeout_s: float, poll_s: float = 0.05) -> bool:
        """Supervise until every pod ended for good; False on timeout."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            self.poll()
            if self.finished:
                return True
            time.sleep(poll_s)
        return False

    def kill_node(self, node: int) -> None:
        """SIGKILL the pod's whole process group: its agent and every rank (a lost node)."""
        proc = self.procs.get(node)
        if proc is not None:
            os.killpg(proc.pid, signal.SIGKILL)

    def close(self) -> None:
        """Kill every process group we ever started (a dead pod's orphans too) and reap."""
        self._due.clear()
        for pgid in self._groups:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pgid, signal.SIGKILL)
        for proc in self.procs.values():
            proc.wait()
        self.procs.clear()


def _describe(code: int) -> str:
    if code < 0:
        return f"killed by signal {-code}"
    return {
        exitcodes.RESCHEDULE: "exit 86: reschedule",
        exitcodes.JOB_EXIT: "exit 87: job gave up",
        exitcodes.STOPPED: "exit 143: asked to stop",
        0: "exit 0",
    }.get(code, f"exit {code}")
