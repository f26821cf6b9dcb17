"""Manager takeover: the active manager and its standbys (docs/manager-takeover.md).

A job may run one manager per address in ``JobConfig.managers`` (``MS_RECOVER_MANAGERS``), in
takeover order: the first is node 0's (next to MindSpore's scheduler), the next the standby on
another node. Exactly one is *active* (it serves members); the others are *standbys*: bound,
answering only status requests, watching the active one. Every manager's status carries its
role, its **term** (0 for the first active one, +1 per takeover) and its node.

Guarantees:

* a standby takes over only after it has seen an active manager answer and then heard nothing
  from it for ``silence_s`` (one more ``silence_s`` per standby ahead of it in the order), and
  only if the job had not ended; it takes the term after the one it saw, declares the lost
  manager's node lost (a node fault, recovered like any other) and adopts the members that
  come to it (``ManagerServer.take_over``);
* the first manager of the list, when it starts, becomes active only if no other manager
  answers as active and none has seen an active one (a fresh job), or if nobody answered
  within ``silence_s`` plus a beat; otherwise it starts as a standby: a recreated node 0
  does not split the brain;
* an active manager asked to stop (SIGTERM: its pod deleted or its node drained) hands over
  when a standby answers (:func:`on_sigterm`): it decides nothing more and says so in its
  status; the next standby that answers takes over at its next probe, without waiting for a
  silence and without declaring the old manager's node lost (that node's agent says itself
  that it is leaving: a planned stop); the old manager stands down with 0 once it sees the
  new term active;
* an active manager that hears another active one with a higher term stands down (exit 1):
  the members follow the higher term;
* a standby that sees the job end stands down with the job's exit code.

The decisions are pure functions of what the probes saw (:func:`start_role`,
:func:`watch_verdict`, :func:`on_sigterm`); :class:`Watch` is the thread that probes and acts.
"""

from __future__ import annotations

import dataclasses
import enum
import logging
import threading
import time
from typing import Any, Protocol

import zmq

from ms_recover.config import JobConfig
from ms_recover.protocol import messages as M
from ms_recover.protocol.transport import DealerChannel, manager_channel

log = logging.getLogger("ms_recover.manager")

ENDED = ("finished", "exiting")


class Role(str, enum.Enum):
    """A manager's role: ACTIVE serves the members; STANDBY answers status requests only and
    watches the active one. STANDBY -> ACTIVE on a takeover; ACTIVE -> (exit) on standing down."""

    ACTIVE = "active"
    STANDBY = "standby"


@dataclasses.dataclass
class Seen:
    """What one peer manager last answered (its ``status["manager"]`` and job state)."""

    role: str = ""
    term: int = -1
    node: int = -1
    state: str = ""
    seen_active: bool = False
    at: float = -1.0  # monotonic time of the last answer; -1: never
    handing_over: str = ""  # an active manager asked to stop: why ("" when it is not)


def seen_of(status: dict[str, Any], now: float) -> Seen:
    mgr = status.get("manager") or {}
    return Seen(
        role=str(mgr.get("role", "active")),
        term=int(mgr.get("term", 0)),
        node=int(mgr.get("node", 0)),
        state=str(status.get("state", "")),
        seen_active=bool(mgr.get("seen_active", False)),
        at=now,
        handing_over=str(mgr.get("handing_over", "")),
    )


class OnSigterm(str, enum.Enum):
    """What a manager does with a SIGTERM (:func:`on_sigterm`): STOP serving at once,
    HAND_OVER to a standby, or END_JOB cleanly (a final dump where ``dump`` is configured,
    then exit 143)."""

    STOP = "stop"
    HAND_OVER = "hand_over"
    END_JOB = "end_job"


def on_sigterm(role: str, job_ended: bool, standbys: int, answering: bool) -> tuple[OnSigterm, str]:
    """The plan of a manager that got SIGTERM, and why. A standby, or a manager whose job has
    ended, has nothing to keep: it stops. The active manager hands over when one of its
    ``standbys`` is ``answering`` (answered its probe within ``silence_s``, or has taken
    over); without one the job cannot outlive this manager, so it ends the job cleanly (the
    manager's node was asked to stop)."""
    if role != Role.ACTIVE:
        return OnSigterm.STOP, "a standby serves nobody"
    if job_ended:
        return OnSigterm.STOP, "the job has ended"
    if not standbys:
        return (
            OnSigterm.END_JOB,
            "no standby manager can take over (MS_RECOVER_MANAGERS lists none)",
        )
    if answering:
        return OnSigterm.HAND_OVER, "a standby manager answers: it takes over"
    return OnSigterm.END_JOB, f"none of the {standbys} standby manager(s) answers"


