"""msrun's four callbacks as the agent's hands (:class:`~ms_recover.agent.hands.RankHands`).

When ``MS_ENABLE_TFT`` enables MindX, msrun (MindSpore 2.x,
``mindspore/parallel/cluster/process_entity/_api.py``) registers four callbacks with its
``taskd`` agent and lets the agent drive its workers:

* ``KILL_WORKER(pids)``: SIGKILL each listed worker's process group (``[-1]``: all); a pid
  whose process already ended is only warned about, and its entry stays in msrun's lists;
* ``START_ALL_WORKER()``: kill all, start all local workers (not used: see :meth:`start_all`);
* ``START_WORKER_LIST(local_ranks)``: start these workers; it does *not* stop an old one;
* ``MONITOR(local_ranks)``: ``{local_rank: {"pid", "status", "global_rank", ...}}`` with status
  ``None`` running, ``0`` exited cleanly, ``200`` never started, ``300`` pid gone, else the
  exit code. It reaps the child first and then asks whether the pid exists, so every failed
  rank reads ``300``: its exit code is never visible.

Hence the rules here: ranks are followed by **pid**; an exit we caused (:meth:`kill`) is reported
by us with the signal we sent, and never again by :meth:`poll`; a pid already gone is never
passed to ``KILL_WORKER``; a restart kills the old process first. Workers inherit msrun's own
``os.environ`` at spawn, so the node's environment (:func:`~ms_recover.agent.ranks.rank_env`)
is put there just before each start.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ms_recover import env as E
from ms_recover.agent.hands import Exited, LauncherError
from ms_recover.agent.ranks import rank_env
from ms_recover.config import JobConfig
from ms_recover.observability import lastwords

log = logging.getLogger("ms_recover.integrations.msrun.hands")

KILL_WORKER = "KILL_WORKER"
START_ALL_WORKER = "START_ALL_WORKER"
START_WORKER_LIST = "START_WORKER_LIST"
MONITOR = "MONITOR"
OPERATORS = (KILL_WORKER, START_ALL_WORKER, START_WORKER_LIST, MONITOR)

ALL = -1
NOT_STARTED = 200
PID_GONE = 300
#: What we report for a rank msrun shows as ``300``: it failed, with an exit code nobody can see.
UNKNOWN_FAILURE = 1
#: The fault report's text for such a rank when it left no last words (see lastwords).
UNKNOWN_NOTE = (
    "exit status not visible under msrun: its MONITOR reaps the worker before it reports, so it "
    "shows only that the pid is gone (code 300); the worker left no traceback (killed by a "
    "signal, or it ended without an uncaught Python exception)"
)
SIGKILL = 9


class MsrunHands:
    """Drive msrun's workers through its callbacks; every exit is reported exactly once."""

    def __init__(
        self,
        config: JobConfig,
        callbacks: Mapping[str, Callable[..., Any]],
        kill_timeout_s: float = 10.0,
        environ: dict[str, str] | None = None,
    ) -> None:
        missing = [op for op in OPERATORS if op not in callbacks]
        if missing:
            raise LauncherError(
                f"msrun registered no {', '.join(missing)} callback; needed: {', '.join(OPERATORS)}"
            )
        self.config = config
        self._cb = dict(callbacks)
        self.kill_timeout_s = kill_timeout_s
        # msrun spawns with its own os.environ: that is the dictionary to prepare.
        self._environ: Any = os.environ if environ is None else environ
        self._first = config.node_rank * config.proc_per_node
        self._pids: dict[int, int] = {}  # rank -> pid we started and have not seen end
        self.incarnations: dict[int, int] = {}
        # Each worker's last words (lastwords.install): how a rank msrun shows as 300 ended.
        self._words_dir = tempfile.mkdtemp(prefix="ms-recover-lastwords-")
        #: The place in ``config.managers`` of the manager the agent talks to now (set by the
        #: taskd agent): a worker starts there, not at a standby that would not welcome it.
        self.manager_index: Callable[[], int] = lambda: 0

    # ------------------------------------------------------------------ RankHands
    def start_all(self, ranks: Sequence[int]) -> None:
        """One START_WORKER_LIST per rank, each with its own environment: START_ALL_WORKER would
        give every worker the same ``RANK_ID`` when msrun runs without ``--node_rank``."""
        for rank in ranks:
            self.start(rank)

    def start(self, rank: int) -> int:
        self._report_leftover(rank)
        inc = self.incarnations.get(rank, -1) + 1
        self.incarnations[rank] = inc
        words = os.path.join(self._words_dir, f"rank_{rank}.json")
        with contextlib.suppress(FileNotFoundError):  # a former incarnation's
            os.unlink(words)
        env = {**rank_env(self.config, rank, inc), lastwords.ERROR_FILE: words}
        if self.config.managers:  # the same ring of managers, from the agent's current one
            at = self.manager_index() % len(self.config.managers)
            env[E.MANAGERS] = ",".join(self.config.managers[at:] + self.config.managers[:at])
        self._prepare_env(env)
        self._call(START_WORKER_LIST, [rank - self._first])
        pid = self._pid_of(self._monitor(), rank)
        self._pids[rank] = pid
        return pid

    def poll(self) -> list[Exited]:
        if not self._pids:
            return []
        status = self._monitor()
        now = time.time()
        exited = []
        for rank, pid in list(self._pids.items()):
            entry = status.get(rank - self._first)
            code = _exit_of(entry, pid)
            if code is not None:
                del self._pids[rank]
                exited.append(self._exited(rank, pid, code, now, _unknown(entry, pid)))
        return exited

    def _exited(
        self, rank: int, pid: int, code: tuple[int, int], now: float, unknown: bool
    ) -> Exited:
        """The exit of a worker that ended by itself, with its last words when it failed. An
        uncaught Python exception (it left a traceback) is a real exit code 1; a status msrun
        hides is said to be unknown."""
        if code == (0, 0):
            return Exited(rank, pid, 0, 0, now)
        host, tail = lastwords.collect(os.path.join(self._words_dir, f"rank_{rank}.json"))
        if unknown and not tail:
            tail = UNKNOWN_NOTE
        return Exited(rank, pid, *code, now, host, tail)

    def kill(self, ranks: list[int]) -> list[Exited]:
        targets = {r: self._pids.pop(r) for r in ranks if r in self._pids}
        if not targets:
            return []
        status = self._monitor()
        now = time.time()
        exited, alive = [], {}
        for rank, pid in targets.items():
            code = _exit_of(status.get(rank - self._first), pid)
            if code is None:
                alive[rank] = pid
            else:  # ended on its own before our kill: never hand msrun a dead pid
                exited.append(Exited(rank, pid, *code, now))
        if alive:
            self._call(KILL_WORKER, list(alive.values()))
            self._await_gone(alive)
            now = time.time()
            exited += [Exited(r, pid, 128 + SIGKILL, SIGKILL, now) for r, pid in alive.items()]
        return exited

    def pids(self) -> dict[int, int]:
        return dict(self._pids)

    def training(self) -> None:
        """Nothing to start: msrun restarts its workers cold (no standby)."""

    def close(self) -> None:
        try:
            self.kill(list(self._pids))
        except LauncherError as exc:
            log.error("could not stop this node's workers: %s", exc)
        self._pids.clear()
        shutil.rmtree(self._words_dir, ignore_errors=True)

    # ------------------------------------------------------------------ helpers
    def _report_leftover(self, rank: int) -> None:
        """START_WORKER_LIST never stops the old process: kill it first, or it runs on
        unwatched. Its exit was the manager's doing, so it is not reported again."""
        if rank in self._pids:
            self.kill([rank])

    def _prepare_env(self, env: Mapping[str, str]) -> None:
        self._environ.update(env)
        # Lets a worker (and the scheduler process) die with this msrun: see bootstrap.
        self._environ[E.LAUNCHER_PID] = str(os.getpid())

    def _await_gone(self, alive: Mapping[int, int]) -> None:
        deadline = time.monotonic() + self.kill_timeout_s
        pending = dict(alive)
        while pending:
            status = self._monitor([r - self._first for r in pending])
            for rank, pid in list(pending.items()):
                if _exit_of(status.get(rank - self._first), pid) is not None:
                    del pending[rank]
            if not pending:
                return
            if time.monotonic() > deadline:
                raise LauncherError(
                    f"workers {sorted(pending.values())} still run {self.kill_timeout_s:g}s "
                    f"after msrun's {KILL_WORKER}"
                )
            time.sleep(0.005)

    def _pid_of(self, status: Mapping[int, Mapping[str, Any]], rank: int) -> int:
        entry = status.get(rank - self._first) or {}
        pid = entry.get("pid")
        if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0:
            raise LauncherError(f"msrun started no worker for rank {rank} (MONITOR: {entry!r})")
        return pid

    def _monitor(self, local_ranks: list[int] | None = None) -> dict[int, Mapping[str, Any]]:
        answer = self._call(MONITOR, local_ranks if local_ranks is not None else [ALL])
        if not isinstance(answer, Mapping):
            raise LauncherError(f"msrun's {MONITOR} answered {answer!r}, not a dict")
        found: dict[int, Mapping[str, Any]] = {}
        for key, entry in answer.items():
            if isinstance(entry, Mapping):
                try:
                    found[int(key)] = entry
                except (TypeError, ValueError):
                    continue
        return found

    def _call(self, operator: str, *args: Any) -> Any:
        try:
            return self._cb[operator](*args)
        except Exception as exc:  # noqa: BLE001 - msrun's code: one line, never a traceback
            shown = ", ".join(map(repr, args))
            raise LauncherError(f"msrun's {operator}({shown}) failed: {exc!r}") from exc


def _unknown(entry: Mapping[str, Any] | None, pid: int) -> bool:
    """Whether msrun hides how the process ``pid`` ended (see :func:`_exit_of`)."""
    if not entry or entry.get("pid") != pid:
        return True
    status = entry.get("status")
    return (
        not isinstance(status, int) or isinstance(status, bool) or status in (PID_GONE, NOT_STARTED)
    )


def _exit_of(entry: Mapping[str, Any] | None, pid: int) -> tuple[int, int] | None:
    """(exit code, signal) when the process ``pid`` has ended, None while it runs.

    msrun shows the latest process of a local rank; another pid there means ours is gone.
    """
    if not entry or entry.get("pid") != pid:
        return UNKNOWN_FAILURE, 0
    status = entry.get("status")
    if status is None:
        return None
    if not isinstance(status, int) or isinstance(status, bool):
        return UNKNOWN_FAILURE, 0
    if status == 0:
        return 0, 0
    if status in (PID_GONE, NOT_STARTED):
        return UNKNOWN_FAILURE, 0
    if status < 0:  # Popen's "killed by signal N"
        return 128 - status, -status
    return status, 0
