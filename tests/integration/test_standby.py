"""The standby interpreter: MindSpore imported ahead, a restarted rank run in it as ``python``
would run it, its output in the rank's log; started only once the ranks train."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from ms_recover import env as E
from ms_recover.agent.agent import Agent
from ms_recover.agent.main import standby_on
from ms_recover.agent.ranks import BOOTSTRAP, RankSet, loads_mindspore, standby_command
from ms_recover.bench.jobdriver import _is_warm_spare
from ms_recover.config import JobConfig
from ms_recover.errors import ConfigError
from ms_recover.localrun.wait import wait_for
from ms_recover.protocol import messages as M
from ms_recover.strategy import parse_strategies

PROGRAM = """\
import json, os, sys
print("hello from rank", os.environ["RANK_ID"], flush=True)
out = os.path.join(os.environ["OUT"], "rank_%s_%s.json" % (os.environ["RANK_ID"],
                                                          os.environ["MS_RECOVER_INCARNATION"]))
with open(out, "w") as fh:
    json.dump({"argv": sys.argv, "name": __name__, "path0": sys.path[0],
               "preloaded": "mindspore" in sys.modules, "pid": os.getpid(),
               "fd_left": "MS_RECOVER_SPARE_FD" in os.environ}, fh)
sys.exit(3)
"""


def test_standby_command_accepts_a_script_or_a_module_and_nothing_else() -> None:
    py = sys.executable
    assert standby_command([py, "t.py", "-x"]) == [
        py,
        "-m",
        "ms_recover.worker.standby",
        "t.py",
        "-x",
    ]
    assert standby_command(["python3", "-m", "pkg.mod"]) == [
        "python3",
        "-m",
        "ms_recover.worker.standby",
        "-m",
        "pkg.mod",
    ]
    for cold in (["python", "-u", "t.py"], ["bash", "run.sh"], ["python", "-m"], ["python"], []):
        assert standby_command(cold) is None, cold
    os.environ["GLOG_logtostderr"] = "0"  # MindSpore's per-rank log directories
    try:
        assert standby_command([py, "t.py"]) is None
    finally:
        del os.environ["GLOG_logtostderr"]


def test_standby_switch_names_its_valid_values() -> None:
    assert standby_on("off") is False and standby_on("on") is True
    os.environ[E.STANDBY] = "0"
    try:
        assert standby_on(None) is False
        os.environ[E.STANDBY] = "maybe"
        with pytest.raises(ConfigError, match="use on, off, 1 or 0"):
            standby_on(None)
    finally:
        del os.environ[E.STANDBY]
    assert standby_on(None) is True  # the default


def _ranks(tmp_path: Path) -> tuple[RankSet, Path]:
    script = tmp_path / "prog" / "train.py"
    script.parent.mkdir()
    script.write_text(PROGRAM)
    os.environ["OUT"] = str(tmp_path)
    config = JobConfig(node_nums=1, proc_per_node=2, manager_port=1)
    ranks = RankSet(
        config, [sys.executable, str(script), "a"], str(tmp_path / "logs"), 0, None, True
    )
    return ranks, script


def _exits(ranks: RankSet, n: int) -> list[Any]:
    got: list[Any] = []
    wait_for(lambda: got.extend(ranks.poll()) or len(got) >= n, 60, f"{n} rank exits")
    return got


def test_a_restarted_rank_runs_in_the_standby_as_python_would_run_it(tmp_path: Path) -> None:
    ranks, script = _ranks(tmp_path)
    try:
        ranks.start_all([0, 1])
        assert not ranks.spares.spares  # no standby while the ranks start
        assert [e.exit_code for e in _exits(ranks, 2)] == [3, 3]
        ranks.training()
        standby = ranks.spares.spares[0].proc.pid
        wait_for(lambda: _is_warm_spare(standby, {os.getpid()}), 120, "a warm standby")
        assert ranks.start(1) == standby
        (exited,) = _exits(ranks, 1)
        assert (exited.rank, exited.pid, exited.exit_code) == (1, standby, 3)
        cold = json.loads((tmp_path / "rank_1_0.json").read_text())
        warm = json.loads((tmp_path / "rank_1_1.json").read_text())
        assert warm["pid"] == standby and cold["pid"] != standby
        for key in ("argv", "name", "path0", "fd_left"):
            assert warm[key] == cold[key], key
        assert warm["argv"] == [str(script), "a"] and warm["name"] == "__main__"
        assert warm["path0"] == str(script.parent) and warm["fd_left"] is False
        assert warm["preloaded"] is True and cold["preloaded"] is False
        log = (tmp_path / "logs" / "rank_1.log").read_text()
        assert log.count("hello from rank 1") == 2  # the cold start's and the standby's
        assert f"ms_recover: standby {standby} runs rank 1" in log
    finally:
        ranks.close()
        os.environ.pop("OUT", None)


def test_an_unused_standby_is_killed_and_reaped_at_once(tmp_path: Path) -> None:
    """Even mid-import: the agent's end does not wait for it."""
    ranks, _ = _ranks(tmp_path)
    ranks.training()
    proc = ranks.spares.spares[0].proc
    ranks.close()
    assert proc.returncode == -9
    os.environ.pop("OUT", None)


