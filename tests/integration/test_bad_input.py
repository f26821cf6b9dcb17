"""Every ``ms-recover`` subcommand fed bad input: a one-line error, a nonzero exit, no traceback,
and an answer in bounded time (issue 9 #9).

Each row is (argv, environment, expected exit code, a fragment of the one error line). The
table runs in-process (fast); a few rows also run as real processes, where a traceback or a
hang would show exactly as a user sees it.
"""

from __future__ import annotations

import os
import pathlib
import re
import socket
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from ms_recover import cli

pytestmark = pytest.mark.timeout(120)

DEADLINE_S = 20.0  # generous: the CI host is shared; a hang would take forever
LOG_LINE = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d")
BAD_UTF8 = b"\xff\xfe".decode("utf-8", "surrogateescape")
BOMB = "".join(
    f"{name}: &{name} [{', '.join([f'*{prev}'] * 9)}]\n"
    for prev, name in zip("abcdefg", "bcdefgh", strict=True)
)
YAML_FILES = {
    "bomb.yaml": "a: &a [x, x, x, x, x, x, x, x, x]\n"
    + BOMB
    + "kind: AscendJob\nmetadata: {name: x, labels: {l: *h}}\n",
    "badfloat.yaml": "kind: AscendJob\nmetadata: {name: !!float abc}\n",
    "badint.yaml": "kind: AscendJob\nmetadata: {name: !!int 12x}\n",
    "badtime.yaml": "kind: AscendJob\nmetadata: {name: !!timestamp abc}\n",
    "recursive.yaml": "kind: AscendJob\nmetadata: &m {name: x, labels: *m}\n",
    "deep.yaml": "kind: AscendJob\nspec: " + "[" * 80 + "]" * 80 + "\n",
    "nospec.yaml": "apiVersion: mindxdl.gitee.com/v1\nkind: AscendJob\n"
    "metadata: {name: x, labels: {framework: mindspore}}\n",
    "bad.jsonl": '{"ts": 1e400, "event": "fault"}\n[1, 2]\n',
}
USAGE = 2