def start_role(peers: list[Seen], waited_s: float, limit_s: float) -> Role | None:
    """The first manager's role at start from its peers' answers so far; None: probe on.

    STANDBY if a peer is active in a job that has not ended. ACTIVE if every peer answered
    as a standby that never saw an active manager (a fresh job), or once ``limit_s`` passed
    (by then a standby that saw the old node 0 die has taken over, if it ever will)."""
    if any(p.role == Role.ACTIVE and p.state not in ENDED for p in peers if p.at >= 0):
        return Role.STANDBY
    if all(p.at >= 0 and p.role == Role.STANDBY and not p.seen_active for p in peers):
        return Role.ACTIVE
    return Role.ACTIVE if waited_s >= limit_s else None


@dataclasses.dataclass(frozen=True)
class Verdict:
    """What a watching manager does now: ``take_over`` (the old manager's node, new term),
    ``stand_down`` (exit code), or nothing; ``reason`` says why. ``handover``: the old manager
    handed over (its node is not lost: its agent announces its own planned stop)."""

    take_over: tuple[int, int] | None = None
    stand_down: int | None = None
    reason: str = ""
    handover: bool = False


def watch_verdict(
    role: Role,
    term: int,
    index: int,
    peers: dict[int, Seen],
    now: float,
    silence_s: float,
    handing_over: bool = False,
) -> Verdict:
    """The decision of the manager at ``index`` (in takeover order, ``peers`` by index).

    A standby takes over from the last active peer it saw once that one was silent for
    ``silence_s`` times its distance in the order (the next one first), unless the job had
    ended, or at once when that peer hands over and no standby ahead of it in the order
    answers; an active manager stands down before a peer active with a higher term (with 0
    when it was ``handing_over``: that peer is its successor)."""
    n = len(peers) + 1
    active = [(i, p) for i, p in peers.items() if p.at >= 0 and p.role == Role.ACTIVE]
    if role is Role.ACTIVE:
        higher = [p for _, p in active if p.term > term and now - p.at <= silence_s]
        if higher and handing_over:
            new = higher[0]
            why = f"handed over to the manager of node {new.node} (term {new.term})"
            return Verdict(stand_down=0, reason=why)
        if higher:
            return Verdict(stand_down=1, reason=f"a manager with term {higher[0].term} is active")
        return Verdict()
    if not active:
        return Verdict()
    i, last = max(active, key=lambda ip: (ip[1].term, ip[1].at))
    if last.state == "finished":
        return Verdict(stand_down=0, reason="the job finished")
    if last.state == "exiting":
        return Verdict(stand_down=1, reason="the job gave up")
    distance = (index - i) % n
    quiet = now - last.at
    if (
        last.handing_over
        and quiet <= silence_s
        and not _answering_ahead(i, index, peers, now, silence_s)
    ):
        why = f"the active manager (node {last.node}, term {last.term}) hands over: "
        return Verdict(
            take_over=(last.node, last.term + 1), reason=why + last.handing_over, handover=True
        )
    if quiet > silence_s * distance:
        why = f"the active manager (node {last.node}, term {last.term}) silent for {quiet:.2f}s"
        return Verdict(take_over=(last.node, last.term + 1), reason=why)
    return Verdict()


def _answering_ahead(
    active: int, index: int, peers: dict[int, Seen], now: float, silence_s: float
) -> bool:
    """Whether a standby between the active manager (at ``active``) and this one (at
    ``index``) in takeover order answered within ``silence_s``: that one takes over first."""
    n = len(peers) + 1
    ahead = [(active + d) % n for d in range(1, (index - active) % n)]
    return any(
        peers[j].at >= 0 and now - peers[j].at <= silence_s and peers[j].role == Role.STANDBY
        for j in ahead
        if j in peers
    )


