"""The takeover decisions, pure (docs/manager-takeover.md): when the first manager starts
active or stands by, when a standby takes over, when a manager stands down; and when an
agent leaves its manager for the next one."""

from __future__ import annotations

import dataclasses

from ms_recover.agent.managers import ManagerLinkState
from ms_recover.config import JobConfig
from ms_recover.errors import ConfigError
from ms_recover.manager.takeover import (
    OnSigterm,
    Role,
    Seen,
    Watch,
    on_sigterm,
    start_role,
    watch_verdict,
)
from ms_recover.protocol import messages as M
from ms_recover.protocol.codec import Envelope
from tests.unit.test_divergence import ServerJob

SILENCE = 2.0


def active(term: int = 0, node: int = 0, at: float = 10.0, state: str = "running") -> Seen:
    return Seen(role="active", term=term, node=node, state=state, seen_active=True, at=at)


def standby(seen_active: bool, at: float = 10.0) -> Seen:
    return Seen(role="standby", term=0, node=1, state="forming", seen_active=seen_active, at=at)


def test_the_first_manager_of_a_fresh_job_starts_active_at_once() -> None:
    assert start_role([standby(seen_active=False)], 0.1, 2.7) is Role.ACTIVE


def test_a_recreated_node_0_stands_by_when_another_manager_is_active() -> None:
    assert start_role([active(term=1, node=1)], 0.1, 2.7) is Role.STANDBY


def test_a_recreated_node_0_waits_while_its_standby_is_still_taking_over() -> None:
    """The standby saw the old node 0 and has not taken over yet: neither role yet."""
    assert start_role([standby(seen_active=True)], 1.0, 2.7) is None
    assert start_role([Seen()], 1.0, 2.7) is None  # nobody answered yet
    assert start_role([Seen()], 2.7, 2.7) is Role.ACTIVE  # nobody at all: start the job


def test_an_ended_job_does_not_keep_a_new_manager_standing_by() -> None:
    assert start_role([active(state="finished")], 3.0, 2.7) is Role.ACTIVE


def test_a_standby_takes_over_only_after_the_silence_with_the_next_term() -> None:
    peers = {0: active(term=0, node=0, at=10.0)}
    assert watch_verdict(Role.STANDBY, 0, 1, peers, 11.9, SILENCE).take_over is None
    v = watch_verdict(Role.STANDBY, 0, 1, peers, 12.1, SILENCE)
    assert v.take_over == (0, 1) and "silent for 2.10s" in v.reason


def test_a_standby_further_down_the_list_waits_one_more_silence_per_place() -> None:
    peers = {0: active(at=10.0), 1: standby(seen_active=True)}
    assert watch_verdict(Role.STANDBY, 0, 2, peers, 13.0, SILENCE).take_over is None
    assert watch_verdict(Role.STANDBY, 0, 2, peers, 14.1, SILENCE).take_over == (0, 1)


def test_a_standby_that_never_saw_an_active_manager_never_takes_over() -> None:
    peers = {0: Seen()}
    assert watch_verdict(Role.STANDBY, 0, 1, peers, 1e9, SILENCE) == watch_verdict(
        Role.STANDBY, 0, 1, {}, 1e9, SILENCE
    )
    assert watch_verdict(Role.STANDBY, 0, 1, peers, 1e9, SILENCE).take_over is None


def test_a_standby_stands_down_when_the_job_ended_instead_of_taking_over() -> None:
    done = watch_verdict(Role.STANDBY, 0, 1, {0: active(state="finished")}, 99.0, SILENCE)
    assert done.stand_down == 0 and done.take_over is None
    gave_up = watch_verdict(Role.STANDBY, 0, 1, {0: active(state="exiting")}, 99.0, SILENCE)
    assert gave_up.stand_down == 1


def test_an_active_manager_stands_down_before_a_higher_term() -> None:
    higher = {1: active(term=1, node=1, at=10.0)}
    assert watch_verdict(Role.ACTIVE, 0, 0, higher, 10.5, SILENCE).stand_down == 1
    lower = {1: active(term=0, node=1, at=10.0)}
    assert watch_verdict(Role.ACTIVE, 1, 0, lower, 10.5, SILENCE).stand_down is None