def test_a_standby_killed_while_it_waits_is_replaced(tmp_path: Path) -> None:
    ranks, _ = _ranks(tmp_path)
    try:
        ranks.training()
        first = ranks.spares.spares[0].proc
        first.kill()
        first.wait()

        def replaced() -> bool:
            ranks.poll()  # the agent's loop
            return ranks.spares.spares[0].proc is not first

        wait_for(replaced, 30, "a new standby")
        assert ranks.spares.spares[0].proc.poll() is None and ranks.spares.respawns == 1
    finally:
        ranks.close()
        os.environ.pop("OUT", None)


def test_a_standby_released_unused_exits_zero(tmp_path: Path) -> None:
    """The spare protocol's release (its pipe closed empty), once it is waiting."""
    ranks, _ = _ranks(tmp_path)
    try:
        ranks.training()
        proc = ranks.spares.spares[0].proc
        wait_for(lambda: _is_warm_spare(proc.pid, {os.getpid()}), 120, "a warm standby")
        ranks.spares.close()
        assert proc.returncode == 0
    finally:
        ranks.close()
        os.environ.pop("OUT", None)


class _Hands:
    def __init__(self) -> None:
        self.told = 0

    def training(self) -> None:
        self.told += 1


def test_the_agent_tells_its_hands_once_every_local_rank_committed_a_step() -> None:
    config = JobConfig(node_nums=2, node_rank=1, proc_per_node=2, manager_port=1)
    agent = Agent(config, [sys.executable, "t.py"])
    hands = _Hands()
    agent.ranks = hands  # type: ignore[assignment]
    try:
        assert agent.relay is not None
        agent._note_training()
        agent.relay.stepped.add(2)  # rank 3 has not committed a step yet
        agent._note_training()
        assert hands.told == 0
        agent.relay.stepped.add(3)
        agent._note_training()
        agent._note_training()
        assert hands.told == 1
    finally:
        agent.close()


def test_a_heartbeat_with_a_committed_step_marks_its_rank_stepped() -> None:
    config = JobConfig(node_nums=1, proc_per_node=2, manager_port=1)
    agent = Agent(config, [sys.executable, "t.py"])
    relay = agent.relay
    assert relay is not None
    try:
        codec = relay.codec
        for rank, step in ((0, -1), (1, 0)):
            frames = codec.encode(M.WorkerHeartbeat(rank, step), 0, f"worker:{rank}", 1)
            relay._accept([f"r{rank}".encode(), *frames])
        assert relay.stepped == {1}
    finally:
        agent.close()


def test_a_registered_agent_skips_beats_only_while_it_exchanges_with_the_manager() -> None:
    config = JobConfig(node_nums=1, proc_per_node=2, manager_port=1)
    agent = Agent(config, [sys.executable, "t.py"])
    beat = config.agent_heartbeat_s
    try:
        now = time.monotonic()
        agent._sent_at = agent._last_heard = now
        assert not agent._exchanging(now)  # not registered yet: a claimant's beats ask again
        agent._handle(M.AgentWelcome(True, ""))
        assert agent._exchanging(now + beat / 2)
        assert not agent._exchanging(now + beat + 0.01)  # nothing either way for an interval
        agent._last_heard = now - beat - 0.01
        assert not agent._exchanging(now)  # the manager answered nothing: beat, hear its answer
        agent._last_heard, agent._sent_at = now, now - beat - 0.01
        assert not agent._exchanging(now)  # nothing relayed: the beat is the node's liveness
        agent._sent_at = now
        agent._rejoin("manager restarted")  # registering again: beats until welcomed again
        assert not agent._exchanging(now)
    finally:
        agent.close()


WARM_PROGRAM = """\
import json, os, sys
from ms_recover.worker.spare import await_assignment

def warm_up():
    with open(os.path.join(os.environ["OUT"], "warm_%d.json" % os.getpid()), "w") as fh:
        json.dump({"rank": os.environ.get("RANK_ID")}, fh)

if os.environ.get("CRASH_AS_SPARE") and "MS_RECOVER_SPARE_FD" in os.environ:
    sys.exit(5)  # a program that cannot run up to init() without a rank's identity
if not await_assignment(warm_up):
    sys.exit(0)
print("hello from rank", os.environ["RANK_ID"], flush=True)
out = os.path.join(os.environ["OUT"], "rank_%s_%s.json" % (os.environ["RANK_ID"],
                                                          os.environ["MS_RECOVER_INCARNATION"]))
with open(out, "w") as fh:
    json.dump({"pid": os.getpid()}, fh)
sys.exit(3)
"""


def _warm_ranks(tmp_path: Path) -> RankSet:
    script = tmp_path / "prog" / "train.py"
    script.parent.mkdir()
    script.write_text(WARM_PROGRAM)
    os.environ["OUT"] = str(tmp_path)
    config = JobConfig(node_nums=1, proc_per_node=2, manager_port=1)
    return RankSet(config, [sys.executable, str(script)], str(tmp_path / "logs"), 0, None, True)


