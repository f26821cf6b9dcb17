"""MindSpore's own CPU AllReduce on a local cluster: the baseline of ``ms-recover bench allreduce``.

The cluster is formed the way msrun forms one: a scheduler process (``MS_ROLE=MS_SCHED``) and
``world`` workers (``MS_ROLE=MS_WORKER``, ``MS_NODE_ID=<rank>``), all with
``MS_SCHED_HOST=127.0.0.1``, ``MS_SCHED_PORT=<a free ephemeral port>``, ``MS_WORKER_NUM=<world>``
and ``MS_TOPO_TIMEOUT=<the formation deadline>``. Each runs
:mod:`ms_recover.mindspore.programs.allreduce_bench`, which calls
``mindspore.set_device("CPU")`` and ``mindspore.communication.init()``; on CPU
the backend is mccl.

A worker appends JSON lines to ``rank-<r>.jsonl`` in the attempt's directory: ``formed`` when
``init()`` has returned, then ``result`` (its seconds per repetition, per element count) or
``error``. The scheduler writes nothing; it serves the cluster inside ``init()`` and exits once
the workers have left.

Forming the cluster is flaky on a small host. An attempt that does not form by its deadline is
retried on a fresh port; a run that formed and then failed is not retried, because that failure
is a result. Either way, what went wrong comes back as a reason and never as a number.

Every process runs in its own session and is killed by process group and reaped on every path:
success, failure, deadline, Ctrl-C. If this process is SIGKILLed, the kernel kills them too
(``PR_SET_PDEATHSIG``).
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import enum
import json
import logging
import math
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from ms_recover import env as E
from ms_recover.errors import MsRecoverError

log = logging.getLogger(__name__)

PROGRAM = [sys.executable, "-m", "ms_recover.mindspore.programs.allreduce_bench"]
SCHEDULER = "scheduler"
POLL_S = 0.1
EXIT_GRACE_S = 3.0  # after every report is in; then the processes are killed
PR_SET_PDEATHSIG = 1
ERROR_LINE = re.compile(r"^\w*(Error|Exception)\b")  # the last line of a Python traceback
# Inherited settings that would put a child into some other cluster, or into ms_recover's.
INHERITED_CLUSTER_VARS = (
    E.ROLE,
    E.SCHED_HOST,
    E.SCHED_PORT,
    E.TOPO_TIMEOUT,
    E.WORKER_NUM,
    E.LOCAL_WORKER,
    E.NODE_RANK,
    E.NODE_ID,
    E.RANK_ID,
    E.RANK_SIZE,
    E.DEVICE_ID,
)


@dataclasses.dataclass(frozen=True)
class Plan:
    """What the workers are asked to time: tensors of these element counts, ``repeats`` times.

    ``program``: the worker program (default :data:`PROGRAM`; another one speaks the same
    event lines and takes ``--counts``, ``--repeats`` and ``--out``), with ``extra`` arguments.
    """

    counts: tuple[int, ...]
    world: int
    repeats: int
    program: tuple[str, ...] = ()
    extra: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True)
class Limits:
    """Deadlines of one attempt: to form the cluster, then for the formed cluster to finish."""

    form_s: float
    run_s: float
    tries: int


@dataclasses.dataclass(frozen=True)
class RankProgress:
    """What one worker has reported so far (times: element count -> seconds per repetition)."""

    formed: bool = False
    times: dict[int, list[float]] | None = None
    error: str = ""


class AttemptState(str, enum.Enum):
    """One attempt's lifecycle.

    FORMING until every worker's ``init()`` has returned, then RUNNING until every worker has
    reported its times. DONE and FAILED are final; a FAILED verdict says whether a fresh
    attempt may help (only a cluster that never formed is worth another try).
    """

    FORMING = "forming"
    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"


# Workers only ever append to their reports, so an attempt never moves backwards. It may skip
# RUNNING: a small run can form and finish between two polls.
TRANSITIONS: dict[AttemptState, frozenset[AttemptState]] = {
    AttemptState.FORMING: frozenset({AttemptState.RUNNING, AttemptState.DONE, AttemptState.FAILED}),
    AttemptState.RUNNING: frozenset({AttemptState.DONE, AttemptState.FAILED}),
    AttemptState.DONE: frozenset(),
    AttemptState.FAILED: frozenset(),
}


@dataclasses.dataclass(frozen=True)
class Verdict:
    phase: AttemptState
    reason: str = ""
    retry: bool = False


@dataclasses.dataclass(frozen=True)
class Outcome:
    """The baseline's result: per element count, each rank's seconds per repetition.

    ``times`` is None when nothing was measured, and ``reason`` then says why.
    """

    times: dict[int, list[list[float]]] | None
    reason: str = ""
    tries: tuple[str, ...] = ()


def event_line(event: str, **fields: Any) -> str:
    """One line of a worker's event file, as the worker program writes it
    (:func:`ms_recover.mindspore.programs.allreduce_bench.event_line`; a test holds them equal)."""
    return json.dumps({"event": event, **fields}, sort_keys=True) + "\n"


def parse_progress(text: str) -> RankProgress:
    """What a worker's event file says so far; a last line still being written is not read."""
    formed, times, error = False, None, ""
    for line in text.splitlines(keepends=True):
        if not line.endswith("\n"):
            break
        try:
            event = json.loads(line)
            kind = event["event"]
            if kind == "formed":
                formed = True
            elif kind == "result":
                times = {int(n): [float(t) for t in ts] for n, ts in event["times"].items()}
            elif kind == "error":
                error = str(event["error"])
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            error = f"unreadable event line {line.strip()[:120]!r}: {exc!r}"
    return RankProgress(formed, times, error)


