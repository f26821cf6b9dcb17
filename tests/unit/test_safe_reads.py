"""Files the product reads are read safely (issue 26 #6).

Every reader (the dump manifest and the npz dump files behind ``load_dump``, the event log,
the secret file, YAML for ``check-job``) gets corrupted, oversized, deeply nested and
implausible files and special files in place of regular ones (a FIFO, a directory, a device):
each one is a single one-line :class:`MsRecoverError` naming the file and the problem, never a
MemoryError, a RecursionError, a traceback or a wait. The dump directory is checked when the
manager starts, not at the fault. ``check-job`` parses every numeric field safely.
"""

from __future__ import annotations

import copy
import json
import os
import pathlib
import threading
import zipfile
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ms_recover.comm.local import LocalBackend
from ms_recover.config import JobConfig
from ms_recover.dumpfiles import MANIFEST_NAME, check_dump_dir, read_manifest
from ms_recover.errors import ConfigError, MsRecoverError, RepairError
from ms_recover.jobcheck import yamlread
from ms_recover.jobcheck.check import check_job
from ms_recover.manager.main import _listen
from ms_recover.manager.server import ManagerServer
from ms_recover.observability.events import read_events
from ms_recover.strategy import parse_strategies
from ms_recover.worker.dump import DumpFile, load_npz, locate, write_manifest, write_rank_dump
from ms_recover.worker.session import Session
from tests.eventlines import line

pytestmark = pytest.mark.timeout(120)

SAMPLES = pathlib.Path(__file__).resolve().parents[2] / "samples"
HUGE = [10**15, 2**63 - 1, 2**64, -(2**63), 10**400, 1e308, -1]
SUFFIXES = st.sampled_from([b"", b"\n", b"]", b"}", b'"', b"\xff", b"\x00"])


class Arrays:
    def __init__(self, arrays: dict[str, Any]) -> None:
        self.arrays = arrays

    def state_dict(self) -> dict[str, Any]:
        return self.arrays

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.arrays = dict(state)


def _dump(directory: pathlib.Path) -> dict[str, Any]:
    """A good dump of a world of 4 (two shards, ranks 0 and 3 wrote); its manifest's body."""
    files: list[DumpFile] = []
    for rank in (0, 3):
        state = Arrays({"w": np.arange(4.0) + rank, "b": np.zeros(0)})
        files.append(write_rank_dump(state, str(directory), rank, 7))
    write_manifest(str(directory), "job-a", 7, 4, files, {0: 0, 1: 1, 2: 0, 3: 1})
    body: dict[str, Any] = json.loads((directory / MANIFEST_NAME).read_text())
    return body


def _one_error(call: Callable[[], Any], error: type[MsRecoverError], *names: str) -> str:
    """Run ``call`` on a thread with a deadline (a FIFO must not block it): it raises one
    ``error`` whose one-line message names every one of ``names``; the message."""
    outcome: list[BaseException | None] = []

    def target() -> None:
        try:
            call()
        except BaseException as exc:  # what escaped is the test's subject
            outcome.append(exc)
        else:
            outcome.append(None)

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(10.0)
    assert outcome, "the reader blocked"
    exc = outcome[0]
    assert isinstance(exc, error), repr(exc)
    message = str(exc)
    assert "\n" not in message and all(name in message for name in names), message
    return message


def _special(path: pathlib.Path, kind: str) -> None:
    """Put a special file of ``kind`` at ``path`` in place of a regular one."""
    if path.exists():
        path.unlink()
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "directory":
        path.mkdir()
    else:
        path.symlink_to(os.devnull)


# --- the dump manifest and files (load_dump) --------------------------------------------------


