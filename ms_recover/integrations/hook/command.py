"""Start and stop the job's manager on the scheduler pod: ``ms-recover hook CMD``.

``ms_recover/integrations/hook/ms_recover_hook.sh`` calls this from a job's ``train_start.sh`` as
``python -m ms_recover hook CMD`` (the same command, with the interpreter the job chose):

- ``start``: only where ``MS_ROLE=MS_SCHED`` or ``MS_SCHED_HOST == POD_IP``, runs
  ``ms-recover manager`` detached, logging to ``manager.log`` in the run directory, records its
  pid in ``manager.pid`` and waits until its port accepts TCP connections. A manager that is
  already running (live pid from the pid file) is reused, never doubled. Elsewhere it prints one
  line and does nothing.
- ``stop``: SIGTERM to the recorded pid, SIGKILL after a deadline; harmless when nothing runs.
- ``status``: exit 0 when the manager runs, 3 when it does not.
- ``install-pth``: writes ``ms_recover_autostart.pth`` into site-packages, so a MindSpore
  scheduler process started with ``MS_RECOVER_AUTOSTART=1`` starts the manager itself
  (see :mod:`ms_recover.integrations.hook.autostart`).

The run directory is ``MS_RECOVER_RUN_DIR``, default ``/tmp/ms-recover/<MINDX_TASK_ID>``.
Exit status: 0 done or nothing to do, 1 failed, 2 usage error, 3 (status) not running.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import fcntl
import os
import pathlib
import re
import signal
import socket
import subprocess
import sys
import sysconfig
import time
from collections.abc import Iterator, Mapping

from ms_recover import env as E

RUN_DIR = "MS_RECOVER_RUN_DIR"
START_TIMEOUT = "MS_RECOVER_START_TIMEOUT"
DEFAULT_PORT = 9601
PTH_NAME = "ms_recover_autostart.pth"
PTH_LINE = (
    'import os; os.environ.get("MS_RECOVER_AUTOSTART") == "1" and os.environ.get("MS_ROLE") '
    '== "MS_SCHED" and __import__("ms_recover.integrations.hook.autostart")'
    ".integrations.hook.autostart.maybe_start()\n"
)
NOT_RUNNING = 3


@dataclasses.dataclass(frozen=True)
class Placement:
    """Whether this pod hosts the manager, and the reason in words."""

    is_scheduler: bool
    reason: str
    missing: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True)
class RunFiles:
    """Where the manager's pid file, log and lock live."""

    directory: pathlib.Path

    @property
    def pid(self) -> pathlib.Path:
        return self.directory / "manager.pid"

    @property
    def log(self) -> pathlib.Path:
        return self.directory / "manager.log"

    @property
    def lock(self) -> pathlib.Path:
        return self.directory / "manager.lock"

    @property
    def events(self) -> pathlib.Path:
        return self.directory / "events.jsonl"


def placement(environ: Mapping[str, str]) -> Placement:
    """Decide from the environment alone whether the manager belongs on this pod."""
    role = environ.get(E.ROLE, "")
    host, pod_ip = environ.get(E.SCHED_HOST, ""), environ.get(E.POD_IP, "")
    if role == E.ROLE_SCHED:
        return Placement(True, f"{E.ROLE}={E.ROLE_SCHED}")
    if host and pod_ip:
        same = host == pod_ip
        relation = "==" if same else "!="
        return Placement(same, f"{E.SCHED_HOST}={host} {relation} {E.POD_IP}={pod_ip}")
    missing = tuple(name for name, value in ((E.SCHED_HOST, host), (E.POD_IP, pod_ip)) if not value)
    return Placement(
        False,
        f"{' and '.join(missing)} not set and {E.ROLE} is {role or 'unset'} (not {E.ROLE_SCHED})",
        missing,
    )


def run_files(environ: Mapping[str, str]) -> RunFiles:
    """The run directory: MS_RECOVER_RUN_DIR, else /tmp/ms-recover/<job id> (sanitised)."""
    if environ.get(RUN_DIR):
        return RunFiles(pathlib.Path(environ[RUN_DIR]))
    job = re.sub(r"[^A-Za-z0-9_.-]", "_", environ.get(E.TASK_ID, "") or "default")
    return RunFiles(pathlib.Path("/tmp/ms-recover") / (job.strip(".") or "default"))


def manager_address(environ: Mapping[str, str]) -> tuple[str, int]:
    """Where agents will reach the manager: MS_SCHED_HOST (else POD_IP) and MS_RECOVER_PORT."""
    host = environ.get(E.SCHED_HOST) or environ.get(E.POD_IP) or "127.0.0.1"
    raw = environ.get(E.PORT, "").strip()
    return host, int(raw) if raw.isdigit() else DEFAULT_PORT


