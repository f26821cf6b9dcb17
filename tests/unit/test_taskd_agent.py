"""The taskd agent facade msrun talks to: bad input, the node's config, no manager."""

from __future__ import annotations

import logging
import os
import signal

import pytest

from ms_recover import env as E
from ms_recover.errors import ConfigError
from ms_recover.integrations.taskd import agent as taskd
from ms_recover.localrun.msrunjob import free_port
from ms_recover.localrun.wait import wait_for

_ON_SIGTERM = taskd._on_sigterm  # the real one (the fixture below keeps pytest's handler)


class FakeMsrun:
    """msrun's callbacks in memory: workers that finish (status 0) at the first MONITOR."""

    def __init__(self, node_rank: int = 0, local: int = 2, world: int = 2) -> None:
        self.node_rank, self.local_worker_num, self.worker_num = node_rank, local, world
        self.master_addr = "127.0.0.1"
        self.started: list[str] = []
        self.status: dict[int, dict] = {}

    def kill_workers(self, pids):
        return 0

    def start_all_workers(self):
        self.started.append("all")
        self.status = {i: {"pid": 1000 + i, "status": None} for i in range(self.local_worker_num)}
        return 0

    def start_worker_list(self, ranks):
        self.started += ranks
        self.status.update({i: {"pid": 1000 + i, "status": None} for i in ranks})
        return 0

    def monitor_rank_status(self, ranks):
        now = {i: dict(s) for i, s in self.status.items()}
        for s in self.status.values():
            s["status"] = 0
        return now

    def callbacks(self) -> dict:
        return {
            "KILL_WORKER": self.kill_workers,
            "START_ALL_WORKER": self.start_all_workers,
            "START_WORKER_LIST": self.start_worker_list,
            "MONITOR": self.monitor_rank_status,
        }


@pytest.fixture(autouse=True)
def clean(monkeypatch):
    saved = dict(os.environ)  # the agent prepares the workers' env in os.environ, as msrun does
    yield from _clean(monkeypatch)
    os.environ.clear()
    os.environ.update(saved)


def _clean(monkeypatch):
    for name in (E.TASKD_PROCESS_ENABLE, E.NODE_RANK, E.LOCAL_WORKER, E.WORKER_NUM, E.SCHED_HOST):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(taskd, "_state", taskd._State())
    monkeypatch.setattr(taskd.children, "settle", lambda *a, **k: [])  # not pytest's children
    monkeypatch.setattr(taskd, "_on_sigterm", lambda stop: None)  # keep pytest's handler
    monkeypatch.setattr(taskd, "_setup_logging", lambda: None)  # keep pytest's logging
    yield


def _errors(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]


@pytest.mark.parametrize(
    ("config", "cls", "needle"),
    [
        ({"Framework": "MindSpore", "Colour": 1}, None, "unknown key(s) Colour; valid: Framework"),
        ({"Framework": "PyTorch"}, None, "Framework 'PyTorch' is not supported"),
        ({"Framework": "MindSpore"}, object, "with a cls is not supported"),
        ("MindSpore", None, "config must be a dict"),
    ],
)
def test_a_config_it_does_not_understand_is_one_line_and_false(caplog, config, cls, needle):
    assert taskd.init(config, cls) is False
    errors = _errors(caplog)
    assert len(errors) == 1 and needle in errors[0] and "\n" not in errors[0]


def test_init_accepts_msrun_and_marks_the_launcher(monkeypatch):
    monkeypatch.delenv(E.LAUNCHER_PID, raising=False)
    assert taskd.init({"Framework": "MindSpore"}) is True
    assert os.environ[E.LAUNCHER_PID] == str(os.getpid())


def test_taskd_process_enable_off_leaves_msrun_in_charge(monkeypatch):
    monkeypatch.setenv(E.TASKD_PROCESS_ENABLE, "off")
    assert taskd.init({"Framework": "MindSpore"}) is False


def test_register_func_rejects_unknown_operators_in_one_line(caplog):
    assert taskd.register("KILL_WORKER", print) is False  # before init
    assert taskd.init({"Framework": "MindSpore"})
    assert taskd.register("REBOOT_NODE", print) is False
    assert taskd.register("MONITOR", "not callable") is False
    assert taskd.register("MONITOR", print) is True
    errors = _errors(caplog)
    assert len(errors) == 3
    assert "unknown operator 'REBOOT_NODE'; valid: KILL_WORKER, START_ALL_WORKER" in errors[1]