class Serving(Protocol):
    """What :class:`Watch` needs of the manager server."""

    #: Why this (active) manager hands over ("" while it does not; :func:`on_sigterm`).
    handing_over: str

    def take_over(
        self, lost_node: int, term: int, detected_at: float, reason: str, handover: bool
    ) -> None: ...

    def stand_down(self, code: int, reason: str) -> None: ...

    def set_role(self, role: str, term: int, seen_active: bool) -> None: ...


class Watch:
    """Probes the other managers every ``heartbeat_s`` and applies :func:`start_role` and
    :func:`watch_verdict` to ``server``. Runs in a daemon thread until :meth:`stop`."""

    def __init__(self, config: JobConfig, index: int, server: Serving) -> None:
        self.config, self.index, self.server = config, index, server
        self.role = Role.STANDBY
        self.term = 0
        self._ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        self._chans: dict[int, DealerChannel] = {
            i: manager_channel(self._ctx, config, "manager", f"mgr{index}.{i}".encode(), ep)
            for i, ep in enumerate(config.manager_endpoints)
            if i != index
        }
        self.peers: dict[int, Seen] = {i: Seen() for i in self._chans}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="ms-recover-watch", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(timeout=5)

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                self._probe()
                if self._act():
                    return
        finally:
            for chan in self._chans.values():
                chan.close()
            self._ctx.term()

    def decide_start(self) -> None:
        """Before serving: the first manager probes until :func:`start_role` decides (the
        members' frames wait in its socket meanwhile); the others stand by."""
        cfg = self.config
        if self.index != 0:
            self.server.set_role(Role.STANDBY.value, 0, False)
            return
        began, limit = time.monotonic(), cfg.silence_s + cfg.agent_heartbeat_s
        role = None
        while role is None and not self._stop.is_set():
            self._probe()
            role = start_role(list(self.peers.values()), time.monotonic() - began, limit)
        self.role = role or Role.STANDBY
        if self.role is Role.ACTIVE:
            log.info("manager %d starts active (term 0)", self.index)
            self.server.set_role(Role.ACTIVE.value, 0, True)

    def _probe(self) -> None:
        """Ask every peer for its status; read answers for one beat."""
        for chan in self._chans.values():
            chan.send(M.StatusRequest(), 0)
        deadline = time.monotonic() + self.config.heartbeat_s
        while not self._stop.is_set():
            left = deadline - time.monotonic()
            if left <= 0:
                return
            for i, chan in self._chans.items():
                env = chan.recv(int(min(left, 0.05) * 1000))
                if env is not None and isinstance(env.msg, M.StatusReply):
                    seen = self.peers[i] = seen_of(env.msg.status, time.monotonic())
                    if seen.role == Role.ACTIVE and self.role is Role.STANDBY:
                        # Said at once, not a beat later: a node 0 recreated right after
                        # it died must learn that the job was running (start_role).
                        self.server.set_role(Role.STANDBY.value, self.term, True)

    def _act(self) -> bool:
        """Apply the verdict; True once this watch has nothing more to do."""
        seen_active = any(p.role == Role.ACTIVE for p in self.peers.values() if p.at >= 0)
        if self.role is Role.STANDBY:
            self.server.set_role(Role.STANDBY.value, self.term, seen_active)
        v = watch_verdict(
            self.role,
            self.term,
            self.index,
            self.peers,
            time.monotonic(),
            self.config.silence_s,
            handing_over=bool(self.server.handing_over),
        )
        if v.stand_down is not None:
            log.warning("manager %d stands down: %s", self.index, v.reason)
            self.server.stand_down(v.stand_down, v.reason)
            return True
        if v.take_over is not None:
            lost, self.term = v.take_over
            log.warning("manager %d takes over with term %d: %s", self.index, self.term, v.reason)
            self.role = Role.ACTIVE
            self.server.take_over(lost, self.term, time.time(), v.reason, v.handover)
        return False

    def successor_answering(self) -> bool:
        """Whether a peer that can take over (a standby), or has (active with a higher
        term), answered within ``silence_s``."""
        now, term = time.monotonic(), self.term
        return any(
            p.at >= 0
            and now - p.at <= self.config.silence_s
            and (p.role == Role.STANDBY or p.term > term)
            for p in self.peers.values()
        )
