"""JobConfig: defaults < environment < explicit overrides, and validation with useful messages."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from ms_recover.config import DEFAULT_PORT, DEFAULT_STRATEGIES, JobConfig
from ms_recover.errors import ConfigError
from ms_recover.strategy import Strategy


def test_defaults_are_a_valid_single_rank_job() -> None:
    cfg = JobConfig.from_env({})
    assert cfg == JobConfig()
    assert (cfg.job_id, cfg.node_nums, cfg.proc_per_node, cfg.node_rank) == ("default", 1, 1, 0)
    assert cfg.world_size == 1
    assert cfg.manager_port == DEFAULT_PORT == 9601
    assert cfg.manager_endpoint == "tcp://127.0.0.1:9601"
    assert cfg.strategies == DEFAULT_STRATEGIES
    assert cfg.strategies == (Strategy.RECOVER_IN_PLACE, Strategy.RECOVER, Strategy.EXIT)
    assert cfg.backend == "host" and cfg.role == "" and cfg.secret == b""
    assert cfg.wait_reschedule_timeout_s == 270.0
    assert cfg.silence_s == pytest.approx(cfg.heartbeat_s * cfg.liveness)


def test_config_is_frozen() -> None:
    cfg = JobConfig()
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.node_rank = 1  # type: ignore[misc]


def test_environment_follows_the_operator_injection() -> None:
    env = {
        "MINDX_TASK_ID": "job-7",
        "MS_WORKER_NUM": "8",
        "MS_LOCAL_WORKER": "4",
        "MS_NODE_RANK": "1",
        "MS_ROLE": "MS_WORKER",
        "MS_SCHED_HOST": "10.0.0.1",
        "POD_IP": "10.0.0.2",
        "MS_RECOVER_PORT": "9700",
        "MS_RECOVER_HEARTBEAT_S": "0.25",
        "MS_RECOVER_HANG_TIMEOUT_S": "30",
        "MS_RECOVER_PHASE_TIMEOUT_S": "20",
        "MS_RECOVER_WAIT_RESCHEDULE_TIMEOUT": "100",
        "MS_RECOVER_MAX_TRIES": "5",
        "MS_RECOVER_SCHED_NODE_RANK": "1",
        "MS_RECOVER_BACKEND": "ascend",
        "MS_RECOVER_EVENTS": "/tmp/ev.jsonl",
    }
    cfg = JobConfig.from_env(env)
    assert cfg.job_id == "job-7"
    assert (cfg.node_nums, cfg.proc_per_node, cfg.world_size) == (2, 4, 8)
    assert cfg.node_rank == 1 and cfg.role == "MS_WORKER"
    assert cfg.manager_endpoint == "tcp://10.0.0.1:9700" and cfg.pod_ip == "10.0.0.2"
    assert (cfg.heartbeat_s, cfg.hang_timeout_s, cfg.phase_timeout_s) == (0.25, 30.0, 20.0)
    assert cfg.wait_reschedule_timeout_s == 100.0 and cfg.max_tries == 5
    assert cfg.sched_node_rank == 1 and cfg.backend == "ascend"
    assert cfg.events_path == "/tmp/ev.jsonl"
    assert cfg.ranks_of(1) == (4, 5, 6, 7) and cfg.node_of(5) == 1


def test_precedence_defaults_then_env_then_overrides() -> None:
    env = {"MINDX_TASK_ID": "from-env", "MS_RECOVER_MAX_TRIES": "4"}
    cfg = JobConfig.from_env(env, job_id="explicit")
    assert cfg.job_id == "explicit"  # override beats env
    assert cfg.max_tries == 4  # env beats default
    assert cfg.backend == "host"  # default where neither says anything


def test_a_none_override_keeps_the_environment_value() -> None:
    assert JobConfig.from_env({"MINDX_TASK_ID": "e"}, job_id=None).job_id == "e"


def test_explicit_node_nums_beats_worker_num_derivation() -> None:
    env = {"MS_WORKER_NUM": "8", "MS_LOCAL_WORKER": "4"}
    cfg = JobConfig.from_env(env, node_nums=2, proc_per_node=4)
    assert cfg.world_size == 8
    assert JobConfig.from_env({"MS_RECOVER_NODE_NUMS": "3", "MS_LOCAL_WORKER": "2"}).node_nums == 3


def test_strategy_override_may_be_a_string() -> None:
    cfg = JobConfig.from_env({}, strategies="exit,recover")
    assert cfg.strategies == (Strategy.RECOVER, Strategy.EXIT)


def test_worker_num_not_a_multiple_of_local_worker() -> None:
    with pytest.raises(
        ConfigError, match=r"MS_WORKER_NUM=7 is not a multiple of MS_LOCAL_WORKER=4"
    ):
        JobConfig.from_env({"MS_WORKER_NUM": "7", "MS_LOCAL_WORKER": "4"})


@pytest.mark.parametrize(
    "env",
    [
        {"MS_WORKER_NUM": "8"},  # no MS_LOCAL_WORKER: world size silently 1
        {"MS_WORKER_NUM": "8", "MS_LOCAL_WORKER": "4", "MS_RECOVER_NODE_NUMS": "3"},
    ],
)
def test_world_size_disagreeing_with_worker_num_is_an_error(env: dict[str, str]) -> None:
    with pytest.raises(ConfigError, match="MS_WORKER_NUM"):
        JobConfig.from_env(env)


@pytest.mark.parametrize(
    ("key", "value", "match"),
    [
        ("MS_NODE_RANK", "one", r"MS_NODE_RANK='one' is not an integer"),
        ("MS_WORKER_NUM", "8x", r"MS_WORKER_NUM='8x' is not an integer"),
        ("MS_LOCAL_WORKER", "2.5", r"MS_LOCAL_WORKER='2.5' is not an integer"),
        ("MS_RECOVER_PORT", "http", r"MS_RECOVER_PORT='http' is not an integer"),
        ("MS_RECOVER_MAX_TRIES", "many", r"MS_RECOVER_MAX_TRIES='many' is not an integer"),
        ("MS_RECOVER_HEARTBEAT_S", "fast", r"MS_RECOVER_HEARTBEAT_S='fast' is not a number"),
        ("MS_RECOVER_PHASE_TIMEOUT_S", "1m", r"MS_RECOVER_PHASE_TIMEOUT_S='1m' is not a number"),
    ],
)
def test_a_bad_number_names_the_variable(key: str, value: str, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        JobConfig.from_env({key: value})


def test_blank_numeric_variables_are_treated_as_unset() -> None:
    assert JobConfig.from_env({"MS_NODE_RANK": "  ", "MS_RECOVER_HEARTBEAT_S": ""}) == JobConfig()


@pytest.mark.parametrize("how", ["from_env", "replace"])
def test_unknown_key_lists_the_valid_ones(how: str) -> None:
    with pytest.raises(ConfigError) as info:
        if how == "from_env":
            JobConfig.from_env({}, node_num=2)
        else:
            JobConfig().replace(heartbeat=1.0)
    text = str(info.value)
    assert "unknown config key(s)" in text
    for valid in ("node_nums", "heartbeat_s", "strategies", "job_id", "backend"):
        assert valid in text


def test_replace_revalidates() -> None:
    cfg = JobConfig(node_nums=2)
    assert cfg.replace(node_rank=1).node_rank == 1
    with pytest.raises(ConfigError, match="node_rank 2 is outside 0..1"):
        cfg.replace(node_rank=2)


@pytest.mark.parametrize(("node_nums", "node_rank"), [(2, 2), (2, -1), (1, 5)])
def test_node_rank_out_of_range(node_nums: int, node_rank: int) -> None:
    with pytest.raises(ConfigError, match=rf"node_rank {node_rank} is outside 0..{node_nums - 1}"):
        JobConfig(node_nums=node_nums, node_rank=node_rank)


def test_node_rank_from_env_out_of_range() -> None:
    env = {"MS_WORKER_NUM": "4", "MS_LOCAL_WORKER": "2", "MS_NODE_RANK": "2"}
    with pytest.raises(ConfigError, match="node_rank 2 is outside 0..1"):
        JobConfig.from_env(env)


def test_sched_node_rank_out_of_range() -> None:
    with pytest.raises(ConfigError, match="sched_node_rank 3 is outside 0..1"):
        JobConfig(node_nums=2, sched_node_rank=3)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("node_nums", 0),
        ("proc_per_node", -1),
        ("liveness", 0),
        ("max_tries", 0),
        ("node_nums", True),
        ("proc_per_node", 1.5),
    ],
)
def test_positive_integers(field: str, value: object) -> None:
    with pytest.raises(ConfigError, match=rf"{field} must be a positive integer"):
        JobConfig(**{field: value})  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "field", ["heartbeat_s", "hang_timeout_s", "phase_timeout_s", "wait_reschedule_timeout_s"]
)
@pytest.mark.parametrize("value", [0, -1.0, "5"])
def test_timeouts_must_be_positive_numbers(field: str, value: object) -> None:
    with pytest.raises(ConfigError, match=rf"{field} must be a positive number of seconds"):
        JobConfig(**{field: value})  # type: ignore[arg-type]


@pytest.mark.parametrize("key", ["MS_RECOVER_HEARTBEAT_S", "MS_RECOVER_HANG_TIMEOUT_S"])
def test_nan_timeout_is_rejected(key: str) -> None:
    with pytest.raises(ConfigError, match="positive number"):
        JobConfig.from_env({key: "nan"})


def test_wrongly_typed_override_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="node_rank"):
        JobConfig.from_env({}, node_rank="1")


@pytest.mark.parametrize(
    ("overrides", "names"),
    [
        ({"heartbeat_s": 10.0, "liveness": 3, "phase_timeout_s": 20.0}, "phase_timeout_s"),
        ({"heartbeat_s": 10.0, "liveness": 3, "hang_timeout_s": 29.0}, "hang_timeout_s"),
        # equality is not "below"
        ({"heartbeat_s": 20.0, "liveness": 3, "phase_timeout_s": 60.0}, "phase_timeout_s"),
    ],
)
def test_silence_must_be_below_hang_and_phase_timeouts(
    overrides: dict[str, float], names: str
) -> None:
    with pytest.raises(ConfigError, match=r"heartbeat_s\*liveness \(\d+s\) must be below") as info:
        JobConfig(**overrides)  # type: ignore[arg-type]
    assert names in str(info.value)


def test_silence_just_below_the_timeouts_is_fine() -> None:
    cfg = JobConfig(heartbeat_s=1.0, liveness=3, hang_timeout_s=3.5, phase_timeout_s=3.5)
    assert cfg.silence_s == 3.0


def test_secret_from_the_environment() -> None:
    cfg = JobConfig.from_env({"MS_RECOVER_SECRET": "s3cret", "MINDX_TASK_ID": "j"})
    assert cfg.secret == b"s3cret"
    assert cfg.effective_secret() == b"s3cret"


def test_secret_from_a_file_is_stripped(tmp_path: Path) -> None:
    path = tmp_path / "secret"
    path.write_bytes(b"from-k8s-secret\n")
    assert JobConfig.from_env({"MS_RECOVER_SECRET_FILE": str(path)}).secret == b"from-k8s-secret"


def test_secret_variable_wins_over_the_file(tmp_path: Path) -> None:
    path = tmp_path / "secret"
    path.write_bytes(b"file")
    env = {"MS_RECOVER_SECRET": "env", "MS_RECOVER_SECRET_FILE": str(path)}
    assert JobConfig.from_env(env).secret == b"env"


def test_unreadable_secret_file_is_a_config_error(tmp_path: Path) -> None:
    missing = tmp_path / "nope"
    with pytest.raises(ConfigError, match=r"MS_RECOVER_SECRET_FILE=.*nope.* cannot be read"):
        JobConfig.from_env({"MS_RECOVER_SECRET_FILE": str(missing)})
    with pytest.raises(ConfigError, match="cannot be read"):
        JobConfig.from_env({"MS_RECOVER_SECRET_FILE": str(tmp_path)})  # a directory


def test_empty_secret_file_is_a_config_error(tmp_path: Path) -> None:
    path = tmp_path / "secret"
    path.write_bytes(b"\n")
    with pytest.raises(ConfigError, match="MS_RECOVER_SECRET_FILE"):
        JobConfig.from_env({"MS_RECOVER_SECRET_FILE": str(path)})


def test_without_a_secret_the_key_still_separates_jobs() -> None:
    a, b = JobConfig(job_id="a"), JobConfig(job_id="b")
    assert a.effective_secret() != b.effective_secret()
    assert a.effective_secret() == JobConfig(job_id="a").effective_secret()


def test_role_validation_lists_the_valid_roles() -> None:
    assert JobConfig.from_env({"MS_ROLE": "MS_SCHED"}).role == "MS_SCHED"
    with pytest.raises(ConfigError) as info:
        JobConfig.from_env({"MS_ROLE": "MS_PSERVER"})
    text = str(info.value)
    assert "MS_ROLE 'MS_PSERVER' is not one of" in text
    assert "'MS_WORKER'" in text and "'MS_SCHED'" in text and "''" in text


def test_backend_validation_lists_the_backends() -> None:
    with pytest.raises(ConfigError, match=r"backend 'gpu' is not one of: host, ascend"):
        JobConfig.from_env({"MS_RECOVER_BACKEND": "gpu"})


def test_port_range() -> None:
    assert JobConfig(manager_port=0).manager_port == 0
    with pytest.raises(ConfigError, match=r"manager_port 70000 is not in 0..65535"):
        JobConfig.from_env({"MS_RECOVER_PORT": "70000"})


def test_empty_job_id_is_rejected_but_empty_env_means_default() -> None:
    assert JobConfig.from_env({"MINDX_TASK_ID": ""}).job_id == "default"
    with pytest.raises(ConfigError, match="job_id must be a non-empty string"):
        JobConfig(job_id="")


def test_strategies_must_be_strategy_values() -> None:
    with pytest.raises(ConfigError, match="strategies must be Strategy values"):
        JobConfig(strategies=("recover",))  # type: ignore[arg-type]


def test_describe_names_the_job_shape_and_strategies() -> None:
    text = JobConfig(job_id="j", node_nums=2, proc_per_node=4).describe()
    assert "job=j" in text and "nodes=2x4" in text
    assert "strategy=recover-in-place,recover,exit" in text
    assert "(none)" in JobConfig(strategies=()).describe()


def test_member_env_gives_agents_and_ranks_the_same_timing() -> None:
    config = JobConfig(
        job_id="j",
        node_nums=2,
        proc_per_node=2,
        heartbeat_s=0.3,
        hang_timeout_s=7.5,
        rank_silence_s=4.0,
        phase_timeout_s=9.0,
        wait_reschedule_timeout_s=33.0,
        max_tries=5,
        sched_node_rank=1,
        dump_dir="/shared/dump",
    )
    seen = JobConfig.from_env(config.member_env(), job_id="j", node_nums=2, proc_per_node=2)
    assert seen == config


@pytest.mark.parametrize(
    "value", ["tcp://10.0.0.5:4000", "tcp://127.0.0.1", "ipc:///tmp/x", "127.0.0.1:4000"]
)
def test_a_relay_endpoint_must_be_a_local_tcp_port(value: str) -> None:
    with pytest.raises(
        ConfigError, match=r"MS_RECOVER_RELAY_ENDPOINT=.* is not tcp://127\.0\.0\.1"
    ):
        JobConfig.from_env({"MS_RECOVER_RELAY_ENDPOINT": value})
    ok = JobConfig.from_env({"MS_RECOVER_RELAY_ENDPOINT": "tcp://127.0.0.1:40123"})
    assert ok.relay_endpoint == "tcp://127.0.0.1:40123"


@pytest.mark.parametrize(("liveness", "period"), [(2, 0.5), (3, 0.5), (4, 2 / 3), (6, 1.0)])
def test_agents_beat_three_times_per_silence_window_never_faster_than_ranks(
    liveness: int, period: float
) -> None:
    cfg = JobConfig(heartbeat_s=0.5, liveness=liveness)
    assert cfg.agent_heartbeat_s == pytest.approx(period)
    assert cfg.silence_s / cfg.agent_heartbeat_s >= min(3, liveness) - 1e-9


@pytest.mark.parametrize(
    ("changes", "period"),
    [
        ({}, 2.5),  # a quarter of the 10 s rank silence
        ({"rank_silence_s": 1.0}, 2 / 3),  # never faster than the agent beats
        ({"rank_silence_s": 40.0, "hang_timeout_s": 20.0}, 5.0),  # progress judged sooner
        ({"heartbeat_s": 4.0, "rank_silence_s": 1.0, "phase_timeout_s": 600.0}, 16 / 3),
    ],
)
def test_agents_report_their_ranks_four_times_per_judged_window(
    changes: dict[str, float], period: float
) -> None:
    cfg = JobConfig(**changes)  # type: ignore[arg-type]
    assert cfg.rank_report_s == pytest.approx(period)
    window = min(max(cfg.rank_silence_s, cfg.silence_s), cfg.hang_timeout_s)
    assert cfg.agent_heartbeat_s <= cfg.rank_report_s <= max(window / 4, cfg.agent_heartbeat_s)
