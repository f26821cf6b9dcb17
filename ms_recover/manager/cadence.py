"""What a steadily running job costs the manager: when to decide, and one shared ManagerBeat.

At 16,384 ranks on 2,048 nodes the manager hears about 4,000 agent heartbeats a second
(DESIGN.md §1c). Two things would otherwise cost it a core:

* **Deciding after every frame.** ``decide`` scans every rank (~3 ms at 16,384). A batch of
  frames that held only heartbeats (:data:`QUIET`) changes no decision while the job runs
  steadily: silence and hangs are judged in whole heartbeats. :class:`Cadence` then decides
  every quarter heartbeat instead; after any other frame, and in every other phase, at once.
  A lost node is therefore still seen within ``heartbeat_s * (liveness + 1/4)`` of its last
  heartbeat (2.125 s at the defaults).
* **Encoding a ManagerBeat per agent.** :class:`SharedBeat` encodes one and sends the same
  frames to every agent heard until the manager sends anything else (a later seq) or the job's
  state or epoch changes; one seq per receiver is all the replay rule needs, and an agent
  heard twice meanwhile gets a fresh one.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import zmq

from ms_recover.manager.model import JobModel, JobState
from ms_recover.protocol import messages as M
from ms_recover.protocol.codec import Codec
from ms_recover.protocol.transport import send_frames

log = logging.getLogger("ms_recover.manager")

#: Frames that only refresh liveness and progress.
QUIET: frozenset[type[M.Message]] = frozenset(
    {M.AgentHeartbeat, M.WorkerHeartbeat, M.StatusRequest}
)


class Cadence:
    """Whether the next ``decide`` is due (see the module docstring)."""

    def __init__(self, model: JobModel, clock: Callable[[], float] = time.monotonic) -> None:
        self.model = model
        self.quiet_s = model.config.heartbeat_s / 4
        self._clock = clock
        self._dirty, self._at = True, -1e18

    def heard(self, kind: type[M.Message]) -> None:
        """A frame of ``kind`` was handled."""
        if kind not in QUIET:
            self._dirty = True

    def due(self) -> bool:
        """True (and reset) if a decision is due now."""
        now = self._clock()
        running = self.model.state is JobState.RUNNING
        if self._dirty or not running or now - self._at >= self.quiet_s:
            self._dirty, self._at = False, now
            return True
        return False


class SharedBeat:
    """ManagerBeat frames shared by the agents heard while nothing else was sent."""

    def __init__(
        self, model: JobModel, codec: Codec, seq: Callable[[], int], next_seq: Callable[[], int]
    ) -> None:
        self.model = model
        self.codec = codec
        self._seq, self._next_seq = seq, next_seq
        self._key: tuple[int, str, int] = (-1, "", -1)  # (seq, state, epoch) of the frames
        self._frames: list[bytes] = []
        self._sent: set[bytes] = set()

    def send(self, sock: zmq.Socket[bytes], ident: bytes) -> None:
        m = self.model
        if self._key != (self._seq(), m.state.value, m.epoch) or ident in self._sent:
            msg = M.ManagerBeat(m.state.value)
            self._frames = self.codec.encode(msg, m.epoch, "manager", self._next_seq())
            self._key, self._sent = (self._seq(), m.state.value, m.epoch), set()
        self._sent.add(ident)
        try:
            send_frames(sock, [ident, *self._frames])
        except zmq.ZMQError as exc:
            log.warning("send manager_hb to %r failed: %s", ident, exc)
