"""Input validation at config build: job ids, hosts, sizes, timing (issue 9 #11, #12)."""

from __future__ import annotations

import argparse
import os
import tempfile

import pytest

from ms_recover import inputs
from ms_recover.config import JobConfig
from ms_recover.errors import ConfigError


@pytest.mark.parametrize(
    "job_id",
    ["default", "demo-123", "8c0a0c4f-2f1e-4b7a-9d55-0e5b7f3c1a2b", "a.b-c", "x" * 253, "7"],
)
def test_kubernetes_names_and_uids_are_valid_job_ids(job_id: str) -> None:
    assert JobConfig(job_id=job_id).job_id == job_id


@pytest.mark.parametrize(
    "job_id",
    ["../../x", "/abs/path", "..", ".hidden", "a/b", "a b", "Upper", "x_y", "-a", "a-", "x" * 254],
)
def test_job_ids_that_could_leave_their_directory_are_refused(job_id: str) -> None:
    with pytest.raises(ConfigError, match="valid: 1..253 characters of lowercase letters"):
        JobConfig(job_id=job_id)
    with pytest.raises(ConfigError, match="is not valid"):
        JobConfig.from_env({"MINDX_TASK_ID": job_id})


def test_the_dump_directory_stays_inside_the_temp_root() -> None:
    root = os.path.join(tempfile.gettempdir(), "ms-recover")
    path = JobConfig(job_id="a..b").effective_dump_dir()
    assert os.path.commonpath([os.path.realpath(path), os.path.realpath(root)]) == (
        os.path.realpath(root)
    )


def test_real_job_sizes_are_admitted() -> None:
    big = JobConfig(node_nums=8192, proc_per_node=8)
    assert big.world_size == 65_536
    assert JobConfig(node_nums=inputs.MAX_NODES, proc_per_node=8).world_size == 131_072


@pytest.mark.parametrize(
    ("fields", "needle"),
    [
        ({"node_nums": 1_000_000}, "node_nums must be an integer in 1..16384, got 1000000"),
        ({"proc_per_node": 10_000}, "proc_per_node must be an integer in 1..128"),
        ({"node_nums": 16_384, "proc_per_node": 16}, "is above the maximum 131072 ranks"),
        ({"liveness": 1}, "liveness must be an integer in 2..100"),
        ({"max_tries": 10**7}, "max_tries must be an integer in 1..1000000"),
        ({"max_frame_bytes": 10}, "max_frame_bytes must be an integer in 1024.."),
        ({"heartbeat_s": 0.001}, "heartbeat_s 0.001s is below the minimum 0.05s"),
        ({"phase_timeout_s": 1e30}, "phase_timeout_s must be a number of seconds above 0 and"),
        ({"wait_reschedule_timeout_s": float("inf")}, "wait_reschedule_timeout_s must be a"),
        ({"rank_silence_s": float("nan")}, "rank_silence_s must be a positive number"),
        ({"manager_host": "a b"}, "manager_host (MS_SCHED_HOST / --host) 'a b' is not a host"),
        ({"pod_ip": "1.2.3.4:5"}, "pod_ip (POD_IP) '1.2.3.4:5' is not a host"),
    ],
)
def test_nonsense_sizes_and_timing_are_refused_with_the_range(
    fields: dict[str, object], needle: str
) -> None:
    with pytest.raises(ConfigError) as info:
        JobConfig(**fields)  # type: ignore[arg-type]
    assert needle in str(info.value)


@pytest.mark.parametrize(
    "host", ["127.0.0.1", "::1", "[::1]", "svc.ns.svc.cluster.local", "eth0", "*"]
)
def test_hosts_of_every_valid_form(host: str) -> None:
    assert JobConfig(manager_host=host).manager_host == host


def test_env_bytes_that_are_not_utf8_are_named() -> None:
    bad = b"job-\xff".decode("utf-8", "surrogateescape")
    with pytest.raises(ConfigError, match=r"MINDX_TASK_ID is not valid UTF-8: b'job-\\xff'"):
        JobConfig.from_env({"MINDX_TASK_ID": bad})


@pytest.mark.parametrize("text", ["-1", "0", "nan", "inf", "-inf", "1e30", "x", ""])
def test_seconds_arg_refuses_what_cannot_be_waited_for(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match="is not a number of seconds above 0"):
        inputs.seconds_arg(high=3600)(text)
    assert inputs.seconds_arg(high=3600)("2.5") == 2.5


def test_int_arg_names_the_range() -> None:
    with pytest.raises(argparse.ArgumentTypeError, match=r"'70000' is not an integer in 0..65535"):
        inputs.int_arg(0, 65535)("70000")
    assert inputs.int_arg(0, 65535)("9601") == 9601