def assess(
    plan: Plan,
    progress: Mapping[int, RankProgress],
    exits: Mapping[str, int | None],
    now: float,
    started: float,
    formed_at: float | None,
    limits: Limits,
) -> Verdict:
    """Where an attempt stands, from the workers' reports and the processes' exit codes.

    ``exits`` maps ``"scheduler"`` and ``"rank <r>"`` to an exit code, or None while running. It
    must be read before ``progress``: a worker writes its result before it exits, so an exit
    seen first has its result in the reports read after it. ``formed_at`` is when the caller
    first saw RUNNING (None until then).
    """
    ranks = [progress.get(r, RankProgress()) for r in range(plan.world)]
    formed = all(p.formed for p in ranks)
    for r, p in enumerate(ranks):
        if p.error:
            return Verdict(AttemptState.FAILED, f"rank {r}: {p.error}", retry=not p.formed)
    for r, p in enumerate(ranks):
        if p.times is not None and not _complete(plan, p.times):
            got = {n: len(ts) for n, ts in p.times.items()}
            return Verdict(
                AttemptState.FAILED,
                f"rank {r} reported {got} (element count: repetitions), not "
                f"{plan.repeats} repetitions of each of {list(plan.counts)}",
            )
    if all(p.times is not None for p in ranks):
        return Verdict(AttemptState.DONE, f"all {plan.world} ranks reported")
    finished = {f"rank {r}" for r, p in enumerate(ranks) if p.times is not None}
    dead = [
        f"{name} exited with {_describe(code)}"
        for name, code in sorted(exits.items())
        if code is not None and name not in finished
    ]
    when = "every rank reported" if formed else "the cluster formed"
    if dead:
        return Verdict(AttemptState.FAILED, f"{'; '.join(dead)} before {when}", retry=not formed)
    if not formed:
        if now - started < limits.form_s:
            return Verdict(AttemptState.FORMING)
        done = [r for r, p in enumerate(ranks) if p.formed]
        return Verdict(
            AttemptState.FAILED,
            f"the cluster did not form within {limits.form_s:g} s (init() returned on ranks "
            f"{done} of {plan.world})",
            retry=True,
        )
    since_formed = 0.0 if formed_at is None else now - formed_at
    if since_formed < limits.run_s:
        return Verdict(AttemptState.RUNNING)
    waiting = [r for r, p in enumerate(ranks) if p.times is None]
    return Verdict(
        AttemptState.FAILED, f"ranks {waiting} did not report within {limits.run_s:g} s of forming"
    )


def rank_times(plan: Plan, progress: Mapping[int, RankProgress]) -> dict[int, list[list[float]]]:
    """Element count -> each rank's seconds per repetition, once :func:`assess` said DONE."""
    return {n: [(progress[r].times or {})[n] for r in range(plan.world)] for n in plan.counts}


def _complete(plan: Plan, times: Mapping[int, list[float]]) -> bool:
    return set(times) == set(plan.counts) and all(len(ts) == plan.repeats for ts in times.values())


def cluster_env(
    base: Mapping[str, str], role: str, port: int, plan: Plan, rank: int | None, limits: Limits
) -> dict[str, str]:
    """msrun's environment for one process of a local cluster; nothing inherited overrides it."""
    env = {
        k: v
        for k, v in base.items()
        if k not in INHERITED_CLUSTER_VARS and not k.startswith("MS_RECOVER_")
    }
    env.update(
        {
            E.ROLE: role,
            E.SCHED_HOST: "127.0.0.1",
            E.SCHED_PORT: str(port),
            E.WORKER_NUM: str(plan.world),
            E.TOPO_TIMEOUT: str(max(1, math.ceil(limits.form_s))),
        }
    )
    if rank is not None:
        env[E.NODE_ID] = str(rank)
    return env


def measure(plan: Plan, workdir: Path, limits: Limits) -> Outcome:
    """Time MindSpore's CPU AllReduce as planned; retry only a cluster that did not form."""
    tries: list[str] = []
    for attempt in range(1, limits.tries + 1):
        verdict, progress = _attempt(plan, workdir / f"try-{attempt}", limits)
        if verdict.phase is AttemptState.DONE:
            return Outcome(rank_times(plan, progress), tries=tuple(tries))
        tries.append(f"try {attempt}: {verdict.reason}")
        log.warning("MindSpore cluster %s (retry=%s)", tries[-1], verdict.retry)
        if not verdict.retry:
            break
    return Outcome(None, f"{'; '.join(tries)} (logs in {workdir})", tuple(tries))