def test_an_agent_leaves_a_dropped_connection_after_a_beat_and_a_silent_manager_later() -> None:
    cfg = JobConfig(node_nums=2, heartbeat_s=0.5)
    link = ManagerLinkState(since=0.0)
    assert link.why_leave(3.0, welcomed=False, cfg=cfg) == ""  # never up: the manager may bind late
    link.note(True, 0.2)
    assert link.why_leave(3.0, welcomed=True, cfg=cfg) == ""
    link.note(False, 5.0)
    assert link.why_leave(5.4, welcomed=True, cfg=cfg) == ""
    assert "unreachable for 0.5s" in link.why_leave(5.5, welcomed=True, cfg=cfg)
    quiet = ManagerLinkState(since=0.0)
    quiet.note(True, 0.1)  # up, but a standby never welcomes
    assert "did not answer within 4.0s" in quiet.why_leave(4.0, welcomed=False, cfg=cfg)


def test_an_agent_the_active_manager_holds_waits_for_it() -> None:
    """A hot switch's new pod: the active manager holds its agent's hello until the swap (up
    to the switch's timeout) and answers it with a beat. The agent waits there; it left for
    the standby after 4 s before, and the swap's rebuild then waited 60 s for its ranks."""
    cfg = JobConfig(node_nums=2, heartbeat_s=0.5)
    link = ManagerLinkState(since=0.0)
    link.note(True, 0.1)
    link.answered()
    assert link.why_leave(30.0, welcomed=False, cfg=cfg) == ""
    link.note(False, 31.0)  # the active manager itself went away: move on as always
    assert "unreachable" in link.why_leave(31.5, welcomed=False, cfg=cfg)


def test_a_held_hello_is_answered_with_a_beat() -> None:
    """The server's side: a hot switch's new pod's agent is held and told so by a beat."""
    job = ServerJob("recover-in-place,recover,exit")
    try:
        job.running(step=10)
        job.model.switching[1] = job.now
        sent: list[tuple[bytes, M.Message]] = []
        job.server._send = lambda ident, msg: sent.append((ident, msg))  # type: ignore[method-assign]
        hello = M.AgentHello(1, "10.0.0.9", [2, 3], 9999, False)
        env = Envelope("unit", 1, "agent:1", 0, hello, 77)
        job.server._on_agent_hello(b"a1-new", env, hello)
        assert [(i, type(m).__name__) for i, m in sent] == [(b"a1-new", "ManagerBeat")]
        assert job.model.agents[1].pid != 9999  # held, not registered
    finally:
        job.server.close()


def test_a_reconnect_to_the_same_address_is_not_the_manager_that_went_away() -> None:
    """A recreated node 0 brings up a manager at the old address within a second; ZeroMQ
    reconnects there, but that manager stands by: the agent still moves on a beat after the
    drop (it used to wait for the standing-by manager to close, 12 s, past the rejoin window)."""
    cfg = JobConfig(node_nums=2, heartbeat_s=0.5)
    link = ManagerLinkState(since=0.0)
    link.note(True, 0.2)
    link.note(False, 5.0)
    link.note(True, 5.2)  # the recreated pod's manager, at the same address
    assert "unreachable for 0.5s" in link.why_leave(5.5, welcomed=True, cfg=cfg)
    link.welcomed()  # a manager there took the agent in: the link is up again
    assert link.why_leave(9.0, welcomed=True, cfg=cfg) == ""


def test_the_managers_list_is_checked_and_carried_to_members() -> None:
    cfg = JobConfig.from_env({"MS_RECOVER_MANAGERS": "10.0.0.1:9601,job-worker-1.job:9601"})
    assert cfg.manager_endpoints == ("tcp://10.0.0.1:9601", "tcp://job-worker-1.job:9601")
    assert cfg.member_env()["MS_RECOVER_MANAGERS"] == "10.0.0.1:9601,job-worker-1.job:9601"
    assert JobConfig().manager_endpoints == ("tcp://127.0.0.1:9601",)
    for bad in ("10.0.0.1", "10.0.0.1:0", "host:99999", ":9601", "bad host:1"):
        try:
            JobConfig.from_env({"MS_RECOVER_MANAGERS": bad})
        except ConfigError as exc:
            assert "MS_RECOVER_MANAGERS" in str(exc) and "valid" in str(exc)
        else:
            raise AssertionError(f"{bad!r} accepted")


def test_a_manager_finds_its_entry_by_address_else_by_its_node() -> None:
    from ms_recover.manager.main import takeover_index

    two = ("job-mgr-0.ns.svc:9601", "job-mgr-1.ns.svc:9601")
    cfg = JobConfig(node_nums=3, managers=two, manager_port=9601)
    assert takeover_index(cfg.replace(managers=()), "10.0.0.5") is None
    assert takeover_index(cfg.replace(node_rank=1), "10.0.0.5") == 1  # a Service: by node
    assert takeover_index(cfg.replace(managers=("10.0.0.9:9601", "10.0.0.5:9601")), "10.0.0.5") == 1
    try:
        takeover_index(cfg.replace(node_rank=2), "10.0.0.7")
    except ConfigError as exc:
        assert "MS_RECOVER_MANAGERS" in str(exc) and "node 2" in str(exc)
    else:
        raise AssertionError("a manager on a node without an entry was accepted")


