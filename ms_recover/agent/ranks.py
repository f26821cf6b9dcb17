"""Local rank processes: spawn them with the MindSpore env, watch them, kill them.

The msrun contract: each rank gets ``MS_ROLE=MS_WORKER``, ``MS_NODE_ID``/``RANK_ID`` (global
rank), ``DEVICE_ID`` (local rank), ``RANK_SIZE``/``MS_WORKER_NUM`` (world), ``MS_LOCAL_WORKER``,
``MS_NODE_RANK`` and ``MS_SCHED_HOST``, plus ms_recover's own variables.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Sequence
from typing import IO

from ms_recover import env as E
from ms_recover.agent.hands import Exited
from ms_recover.agent.spares import SparePool
from ms_recover.config import JobConfig
from ms_recover.observability import lastwords
from ms_recover.strategy import format_strategies
from ms_recover.worker.standby import command_ok

PR_SET_PDEATHSIG = 1


def rank_env(
    config: JobConfig, rank: int, incarnation: int, relay_endpoint: str | None = None
) -> dict[str, str]:
    """The environment variables a rank process gets on top of the agent's own; with
    ``relay_endpoint``, the rank talks to its agent's relay there instead of the manager."""
    local = rank - config.node_rank * config.proc_per_node
    relay = {E.RELAY_ENDPOINT: relay_endpoint} if relay_endpoint else {}
    return {
        **relay,
        E.ROLE: E.ROLE_WORKER,
        E.NODE_ID: str(rank),
        E.RANK_ID: str(rank),
        E.DEVICE_ID: str(local),
        E.LOCAL_RANK: str(local),
        E.RANK_SIZE: str(config.world_size),
        E.WORKER_NUM: str(config.world_size),
        E.LOCAL_WORKER: str(config.proc_per_node),
        E.NODE_NUMS: str(config.node_nums),
        E.NODE_RANK: str(config.node_rank),
        E.SCHED_HOST: config.manager_host,
        E.PORT: str(config.manager_port),
        E.POD_IP: config.pod_ip,
        E.TASK_ID: config.job_id,
        E.STRATEGY: format_strategies(config.strategies),
        E.INCARNATION: str(incarnation),
        E.HEARTBEAT: str(config.heartbeat_s),
        E.BACKEND: config.backend,
    }


#: Variables that name one rank; a spare gets the rest of :func:`rank_env` when it starts.
RANK_IDENTITY = (E.NODE_ID, E.RANK_ID, E.DEVICE_ID, E.LOCAL_RANK, E.INCARNATION)


def spare_env(config: JobConfig) -> dict[str, str]:
    """A spare's environment before it takes a rank: the job's (world size, manager, ...),
    so its program sees what a rank's sees while it builds and compiles, minus the identity."""
    env = rank_env(config, config.node_rank * config.proc_per_node, 0)
    return {k: v for k, v in env.items() if k not in RANK_IDENTITY}


