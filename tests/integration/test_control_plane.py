"""The control plane on real processes: detection, membership checks, hostile frames, CLI."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator

import pytest
import zmq

from ms_recover.localrun.job import LocalJob
from ms_recover.localrun.wait import wait_for
from ms_recover.protocol import messages as M
from ms_recover.protocol.codec import Codec, Envelope

from .jobs import results, run_to_end, trainer_job

pytestmark = pytest.mark.timeout(120)

LONG = 3000  # steps of 10 ms: the job is still running while a test pokes at it
SLOW = ("--step-time", "0.01")


def _live_rank_pid(job, rank: int) -> int:
    def pid():
        info = job.status()["ranks"][rank]
        return info["pid"] if info["alive"] and info["step"] >= 1 else 0

    return wait_for(pid, 30, f"rank {rank} to train")


def test_external_kill_9_of_a_rank_is_detected(tmp_path):
    with trainer_job(str(tmp_path), strategy="exit", steps=LONG, extra=SLOW) as job:
        os.kill(_live_rank_pid(job, 2), signal.SIGKILL)
        fault = wait_for(lambda: job.find("fault", kind="rank_exit", rank=2), 10, "the fault")[0]
        assert "signal 9" in fault["detail"]
        assert fault["detect_s"] < 1.0
        assert job.wait(30)
    assert job.exit_code == 87  # the exit strategy: every process leaves with JOB_EXIT
    assert job.pods.exit_codes == {0: 87, 1: 87}


def test_killed_agent_means_node_lost(tmp_path):
    with trainer_job(str(tmp_path), strategy="exit", steps=LONG, extra=SLOW) as job:
        _live_rank_pid(job, 3)
        agent = job.pods.procs[1]
        os.kill(agent.pid, signal.SIGKILL)  # only the agent: its ranks are orphaned
        fault = wait_for(lambda: job.find("fault", kind="node_lost"), 10, "node loss")[0]
        assert fault["node_rank"] == 1
        assert fault["detect_s"] >= job.config.silence_s
        assert job.status()["agents"][1]["alive"] is False


def _raw(job, secret: bytes, job_id: str = "itest") -> tuple[zmq.Context, zmq.Socket, Codec]:
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(job.config.manager_endpoint)
    return ctx, sock, Codec(job_id, secret)


def test_bad_and_foreign_frames_are_dropped_while_the_job_goes_on(tmp_path):
    out = str(tmp_path)
    with trainer_job(out, steps=60) as job:
        _live_rank_pid(job, 0)
        secret = job.config.effective_secret()
        ctx, sock, good = _raw(job, secret)
        _, _, foreign = (None, None, Codec("other-job", secret))
        _, _, forged = (None, None, Codec("itest", b"wrong secret"))
        try:
            sock.send_multipart([b"garbage"])
            sock.send_multipart([b"msr1", b"stop", b"\xc1\xc1", b"0" * 32])  # an old layout
            sock.send_multipart([b"msr2\x04stop\xc1\xc1" + b"0" * 32])
            sock.send_multipart(foreign.encode(M.Exit(1, "foreign"), 0, "x", 1))
            sock.send_multipart(forged.encode(M.Exit(1, "forged"), 0, "x", 1))
            sock.send_multipart(good.encode(M.GroupCreated(0, "g", [0]), 0, "x", 1))  # unregistered
            wait_for(lambda: job.server.drops.total >= 6, 10, "six dropped frames")
        finally:
            sock.close(0)
            ctx.term()
        run_to_end(job)
    assert job.exit_code == 0
    assert {r["committed"] for r in results(out)} == {59}
    assert not job.find("fault")


@pytest.fixture(scope="module")
def live_job(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalJob]:
    """One job, training until the module is done, that the tests below poke without
    disturbing it (each asserts so): one start-up for all of them, not one each."""
    out = str(tmp_path_factory.mktemp("live"))
    with trainer_job(out, steps=10**6, extra=SLOW) as job:
        for rank in range(job.config.world_size):
            _live_rank_pid(job, rank)
        yield job


@pytest.mark.parametrize(
    ("rank", "node", "reason"),
    [(9, 1, "outside the world 0..3"), (3, 0, "belongs to node 1"), (0, 0, "already registered")],
)
def test_bad_registrations_are_rejected_with_a_reason(live_job, rank, node, reason):
    job = live_job
    ctx, sock, codec = _raw(job, job.config.effective_secret())
    try:
        sock.send_multipart(
            codec.encode(
                M.WorkerHello(rank, node, 424242, 0, "tcp://127.0.0.1:1", -1, 0), 0, "rank:x", 1
            )
        )
        assert sock.poll(5000), "no answer to a bad registration"
        reply = codec.decode(sock.recv_multipart())
    finally:
        sock.close(0)
        ctx.term()
    assert isinstance(reply.msg, M.Welcome) and not reply.msg.ok
    assert reason in reply.msg.reason
    assert job.status()["state"] == "running"
    assert not job.find("fault")


def test_status_command_reports_a_live_job(live_job):
    job = live_job
    env = {
        **os.environ,
        "MS_SCHED_HOST": "127.0.0.1",
        "MS_RECOVER_PORT": str(job.server.port),
        "MINDX_TASK_ID": "itest",
    }
    out = subprocess.run(
        [sys.executable, "-m", "ms_recover.cli", "status", "--ranks"],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert out.returncode == 0, out.stderr
    assert "job itest: running" in out.stdout
    assert "ranks: world 4, alive 4, done 0, not registered 0; steps " in out.stdout
    assert out.stdout.count(" up ") >= 4
    _watch_prints_again_until_interrupted(env)
    wrong = subprocess.run(
        [
            sys.executable,
            "-m",
            "ms_recover.cli",
            "status",
            "--job-id",
            "nope",
            "--timeout",
            "0.5",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert wrong.returncode == 1 and "no manager answered" in wrong.stderr


def _watch_prints_again_until_interrupted(env: dict[str, str]) -> None:
    """``status --watch`` prints the summary again and again; Ctrl-C ends it with 0."""
    watch = subprocess.Popen(
        [sys.executable, "-m", "ms_recover.cli", "status", "--watch", "0.2"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert watch.stdout is not None
        summaries = 0
        for line in iter(watch.stdout.readline, ""):  # the test's timeout bounds the wait
            summaries += line.startswith("job itest: running")
            if summaries == 2:
                break
        assert summaries == 2
        watch.send_signal(signal.SIGINT)
        assert watch.wait(timeout=10) == 0, watch.stderr.read() if watch.stderr else ""
    finally:
        if watch.poll() is None:
            watch.kill()
            watch.wait()


# ----------------------------------------------------------------------------- handlers
@pytest.fixture
def server():
    from ms_recover.config import JobConfig
    from ms_recover.manager.server import ManagerServer
    from ms_recover.strategy import parse_strategies

    config = JobConfig(
        job_id="unit",
        node_nums=2,
        proc_per_node=2,
        manager_port=0,
        strategies=parse_strategies("recover-in-place,exit"),
    )
    srv = ManagerServer(config, bind="127.0.0.1")
    agent = srv.model.agents[1]
    agent.registered = agent.alive = True
    srv._agent_ids[1] = b"a1"
    info = srv.model.ranks[3]  # rank 3 was replaced: its old process (pid 500) is gone
    info.registered, info.alive, info.pid = True, False, 500
    yield srv
    srv.close()


def _exited(srv, pid: int, code: int, sig: int, requested: bool = False) -> None:
    env = Envelope("unit", srv.model.epoch, "agent:1", 1, None)
    srv._on_rank_exited(b"a1", env, M.RankExited(1, 3, pid, code, sig, 0.0, requested))


def test_the_managers_own_kill_is_not_a_fault(server):
    """Issue 9 #1: a replacement the manager killed (it never registered: another pid)."""
    _exited(server, 99999, 137, 9, requested=True)
    assert server.model.pending == []
    assert server.events.recent("rank_exit")[-1]["expected"] is True
    _exited(server, 99998, 1, 0)  # a replacement crashing on its own is a fault
    assert [f.kind for f in server.model.pending] == ["rank_exit"]


def test_a_requested_kill_of_a_just_registered_rank_unregisters_it(server):
    info = server.model.ranks[3]
    info.alive, info.pid, info.identity = True, 777, b"r3"  # registered just before the kill
    _exited(server, 777, 137, 9, requested=True)
    assert not info.alive and info.identity == b"" and server.model.pending == []


def test_impossible_strategies_are_reported_when_the_manager_starts() -> None:
    from ms_recover.config import JobConfig
    from ms_recover.manager.server import ManagerServer
    from ms_recover.strategy import parse_strategies

    config = JobConfig(
        job_id="one", manager_port=0, strategies=parse_strategies("recover,elastic-training,exit")
    )
    server = ManagerServer(config)
    try:
        problems = [e["problem"] for e in server.events.recent("config_warning")]
    finally:
        server.close()
    assert any(p.startswith("recover: a one-rank job") for p in problems)
    assert any(p.startswith("elastic-training: a one-rank job") for p in problems)