def read_pid(files: RunFiles) -> int | None:
    """The pid in the pid file, or None when it is absent or unreadable."""
    try:
        text = files.pid.read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def is_alive(pid: int) -> bool:
    """True while ``pid`` runs and is not a zombie (a child of ours is reaped here)."""
    with contextlib.suppress(ChildProcessError):
        done, _ = os.waitpid(pid, os.WNOHANG)
        if done == pid:
            return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        stat = pathlib.Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rpartition(")")[2].split()[0] != "Z"


def is_manager(pid: int) -> bool:
    """True when ``pid`` is alive and looks like our manager (guards against pid reuse)."""
    if not is_alive(pid):
        return False
    try:
        cmdline = pathlib.Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return True  # no /proc: trust the pid file
    return b"ms_recover" in cmdline or b"ms-recover" in cmdline


@contextlib.contextmanager
def _locked(files: RunFiles) -> Iterator[None]:
    """Serialise start/stop between processes of the same pod."""
    files.directory.mkdir(parents=True, exist_ok=True)
    with open(files.lock, "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def launch(environ: Mapping[str, str], settle_s: float = 0.0) -> tuple[int, bool]:
    """(pid, started): the running manager's pid, spawning it first if none runs.

    With ``settle_s``, a new manager is given that long, still under the lock, to listen
    (or to die): a concurrent starter then finds a settled manager, never a half-started one.
    """
    files = run_files(environ)
    with _locked(files):
        pid = read_pid(files)
        if pid is not None and is_manager(pid):
            return pid, False
        pid = _spawn(environ, files)
        tmp = files.pid.with_suffix(".tmp")
        tmp.write_text(f"{pid}\n")
        os.replace(tmp, files.pid)
        if settle_s > 0:
            wait_ready(pid, environ, settle_s)
        return pid, True


def _spawn(environ: Mapping[str, str], files: RunFiles) -> int:
    command = [sys.executable, "-m", "ms_recover.cli", "manager"]
    if not environ.get(E.EVENTS):
        command += ["--events", str(files.events)]
    if not environ.get(E.POD_IP) and environ.get(E.SCHED_HOST):
        # MS_ROLE=MS_SCHED without POD_IP: bind where agents look (the operator sets
        # MS_SCHED_HOST to this pod's IP), not on the loopback default.
        command += ["--host", environ[E.SCHED_HOST]]
    child_env = dict(environ)
    child_env[E.AUTOSTART] = "0"  # the manager is python too: no recursive autostart
    with open(files.log, "ab") as log:
        log.write(f"--- {time.strftime('%Y-%m-%dT%H:%M:%S')} {' '.join(command)}\n".encode())
        log.flush()
        proc = subprocess.Popen(  # noqa: S603 - our own interpreter and module
            command,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=child_env,
            start_new_session=True,
            close_fds=True,
        )
    return proc.pid


def port_open(host: str, port: int, timeout: float = 0.5) -> bool:
    """True when a TCP connection to host:port succeeds."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def wait_ready(pid: int, environ: Mapping[str, str], timeout: float) -> str | None:
    """Wait until the manager accepts connections; None when ready, else the reason."""
    host, port = manager_address(environ)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if port_open(host, port, timeout=min(0.5, max(0.05, deadline - time.monotonic()))):
            return None
        if not is_alive(pid):
            return f"manager pid {pid} exited before listening on {host}:{port}"
        time.sleep(0.05)
    return f"manager pid {pid} did not accept connections on {host}:{port} within {timeout:g}s"


def _log_tail(files: RunFiles, lines: int = 15) -> str:
    try:
        text = files.log.read_text(errors="replace")
    except OSError:
        return ""
    return "\n".join("    " + line for line in text.splitlines()[-lines:])


def say(message: str, *, error: bool = False) -> None:
    print(f"ms_recover hook: {message}", file=sys.stderr if error else sys.stdout, flush=True)


def cmd_start(environ: Mapping[str, str], timeout: float) -> int:
    """Start (or reuse) the manager where it belongs and wait for its port."""
    where = placement(environ)
    if not where.is_scheduler:
        if where.missing:
            say(
                f"warning: cannot tell whether this pod hosts the manager: {where.reason}; "
                "the Ascend Operator injects MS_SCHED_HOST and MS_ROLE, add POD_IP from "
                "fieldRef status.podIP; not starting the manager",
                error=True,
            )
        else:
            say(f"not the scheduler pod ({where.reason}): nothing to start")
        return 0
    files = run_files(environ)
    pid, started = launch(environ, settle_s=timeout)
    say(
        f"{'started' if started else 'reusing'} manager pid {pid} ({where.reason}); log {files.log}"
    )
    problem = wait_ready(pid, environ, timeout)
    if problem is None:
        host, port = manager_address(environ)
        say(f"manager pid {pid} is accepting connections on {host}:{port}")
        return 0
    say(f"error: {problem}; see {files.log}:\n{_log_tail(files)}", error=True)
    return 1


def cmd_stop(environ: Mapping[str, str], timeout: float) -> int:
    """SIGTERM the recorded manager, SIGKILL it after ``timeout``; 0 once it is gone."""
    files = run_files(environ)
    if not files.pid.exists():
        say("no manager pid file here: nothing to stop")
        return 0
    with _locked(files):
        pid = read_pid(files)
        if pid is None or not is_manager(pid):
            files.pid.unlink(missing_ok=True)
            say("no manager running here: nothing to stop")
            return 0
        gone = _terminate(pid, timeout)
        if gone:
            files.pid.unlink(missing_ok=True)
    say(
        f"stopped manager pid {pid}" if gone else f"error: manager pid {pid} survived SIGKILL",
        error=not gone,
    )
    return 0 if gone else 1


def _terminate(pid: int, timeout: float) -> bool:
    for sig, wait_s in ((signal.SIGTERM, timeout), (signal.SIGKILL, 5.0)):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            if not is_alive(pid):
                return True
            time.sleep(0.02)
    return not is_alive(pid)


def cmd_status(environ: Mapping[str, str]) -> int:
    files = run_files(environ)
    pid = read_pid(files)
    if pid is None or not is_manager(pid):
        say(f"no manager running (run dir {files.directory})")
        return NOT_RUNNING
    host, port = manager_address(environ)
    listening = "accepting" if port_open(host, port) else "NOT accepting"
    say(f"manager pid {pid} running, {listening} connections on {host}:{port}")
    return 0


def cmd_install_pth(site_dir: str | None) -> int:
    """Write the autostart .pth file into ``site_dir`` (default: this interpreter's purelib)."""
    target = pathlib.Path(site_dir or sysconfig.get_paths()["purelib"]) / PTH_NAME
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(PTH_LINE)
    except OSError as exc:
        say(f"error: cannot write {target}: {exc.strerror or exc}", error=True)
        return 1
    say(
        f"wrote {target}; python processes with {E.AUTOSTART}=1 and {E.ROLE}={E.ROLE_SCHED} "
        "now start the manager"
    )
    return 0


def configure(parser: argparse.ArgumentParser) -> None:
    """The hook's commands, as ``ms-recover hook`` (and :func:`main`) parse them."""
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    sub = parser.add_subparsers(dest="command", required=True)
    start = sub.add_parser("start", help="start the manager on the scheduler pod")
    start.add_argument(
        "--timeout",
        type=float,
        default=None,
        help=f"seconds to wait for the port (default ${START_TIMEOUT} or 60)",
    )
    stop = sub.add_parser("stop", help="stop the manager started here")
    stop.add_argument("--timeout", type=float, default=10.0, help="seconds before SIGKILL")
    sub.add_parser("status", help="exit 0 if the manager runs, 3 if not")
    pth = sub.add_parser("install-pth", help=f"install {PTH_NAME} into site-packages")
    pth.add_argument("--site-dir", default=None, help="target directory (default: purelib)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ms-recover hook", description=__doc__)
    configure(parser)
    return parser


def _env_timeout(environ: Mapping[str, str]) -> float | None:
    raw = environ.get(START_TIMEOUT, "").strip()
    try:
        return float(raw) if raw else 60.0
    except ValueError:
        return None


def main(argv: list[str] | None = None, environ: Mapping[str, str] | None = None) -> int:
    """Run one hook command; return its exit status. File-system failures are reported, not
    raised (exit 1)."""
    return _run(build_parser().parse_args(argv), environ)


def run(args: argparse.Namespace) -> int:
    """``ms-recover hook CMD``: :func:`main` on the parsed arguments and this environment."""
    return _run(args, None)


def _run(args: argparse.Namespace, environ: Mapping[str, str] | None) -> int:
    env = dict(os.environ if environ is None else environ)
    try:
        return _dispatch(args, env)
    except OSError as exc:
        where = f" {exc.filename}" if exc.filename else ""
        say(f"error: {args.command} failed:{where}: {exc.strerror or exc}", error=True)
        return 1


def _dispatch(args: argparse.Namespace, env: dict[str, str]) -> int:
    if args.command == "start":
        timeout = args.timeout if args.timeout is not None else _env_timeout(env)
        if timeout is None or timeout <= 0:
            say(
                f"error: {START_TIMEOUT}={env.get(START_TIMEOUT)!r} / --timeout must be a "
                "positive number of seconds",
                error=True,
            )
            return 2
        return cmd_start(env, timeout)
    if args.command == "stop":
        return cmd_stop(env, args.timeout)
    if args.command == "status":
        return cmd_status(env)
    return cmd_install_pth(args.site_dir)


if __name__ == "__main__":
    sys.exit(main())