class RankSet:
    """The rank processes of one node, by global rank id: the agent's own hands
    (:class:`~ms_recover.agent.hands.RankHands`)."""

    def __init__(
        self,
        config: JobConfig,
        command: list[str],
        log_dir: str = "",
        spares: int = 0,
        relay_endpoint: str | None = None,
        standby: bool = False,
    ) -> None:
        self.config = config
        self.relay_endpoint = relay_endpoint
        self.command = command
        self.log_dir = log_dir
        self.procs: dict[int, subprocess.Popen[bytes]] = {}
        self.incarnations: dict[int, int] = {}
        self._logs: dict[int, IO[bytes]] = {}
        self._agent_pid = os.getpid()
        # Each rank's last words (lastwords.install), read when it ends; removed in close().
        # Under the log directory when there is one: an agent killed whole leaves it there.
        if log_dir:
            os.makedirs(log_dir, exist_ok=True)
        self._words_dir = tempfile.mkdtemp(prefix="ms-recover-lastwords-", dir=log_dir or None)
        # Pre-warmed spares if asked for; else one standby interpreter, if the command allows.
        pool_command = command if spares else standby_command(command) if standby else None
        self.standby = not spares and pool_command is not None
        # A rank whose program passes init(warm_up=...) creates this file: the standby may
        # then run the program up to init() and compile there (see training()).
        self._warm_mark = os.path.join(self._words_dir, "warm_up")
        self.spares = SparePool(
            pool_command or command,
            {**os.environ, **spare_env(config)},
            spares or int(self.standby),
            self._log_file(-1),
            self._die_with_me,
        )
        self._regular: tuple[list[str], int, bool] | None = None  # see hold_warm()

    def hold_warm(self) -> None:
        """A spare node (``ms-recover agent --spare``): keep one pre-warmed process per local
        rank (the rank command run up to ``init()``, its ``warm_up`` compiled there) until
        :meth:`adopt` gives the node its ranks; the regular pool is restored then."""
        pool = self.spares
        self._regular = (pool.command, pool.count, self.standby)
        pool.command, pool.count, self.standby = self.command, self.config.proc_per_node, False
        pool.fill()

    def adopt(self, config: JobConfig) -> None:
        """This spare node takes ``config.node_rank``: :meth:`start_all` then starts its ranks
        in the warm processes, and the pool goes back to what a regular node keeps (its
        ``--spares``, or the standby once the ranks train)."""
        self.config = config
        pool = self.spares
        pool.env = {**os.environ, **spare_env(config)}
        if self._regular is not None:
            pool.command, pool.count, self.standby = self._regular
            self._regular = None

    @property
    def warm(self) -> int:
        """Pre-warmed processes alive now, waiting for a rank."""
        return sum(1 for s in self.spares.spares if s.proc.poll() is None)

    def start_all(self, ranks: Sequence[int]) -> None:
        """Start every local rank, then warm the spares (a standby waits for
        :meth:`training`)."""
        for rank in ranks:
            self.start(rank)
        if not self.standby:
            self.spares.fill()

    def training(self) -> None:
        """Every local rank committed a step: start the standby now, so its import does not
        compete with the ranks' own start (a live one is kept: the pool fills only up).

        The standby is *warm* (the rank command itself, run as a pre-warmed spare: up to
        ``init()``, its ``warm_up`` compiled there) when a rank showed that its program passes
        ``warm_up`` and the data plane is the host's (a spare would open no device); else, or
        once a warm one died before it took a rank, a bare interpreter with MindSpore imported.
        """
        if self.standby and self.config.backend != "ascend" and os.path.exists(self._warm_mark):
            self.spares.fallback, self.spares.command = self.spares.command, self.command
        if self.standby:
            live = [p.pid for p in self.procs.values() if p.poll() is None]
            if live and not any(loads_mindspore(pid) for pid in live):
                self.spares.env[E.STANDBY_PRELOAD] = BOOTSTRAP  # MindSpore would be dead weight
            self.spares.fill()

    def start(self, rank: int) -> int:
        """Start (or restart) ``rank``; returns its pid. A still-running old process is killed."""
        self.kill([rank])
        inc = self.incarnations.get(rank, -1) + 1
        self.incarnations[rank] = inc
        env = rank_env(self.config, rank, inc, self.relay_endpoint)
        env[lastwords.ERROR_FILE] = self._words_path(rank)
        env[E.WARM_UP_MARK] = self._warm_mark
        with contextlib.suppress(FileNotFoundError):  # a former incarnation's
            os.unlink(env[lastwords.ERROR_FILE])
        # A pre-warmed spare or the standby, if one is ready; poll() starts the next once this
        # one settled. The standby writes to the rank's log from then on.
        log_path = self._log_path(rank) if self.standby else ""
        proc = self.spares.activate({**env, E.STANDBY_LOG: log_path} if log_path else env)
        if proc is None:
            out = self._log_file(rank)
            proc = subprocess.Popen(
                self.command,
                env={**os.environ, **env},
                stdout=out,
                stderr=out,
                preexec_fn=self._die_with_me,
            )
        self.procs[rank] = proc
        return proc.pid

    def _die_with_me(self) -> None:
        die_with_parent(self._agent_pid)  # in the child, between fork and exec

    def _log_path(self, rank: int) -> str:
        if not self.log_dir:
            return ""
        os.makedirs(self.log_dir, exist_ok=True)
        return os.path.join(self.log_dir, f"rank_{rank}.log" if rank >= 0 else "spares.log")

    def _words_path(self, rank: int) -> str:
        return os.path.join(self._words_dir, f"rank_{rank}.json")

    def _log_file(self, rank: int) -> IO[bytes] | None:
        if not self.log_dir:
            return None
        if rank not in self._logs:
            self._logs[rank] = open(self._log_path(rank), "ab")  # noqa: SIM115 - see close()
        return self._logs[rank]

    def poll(self) -> list[Exited]:
        """Ranks that exited since the last poll (each reported once)."""
        self.spares.poll()  # a taken spare settled: warm the next one now
        exited = []
        for rank, proc in list(self.procs.items()):
            code = proc.poll()
            if code is not None:
                del self.procs[rank]
                sig = -code if code < 0 else 0
                code = code if code >= 0 else 128 + sig
                host, tail = "", ""
                if code:  # why it failed: its own word, else its log's end
                    host, tail = lastwords.collect(self._words_path(rank), self._log_path(rank))
                exited.append(Exited(rank, proc.pid, code, sig, time.time(), host, tail))
        return exited

    def kill(
        self, ranks: list[int], sig: int = signal.SIGKILL, grace_s: float = 5.0
    ) -> list[Exited]:
        """Send ``sig`` to the given ranks and reap them (SIGKILL after ``grace_s``)."""
        targets = {r: self.procs.pop(r) for r in ranks if r in self.procs}
        for proc in targets.values():
            _signal(proc, sig)
        exited = []
        deadline = time.monotonic() + grace_s
        for rank, proc in targets.items():
            try:
                proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                _signal(proc, signal.SIGKILL)
                proc.wait()
            code = proc.returncode
            exited.append(
                Exited(
                    rank, proc.pid, code if code >= 0 else 128 - code, max(0, -code), time.time()
                )
            )
        return exited

    def pids(self) -> dict[int, int]:
        return {rank: proc.pid for rank, proc in self.procs.items()}

    def close(self, sig: int = signal.SIGTERM) -> None:
        self.spares.close(kill=self.standby)
        self.kill(list(self.procs), sig)
        for fh in self._logs.values():
            fh.close()
        self._logs.clear()
        shutil.rmtree(self._words_dir, ignore_errors=True)


