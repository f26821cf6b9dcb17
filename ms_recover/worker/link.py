"""The worker's background link to the manager.

A daemon thread owns the DEALER socket: it registers, heartbeats with the last committed step,
sends what the training thread queued, and latches the manager's commands. It never raises
into the training thread and never runs training code. On STOP or EXIT it calls the
``on_abort`` callback at once (the backend's ``abort()``), so a collective blocked on a dead
peer returns and the training thread reaches its safe point.
"""

from __future__ import annotations

import collections
import logging
import queue
import threading
import time
from collections.abc import Callable

import zmq

from ms_recover.config import JobConfig
from ms_recover.protocol import messages as M
from ms_recover.protocol.codec import Codec, Envelope
from ms_recover.transport import DealerChannel

log = logging.getLogger("ms_recover.worker")


class ManagerLink:
    """Thread-safe mailbox between the training thread and the manager."""

    def __init__(
        self, config: JobConfig, rank: int, identity: bytes, on_abort: Callable[[], None]
    ) -> None:
        self.config = config
        self.rank = rank
        self._on_abort = on_abort
        self._ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        codec = Codec(config.job_id, config.effective_secret(), config.max_frame_bytes)
        self._chan = DealerChannel(
            self._ctx, config.manager_endpoint, codec, f"rank:{rank}", identity
        )
        self._out: queue.SimpleQueue[tuple[M.Message, int | None]] = queue.SimpleQueue()
        self._inbox: collections.deque[Envelope] = collections.deque()
        self._cond = threading.Condition()
        self._stop = threading.Event()
        self.epoch = 0
        self.committed = -1
        self._sent_step = -2
        self.last_heard = time.monotonic()
        self._thread = threading.Thread(
            target=self._loop, name=f"ms-recover-link-{rank}", daemon=True
        )

    def start(self) -> None:
        self._thread.start()

    def send(self, msg: M.Message, epoch: int | None = None) -> None:
        """Queue a message (an ack carries the epoch of its command); sent within one tick."""
        self._out.put((msg, epoch))

    def next_command(self, timeout_s: float) -> Envelope | None:
        """The oldest latched command, waiting up to ``timeout_s``."""
        with self._cond:
            if not self._inbox:
                self._cond.wait(timeout_s)
            return self._inbox.popleft() if self._inbox else None

    def has_command(self) -> bool:
        with self._cond:
            return bool(self._inbox)

    def close(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)
        self._chan.close()
        self._ctx.term()

    def _loop(self) -> None:
        next_beat = 0.0
        hb = self.config.heartbeat_s
        while not self._stop.is_set():
            while True:
                try:
                    msg, epoch = self._out.get_nowait()
                except queue.Empty:
                    break
                self._chan.send(msg, self.epoch if epoch is None else epoch)
            now = time.monotonic()
            if now >= next_beat or self.committed != self._sent_step:
                self._sent_step = self.committed
                self._chan.send(M.WorkerHeartbeat(self.rank, self._sent_step), self.epoch)
                next_beat = now + hb
            env = self._chan.recv(10)
            while env is not None:
                self._latch(env)
                env = self._chan.recv_ready()

    def _latch(self, env: Envelope) -> None:
        self.last_heard = time.monotonic()
        if isinstance(env.msg, M.StatusReply):
            return
        if env.epoch < self.epoch:
            self._chan.drops.drop(f"stale {env.msg.KIND.decode()} of epoch {env.epoch}", "manager")
            return
        self.epoch = env.epoch
        if isinstance(env.msg, (M.Stop, M.Exit)):
            self._on_abort()
        with self._cond:
            self._inbox.append(env)
            self._cond.notify_all()
