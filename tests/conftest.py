"""Suite-wide fixtures: the tiers' markers, the leak check, and the fault matrix's tally.

**Tiers.** A test is marked by the directory it lives in: ``tests/unit`` (``unit``: no
subprocess, no real network), ``tests/integration`` (``integration``: threads, real ZeroMQ on
127.0.0.1 ephemeral ports, numpy worker processes) and ``tests/e2e`` (``e2e``: real MindSpore
processes). Choose with ``-m``: ``python -m pytest -m unit`` runs the fast tier alone.

**Leaks.** Every test must leave the pytest process as it found it: no thread, no child process,
no socket and no signal handler of its own left behind (:func:`no_leaks`). A leak fails the test
at teardown with a message naming what leaked; the leaked handler is put back and leaked children
are killed, so the next test starts clean.

**Fault matrix.** A test that takes the ``scenario`` fixture is one fault-matrix scenario: it
survived if it passed, and it reports the committed steps its recoveries lost
(``scenario.lost_steps``). The terminal summary ends with ``N scenarios, S survived, L lost
steps``; under pytest-xdist each scenario travels to the controller in its report.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import os
import pathlib
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Generator, Iterator
from types import FrameType
from typing import Any

import pytest

from ms_recover import env as E

# ms-recover agent's standby (on by default) imports MindSpore in one more process per node
# once the ranks train: seconds of CPU and 400 MB per agent of every short test job on this
# 2-core host. The suite turns it off; the tests of the standby turn it on explicitly
# (tests/integration/test_standby.py, tests/e2e/test_demo_job.py).
os.environ.setdefault(E.STANDBY, "off")

TIERS = ("unit", "integration", "e2e")
TIER_HELP = (
    "tests/unit: no subprocess, no real network (the whole tier in seconds)",
    "tests/integration: threads, ZeroMQ on 127.0.0.1, numpy worker processes",
    "tests/e2e: real MindSpore processes (needs the [mindspore] extra)",
)
HERE = pathlib.Path(__file__).resolve().parent

# How long a test's own clean-up may still run after it returned (a server thread joining, a
# child being reaped, ZeroMQ closing a socket in its I/O thread) before it counts as a leak.
LEAK_GRACE_S = float(os.environ.get("MSR_TEST_LEAK_GRACE_S", "5"))


def pytest_configure(config: pytest.Config) -> None:
    for tier, what in zip(TIERS, TIER_HELP, strict=True):
        config.addinivalue_line("markers", f"{tier}: {what}")


#: Modules run first, longest first: their whole demo runs would otherwise end a parallel run
#: alone on one worker while the others idle.
FIRST = ("e2e/test_demo_cli.py", "e2e/test_demo_job.py", "integration/test_bench_goodput.py")


@pytest.hookimpl(tryfirst=True)  # before xdist's, which reads the xdist_group marks added here
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark each test with the tier of the directory it lives in, and keep the tests that share
    a module-scoped fixture (one whole job asserted several ways) on one xdist worker, so the
    job runs once. The costliest run first (:data:`FIRST`, then e2e, integration, unit): a
    module's tests stay together, so its fixtures still run once."""
    rank: dict[str, int] = {}
    for item in items:
        try:
            parts = pathlib.Path(str(item.path)).resolve().relative_to(HERE).parts
        except ValueError:
            continue
        if parts and parts[0] in TIERS:
            item.add_marker(parts[0])
            where = "/".join(parts)
            first = FIRST.index(where) if where in FIRST else len(FIRST)
            rank[item.nodeid] = first * len(TIERS) + TIERS[::-1].index(parts[0])
        if _shares_a_wide_fixture(item):
            item.add_marker(pytest.mark.xdist_group(name=str(item.path)))
    items.sort(key=lambda item: rank.get(item.nodeid, len(FIRST) * len(TIERS)))


def _shares_a_wide_fixture(item: pytest.Item) -> bool:
    info = getattr(item, "_fixtureinfo", None)  # pytest has no public accessor for this
    if info is None:
        return False
    wide = ("module", "package", "class")
    return any(d.scope in wide for defs in info.name2fixturedefs.values() for d in defs)