#: What a standby preloads for ranks that do not load MindSpore (see :meth:`RankSet.training`).
BOOTSTRAP = "ms_recover.worker.bootstrap"


def loads_mindspore(pid: int) -> bool:
    """Whether process ``pid`` has MindSpore's native library mapped (Linux ``/proc``); True when
    that cannot be read, so a standby then imports MindSpore as it always did."""
    try:
        with open(f"/proc/{pid}/maps", "rb") as fh:
            return b"/mindspore/" in fh.read()
    except OSError:
        return True


def standby_command(command: list[str]) -> list[str] | None:
    """The standby's command for the rank command ``command`` (``python SCRIPT ...`` or
    ``python -m MODULE ...``, as :mod:`ms_recover.worker.standby` runs it); None for any other
    command (a shell script, interpreter options), and when MindSpore logs to files
    (``GLOG_logtostderr=0``: it names their directory after ``RANK_ID`` as it loads, before a
    standby knows its rank): such ranks always start cold."""
    if os.environ.get("GLOG_logtostderr", "").strip() == "0":
        return None
    if not command or not os.path.basename(command[0]).startswith("python"):
        return None
    if not command_ok(command[1:]):
        return None
    return [command[0], "-m", "ms_recover.worker.standby", *command[1:]]


def die_with_parent(parent: int = 0) -> None:
    """SIGKILL this process when its parent dies (Linux); in a rank, called in the child
    before exec. The agent calls it on itself too, under LocalPods.

    A rank must never outlive its agent: nobody would report its exit or stop it, and it
    would hold its data-plane sockets open forever. If the parent (pid ``parent``) died
    before the request was made, the kernel will never send the signal: die now.
    """
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if parent and os.getppid() != parent:
        os.kill(os.getpid(), signal.SIGKILL)


def _signal(proc: subprocess.Popen[bytes], sig: int) -> None:
    try:
        proc.send_signal(sig)
    except ProcessLookupError:
        pass