@pytest.mark.parametrize("kind", ["fifo", "directory", "device"])
def test_a_special_file_in_place_of_the_manifest_is_refused_at_once(
    tmp_path: pathlib.Path, kind: str
) -> None:
    _dump(tmp_path)
    _special(tmp_path / MANIFEST_NAME, kind)
    message = _one_error(lambda: read_manifest(str(tmp_path)), RepairError, MANIFEST_NAME)
    assert "regular file" in message or "directory" in message


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        (lambda b: b | {"world_size": 10**15}, "world_size"),
        (lambda b: b | {"world_size": 2**64}, "world_size"),
        (lambda b: b | {"step": float("inf")}, "step"),
        (lambda b: b | {"files": [b["files"][0] | {"size": 10**400}]}, "size"),
        (lambda b: b | {"files": [b["files"][0] | {"rank": 2**63}]}, "rank"),
        (lambda b: b | {"files": [b["files"][0]] * 5}, "files"),
        (lambda b: b | {"ranks": {"9" * 5000: {"shard": 0, "file": "x"}}}, "ranks"),
        (lambda b: b | {"ranks": {"0": [], "1": [], "2": [], "3": []}}, "rank 0"),
        (lambda b: b | {"job_id": {"a": {"b": {"c": {"d": 1}}}}}, "nests deeper"),
    ],
)
def test_implausible_manifest_values_are_refused_before_allocating(
    tmp_path: pathlib.Path, change: Callable[[dict[str, Any]], Any], problem: str
) -> None:
    body = _dump(tmp_path)
    (tmp_path / MANIFEST_NAME).write_text(json.dumps(change(body)))
    message = _one_error(lambda: read_manifest(str(tmp_path)), RepairError, MANIFEST_NAME)
    assert problem in message


@pytest.mark.parametrize("depth", [5, 1000, 200_000])
def test_a_deeply_nested_manifest_is_refused(tmp_path: pathlib.Path, depth: int) -> None:
    _dump(tmp_path)
    (tmp_path / MANIFEST_NAME).write_text("[" * depth + "]" * depth)
    message = _one_error(lambda: read_manifest(str(tmp_path)), RepairError, MANIFEST_NAME)
    assert "nests deeper" in message


def test_an_oversized_manifest_is_refused_unread(tmp_path: pathlib.Path) -> None:
    _dump(tmp_path)
    with open(tmp_path / MANIFEST_NAME, "r+b") as fh:
        fh.truncate(65 << 20)  # sparse: nothing is written, nothing need be read
    message = _one_error(lambda: read_manifest(str(tmp_path)), RepairError, MANIFEST_NAME)
    assert "at most" in message


def _mutations() -> st.SearchStrategy[Any]:
    leaves = st.sampled_from([*HUGE, None, True, "", "x" * 300, [], {}, "rank_0.npz"])
    return st.recursive(leaves, lambda kids: st.lists(kids, max_size=3), max_leaves=6)


@pytest.fixture(scope="module")
def good_dump(tmp_path_factory: pytest.TempPathFactory) -> tuple[pathlib.Path, dict[str, Any]]:
    """One good dump for every fuzzed manifest (only the manifest changes)."""
    tmp = tmp_path_factory.mktemp("fuzz")
    return tmp, _dump(tmp)


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data(), tail=SUFFIXES)
def test_fuzzed_manifests_give_a_manifest_or_one_repair_error(
    good_dump: tuple[pathlib.Path, dict[str, Any]], data: Any, tail: bytes
) -> None:
    tmp, body = good_dump
    doc = copy.deepcopy(body)
    node: Any = doc
    path = data.draw(st.lists(st.integers(0, 8), max_size=4))
    for step in path:  # walk somewhere into the body, then replace what is there
        keys = list(node) if isinstance(node, dict) else list(range(len(node)))
        if not keys or not isinstance(node, (dict, list)):
            break
        key = keys[step % len(keys)]
        if isinstance(node[key], (dict, list)) and step % 2:
            node = node[key]
            continue
        node[key] = data.draw(_mutations())
        break
    raw = json.dumps(doc).encode()
    cut = data.draw(st.integers(0, len(raw)))
    (tmp / MANIFEST_NAME).write_bytes(raw if not tail else raw[:cut] + tail)
    try:
        read_manifest(str(tmp))
    except RepairError as exc:
        assert "\n" not in str(exc) and MANIFEST_NAME in str(exc)


