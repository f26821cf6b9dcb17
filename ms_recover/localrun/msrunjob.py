"""A local job whose nodes are real ``msrun`` invocations with ms_recover's taskd shim.

Each "pod" is one ``msrun --node_rank N`` in its own process group, with the environment a pod
of an AscendJob would have: ``POD_IP`` 127.0.0.(N+1) (so only node 0 matches
``MS_SCHED_HOST``), ``MS_NODE_RANK``, ``MS_LOCAL_WORKER``, ``MS_WORKER_NUM``, ``MINDX_TASK_ID``,
``MS_ENABLE_TFT={ARF:1}`` (msrun hands its workers to the taskd agent) and the shim directory
first on ``PYTHONPATH``. :class:`~ms_recover.localrun.pods.LocalPods` supervises them: a pod
whose msrun exits 86 or dies from a signal is recreated, as Kubernetes would.

msrun starts ``python`` from ``PATH``: this interpreter's directory is put first.
"""

from __future__ import annotations

import os
import shutil
import socket
import sys
from collections.abc import Callable

from ms_recover import env as E
from ms_recover.config import JobConfig
from ms_recover.errors import ConfigError
from ms_recover.integrations import shims
from ms_recover.localrun.job import LocalJob, ManagerPodJob
from ms_recover.localrun.pods import LocalPods
from ms_recover.observability.events import Event
from ms_recover.strategy import format_strategies


def msrun_path() -> str:
    """The ``msrun`` next to this interpreter, else on PATH; ConfigError if there is none."""
    here = os.path.join(os.path.dirname(sys.executable), "msrun")
    found = here if os.access(here, os.X_OK) else shutil.which("msrun")
    if not found:
        raise ConfigError("msrun not found: pip install 'ms-recover[mindspore]' (MindSpore >= 2.3)")
    return found


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def pod_ip(node: int) -> str:
    return f"127.0.0.{node + 1}"


def script_command(command: list[str]) -> list[str]:
    """msrun runs ``python <script> ...`` unless the command starts with ``python``: turn this
    interpreter's path into plain ``python`` (found first on the pods' PATH)."""
    if command and os.path.realpath(command[0]) == os.path.realpath(sys.executable):
        return ["python", *command[1:]]
    return list(command)


class MsrunPods(LocalPods):
    """One real msrun per node; ``start_script`` (optional) is a bash script run instead, with
    msrun's arguments as ``"$@"`` (the documented ``train_start.sh`` shape). With
    ``node_env=False`` msrun's process gets no ``MS_NODE_RANK`` / ``MS_LOCAL_WORKER`` /
    ``MS_WORKER_NUM``: the taskd agent must take them from msrun's own arguments."""

    def __init__(
        self,
        config: JobConfig,
        command: list[str],
        env: dict[str, str] | None = None,
        log_dir: str = "",
        reschedule_delay_s: float = 0.0,
        start_script: str = "",
        node_env: bool = True,
        spares: int = 0,
        managers: dict[int, list[str]] | None = None,
    ) -> None:
        if spares:
            raise ConfigError("msrun starts its workers cold: spares need 'ms-recover agent'")
        job_env = {
            "PATH": os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""),
            "PYTHONPATH": os.pathsep.join(
                p for p in (shims.path(), os.environ.get("PYTHONPATH", "")) if p
            ),
            E.ENABLE_TFT: "{ARF:1}",
            E.RESTART_FAULT_PROCESS: "on",
            E.STRATEGY: format_strategies(config.strategies),
            E.TASK_ID: config.job_id,
            E.SCHED_HOST: pod_ip(config.sched_node_rank),
            E.PORT: str(config.manager_port),
            E.WORKER_NUM: str(config.world_size),
            E.LOCAL_WORKER: str(config.proc_per_node),
            E.MANAGER_WAIT: repr(config.phase_timeout_s),
        }
        self.node_env = node_env
        if not node_env:
            for name in (E.WORKER_NUM, E.LOCAL_WORKER, E.NODE_RANK):
                job_env[name] = ""
        super().__init__(
            config,
            script_command(command),
            {**job_env, **(env or {})},
            log_dir,
            reschedule_delay_s,
            managers=managers,
        )
        self.start_script = start_script
        self.sched_port = free_port()  # MindSpore's scheduler port: unused by the host backend
        self.msrun = msrun_path()

    def agent_argv(self, node: int, spare: bool = False) -> list[str]:
        if spare:
            raise ValueError(
                "msrun pods have no spare node (its ranks are msrun's, not an agent's)"
            )
        cfg = self.config
        args = [
            "--worker_num", str(cfg.world_size),
            "--local_worker_num", str(cfg.proc_per_node),
            "--master_addr", pod_ip(cfg.sched_node_rank),
            "--master_port", str(self.sched_port),
            "--node_rank", str(node),
            "--log_dir", os.path.join(self.log_dir or ".", f"msrun_node{node}"),
            *self.command,
        ]  # fmt: skip
        head = ["bash", self.start_script] if self.start_script else [self.msrun]
        rank = [f"{E.NODE_RANK}={node}"] if self.node_env else []
        return ["env", f"{E.POD_IP}={pod_ip(node)}", *rank, *head, *args]


class MsrunManagerPodJob(ManagerPodJob):
    """:class:`ManagerPodJob` with msrun pods: the manager is a process of node 0's pod (next
    to msrun, its MindSpore scheduler process, the taskd agent and the ranks) and a standby
    waits in node 1's, so losing node 0's msrun whole loses the manager too
    (docs/manager-takeover.md, the msrun path)."""

    PODS = MsrunPods


class MsrunJob(LocalJob):
    """:class:`LocalJob` (manager in a thread) with msrun pods instead of ``ms-recover agent``."""

    def __init__(
        self,
        config: JobConfig,
        command: list[str],
        env: dict[str, str] | None = None,
        log_dir: str = "",
        reschedule_delay_s: float = 0.0,
        on_event: Callable[[Event], None] | None = None,
        node_env: bool = True,
    ) -> None:
        super().__init__(config, command, env, log_dir, reschedule_delay_s, on_event)
        self.pods = MsrunPods(  # member_env: the caller's env plus the job secret
            self.config, command, self.member_env, log_dir, reschedule_delay_s, node_env=node_env
        )