def test_the_node_config_falls_back_to_msruns_arguments():
    """msrun's own process may lack the pod's environment: msrun's command line fills in."""
    fake = FakeMsrun(node_rank=1, local=2, world=4)
    fake.master_addr = "10.1.2.3"
    config = taskd.node_config({}, {"Framework": "MindSpore"}, fake.callbacks())
    assert (config.node_rank, config.proc_per_node, config.node_nums) == (1, 2, 2)
    assert config.manager_host == "10.1.2.3"
    env = {E.NODE_RANK: "1", E.SCHED_HOST: "10.9.9.9", E.ROLE: "MS_SCHED"}
    config = taskd.node_config(env, {"UpstreamPort": "7001"}, fake.callbacks())
    assert (config.manager_host, config.manager_port) == ("10.9.9.9", 7001)


def test_a_node_rank_msrun_contradicts_is_an_error():
    with pytest.raises(ConfigError, match="MS_NODE_RANK=0 but msrun runs with --node_rank 1"):
        taskd.node_config({E.NODE_RANK: "0"}, {}, FakeMsrun(node_rank=1, world=4).callbacks())


@pytest.mark.parametrize(
    ("env", "needle"),
    [
        ({E.MANAGER_WAIT: "soon"}, "is not a positive number of seconds"),
        ({E.MANAGER_WAIT: "-1"}, "is not a positive number of seconds"),
        ({E.NO_MANAGER: "retry"}, "is not one of: run, exit"),
    ],
)
def test_bad_agent_settings_name_the_valid_values(env, needle):
    with pytest.raises(ConfigError, match=needle):
        taskd.AgentSettings.from_env(env)


def _start_without_manager(monkeypatch, no_manager: str) -> tuple[int, FakeMsrun]:
    monkeypatch.setenv(E.PORT, str(free_port()))  # nobody listens there
    monkeypatch.setenv(E.MANAGER_WAIT, "0.3")
    monkeypatch.setenv(E.NO_MANAGER, no_manager)
    fake = FakeMsrun()
    assert taskd.init({"Framework": "MindSpore"})
    for name, func in fake.callbacks().items():
        assert taskd.register(name, func)
    return taskd.start(), fake


def test_without_a_manager_the_workers_run_plain_after_one_loud_warning(monkeypatch, caplog):
    with caplog.at_level(logging.WARNING, logger="ms_recover"):
        code, fake = _start_without_manager(monkeypatch, "run")
    assert code == 0 and fake.started == [0, 1]
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "NO FAULT RECOVERY" in warnings[0]


def test_without_a_manager_the_exit_setting_stops_before_any_worker(monkeypatch, caplog):
    code, fake = _start_without_manager(monkeypatch, "exit")
    assert code == 1 and fake.started == []
    assert len(_errors(caplog)) == 1


def test_start_before_init_is_a_usage_error(caplog):
    assert taskd.start() == 2
    assert "before a successful init_taskd_agent" in _errors(caplog)[0]


def test_sigterm_under_msrun_is_a_planned_stop_not_a_stop() -> None:
    """msrun's process gets the pod's SIGTERM: the shim's agent leaves as planned (it tells
    the manager and keeps the workers running), instead of stopping them at once."""
    asked: list[str] = []
    before = signal.getsignal(signal.SIGTERM)
    try:
        _ON_SIGTERM(asked.append)
        os.kill(os.getpid(), signal.SIGTERM)
        wait_for(lambda: asked, 5, "the handler")
    finally:
        signal.signal(signal.SIGTERM, before)
    assert asked == ["SIGTERM"]


def test_msrun_workers_start_at_the_manager_their_agent_talks_to() -> None:
    """With standby managers, a worker's list of managers starts at the one its agent talks
    to now (a recreated node 0's agent moved on from its own pod's standing-by manager), the
    same ring in the same order: the worker's first hello is not held by a standby."""
    from ms_recover.config import JobConfig
    from ms_recover.integrations.msrun.hands import MsrunHands
    from tests.unit.test_lastwords import FakeMsrun

    managers = ("10.0.0.1:9601", "10.0.0.2:9601", "10.0.0.3:9601")
    config = JobConfig(node_nums=3, proc_per_node=2, node_rank=0, managers=managers)
    environ: dict[str, str] = {}
    fake = FakeMsrun()
    hands = MsrunHands(config, fake.callbacks(), environ=environ)
    try:
        hands.start(0)
        assert environ[E.MANAGERS] == ",".join(managers)
        hands.manager_index = lambda: 2
        hands.start(1)
        assert environ[E.MANAGERS] == "10.0.0.3:9601,10.0.0.1:9601,10.0.0.2:9601"
    finally:
        for entry in fake.status.values():  # the workers ended: nothing left to kill
            entry["status"] = 0
        hands.close()