# (id, argv, env, exit code, fragment of the error line). "{busy}" is a port in use, "{tmp}"
# the test's directory (it holds YAML_FILES and a sub-directory "dir").
CASES: list[tuple[str, list[str], dict[str, str], int, str]] = [
    # manager
    ("manager-port-in-use", ["manager", "--port", "{busy}"], {}, USAGE, "Address already in use"),
    ("manager-events-dir", ["manager", "--port", "0", "--events", "{tmp}/dir"], {}, USAGE,
     "event log '{tmp}/dir' cannot be opened for appending: Is a directory"),
    ("manager-events-proc", ["manager", "--port", "0", "--events", "/proc/version"], {}, USAGE,
     "event log '/proc/version' cannot be opened"),
    ("manager-host-unresolvable", ["manager", "--port", "0", "--host", "no-such-host.invalid"],
     {}, USAGE, "cannot listen on no-such-host.invalid:0"),
    ("manager-sub-healthy", ["manager", "--port", "0", "--sub-healthy-strategy", "hotswitch"],
     {}, USAGE, "subHealthyStrategy 'hotswitch' is not one of: ignore, graceExit, forceExit, "
     "hotSwitch"),
    ("manager-sub-healthy-env", ["manager", "--port", "0"],
     {"MS_RECOVER_SUB_HEALTHY_STRATEGY": "evict"}, USAGE,
     "subHealthyStrategy 'evict' is not one of: ignore, graceExit, forceExit, hotSwitch"),
    ("manager-host-garbage", ["manager", "--port", "0", "--host", "a b"], {}, USAGE,
     "--host 'a b' is not a host; valid: an IPv4/IPv6 address"),
    ("manager-port-range", ["manager", "--port", "70000"], {}, USAGE,
     "argument --port: '70000' is not an integer in 0..65535"),
    ("manager-metrics-port", ["manager", "--port", "0", "--metrics-port", "-1"], {}, USAGE,
     "argument --metrics-port: '-1' is not an integer in 1..65535"),
    ("manager-wait-nan", ["manager", "--wait-reschedule-timeout", "nan"], {}, USAGE,
     "'nan' is not a number of seconds above 0"),
    ("manager-million-nodes", ["manager", "--port", "0", "--node-nums", "1000000"], {}, USAGE,
     "node_nums must be an integer in 1..16384, got 1000000"),
    ("manager-job-id-dotdot", ["manager", "--port", "0", "--job-id", "../../x"], {}, USAGE,
     "job id '../../x' is not valid; valid: 1..253 characters of lowercase letters"),
    ("manager-job-id-absolute", ["manager", "--port", "0"], {"MINDX_TASK_ID": "/etc"}, USAGE,
     "job id '/etc' is not valid"),
    ("manager-env-not-utf8", ["manager", "--port", "0"], {"MINDX_TASK_ID": BAD_UTF8}, USAGE,
     "environment variable MINDX_TASK_ID is not valid UTF-8: b'\\xff\\xfe'"),
    ("manager-heartbeat-below-poll", ["manager", "--port", "0"],
     {"MS_RECOVER_HEARTBEAT_S": "0.001"}, USAGE, "heartbeat_s 0.001s is below the minimum 0.05s"),
    ("manager-timeout-huge", ["manager", "--port", "0"], {"MS_RECOVER_PHASE_TIMEOUT_S": "1e30"},
     USAGE, "phase_timeout_s must be a number of seconds above 0 and at most 604800"),
    ("manager-world-too-big", ["manager", "--port", "0"],
     {"MS_WORKER_NUM": "2000000", "MS_LOCAL_WORKER": "125"}, USAGE,
     "world size 16000x125=2000000 is above the maximum 131072 ranks"),
    ("manager-secret-file-device", ["manager", "--port", "0"],
     {"MS_RECOVER_SECRET_FILE": "/dev/zero"}, USAGE,
     "MS_RECOVER_SECRET_FILE='/dev/zero' cannot be read: is not a regular file"),
    ("manager-unknown-flag", ["manager", "--bogus"], {}, USAGE, "unrecognized arguments: --bogus"),
    # agent
    ("agent-command-missing", ["agent", "--", "/no/such/command"], {}, USAGE,
     "rank command '/no/such/command' is not an executable file"),
    ("agent-command-not-on-path", ["agent", "--", "no-such-program-xyz"], {}, USAGE,
     "rank command 'no-such-program-xyz' is not found on PATH"),
    ("agent-log-dir-is-file", ["agent", "--log-dir", "{tmp}/nospec.yaml", "--", "true"], {},
     USAGE, "--log-dir '{tmp}/nospec.yaml' exists and is not a directory"),
    ("agent-spares-huge", ["agent", "--spares", "100000", "--", "true"], {}, USAGE,
     "argument --spares: '100000' is not an integer in 0..64"),
    ("agent-host-garbage", ["agent", "--host", "!!!", "--", "true"], {}, USAGE,
     "'!!!' is not a host"),
    ("agent-liveness-env", ["agent", "--", "true"], {"MS_RECOVER_HEARTBEAT_S": "inf"}, USAGE,
     "heartbeat_s must be a positive number of seconds, got inf"),
    # status
    ("status-timeout-negative", ["status", "--timeout", "-1"], {}, USAGE,
     "argument --timeout: '-1' is not a number of seconds above 0 and at most 3600"),
    ("status-timeout-nan", ["status", "--timeout", "nan"], {}, USAGE, "'nan' is not a number"),
    ("status-timeout-inf", ["status", "--timeout", "inf"], {}, USAGE, "'inf' is not a number"),
    ("status-host-garbage", ["status", "--host", "a b", "--timeout", "0.2"], {}, USAGE,
     "'a b' is not a host"),
    ("status-env-not-utf8", ["status", "--timeout", "0.2"], {"MS_SCHED_HOST": BAD_UTF8}, USAGE,
     "environment variable MS_SCHED_HOST is not valid UTF-8"),
    # check-job (a bad file is a finding and exit 1; a usage error exits 2)
    ("check-job-alias-bomb", ["check-job", "{tmp}/bomb.yaml"], {}, 1,
     "expands to more than 100000 nodes"),
    ("check-job-bad-float-tag", ["check-job", "{tmp}/badfloat.yaml"], {}, 1,
     "line 2, column 18: 'abc' is not a valid !!float value"),
    ("check-job-bad-int-tag", ["check-job", "{tmp}/badint.yaml"], {}, 1,
     "'12x' is not a valid !!int value"),
    ("check-job-bad-timestamp-tag", ["check-job", "{tmp}/badtime.yaml"], {}, 1,
     "'abc' is not a valid !!timestamp value"),
    ("check-job-recursive-alias", ["check-job", "{tmp}/recursive.yaml"], {}, 1,
     "a recursive alias"),
    ("check-job-too-deep", ["check-job", "{tmp}/deep.yaml"], {}, 1, "nests deeper than 64"),
    ("check-job-directory", ["check-job", "{tmp}/dir"], {}, 1, "is a directory"),
    ("check-job-device", ["check-job", "/dev/zero"], {}, 1, "is not a regular file"),
    ("check-job-no-spec", ["check-job", "{tmp}/nospec.yaml"], {}, 1,
     "spec: error: is missing; an AscendJob needs spec.replicaSpecs"),
    ("check-job-no-files", ["check-job"], {}, USAGE, "the following arguments are required"),
    # report
    ("report-directory", ["report", "{tmp}/dir"], {}, 1, "is a directory"),
    ("report-device", ["report", "/dev/zero"], {}, 1, "is not a regular file"),
    ("report-no-events", ["report", "{tmp}/bad.jsonl"], {}, 1, "no events"),
    ("report-plot-is-dir", ["report", "{tmp}/bad.jsonl", "--plot", "{tmp}/dir"], {}, USAGE,
     "--plot '{tmp}/dir' must be a file path"),
    # demo (all refused before any process starts)
    ("demo-timeout-negative", ["demo", "--timeout", "-1"], {}, USAGE,
     "argument --timeout: '-1' is not a number of seconds"),
    ("demo-too-many-ranks", ["demo", "--nodes", "1000", "--procs-per-node", "8"], {}, USAGE,
     "use at most 32 ranks in total"),
    ("demo-workdir-is-file", ["demo", "--workdir", "{tmp}/nospec.yaml"], {}, USAGE,
     "--workdir '{tmp}/nospec.yaml' cannot be created"),
    ("demo-json-is-dir", ["demo", "--json", "{tmp}/dir"], {}, USAGE,
     "--json '{tmp}/dir' must be a file path in an existing, writable directory"),
    ("demo-steps-zero", ["demo", "--steps", "0"], {}, USAGE, "'0' is not an integer in 1.."),
    # bench (all refused before a benchmark runs)
    ("bench-timeout-negative", ["bench", "detect", "--timeout", "-1"], {}, USAGE,
     "--timeout must be a number of seconds above 0"),
    ("bench-heartbeat-nan", ["bench", "controlplane", "--heartbeat", "nan"], {}, USAGE,
     "--heartbeat must be a number of seconds above 0"),
    ("bench-ranks-per-agent-zero", ["bench", "controlplane", "--ranks-per-agent", "0"], {},
     USAGE, "--ranks-per-agent must be at least 1, got 0"),
    ("bench-sizes-nan", ["bench", "allreduce", "--sizes", "nan"], {}, USAGE,
     "--sizes must be positive numbers of MB"),
    ("bench-world-huge", ["bench", "allreduce", "--world", "100000"], {}, USAGE,
     "--world must be at most 64"),
    ("bench-json-is-dir", ["bench", "overhead", "--json", "{tmp}/dir"], {}, USAGE,
     "--json '{tmp}/dir' must be a file path"),
    ("bench-nodes-huge", ["bench", "recovery", "--nodes", "100000"], {}, USAGE,
     "node_nums must be an integer in 1..16384"),
]  # fmt: skip


