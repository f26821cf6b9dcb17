"""The fault-injection builder, its env encoding, and the injector's firing rules.

Nothing here kills anything: the signal-sending paths run with ``os.kill``/``os.killpg``
replaced by recorders.
"""

from __future__ import annotations

import os
import signal

import pytest

from ms_recover.errors import CommError, ConfigError
from ms_recover.localrun import faults as F
from ms_recover.localrun.faults import FaultInjector, Faults, FaultSpec, parse


def test_builder_env_parse_round_trip() -> None:
    plan = (
        Faults()
        .kill(rank=1, step=5)
        .node(rank=2, step=9)
        .hang(rank=0, step=3)
        .in_allreduce(rank=3, step=7)
        .transient(rank=1, step=4)
        .corrupt(rank=2)
        .kill(rank=1, step=8, inc=1)
    )
    env = plan.to_env()
    assert list(env) == ["MS_RECOVER_FAULTS"]
    assert (
        parse(env["MS_RECOVER_FAULTS"])
        == plan.specs
        == (
            FaultSpec("kill", 1, 5, 0),
            FaultSpec("node", 2, 9, 0),
            FaultSpec("hang", 0, 3, 0),
            FaultSpec("allreduce", 3, 7, 0),
            FaultSpec("transient", 1, 4, 0),
            FaultSpec("corrupt", 2, -1, 0),
            FaultSpec("kill", 1, 8, 1),
        )
    )


@pytest.mark.parametrize("kind", F.KINDS)
def test_every_kind_round_trips(kind: str) -> None:
    plan = Faults().add(kind, rank=3, step=2, inc=1)
    assert parse(plan.to_env()["MS_RECOVER_FAULTS"]) == (FaultSpec(kind, 3, 2, 1),)


def test_the_builder_is_immutable() -> None:
    base = Faults().kill(rank=0, step=1)
    more = base.hang(rank=1, step=2)
    assert len(base.specs) == 1 and len(more.specs) == 2
    assert Faults().to_env() == {"MS_RECOVER_FAULTS": ""}


def test_parse_tolerates_blanks_and_defaults() -> None:
    assert parse("") == ()
    assert parse(" ; ;") == ()
    assert parse(" kill:rank=1:step=2 ;corrupt:rank=0;") == (
        FaultSpec("kill", 1, 2),
        FaultSpec("corrupt", 0, -1, 0),
    )


def test_a_bad_kind_lists_the_kinds() -> None:
    with pytest.raises(ConfigError) as info:
        Faults().add("explode", rank=0)
    assert "fault kind 'explode' is not one of:" in str(info.value)
    for kind in F.KINDS:
        assert kind in str(info.value)
    with pytest.raises(
        ConfigError,
        match=r"fault spec 'explode:rank=1': kind 'explode' is not one "
        r"of: kill, node, hang",
    ):
        parse("kill:rank=0:step=1;explode:rank=1")


@pytest.mark.parametrize(
    "spec",
    ["kill:rank=x:step=1", "kill:rank", "kill:rank=1:colour=2", "kill:step=3", "hang:rank=1:step="],
)
def test_a_bad_spec_shows_the_expected_form(spec: str) -> None:
    with pytest.raises(ConfigError, match=r"must look like kind:rank=R:step=K\[:inc=N\]") as info:
        parse(spec)
    assert repr(spec) in str(info.value)


def test_in_allreduce_fires_once_at_its_step() -> None:
    specs = Faults().in_allreduce(rank=1, step=5).specs
    inj = FaultInjector(specs, rank=1, incarnation=0)
    assert [inj.in_allreduce(s) for s in (3, 4, 5, 5, 6)] == [False, False, True, False, False]


@pytest.mark.parametrize(("rank", "incarnation"), [(0, 0), (2, 0), (1, 1)])
def test_faults_fire_only_for_their_rank_and_incarnation(rank: int, incarnation: int) -> None:
    specs = Faults().in_allreduce(rank=1, step=5).transient(rank=1, step=5).corrupt(rank=1).specs
    inj = FaultInjector(specs, rank=rank, incarnation=incarnation)
    assert not inj.in_allreduce(5)
    inj.before_allreduce(5)  # does not raise
    assert not inj.corrupt_repair()


def test_a_restarted_rank_fires_only_its_own_incarnation() -> None:
    specs = Faults().kill(rank=1, step=5).in_allreduce(rank=1, step=7).specs
    specs += Faults().add("allreduce", rank=1, step=9, inc=1).specs
    first = FaultInjector(specs, rank=1, incarnation=0)
    second = FaultInjector(specs, rank=1, incarnation=1)
    assert [first.in_allreduce(s) for s in (7, 9)] == [True, False]
    assert [second.in_allreduce(s) for s in (7, 9)] == [False, True]


def test_before_allreduce_raises_comm_error_once() -> None:
    inj = FaultInjector(Faults().transient(rank=0, step=4).specs, rank=0, incarnation=0)
    inj.before_allreduce(3)
    with pytest.raises(CommError, match="injected transient data-plane failure at step 4"):
        inj.before_allreduce(4)
    inj.before_allreduce(4)  # the redone step goes through