def test_an_npz_that_claims_more_than_it_holds_is_refused(tmp_path: pathlib.Path) -> None:
    _dump(tmp_path)
    path = tmp_path / "rank_0.npz"
    with zipfile.ZipFile(path, "w") as zf, zf.open("w.npy", "w") as member:
        header = {"descr": "<f8", "fortran_order": False, "shape": (10**7, 10**7)}
        np.lib.format.write_array_header_1_0(member, header)  # type: ignore[no-untyped-call]
        member.write(b"\0" * 64)
    message = _one_error(lambda: load_npz(str(path)), RepairError, str(path))
    assert "claims" in message


@pytest.mark.parametrize("kind", ["fifo", "directory"])
def test_a_special_file_in_place_of_a_dump_file_is_refused(
    tmp_path: pathlib.Path, kind: str
) -> None:
    body = _dump(tmp_path)
    body["files"][0]["size"] = 0  # as a FIFO would stat
    (tmp_path / MANIFEST_NAME).write_text(json.dumps(body))
    _special(tmp_path / "rank_0.npz", kind)
    message = _one_error(lambda: locate(str(tmp_path), 0), RepairError, "rank_0.npz")
    assert "regular file" in message
    message = _one_error(lambda: load_npz(str(tmp_path / "rank_0.npz")), RepairError)
    assert "rank_0.npz" in message


# --- the event log, the secret file, YAML -----------------------------------------------------


@pytest.mark.parametrize("kind", ["fifo", "directory"])
def test_an_event_log_must_be_a_regular_file(tmp_path: pathlib.Path, kind: str) -> None:
    path = tmp_path / "events.jsonl"
    _special(path, kind)
    _one_error(lambda: read_events(str(path)), ConfigError, str(path))


def test_bad_event_lines_are_counted_never_raised(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "events.jsonl"
    good = json.dumps(line(1.0, "fault"))
    bad = ["[" * 100_000, '{"ts": 1, "event": 1' + "9" * 5000 + "}", "\xff\xfe", "x" * (2 << 20)]
    path.write_bytes("\n".join([good, *bad, good]).encode("utf-8", "surrogateescape"))
    events, skipped = read_events(str(path))
    assert len(events) == 2 and skipped >= len(bad)


@pytest.mark.parametrize("kind", ["fifo", "directory", "device"])
def test_a_special_secret_file_is_refused_at_once(tmp_path: pathlib.Path, kind: str) -> None:
    path = tmp_path / "secret"
    _special(path, kind)
    env = {"MS_RECOVER_SECRET_FILE": str(path)}
    _one_error(lambda: JobConfig.from_env(env), ConfigError, str(path))


def test_yaml_errors_are_ms_recover_errors(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "job.yaml"
    _special(path, "fifo")
    _one_error(lambda: yamlread.read_text(str(path)), yamlread.ReadError)
    for text in ("[" * 100_000, "a: &a [*a]", "a: !!float x", "\x00"):
        with pytest.raises(MsRecoverError):
            list(yamlread.documents(text))


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=200) | st.binary(max_size=200).map(lambda b: b.decode("latin-1")))
def test_fuzzed_yaml_is_a_document_or_one_read_error(text: str) -> None:
    try:
        list(yamlread.documents(text))
    except yamlread.ReadError as exc:
        assert "\n" not in str(exc)


# --- check-job's numeric fields ---------------------------------------------------------------

NUMBERS = (
    st.sampled_from(["²", "١٢", "9" * 5000, "1e400", "nan", "-1", " 12 ", "0x10", "1_000", "+5"])
    | st.text(max_size=8)
    | st.integers()
    | st.floats()
    | st.none()
    | st.booleans()
    | st.lists(st.integers(), max_size=2)
)


