"""ZeroMQ CURVE on both planes: peers without the job's keys cannot connect or talk, and a
job with a secret runs and recovers end to end with both planes encrypted."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import zmq

from ms_recover.comm.host.auth import DataCurve, configure_client, data_plane_password
from ms_recover.config import JobConfig
from ms_recover.localrun.faults import Faults
from ms_recover.localrun.wait import wait_for
from ms_recover.manager.server import ManagerServer
from ms_recover.observability.events import EventLog
from ms_recover.observability.status import query
from ms_recover.protocol import messages as M
from ms_recover.protocol.codec import Codec
from ms_recover.protocol.transport import control_server_keys, curve_client

from .jobs import STEPS, results, run_to_end, trainer_job
from .test_host_backend import _raw_messages, inputs, run_all
from .test_host_backend import make as make  # noqa: F401 (a fixture, used by name)

pytestmark = pytest.mark.timeout(180)

SECRET = b"curve test secret"


@pytest.fixture
def manager():
    cfg = JobConfig(job_id="curve", manager_port=0, secret=SECRET)
    server = ManagerServer(cfg, events=EventLog(), bind="127.0.0.1")
    thread = server.start_thread()
    yield server, cfg.replace(manager_port=server.port)
    server.stop()
    thread.join(10)


def _ask(endpoint: str, secret: bytes, server_key: bytes | None) -> bool:
    """Send a validly signed StatusRequest from a raw DEALER; True if a reply came back."""
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.linger = 0
    if server_key is not None:
        curve_client(sock, server_key)
    try:
        sock.connect(endpoint)
        sock.send_multipart(Codec("curve", secret).encode(M.StatusRequest(), 0, "status", 0))
        return bool(sock.poll(1500))
    finally:
        sock.close(0)
        ctx.term()


def test_the_control_plane_admits_only_peers_with_the_keys(manager) -> None:
    server, cfg = manager
    assert cfg.control_curve
    assert query(cfg, 10)["encrypted"] is True  # the members' way in: keys from the secret
    right_key = control_server_keys(SECRET, "curve")[0]
    wrong_key = control_server_keys(b"another secret", "curve")[0]
    drops = server.drops.total
    # Even a correctly signed frame does not get through without the manager's public key.
    assert not _ask(cfg.manager_endpoint, SECRET, None)
    assert not _ask(cfg.manager_endpoint, SECRET, wrong_key)
    assert server.drops.total == drops  # refused in the handshake: no frame reached the manager
    assert _ask(cfg.manager_endpoint, SECRET, right_key)


def test_without_curve_a_null_peer_gets_through() -> None:
    """The control for the test above: with CURVE off the same raw request is answered."""
    cfg = JobConfig(job_id="curve", manager_port=0, secret=SECRET, curve=False)
    server = ManagerServer(cfg, events=EventLog(), bind="127.0.0.1")
    thread = server.start_thread()
    try:
        assert _ask(f"tcp://127.0.0.1:{server.port}", SECRET, None)
    finally:
        server.stop()
        thread.join(10)


def test_curve_needs_a_secret() -> None:
    assert not JobConfig(job_id="x").control_curve  # nothing to derive keys from
    assert not JobConfig(job_id="x", data_curve=True).data_plane_curve
    assert JobConfig(job_id="x", secret=b"s", data_curve=True).data_plane_curve
    with pytest.raises(ValueError, match="non-empty job secret"):
        control_server_keys(b"", "x")


PASSWORD = data_plane_password(SECRET, "job-c")
KEYS = DataCurve.derive(SECRET, "job-c")


def test_data_plane_ranks_with_the_keys_talk_encrypted(make: Any) -> None:
    backends = make(3, password=PASSWORD, curve=KEYS, chunk_bytes=4096)
    xs = inputs(3, 5000, np.float32)
    outs = run_all(backends, lambda b: b.allreduce(xs[b.rank]))
    assert all(o.tobytes() == outs[0].tobytes() for o in outs)
    np.testing.assert_allclose(outs[0], np.sum(xs, axis=0), rtol=1e-5, atol=1e-5)
    assert all(b.stats.refused_connections == 0 for b in backends)


def test_data_plane_peers_without_the_keys_are_refused(make: Any) -> None:
    _, b1 = make(2, password=PASSWORD, curve=KEYS)
    other = DataCurve.derive(b"another secret", "job-c")
    ctx = zmq.Context()
    socks = []
    try:
        for how in ("null", "plain", "wrong client key", "wrong server key"):
            sock = ctx.socket(zmq.DEALER)
            sock.linger = 0
            if how == "plain":
                configure_client(sock, PASSWORD)  # the right password, but no CURVE
            elif how == "wrong client key":
                curve_client(sock, KEYS.server[0], other.client)
            elif how == "wrong server key":
                configure_client(sock, PASSWORD, other)
            sock.connect(b1.endpoint)
            for msg in _raw_messages(1, "t", np.array([-1.0])):
                sock.send_multipart(msg)
            socks.append(sock)
        wait_for(lambda: b1.stats.refused_connections >= 3, 10, "three refusals")
        assert b1.stats.delivered == 0
        good = ctx.socket(zmq.DEALER)
        good.linger = 0
        configure_client(good, PASSWORD, KEYS)
        good.connect(b1.endpoint)
        socks.append(good)
        for msg in _raw_messages(1, "t", np.array([7.0])):
            good.send_multipart(msg)
        assert b1.recv(0, tag="t")["v"][0] == 7.0
    finally:
        for sock in socks:
            sock.close(0)
        ctx.term()


def test_a_job_with_a_secret_recovers_with_both_planes_encrypted(tmp_path) -> None:
    shas = []
    for name, faults in (("reference", None), ("killed", Faults().kill(rank=1, step=10))):
        out = str(tmp_path / name)
        with trainer_job(out, faults, secret=SECRET, data_curve=True) as job:
            status = wait_for(lambda job=job: job.status(), 5, "status")
            assert status["encrypted"] and not status["insecure"]
            run_to_end(job)
            assert job.exit_code == 0
        final = results(out)
        assert all(r["committed"] == STEPS - 1 for r in final)
        shas.append({r["sha256"] for r in final})
        if faults is not None:
            assert job.find("recovery", ok=True)[-1]["lost_steps"] == 0
    assert len(shas[0]) == 1 and shas[0] == shas[1]  # bit-identical to the uninterrupted run