def _attempt(plan: Plan, adir: Path, limits: Limits) -> tuple[Verdict, dict[int, RankProgress]]:
    adir.mkdir(parents=True, exist_ok=True)
    argv = list(plan.program) or PROGRAM
    argv += ["--counts", *map(str, plan.counts), "--repeats", str(plan.repeats)]
    argv += ["--out", str(adir), *plan.extra]
    port = free_port()
    with _Cluster(adir) as cluster:
        cluster.start(
            SCHEDULER, argv, cluster_env(os.environ, E.ROLE_SCHED, port, plan, None, limits)
        )
        for r in range(plan.world):
            env = cluster_env(os.environ, E.ROLE_WORKER, port, plan, r, limits)
            cluster.start(f"rank {r}", argv, env)
        started, formed_at, phase = time.monotonic(), None, AttemptState.FORMING
        while True:
            exits = cluster.exit_codes()  # before the reports: see assess()
            progress = {r: _read_progress(adir / f"rank-{r}.jsonl") for r in range(plan.world)}
            now = time.monotonic()
            verdict = assess(plan, progress, exits, now, started, formed_at, limits)
            if verdict.phase is not phase:
                _check_transition(phase, verdict.phase)
                log.info(
                    "MindSpore cluster port=%d: %s -> %s %s",
                    port,
                    phase.value,
                    verdict.phase.value,
                    verdict.reason,
                )
                phase = verdict.phase
            if phase is AttemptState.RUNNING and formed_at is None:
                formed_at = now
            elif phase is AttemptState.DONE:
                cluster.wait_all(EXIT_GRACE_S)  # every report is in: a clean exit is a courtesy
                return verdict, progress
            elif phase is AttemptState.FAILED:
                explained = dataclasses.replace(verdict, reason=cluster.explain(verdict.reason))
                return explained, progress
            time.sleep(POLL_S)


def _check_transition(old: AttemptState, new: AttemptState) -> None:
    if new not in TRANSITIONS[old]:
        raise MsRecoverError(
            f"MindSpore cluster attempt: illegal transition {old.value} -> {new.value}"
        )


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (a taken one fails the attempt)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _read_progress(path: Path) -> RankProgress:
    try:
        return parse_progress(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return RankProgress()


class _Cluster:
    """The scheduler and worker processes of one attempt, each in its own process group."""

    def __init__(self, adir: Path) -> None:
        self.adir = adir
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def __enter__(self) -> _Cluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.kill()

    def _log(self, name: str) -> Path:
        return self.adir / f"{name.replace(' ', '-')}.log"

    def start(self, name: str, argv: list[str], env: dict[str, str]) -> None:
        with open(self._log(name), "wb") as out:
            self.procs[name] = subprocess.Popen(
                argv,
                env=env,
                cwd=self.adir,  # MindSpore writes its own files into the working directory
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=_die_with_parent(),
            )

    def exit_codes(self) -> dict[str, int | None]:
        """Each process's exit code (negative: killed by that signal), or None while it runs.

        An exited process is left a zombie, not reaped: its pid, which is also its process
        group's id, cannot be reused before :meth:`kill` has signalled the group.
        """
        return {name: _peek_exit(proc.pid) for name, proc in self.procs.items()}

    def wait_all(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        for proc in self.procs.values():
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=max(0.0, deadline - time.monotonic()))

    def kill(self) -> None:
        """SIGKILL every process group still there, then reap every process."""
        for proc in self.procs.values():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)  # the group's leader is the process itself
        for proc in self.procs.values():
            proc.wait()

    def explain(self, reason: str) -> str:
        """``reason`` with the last error each log shows (MindSpore says why it gave up there)."""
        found = [f"{name} log: {line}" for name in self.procs for line in self._last_error(name)]
        return "; ".join([reason, *found])

    def _last_error(self, name: str) -> Iterator[str]:
        with contextlib.suppress(OSError):
            lines = self._log(name).read_text(encoding="utf-8", errors="replace").splitlines()
            errors = [ln for ln in lines if "[ERROR]" in ln or ERROR_LINE.match(ln)]
            if errors:
                yield errors[-1].strip()[:300]


def _die_with_parent() -> Callable[[], None] | None:
    """A hook for the child, between fork and exec: SIGKILL it if the benchmark dies (Linux).

    ``prctl`` is looked up here, in the parent: the child only calls it, and takes no lock
    (the dynamic loader's) that another thread of the parent may have held at fork time.
    """
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    return lambda: prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def _peek_exit(pid: int) -> int | None:
    info = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    if info is None:
        return None
    return info.si_status if info.si_code == os.CLD_EXITED else -info.si_status


def _describe(code: int) -> str:
    return f"signal {-code}" if code < 0 else f"code {code}"
