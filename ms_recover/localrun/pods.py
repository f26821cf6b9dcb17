"""LocalPods: a local stand-in for Kubernetes, one agent process per "pod".

Each agent runs in its own session (process group), so killing the group loses the whole node,
as a node failure would. When an agent exits with :data:`~ms_recover.exitcodes.RESCHEDULE`,
or dies from a signal, the pod is recreated: a new agent with the same node rank starts after
``reschedule_delay_s``. Any other exit code ends that pod, as ``restartPolicy: Never`` would.

Pods never outlive the process that runs LocalPods (the demo, a test): each agent asks the
kernel to SIGKILL it when the thread that started it dies (``MS_RECOVER_DIE_WITH_PID``), and
its ranks die with it. So start pods from a thread that lives as long as the job.

A hot switch (the ``hotSwitch`` sub-health policy) asks for a new pod for a node whose old
pod still runs (:meth:`LocalPods.want_backup`, as Kubernetes would create the backup pod): the
new pod's agent starts at the next :meth:`poll`, the old one is *retired* (reaped when it
leaves, never recreated).

A pod may also hold a manager process (``managers``: node -> the manager's command), as the
scheduler pod does in Kubernetes (docs/manager-takeover.md): it starts first, in the same
process group as the pod's agent, so losing the node loses its manager too, and a pod that
is recreated (or deleted) takes its manager along.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from typing import Any

from ms_recover import env as E
from ms_recover import exitcodes
from ms_recover.agent.ranks import die_with_parent
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
        managers: dict[int, list[str]] | None = None,
        spare_pods: int = 0,
    ):
        self.config = config
        #: Spare nodes (``ms-recover agent --spare``): pods ``node_nums..`` start as spares,
        #: and with any, every recreated pod comes back as a spare (docs/design.md §1f).
        self.spare_pods = spare_pods
        #: With spares, a recreated pod comes back as a spare (False: as its node, as a
        #: Kubernetes pod would; the manager then tells it to become a spare).
        self.back_as_spare = True
        self.promotions: dict[int, int] = {}  # node -> agent pid of the spare that took it
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
        self.manager_argv = managers or {}
        self.managers: dict[int, subprocess.Popen[bytes]] = {}  # node -> its pod's manager
        self.manager_exits: list[tuple[int, int]] = []  # (node, exit code) of ended managers
        self._pgid: dict[int, int] = {}  # node -> its pod's process group
        self._launches: dict[int, int] = {}  # node -> pods started for it (fault plans' pod)
        self.history: list[tuple[float, int, str]] = []  # (time, node, what)
        self.backups_wanted: set[int] = set()  # nodes whose hot switch wants a new pod
        self.retired: list[tuple[int, subprocess.Popen[bytes]]] = []  # (node, old agent)
        self.retired_exits: list[tuple[int, int]] = []  # (node, exit code) of retired agents

    def agent_argv(self, node: int, spare: bool = False) -> list[str]:
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
        if spare:
            argv += ["--spare", "on"]
        return argv + ["--", *self.command]

    def start(self) -> None:
        for node in range(self.config.node_nums + self.spare_pods):
            self._launch(node)

    def pod_of(self, node: int) -> int:
        """The pod that holds ``node`` now: the spare that took its place last, while that
        one lives; else its own."""
        pid = self.promotions.get(node)
        return next((p for p, proc in list(self.procs.items()) if proc.pid == pid), node)

    def promoted(self, node: int, agent_pid: int) -> None:
        """A spare pod (its agent ``agent_pid``) took ``node``'s place (called from the
        manager's thread: one dict write)."""
        self.promotions[node] = agent_pid

    def _is_spare_launch(self, pod: int) -> bool:
        """A pod beyond the job's nodes starts as a spare; with spares, so does every
        recreated pod (except one that holds a manager, which cannot move)."""
        if pod >= self.config.node_nums:
            return True
        again = self.restarts.get(pod, 0) > 0 and pod not in self.managers
        return self.spare_pods > 0 and self.back_as_spare and again

    def _launch(self, node: int) -> None:
        group: dict[str, Any] = {"start_new_session": True}
        if node in self.manager_argv:  # the pod's manager leads the group its agent joins
            # A group of its own in this session (a new session would refuse the agent).
            mgr = self._spawn(
                self.manager_argv[node], f"manager_{node}.log", node, {"process_group": 0}
            )
            self.managers[node] = mgr
            self._groups.add(mgr.pid)
            group = {"process_group": mgr.pid}
        spare = self._is_spare_launch(node)
        # A fault plan fires in a node's first pod only (a spare is never one).
        pod = self._launches[node] = self._launches.get(node, int(spare)) + 1
        proc = self.procs[node] = self._spawn(
            self.agent_argv(node, spare),
            f"agent_{node}.log",
            node,
            group,
            {E.FAULTS_POD: str(pod - 1)},
        )
        self._pgid[node] = group.get("process_group", proc.pid)
        self._groups.add(self._pgid[node])
        what = "spare pod" if spare else "pod"
        self.history.append((time.time(), node, f"{what} started (agent pid {proc.pid})"))

    def _spawn(
        self,
        argv: list[str],
        log: str,
        node: int,
        group: dict[str, Any],
        extra: dict[str, str] | None = None,
    ) -> subprocess.Popen[bytes]:
        out = None
        if self.log_dir:
            os.makedirs(self.log_dir, exist_ok=True)
            out = open(os.path.join(self.log_dir, log), "ab")  # noqa: SIM115
        env = {**self.env, E.NODE_RANK: str(node)} if node in self.manager_argv else self.env
        env = {**env, **(extra or {})}
        try:
            # A manager dies with this process as the agent does (MS_RECOVER_DIE_WITH_PID).
            return subprocess.Popen(
                argv, env=env, stdout=out, stderr=out, preexec_fn=die_with_parent, **group
            )
        finally:
            if out is not None:
                out.close()

    def want_backup(self, node: int) -> None:
        """A hot switch asks for a new pod for ``node`` (started at the next :meth:`poll`;
        thread-safe: a set add)."""
        self.backups_wanted.add(node)

    def _start_backups(self) -> None:
        for node in sorted(self.backups_wanted):
            self.backups_wanted.discard(node)
            old = self.procs.pop(node, None)
            if old is not None:
                self.retired.append((node, old))
            self._launch(node)
            self.history[-1] = (self.history[-1][0], node, "backup " + self.history[-1][2])

    def _reap_retired(self) -> None:
        for node, proc in list(self.retired):
            if proc.poll() is not None:
                self.retired.remove((node, proc))
                self.retired_exits.append((node, proc.returncode))
                self.history.append(
                    (time.time(), node, f"old pod retired ({_describe(proc.returncode)})")
                )

    def poll(self) -> None:
        """Reap exited agents and recreate pods that must be rescheduled."""
        self._start_backups()
        self._reap_retired()
        now = time.monotonic()
        for node, mgr in list(self.managers.items()):
            if mgr.poll() is not None:
                del self.managers[node]
                self.manager_exits.append((node, mgr.returncode))
        for node, proc in list(self.procs.items()):
            code = proc.poll()
            if code is None:
                continue
            del self.procs[node]
            reschedule = code == exitcodes.RESCHEDULE or code < 0
            if reschedule and node in self.managers:  # the pod goes, its manager with it
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self._pgid[node], signal.SIGKILL)
                self.managers[node].wait()
                self.manager_exits.append((node, self.managers.pop(node).returncode))
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
        return not self.procs and not self._due and not self.retired

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
        """SIGKILL the whole process group of the pod that holds ``node``: its agent and
        every rank (a lost node)."""
        pod = self.pod_of(node)
        if pod in self.procs:
            os.killpg(self._pgid[pod], signal.SIGKILL)

    def stop_node(self, node: int) -> None:
        """SIGTERM the pod's main processes, its manager (if it holds one) and its agent, as
        Kubernetes does to every container of a pod it deletes (a drain, a preemption): a
        planned stop. The ranks are the agent's to stop."""
        for proc in (self.managers.get(node), self.procs.get(node)):
            if proc is not None and proc.poll() is None:
                proc.send_signal(signal.SIGTERM)

    def close(self) -> None:
        """Kill every process group we ever started (a dead pod's orphans too) and reap."""
        self._due.clear()
        for pgid in self._groups:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pgid, signal.SIGKILL)
        for proc in [*self.procs.values(), *self.managers.values(), *(p for _, p in self.retired)]:
            proc.wait()
        self.procs.clear()
        self.retired.clear()
        self.managers.clear()


def _describe(code: int) -> str:
    if code < 0:
        return f"killed by signal {-code}"
    return {
        exitcodes.RESCHEDULE: "exit 86: reschedule",
        exitcodes.JOB_EXIT: "exit 87: job gave up",
        exitcodes.STOPPED: "exit 143: asked to stop",
        0: "exit 0",
    }.get(code, f"exit {code}")