def test_a_program_with_a_warm_up_gets_a_warm_standby_that_compiled_before_it_took_a_rank(
    tmp_path: Path,
) -> None:
    """A rank whose init() has a warm_up marks it; the standby then runs the rank command up to
    init(), warms up there, and takes the next restarted rank with its output in the rank log."""
    ranks = _warm_ranks(tmp_path)
    try:
        ranks.start_all([0, 1])
        assert [e.exit_code for e in _exits(ranks, 2)] == [3, 3]
        ranks.training()
        standby = ranks.spares.spares[0].proc
        assert standby.args == ranks.command  # the rank command itself, not the bare standby
        wait_for(lambda: _is_warm_spare(standby.pid, {os.getpid()}), 120, "a warm standby")
        warm = json.loads((tmp_path / f"warm_{standby.pid}.json").read_text())
        assert warm == {"rank": None}  # warmed up before it knew its rank
        assert ranks.start(1) == standby.pid
        (exited,) = _exits(ranks, 1)
        assert (exited.rank, exited.exit_code) == (1, 3)
        took = json.loads((tmp_path / "rank_1_1.json").read_text())
        assert took["pid"] == standby.pid
        log = (tmp_path / "logs" / "rank_1.log").read_text()
        assert log.count("hello from rank 1") == 2  # the cold start's and the standby's
        assert f"ms_recover: standby {standby.pid} runs rank 1 (warm" in log
        assert "hello from rank" not in (tmp_path / "logs" / "spares.log").read_text()
    finally:
        ranks.close()
        os.environ.pop("OUT", None)


def test_a_program_without_a_warm_up_keeps_the_bare_standby(tmp_path: Path) -> None:
    ranks, _ = _ranks(tmp_path)
    try:
        ranks.start_all([0, 1])
        _exits(ranks, 2)
        ranks.training()
        assert ranks.spares.spares[0].proc.args[1:3] == ["-m", "ms_recover.worker.standby"]
    finally:
        ranks.close()
        os.environ.pop("OUT", None)


def test_a_warm_standby_that_dies_before_it_is_ready_falls_back_to_the_bare_standby(
    tmp_path: Path,
) -> None:
    os.environ["CRASH_AS_SPARE"] = "1"
    ranks = _warm_ranks(tmp_path)
    try:
        ranks.start_all([0, 1])
        _exits(ranks, 2)
        ranks.training()
        first = ranks.spares.spares[0].proc
        assert first.args == ranks.command
        assert first.wait(timeout=60) == 5

        def replaced() -> bool:
            ranks.poll()  # the agent's loop
            return ranks.spares.spares[0].proc is not first

        wait_for(replaced, 30, "a new standby")
        bare = ranks.spares.spares[0].proc
        assert bare.args[1:3] == ["-m", "ms_recover.worker.standby"]
        wait_for(lambda: _is_warm_spare(bare.pid, {os.getpid()}), 120, "a bare standby")
        assert ranks.start(1) == bare.pid
        (exited,) = _exits(ranks, 1)
        assert (exited.rank, exited.exit_code) == (1, 3)  # ran from its first line, as a rank
    finally:
        ranks.close()
        os.environ.pop("OUT", None)
        os.environ.pop("CRASH_AS_SPARE", None)


@pytest.mark.parametrize(
    ("strategies", "kept"),
    [
        ("recover-in-place,recover,exit", True),
        ("recover,elastic-training,exit", True),
        ("dump,exit", False),
        ("retry,recover,exit", False),
    ],
)
def test_a_node_keeps_a_standby_only_if_a_strategy_restarts_ranks_in_place(
    strategies: str, kept: bool
) -> None:
    """StartRanks to a live node comes only from recover-in-place and elastic-training: with
    neither, a standby would hold a MindSpore interpreter's memory for nothing."""
    config = JobConfig(
        node_nums=1, proc_per_node=2, manager_port=1, strategies=parse_strategies(strategies)
    )
    agent = Agent(config, [sys.executable, "t.py"], standby=True)
    try:
        assert isinstance(agent.ranks, RankSet) and agent.ranks.standby is kept
    finally:
        agent.close()


def test_ranks_without_mindspore_get_a_standby_without_it(tmp_path: Path) -> None:
    """The standby imports MindSpore only for ranks that loaded it: a rank program that never
    does (this one) gets an interpreter with ms_recover's bootstrap alone."""
    script = tmp_path / "train.py"
    script.write_text("import time\nwhile True:\n    time.sleep(1)\n")
    config = JobConfig(node_nums=1, proc_per_node=1, manager_port=1)
    ranks = RankSet(config, [sys.executable, str(script)], str(tmp_path / "logs"), 0, None, True)
    try:
        pid = ranks.start(0)
        assert not loads_mindspore(pid)
        ranks.training()
        assert ranks.spares.env[E.STANDBY_PRELOAD] == BOOTSTRAP
        standby = ranks.spares.spares[0].proc.pid
        wait_for(lambda: _is_warm_spare(standby, {os.getpid()}), 120, "a ready standby")
        assert not loads_mindspore(standby)
        assert loads_mindspore(-1)  # unreadable: assume MindSpore, as before
    finally:
        ranks.close()
