"""What a large job costs the manager between decisions: when to decide, when to read, and
one shared ManagerBeat.

At 16,384 ranks on 2,048 nodes the manager hears about 4,000 agent heartbeats a second
(docs/design.md §1c), and one ``decide`` scans every rank (~3 ms). Deciding after every wake-up, as
a small job can afford, would cost the manager its whole thread. :class:`Cadence` decides:

* after frames that may change a decision (anything but :data:`QUIET` heartbeats), at once,
  unless the last decision began less than :data:`SHARE` times its own duration ago: then as
  soon as it has, so deciding takes at most a quarter of the thread while acknowledgements
  stream in and the rest goes to reading them (a 4-rank job's decision takes ~50 us: no delay
  anyone can see; 16,384 ranks' ~3 ms delay a phase by at most ~10 ms);
* when the last answer a STOP or REBUILD broadcast is owed in this epoch is handled, at once,
  and the server stops reading first (:meth:`Cadence.owed`, :data:`ANSWERS`);
* otherwise every ``tick_s`` (phase timeouts), and while the job runs steadily every quarter
  heartbeat: silence and hangs are judged in whole heartbeats, so a lost node is still seen
  within ``heartbeat_s * (liveness + 1/4)`` of its last heartbeat (2.125 s at the defaults);
* while the job runs steadily and only heartbeats came, the manager also rests
  :data:`REST_S` between reads, so 3,000 heartbeats a second are read in about forty batches
  instead of one wake-up each: a batch read at once costs about half as much CPU per frame as
  a few frames per wake-up, whose reads find the caches cold (a rank's death report waits at
  most that long; detection stays far inside its 0.2 s target).

The rules that read every rank (its silence, its timing report: adaptive hangs, fail-slow
ranks) run with a decision only once :data:`JUDGE_SHARE` times the last such decision's
duration has passed since it began: on every decision of a small job, about every three
seconds at 65,536 ranks, whose reports take 60-75 ms to read. Lost nodes, reported faults and phases
are decided on every tick as before, and the SHARE wait after a judging decision is that of an
ordinary one (a fault reported right after one is not held back by its cost).

:class:`SharedBeat` answers an agent's heartbeat (``JobConfig.agent_heartbeat_s``) once per
quarter of the agent's manager-silence grace (``lost_manager_grace_s``; 60 s by default, so
about every 15 s), the first beat due after that: the longest gap an agent sees between two
answers is a quarter grace plus one agent heartbeat, below half its grace (the config keeps
the grace above ``heartbeat_s * liveness``, three agent heartbeats), so a live manager is
never mistaken for a lost one, and 2,048 agents cost the manager ~140 frames a second
instead of ~1,500. Any other frame the manager sends an agent is heard as well. It encodes
one ManagerBeat and sends the same frames to every agent it answers until the manager sends
anything else (a later seq) or the job's state or epoch changes; one seq per receiver is all
the replay rule needs, and an agent answered twice meanwhile gets a fresh one.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable

import zmq

from ms_recover.manager.model import JobModel
from ms_recover.observability.schema import JobState
from ms_recover.protocol import messages as M
from ms_recover.protocol.codec import Codec
from ms_recover.protocol.transport import send_frames

log = logging.getLogger("ms_recover.manager")

#: Frames that only refresh liveness and progress.
QUIET: frozenset[type[M.Message]] = frozenset(
    {M.AgentHeartbeat, M.GroupBeats, M.WorkerHeartbeat, M.StatusRequest}
)


#: Deciding takes at most 1/SHARE of the thread while frames stream in.
SHARE = 4

#: What a member answers to a broadcast that ends when everyone has answered: when the last
#: answer owed is handled the manager stops reading and decides at once (:meth:`Cadence.owed`),
#: instead of after a drain that heartbeats keep alive or a SHARE wait (at 16,384 ranks both
#: held a finished stop-all back by up to 0.13 s).
ANSWERS: dict[type[M.Message], type[M.Message]] = {
    M.Stop: M.Stopped,
    M.Rebuild: M.Rebuilt,
    M.Repair: M.Repaired,
}

#: The manager answers an agent's heartbeat once per 1/GRACE_SHARE of the agent's grace.
GRACE_SHARE = 4

#: Rest between reads while the job runs steadily and only heartbeats came (see above).
REST_S = 0.025

#: The rules that read every rank (its timing report, its silence) take at most 1/JUDGE_SHARE
#: of the thread.
JUDGE_SHARE = 40


class Cadence:
    """When to decide and how long to wait for frames (see the module docstring)."""

    def __init__(
        self, model: JobModel, tick_s: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.model = model
        self.tick_s = tick_s
        self.quiet_s = model.config.heartbeat_s / 4
        self._clock = clock
        self._dirty, self._at, self._cost = True, -1e18, 0.0
        self._judged_at, self._judge_cost = -1e18, 0.0  # the last decision that judged
        self._plain_cost: float | None = None  # the last decision that did not judge
        # Answers owed to this epoch's broadcasts (see :meth:`owed`): answer kind -> count.
        self._owed: dict[type[M.Message], int] = {}
        self._owed_epoch = -1
        #: The last answer owed came: decide now (see :meth:`run`), and stop reading first.
        self.answered = False
        self.judged = 0  # decisions that judged every rank so far (see :meth:`run`)

    def owed(self, asked: type[M.Message], n: int) -> None:
        """``n`` members were sent ``asked`` in this epoch: their answers end a phase."""
        answer = ANSWERS.get(asked)
        if answer is None:
            return
        if self._owed_epoch != self.model.epoch:
            self._owed, self._owed_epoch = {}, self.model.epoch
        self._owed[answer] = self._owed.get(answer, 0) + n

    def heard(self, kind: type[M.Message], epoch: int = -1, n: int = 1) -> None:
        """``n`` frames of ``kind`` (sent in ``epoch``) were handled."""
        if kind not in QUIET and n > 0:
            self._dirty = True
            left = self._owed.get(kind) if epoch == self._owed_epoch else None
            if left is not None:  # a hint, not a count of valid answers: decide checks them
                self._owed[kind] = left - n
                if left - n <= 0 < left:
                    self.answered = True

    def _steady(self) -> bool:
        return self.model.state is JobState.RUNNING

    def _wait_s(self, now: float) -> float:
        """Seconds until a decision is due."""
        since = now - self._at
        if self._dirty:  # three times as long as the last decision took, from its start
            return SHARE * self._cost - since
        return (self.quiet_s if self._steady() else self.tick_s) - since

    def due(self) -> bool:
        """Whether a decision is due now."""
        return self.answered or self._wait_s(self._clock()) <= 0

    def run(self, decide: Callable[[bool], None]) -> bool:
        """Call ``decide`` if a decision is due (timing it); whether it was called. Its
        argument: whether to judge the ranks' timing reports too, once JUDGE_SHARE times the
        last such decision's duration has passed since it began (see the module docstring)."""
        now = self._clock()
        if self._wait_s(now) > 0 and not self.answered:
            return False
        self._dirty, self._at, self.answered = False, now, False
        judge = now - self._judged_at >= JUDGE_SHARE * self._judge_cost
        decide(judge)
        cost = self._clock() - now
        if judge:
            self._judged_at, self._judge_cost = now, cost
            self.judged += 1
            # JUDGE_SHARE bounds the judging: the next decision waits on an ordinary one's
            # cost (at 65,536 ranks a judging decision takes 200 ms; a fault reported right
            # after it waited SHARE times that, 0.8 s, for its decision). A job that judges on
            # every decision has no other cost to go by.
            self._cost = cost if self._plain_cost is None else self._plain_cost
        else:
            self._cost = self._plain_cost = cost
        return True

    def poll_ms(self) -> int:
        """How long the next read may wait for a frame: until a decision is due."""
        wait = self._wait_s(self._clock())
        most = self.quiet_s if self._steady() and not self._dirty else self.tick_s
        return max(0, min(int(most * 1000), math.ceil(wait * 1000)))

    def rest_s(self) -> float:
        """How long to rest before the next read: :data:`REST_S` while only heartbeats came
        to a steadily running job, else 0."""
        return REST_S if self._steady() and not self._dirty else 0.0


class SharedBeat:
    """ManagerBeat frames shared by the agents heard while nothing else was sent."""

    def __init__(
        self,
        model: JobModel,
        codec: Codec,
        seq: Callable[[], int],
        next_seq: Callable[[], int],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.model = model
        self.codec = codec
        # A quarter of the agent's grace (see the module docstring): at most every beat.
        self.every_s = model.config.lost_manager_grace_s / GRACE_SHARE
        self._clock = clock
        self._answered: dict[bytes, float] = {}  # agent identity -> when it was last answered
        self._seq, self._next_seq = seq, next_seq
        self._key: tuple[int, str, int] = (-1, "", -1)  # (seq, state, epoch) of the frames
        self._frames: list[bytes] = []
        self._sent: set[bytes] = set()

    def send(self, sock: zmq.Socket[bytes], ident: bytes, force: bool = False) -> bool:
        """Answer the agent ``ident``'s heartbeat if it is due (``force``: now, a group
        leader's batch, whose members learn from the answer that the manager is alive);
        whether a frame was sent."""
        now = self._clock()
        if not force and now - self._answered.get(ident, -1e18) < self.every_s:
            return False
        self._answered[ident] = now
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
        return True