def test_two_faults_of_a_kind_at_different_steps_both_fire() -> None:
    specs = Faults().transient(rank=0, step=2).transient(rank=0, step=6).specs
    inj = FaultInjector(specs, rank=0, incarnation=0)
    raised = []
    for step in range(8):
        try:
            inj.before_allreduce(step)
        except CommError:
            raised.append(step)
    assert raised == [2, 6]


def test_corrupt_repair_fires_on_the_first_repair_only() -> None:
    inj = FaultInjector(Faults().corrupt(rank=2).specs, rank=2, incarnation=0)
    assert [inj.corrupt_repair() for _ in range(3)] == [True, False, False]


def test_kinds_do_not_fire_at_each_others_hooks() -> None:
    specs = Faults().corrupt(rank=0).transient(rank=0, step=1).specs
    inj = FaultInjector(specs, rank=0, incarnation=0)
    assert not inj.in_allreduce(1)
    with pytest.raises(CommError):
        inj.before_allreduce(1)
    assert inj.corrupt_repair()


def test_from_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(
        "MS_RECOVER_FAULTS", Faults().in_allreduce(rank=3, step=1).to_env()["MS_RECOVER_FAULTS"]
    )
    assert FaultInjector.from_env(rank=3, incarnation=0).in_allreduce(1)
    assert not FaultInjector.from_env(rank=2, incarnation=0).in_allreduce(1)
    monkeypatch.setenv("MS_RECOVER_FAULTS", "boom:rank=1")
    with pytest.raises(ConfigError, match="not one of"):
        FaultInjector.from_env(rank=1, incarnation=0)


def test_a_node_fault_fires_in_the_nodes_first_pod_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """A recreated pod's ranks start again at incarnation 0: LocalPods numbers the pod
    (MS_RECOVER_FAULTS_POD), so a node fault does not kill the recreated pod again (the
    survivors may resume before the fault's step), unless the spec names that pod."""
    plan = Faults().node(rank=0, step=12).add("allreduce", rank=0, step=3, pod=1)
    assert parse(plan.to_env()["MS_RECOVER_FAULTS"]) == plan.specs
    assert plan.specs[1] == FaultSpec("allreduce", 0, 3, 0, 1)
    monkeypatch.setenv("MS_RECOVER_FAULTS", plan.to_env()["MS_RECOVER_FAULTS"])
    first = FaultInjector.from_env(rank=0, incarnation=0)
    assert [s.kind for s in first._specs] == ["node"]
    monkeypatch.setenv("MS_RECOVER_FAULTS_POD", "1")
    again = FaultInjector.from_env(rank=0, incarnation=0)
    assert [s.kind for s in again._specs] == ["allreduce"] and again.in_allreduce(3)
    monkeypatch.setenv("MS_RECOVER_FAULTS_POD", "next")
    with pytest.raises(ConfigError, match=r"MS_RECOVER_FAULTS_POD='next' must be a pod number"):
        FaultInjector.from_env(rank=0, incarnation=0)


@pytest.fixture
def signals(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, int, int]]:
    """Record, instead of sending, every signal the injector sends."""
    sent: list[tuple[str, int, int]] = []
    monkeypatch.setattr(os, "kill", lambda pid, sig: sent.append(("kill", pid, sig)))
    monkeypatch.setattr(os, "killpg", lambda pgid, sig: sent.append(("killpg", pgid, sig)))
    assert F.os is os  # the injector signals through the module patched here
    return sent


def test_after_commit_sends_the_right_signal_once(signals: list[tuple[str, int, int]]) -> None:
    specs = Faults().kill(rank=0, step=2).hang(rank=0, step=3).node(rank=0, step=4).specs
    inj = FaultInjector(specs, rank=0, incarnation=0)
    for step in range(6):
        inj.after_commit(step, flush=lambda: signals.append(("flush", 0, 0)))
        inj.after_commit(step)  # a second call at the same step never fires again
    pid, pgid = os.getpid(), os.getpgid(0)
    assert signals == [
        ("flush", 0, 0),  # only a kill flushes the data plane first
        ("kill", pid, signal.SIGKILL),
        ("kill", pid, signal.SIGSTOP),
        ("killpg", pgid, signal.SIGKILL),
    ]


def test_after_commit_ignores_other_ranks(signals: list[tuple[str, int, int]]) -> None:
    inj = FaultInjector(Faults().kill(rank=1, step=2).specs, rank=0, incarnation=0)
    for step in range(4):
        inj.after_commit(step)
    assert signals == []


def test_a_recovery_phase_fault_fires_on_its_command_once(
    signals: list[tuple[str, int, int]],
) -> None:
    specs = Faults().add("rebuilddie", rank=0).add("resumedie", rank=1).specs
    inj = FaultInjector(specs, rank=0, incarnation=0)
    for command in ("stop", "rebuild", "repair", "rebuild", "resume"):
        inj.at_command(command)
    assert signals == [("kill", os.getpid(), signal.SIGKILL)]