@pytest.hookimpl(optionalhook=True)  # a pytest-xdist hook
def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """``-n auto``: one worker more than the cores (whole-job tests spend much of their time
    waiting on their processes), at most 4, and at most one per 3 GiB of available memory (an
    e2e job is a few MindSpore processes of 0.5 GiB each). Two per core was faster on 2 cores
    (554 s against 592 s) but loaded the host past what a MindSpore job's first-step compile
    fits in: a clean-clone run failed once that way."""
    cores = len(os.sched_getaffinity(0))
    return max(1, min(cores + 1, 4, _available_gib() // 3))


def _available_gib() -> int:
    try:
        for line in pathlib.Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) // (1024 * 1024)
    except (OSError, ValueError, IndexError):
        pass
    return 3


def _import_mindspore_once() -> None:
    """MindSpore's own import starts a process: done before the refusal below, so that a unit
    test that imports it lazily (alone, or first on its worker) is judged by what it starts."""
    if "mindspore" not in sys.modules and importlib.util.find_spec("mindspore") is not None:
        importlib.import_module("mindspore")


def _build_font_cache_once() -> None:
    """Matplotlib's first import on a fresh machine builds its font cache by running fc-list:
    done before the refusal below, as MindSpore's import is (the unit tests that plot run in
    CI's fresh home)."""
    if "matplotlib.font_manager" not in sys.modules and importlib.util.find_spec("matplotlib"):
        importlib.import_module("matplotlib.font_manager")


@pytest.fixture(autouse=True)
def unit_tests_start_no_process(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The unit tier starts no process: a test that needs one belongs in tests/integration."""
    if request.node.get_closest_marker("unit") is None:
        return
    _import_mindspore_once()
    _build_font_cache_once()

    def refuse(*args: object, **kwargs: object) -> None:
        pytest.fail(
            f"{request.node.nodeid} starts a process; unit tests start none "
            "(move it to tests/integration)",
            pytrace=False,
        )

    monkeypatch.setattr(subprocess.Popen, "__init__", refuse)
    monkeypatch.setattr(os, "fork", refuse)
    monkeypatch.setattr(os, "posix_spawn", refuse)


# --- leaks -------------------------------------------------------------------------------------

Handler = Callable[[int, FrameType | None], Any] | int | signal.Handlers | None


@dataclasses.dataclass(frozen=True)
class ProcessState:
    """What a test can leak in this process, at one moment."""

    threads: frozenset[threading.Thread]
    spawned: int  # how many children this process had started (len(_SPAWNED))
    children: dict[int, str]  # pid -> command line (or state), of those started since a mark
    sockets: frozenset[str]  # "socket:[inode]" of the open descriptors
    handlers: dict[int, Handler]

    @classmethod
    def now(cls, since: int | None = None) -> ProcessState:
        """Now; ``children`` holds those started since ``since`` (none when it is None)."""
        alive = [t for t in threading.enumerate() if t.is_alive() and not _lives_on_purpose(t)]
        return cls(
            frozenset(alive),
            len(_SPAWNED),
            {} if since is None else _children(since),
            _sockets(),
            _handlers(),
        )


def _handlers() -> dict[int, Handler]:
    """Every signal's handler, except pytest-timeout's SIGALRM: it is armed around each test and
    cancelled as soon as a test fails (before the fixtures' teardown), by design."""
    found: dict[int, Handler] = {}
    for signum in signal.Signals:  # the named ones (real-time signals are not ours to take)
        try:
            handler = signal.getsignal(signum)
        except (OSError, ValueError):
            continue
        if getattr(handler, "__module__", None) != "pytest_timeout":
            found[int(signum)] = handler
    return found


_SPAWNED: list[int] = []  # every child this process started, in order (see _track_spawns)


def _track_spawns() -> None:
    """Record the pid of every child process started from here on: by subprocess, os.fork
    (multiprocessing's too) or os.posix_spawn. Cheaper than scanning /proc after each test."""
    execute = subprocess.Popen._execute_child  # type: ignore[attr-defined]

    def execute_child(self: subprocess.Popen[Any], *args: Any, **kwargs: Any) -> None:
        execute(self, *args, **kwargs)
        _SPAWNED.append(self.pid)

    subprocess.Popen._execute_child = execute_child  # type: ignore[attr-defined]
    fork, spawn = os.fork, os.posix_spawn

    def tracked_fork() -> int:
        pid = fork()
        if pid:
            _SPAWNED.append(pid)
        return pid

    def tracked_spawn(*args: Any, **kwargs: Any) -> int:
        pid = spawn(*args, **kwargs)
        _SPAWNED.append(pid)
        return pid

    os.fork = tracked_fork
    os.posix_spawn = tracked_spawn


_track_spawns()


def _children(since: int) -> dict[int, str]:
    """The children started since ``_SPAWNED[since]`` that are still this process's children
    (zombies included: a child must be reaped too): pid -> command line or state."""
    me, found = os.getpid(), {}
    for pid in _SPAWNED[since:]:
        try:
            stat = pathlib.Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2 :].split()
        if int(fields[1]) != me:
            continue
        if fields[0] == "Z":
            found[pid] = f"(zombie, never waited for) {stat[stat.find('(') : stat.rfind(')') + 1]}"
            continue
        try:
            raw = pathlib.Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            raw = b""
        found[pid] = raw.replace(b"\0", b" ").decode(errors="replace").strip()[:200]
    return found


def _sockets() -> frozenset[str]:
    found = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:"):
            found.add(target)
    return frozenset(found)


def _thread_name(thread: threading.Thread) -> str:
    """The thread's name, and what it runs when it was not named."""
    target = getattr(thread, "_target", None)  # threading keeps it; there is no public accessor
    if target is None:
        kind = type(thread)
        return thread.name if kind is threading.Thread else f"{thread.name} ({kind.__qualname__})"
    return f"{thread.name} ({getattr(target, '__module__', '?')}.{target.__qualname__})"


def _lives_on_purpose(thread: threading.Thread) -> bool:
    """pyzmq's garbage collector: one per process, started by the first zero-copy send, kept
    until exit by design (it frees the buffers zmq sent from)."""
    return type(thread).__module__ == "zmq.utils.garbage"


def _describe(before: ProcessState, after: ProcessState) -> list[str]:
    leaks = []
    threads = sorted(_thread_name(t) for t in after.threads - before.threads)
    if threads:
        leaks.append(f"{len(threads)} thread(s) still running: {', '.join(threads)}")
    children = {p: c for p, c in after.children.items() if p not in before.children}
    if children:
        named = "; ".join(f"pid {p}: {c}" for p, c in sorted(children.items()))
        leaks.append(f"{len(children)} child process(es) not reaped: {named}")
    sockets = after.sockets - before.sockets
    if sockets:
        leaks.append(f"{len(sockets)} socket(s) left open: {', '.join(sorted(sockets)[:8])}")
    changed = [s for s, h in after.handlers.items() if s in before.handlers]
    changed = [s for s in changed if before.handlers[s] is not after.handlers[s]]
    if changed:
        named = ", ".join(f"{signal.Signals(s).name} -> {after.handlers[s]!r}" for s in changed)
        leaks.append(f"signal handler(s) not restored: {named}")
    return leaks


def _clean_up(before: ProcessState, after: ProcessState) -> None:
    """Put back the handlers and end the children a leaking test left, so the next test and
    the suite itself (Ctrl-C, SIGTERM) are not affected by it."""
    for signum, handler in before.handlers.items():
        if after.handlers.get(signum) is not handler and handler is not None:
            try:
                signal.signal(signum, handler)
            except (OSError, ValueError):
                pass
    for pid in after.children:
        if pid in before.children:
            continue
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        try:
            os.waitpid(pid, 0)
        except ChildProcessError:  # someone else's to wait for (a subprocess.Popen object)
            pass


@pytest.fixture(autouse=True)
def no_leaks(request: pytest.FixtureRequest) -> Iterator[None]:
    """Fail a test that leaves a thread, a child process, a socket or a signal handler behind.

    Compared with the state before the test's function-scoped fixtures ran, after they were
    torn down; clean-up still in flight gets :data:`LEAK_GRACE_S` seconds.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    before = ProcessState.now()
    yield
    deadline = time.monotonic() + LEAK_GRACE_S
    after = ProcessState.now(before.spawned)
    while _describe(before, after) and time.monotonic() < deadline:
        time.sleep(0.05)
        after = ProcessState.now(before.spawned)
    leaks = _describe(before, after)
    if leaks:
        _clean_up(before, after)
        pytest.fail(f"{request.node.nodeid} leaked: " + " | ".join(leaks), pytrace=False)


# --- the fault matrix's tally -------------------------------------------------------------------


@dataclasses.dataclass
class Scenario:
    name: str
    lost_steps: int | None = None  # None: the test failed before it could count them
    survived: bool = False


_SCENARIOS: dict[str, Scenario] = {}  # where the test runs (a worker under xdist)
_TALLY: dict[str, Scenario] = {}  # where the terminal summary is written
_KEY = "fault-matrix-scenario"


@pytest.fixture
def scenario(request: pytest.FixtureRequest) -> Iterator[Scenario]:
    found = _SCENARIOS.setdefault(request.node.nodeid, Scenario(request.node.nodeid))
    yield found


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, None]:
    outcome = yield
    report = outcome.get_result()
    found = _SCENARIOS.get(item.nodeid)
    if found is not None and report.when == "call":
        found.survived = report.passed
        report.user_properties.append((_KEY, dataclasses.asdict(found)))


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    for key, value in report.user_properties:
        if key == _KEY and isinstance(value, dict):
            _TALLY[report.nodeid] = Scenario(**value)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if not _TALLY:
        return
    found = list(_TALLY.values())
    survived = sum(s.survived for s in found)
    lost = sum(s.lost_steps or 0 for s in found)
    unknown = [s.name for s in found if s.lost_steps is None]
    terminalreporter.section("fault matrix")
    for s in found:
        if not s.survived:
            terminalreporter.write_line(f"LOST  {s.name}")
    line = f"{len(found)} scenarios, {survived} survived, {lost} lost steps"
    if unknown:
        line += f" ({len(unknown)} not counted: failed before their recoveries were read)"
    terminalreporter.write_line(line)