@pytest.fixture(scope="module")
def busy_port() -> Iterator[int]:
    """A port some other socket listens on."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    tmp = tmp_path_factory.mktemp("bad-input")
    (tmp / "dir").mkdir()
    for name, text in YAML_FILES.items():
        (tmp / name).write_text(text)
    return tmp


def _fill(text: str, tmp: pathlib.Path, busy: int) -> str:
    return text.replace("{tmp}", str(tmp)).replace("{busy}", str(busy))


def _error_lines(text: str) -> list[str]:
    return [ln for ln in text.splitlines() if ln.strip() and not LOG_LINE.match(ln)]


@pytest.mark.parametrize(
    ("argv", "env", "code", "fragment"),
    [pytest.param(*case[1:], id=case[0]) for case in CASES],
)
def test_bad_input_is_one_line_and_nonzero(
    argv: list[str],
    env: dict[str, str],
    code: int,
    fragment: str,
    files: pathlib.Path,
    busy_port: int,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for key in ("MINDX_TASK_ID", "MS_SCHED_HOST", "MS_RECOVER_PORT", "POD_IP"):
        monkeypatch.delenv(key, raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    started = time.monotonic()
    try:
        got = cli.main([_fill(a, files, busy_port) for a in argv])
    except SystemExit as exc:  # argparse's usage errors
        got = int(exc.code or 0)
    elapsed = time.monotonic() - started
    out = capsys.readouterr()
    fragment = _fill(fragment, files, busy_port)
    assert elapsed < DEADLINE_S
    assert "Traceback" not in out.out + out.err
    assert got == code, out.out + out.err
    if code == USAGE:
        [line] = _error_lines(out.err)  # exactly one line, and it names the problem
        assert "error:" in line and fragment in line, line
    else:  # a file-level finding: one line for the file, then check-job's summary line
        lines = [ln for ln in _error_lines(out.out + out.err) if "error" in ln]
        assert len([ln for ln in lines if fragment in ln]) == 1, lines
        assert len([ln for ln in lines if not ln.startswith("check-job:")]) == 1, lines


SUBPROCESS_CASES = [
    "manager-port-in-use",
    "manager-env-not-utf8",
    "agent-command-missing",
    "status-timeout-negative",
    "check-job-bad-float-tag",
    "report-device",
]


@pytest.mark.parametrize("name", SUBPROCESS_CASES)
def test_bad_input_as_a_real_process(name: str, files: pathlib.Path, busy_port: int) -> None:
    """What a user sees: the exit status and stderr of the real command, within a deadline."""
    [(argv, env, code, fragment)] = [c[1:] for c in CASES if c[0] == name]
    clean = {k: v for k, v in os.environ.items() if k not in ("MINDX_TASK_ID", "MS_RECOVER_PORT")}
    started = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-m", "ms_recover.cli", *[_fill(a, files, busy_port) for a in argv]],
        env={**clean, **env},
        capture_output=True,
        timeout=60,
        check=False,
    )
    stderr = result.stderr.decode(errors="replace")
    stdout = result.stdout.decode(errors="replace")
    assert time.monotonic() - started < DEADLINE_S + 20
    assert "Traceback" not in stderr + stdout
    assert result.returncode == code
    shown = _error_lines(stderr) if code == USAGE else _error_lines(stdout + stderr)[:1]
    assert len(shown) == 1 and _fill(fragment, files, busy_port) in shown[0], stderr + stdout


def test_broken_pipe_is_quiet(files: pathlib.Path) -> None:
    """`ms-recover check-job ... | head -1`: the reader leaves early; no traceback."""
    many = [str(files / "nospec.yaml")] * 200
    proc = subprocess.Popen(
        [sys.executable, "-m", "ms_recover.cli", "check-job", *many],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        assert proc.stdout is not None and proc.stderr is not None
        proc.stdout.readline()
        proc.stdout.close()  # as `head -1` does
        stderr = proc.stderr.read().decode(errors="replace")
        assert proc.wait(timeout=60) != 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert "Traceback" not in stderr