def _container(doc: dict[str, Any]) -> dict[str, Any]:
    spec = doc["spec"]["replicaSpecs"]["Worker"]["template"]["spec"]
    container: dict[str, Any] = spec["containers"][0]
    return container


def _numeric_fields(doc: dict[str, Any], value: Any) -> list[dict[str, Any]]:
    """Copies of ``doc`` with ``value`` in each field check-job reads as a number."""
    out = []
    for key in ("wait-reschedule-timeout", "recover-strategy"):
        d = copy.deepcopy(doc)
        d["metadata"].setdefault("annotations", {})[key] = value
        out.append(d)
    for name in ("MS_RECOVER_PORT", "TTP_PORT", "MS_TFT_PORT"):
        d = copy.deepcopy(doc)
        _container(d).setdefault("env", []).append({"name": name, "value": value})
        out.append(d)
    d = copy.deepcopy(doc)
    _container(d)["resources"] = {"requests": {"huawei.com/Ascend910": value}}
    out.append(d)
    d = copy.deepcopy(doc)
    _container(d)["ports"][0]["containerPort"] = value
    out.append(d)
    d = copy.deepcopy(doc)
    d["spec"]["replicaSpecs"]["Worker"]["replicas"] = value
    out.append(d)
    return out


SAMPLE: dict[str, Any] = yaml.safe_load((SAMPLES / "ascendjob-recover.yaml").read_text())


@settings(max_examples=60, deadline=None)
@given(value=NUMBERS)
def test_check_job_parses_every_numeric_field_safely(value: Any) -> None:
    for doc in _numeric_fields(SAMPLE, value):
        issues = check_job(doc)  # findings, never an exception
        assert all(isinstance(message, str) for _, _, message in issues)


@pytest.mark.parametrize("value", ["²", "١٢", "9" * 5000, "+", "30.5"])
def test_a_wait_reschedule_timeout_that_is_no_integer_is_an_error(value: str) -> None:
    doc = copy.deepcopy(SAMPLE)
    doc["metadata"].setdefault("annotations", {})["wait-reschedule-timeout"] = value
    assert any("wait-reschedule-timeout" in ".".join(map(str, p)) for _, p, _ in check_job(doc))


# --- the dump directory, at start ---------------------------------------------------------------


def test_the_dump_directory_is_checked_when_the_manager_starts(tmp_path: pathlib.Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    cfg = JobConfig(
        job_id="dirs",
        manager_port=0,
        dump_dir=str(blocker / "dump"),
        events_path=str(tmp_path / "events.jsonl"),
        strategies=parse_strategies("recover,dump,exit"),
    )
    message = _one_error(lambda: _listen(cfg, "127.0.0.1"), ConfigError, str(blocker / "dump"))
    assert "MS_RECOVER_DUMP_DIR" in message
    # every other start (the scheduler hook, start_taskd_manager, MindIO's controller) too
    server = lambda: ManagerServer(cfg, bind="127.0.0.1")  # noqa: E731
    _one_error(server, ConfigError, str(blocker / "dump"))
    check_dump_dir(str(tmp_path / "new" / "dump"))  # a missing one is created, owner only
    assert (tmp_path / "new" / "dump").stat().st_mode & 0o777 == 0o700
    fine = cfg.replace(strategies=parse_strategies("recover,exit"))
    _listen(fine, "127.0.0.1").close()  # no dump strategy: the directory is never needed


def test_the_dump_directory_is_checked_when_a_rank_starts(tmp_path: pathlib.Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    cfg = JobConfig(
        job_id="dirs",
        manager_port=1,  # never reached: the check comes before registering
        dump_dir=str(blocker / "dump"),
        strategies=parse_strategies("recover,dump,exit"),
    )
    session = Session(cfg, 0, LocalBackend(), None)
    try:
        message = _one_error(lambda: session.connect(1.0), ConfigError, str(blocker / "dump"))
        assert "cannot be created" in message
    finally:
        assert session.link is not None
        session.link.close()
