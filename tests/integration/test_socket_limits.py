"""The frame size cap sits at the socket (issue 9 #8): an oversize frame costs no memory.

Before the cap, a 256 MiB frame was received in full (570 MB of manager RSS) and only then
refused by the codec. Now libzmq reads the announced length, drops the connection and never
allocates the body, for the manager's ROUTER and for a rank's data-plane ROUTER alike.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
import zmq
from zmq.utils.monitor import recv_monitor_message

from ms_recover.comm.host.backend import HostBackend
from ms_recover.comm.host.lane.lanes import split_endpoint
from ms_recover.comm.host.link import MAX_MESSAGE_BYTES
from ms_recover.config import JobConfig
from ms_recover.localrun.wait import wait_for
from ms_recover.observability.status import query
from ms_recover.protocol import messages as M
from ms_recover.protocol.codec import Codec

pytestmark = pytest.mark.timeout(120)

BIG = 256 << 20
RSS_BOUND = 32 << 20

MANAGER = (
    "from ms_recover.config import JobConfig\n"
    "from ms_recover.manager.server import ManagerServer\n"
    "s = ManagerServer(JobConfig(job_id='rss', manager_port=0), bind='127.0.0.1')\n"
    "print(s.port, flush=True)\n"
    "s.serve()\n"
)


def _rss(pid: int) -> int:
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for pid {pid}")


def _send_and_wait_for_disconnect(endpoint: str, frames: list[bytes]) -> None:
    """Send ``frames`` from a fresh DEALER; return once the receiver dropped the connection."""
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.linger = 0
    monitor = sock.get_monitor_socket(zmq.EVENT_CONNECTED | zmq.EVENT_DISCONNECTED)
    try:
        sock.connect(endpoint)
        sock.send_multipart(frames, copy=False)
        seen: list[int] = []

        def disconnected() -> bool:
            while monitor.poll(0):
                seen.append(recv_monitor_message(monitor)["event"])
            return zmq.EVENT_DISCONNECTED in seen

        wait_for(disconnected, 30, "the receiver to drop the oversize sender")
    finally:
        sock.disable_monitor()
        monitor.close(0)
        sock.close(0)
        ctx.term()


@pytest.fixture
def manager():
    proc = subprocess.Popen(
        [sys.executable, "-c", MANAGER],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert proc.stdout is not None
        port = int(proc.stdout.readline())
        yield proc, port
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


def test_an_oversize_frame_does_not_grow_the_manager(manager) -> None:
    proc, port = manager
    cfg = JobConfig(job_id="rss", manager_port=port)
    assert query(cfg, 10) is not None  # up, and its steady-state memory allocated
    before = _rss(proc.pid)
    codec = Codec("rss", cfg.effective_secret())
    frames = codec.encode(M.StatusRequest(), 0, "status", 0)
    frames[0] = bytes(BIG)  # an unauthenticated 256 MiB frame: refused before it is read
    _send_and_wait_for_disconnect(cfg.manager_endpoint, frames)
    grown = _rss(proc.pid) - before
    assert grown < RSS_BOUND, f"manager RSS grew by {grown >> 20} MiB"
    assert proc.poll() is None and query(cfg, 10) is not None  # still serving


def test_an_oversize_data_plane_message_is_refused_at_the_socket() -> None:
    rank = HostBackend(0, 1, timeout=5.0)
    try:
        zmq_endpoint = split_endpoint(rank.endpoint)[0]  # without the lane port
        _send_and_wait_for_disconnect(zmq_endpoint, [b"hdr", bytes(MAX_MESSAGE_BYTES + 1)])
        assert rank._link._drain() == 0  # nothing reached the mailboxes
    finally:
        rank.close()