def test_a_sigterm_hands_over_to_a_standby_that_answers_else_ends_the_job() -> None:
    """Node 0's pod deleted or drained: its active manager hands over when a standby answers;
    with none listed, or none answering, the job cannot outlive it and ends as asked."""
    assert on_sigterm("active", False, 1, True)[0] is OnSigterm.HAND_OVER
    plan, why = on_sigterm("active", False, 0, False)
    assert plan is OnSigterm.END_JOB and "MS_RECOVER_MANAGERS lists none" in why
    plan, why = on_sigterm("active", False, 2, False)
    assert plan is OnSigterm.END_JOB and "none of the 2 standby manager(s) answers" in why
    assert on_sigterm("standby", False, 1, True)[0] is OnSigterm.STOP  # serves nobody
    assert on_sigterm("active", True, 1, True)[0] is OnSigterm.STOP  # the job has ended


def test_a_standby_takes_over_at_once_from_a_manager_that_hands_over() -> None:
    """No silence to wait for, and the old manager's node is not lost (a handover)."""
    asked = "node 0, which hosts the manager, was asked to stop (SIGTERM)"
    peers = {0: dataclasses.replace(active(at=10.0), handing_over=asked)}
    v = watch_verdict(Role.STANDBY, 0, 1, peers, 10.1, SILENCE)
    assert v.take_over == (0, 1) and v.handover and v.reason.endswith(asked), v
    # One further down the list leaves it to the next one while that one answers...
    ahead = {**peers, 1: standby(seen_active=True, at=10.0)}
    assert watch_verdict(Role.STANDBY, 0, 2, ahead, 10.1, SILENCE).take_over is None
    # ...and takes over at once when that one is silent.
    gone = {**peers, 1: standby(seen_active=True, at=5.0)}
    assert watch_verdict(Role.STANDBY, 0, 2, gone, 10.1, SILENCE).handover
    # A manager that handed over and then went silent is taken over as a lost one.
    late = watch_verdict(Role.STANDBY, 0, 1, peers, 12.1, SILENCE)
    assert late.take_over == (0, 1) and not late.handover


def test_a_manager_that_hands_over_stands_down_with_0_once_its_successor_is_active() -> None:
    successor = {1: active(term=1, node=1, at=10.0)}
    v = watch_verdict(Role.ACTIVE, 0, 0, successor, 10.2, SILENCE, handing_over=True)
    assert v.stand_down == 0 and "handed over to the manager of node 1 (term 1)" in v.reason
    standing_by = {1: standby(seen_active=True, at=10.0)}
    assert watch_verdict(Role.ACTIVE, 0, 0, standing_by, 10.2, SILENCE, handing_over=True) == (
        watch_verdict(Role.ACTIVE, 0, 0, {}, 10.2, SILENCE)
    )


class _Server:
    """The Serving side of a Watch, recorded."""

    handing_over = ""

    def __init__(self) -> None:
        self.roles: list[tuple[str, int, bool]] = []

    def set_role(self, role: str, term: int, seen_active: bool) -> None:
        self.roles.append((role, term, seen_active))


class _Chan:
    """A peer channel that answers the first receive with ``status``."""

    def __init__(self, status: dict[str, object]) -> None:
        self.replies = [Envelope("j", 0, "manager", 1, M.StatusReply(status=status))]

    def send(self, msg: object, epoch: int) -> None:
        pass

    def recv(self, timeout_ms: int) -> Envelope | None:
        return self.replies.pop() if self.replies else None


def test_a_standby_says_it_saw_an_active_manager_as_soon_as_the_answer_comes() -> None:
    """Within the probe, not a beat later: node 0 recreated right after it died asks the
    standby in that beat, and must hear that the job was running (a fresh-job answer made it
    start active with term 0 and the survivors waited 4 s for it instead of a takeover)."""
    server = _Server()
    watch = Watch(JobConfig(job_id="j", heartbeat_s=0.05), 1, server)  # type: ignore[arg-type]
    try:
        running = {"state": "running", "manager": {"role": "active", "term": 0, "node": 0}}
        watch._chans = {0: _Chan(running)}  # type: ignore[dict-item]
        watch._probe()
        assert server.roles == [("standby", 0, True)]
        assert watch.peers[0].role == "active"
    finally:
        watch._ctx.term()
