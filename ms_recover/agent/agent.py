"""The node agent: launches this node's ranks, reports their exits, obeys the manager.

It touches rank processes only through its hands (:mod:`ms_recover.agent.hands`): processes it
spawns itself, or msrun's callbacks when msrun is the launcher
(:mod:`ms_recover.integrations.taskd.agent`).

Guarantees:

* every rank exit is reported to the manager within one poll interval (20 ms by default) with
  its exit code or signal;
* KillRanks and StartRanks are carried out in the order received, so "kill leftovers, then
  restart" never races;
* AgentExit kills every local rank and makes :meth:`Agent.run` return the given code (the pod
  supervisor recreates the pod on :data:`~ms_recover.exitcodes.RESCHEDULE`); at the normal end
  of the job (code 0) the ranks are instead given up to ``phase_timeout_s`` to leave on their
  own (``session.finish()`` returns, atexit runs), and their real exit codes are reported;
* on :meth:`Agent.stop` every child is terminated and reaped before returning;
* SIGTERM (:meth:`Agent.leave`) is a planned stop, not a crash (a pod deletion, a node drain,
  a preemption: Kubernetes sends SIGKILL ``termination_grace_s`` later): the agent logs it,
  tells the manager at once (``NodeLeaving``, with its deadline), keeps its ranks running,
  and leaves when the manager tells it (AgentExit) or at its deadline, the grace less a safety
  margin for killing and reaping the ranks before the SIGKILL
  (:mod:`ms_recover.agent.leaving`); an agent no manager has welcomed yet has no one to wait
  for and leaves at once (exit 143);
* a restarted manager on the same address is reached again by ZeroMQ's own reconnect; when it
  asks (``Rejoin``) the agent registers again and re-sends the last exit of every local rank
  that is not running, so a fault that happened while the manager was away is handled;
* the ranks it launches itself talk to it, not to the manager (:mod:`ms_recover.agent.relay`):
  their frames are relayed in batches, their heartbeats folded into the agent's own, and the
  manager's messages for them fanned out, so the manager's load grows with nodes, not ranks.
  Ranks launched by msrun (the TaskD shim, :mod:`ms_recover.integrations.taskd.agent`) keep
  their own connection to the manager;
* a rank stopped by a signal (SIGSTOP: state ``T``) for ``frozen_s`` is reported once
  (``RankFrozen``, :mod:`ms_recover.agent.frozen`): the manager declares its hang at once
  instead of after ``rank_silence_s``;
* it beats every ``agent_heartbeat_s``, except when it relayed a frame to the manager and heard
  from it within that interval (the relayed frame already says the node is alive); a beat that
  carries its ranks' steps is always sent; in a large job its beats go through its heartbeat
  group's leader while the leader answers, and the agent of a group's first node leads it
  (:mod:`ms_recover.agent.group`);
* it leaves only when the manager says so (``AgentExit``), even once every local rank
  exited 0: only the manager knows whether they finished (``session.finish()``) or left
  early, which is a fault it recovers by restarting them here;
* with standby managers (``MS_RECOVER_MANAGERS``, docs/manager-takeover.md) the agent leaves
  its manager for the next one in the list (round robin) when its connection, once up, has
  been down for ``heartbeat_s`` (ZeroMQ's own PING/PONG ends a connection silent for
  ``silence_s``, so a lost machine counts too, at no cost to the manager), or when the
  manager has not welcomed it within ``2 * silence_s`` of its hello (a standby that does not
  take over). A fresh
  DEALER connects there and the agent registers again as with ``Rejoin``, its ranks through
  the relay: they never reconnect themselves;
* if the manager stays silent for ``lost_manager_grace_s`` (default ``phase_timeout_s``), the
  ranks are killed and the agent exits 1 (0 if every local rank had exited 0): without a
  manager nothing can be recovered;
* a spare node's agent (``spare=True``, ``ms-recover agent --spare``) starts no rank: it holds
  one warm process per local rank and waits (:mod:`ms_recover.agent.sparenode`) until the
  manager gives it a node, then registers as that node's agent and starts the node's ranks in
  the warm processes. An agent told that its node was taken by a spare meanwhile
  (``BecomeSpare``: its pod came back late) ends the ranks it started and becomes a spare.
"""

from __future__ import annotations

import logging
import math
import os
import threading
import time
import typing

import zmq

from ms_recover import exitcodes
from ms_recover.agent.endings import RankEnds
from ms_recover.agent.frozen import FreezeWatch
from ms_recover.agent.group import GroupLeader, GroupLink
from ms_recover.agent.hands import Exited, LauncherError, RankHands
from ms_recover.agent.leaving import PlannedStop
from ms_recover.agent.managers import ManagerLinkState, ManagerSide
from ms_recover.agent.ranks import RankSet
from ms_recover.agent.relay import LocalRelay
from ms_recover.agent.sparenode import SpareSide
from ms_recover.config import JobConfig
from ms_recover.protocol import messages as M
from ms_recover.protocol.transport import manager_channel
from ms_recover.strategy import restarts_in_place

log = logging.getLogger("ms_recover.agent")

#: An agent loop iteration longer than this is logged (with the CPU this process had in
#: it): the manager declares a node lost after ``silence_s`` (2 s by default) without a beat.
STALL_S = 1.0


class StallWatch:
    """Logs a loop iteration that took longer than ``limit_s``: wall time, and the CPU time
    the process ran in it (little CPU: not scheduled, or blocked in a system call)."""

    def __init__(self, limit_s: float) -> None:
        self.limit_s = limit_s
        self._at, self._cpu = time.monotonic(), time.process_time()

    def lap(self) -> float:
        """Start the next iteration; the last one's wall time."""
        now, cpu = time.monotonic(), time.process_time()
        took = now - self._at
        if took > self.limit_s:
            log.warning(
                "agent loop stalled %.2fs (this process ran %.2fs of CPU)", took, cpu - self._cpu
            )
        self._at, self._cpu = now, cpu
        return took


class Agent(ManagerSide, RankEnds, SpareSide):
    def __init__(
        self,
        config: JobConfig,
        command: list[str],
        log_dir: str = "",
        poll_s: float = 0.02,
        spares: int = 0,
        hands: RankHands | None = None,
        standby: bool = False,
        spare: bool = False,
    ) -> None:
        if not command and hands is None:
            raise ValueError("agent needs a rank command, e.g. -- python train.py")
        if spare and hands is not None:
            raise ValueError("a spare node launches its own ranks: no msrun hands")
        self.config = config
        self._ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        # Our own child processes talk to our relay; msrun's (lent hands) to the manager.
        self.relay = LocalRelay(self._ctx, config) if hands is None else None
        endpoint = self.relay.endpoint if self.relay is not None else None
        # A standby serves only a rank restarted on this node: no strategy does, no standby
        # (a MindSpore interpreter is ~400 MB of a node's memory).
        standby = standby and restarts_in_place(config.strategies)
        own = (
            RankSet(config, command, log_dir, spares, endpoint, standby) if hands is None else None
        )
        self.ranks: RankHands = hands if hands is not None else typing.cast(RankSet, own)
        self._own = own
        #: A spare node (docs/design.md §1f): no node rank until the manager gives it one.
        self.spare = spare
        self._training = False  # every local rank committed a step (told to the hands once)
        self._frozen = FreezeWatch(config.frozen_s)  # ranks stopped by a signal (SIGSTOP)
        self.poll_s = poll_s
        self._stop = threading.Event()
        self._epoch = 0
        ident = (f"s.{os.getpid()}" if spare else f"a{config.node_rank}.{os.getpid()}").encode()
        self._ident, self._endpoints, self._at = ident, config.manager_endpoints, 0
        self._failover = len(self._endpoints) > 1
        # With standbys, ZeroMQ's PING/PONG ends a connection silent for silence_s.
        beats: dict[int, int] = {
            zmq.HEARTBEAT_IVL: int(config.heartbeat_s * 1000),
            zmq.HEARTBEAT_TIMEOUT: int(config.silence_s * 1000),
        }
        self.chan = manager_channel(
            self._ctx,
            config,
            f"spare:{os.getpid()}" if spare else f"agent:{config.node_rank}",
            ident,
            self._endpoints[0],
            beats if self._failover else None,
        )
        self._link = ManagerLinkState(time.monotonic())
        self._monitor = self._watch_link()
        self._manager_nonce, self._manager_epoch = -1, 0
        self.exit_code: int | None = None
        # The last exit of each local rank, and whether this agent caused it (re-sent on Rejoin).
        self._exits: dict[int, tuple[Exited, bool]] = {}
        self._drain: tuple[float, int] | None = None  # (deadline, exit code) at the job's end
        self._leaving: PlannedStop | None = None  # a SIGTERM: see leave()
        self._last_heard = time.monotonic()
        self._sent_at = -math.inf  # when a frame other than a beat last went to the manager
        self._welcomed = False  # the manager accepted this agent's (last) hello
        self._demoted = False  # told to become a spare node (see _step_down)
        self._poller = zmq.Poller()
        self._poller.register(self.chan.sock, zmq.POLLIN)
        if self.relay is not None:
            self._poller.register(self.relay.sock, zmq.POLLIN)
        # Heartbeat groups (docs/design.md §1c): this agent leads its group, or beats to the
        # leader the manager names (GroupAt).
        self.group_leader: GroupLeader | None = None
        self._lead()
        self.group: GroupLink | None = None
        self._grouped = False  # the last heartbeat went through the group's leader only
        self._led_stop = -1  # the epoch of the last STOP that came through the group's leader

    def stop(self) -> None:
        """Ask run() to terminate the children and return (safe from a signal handler)."""
        self._stop.set()

    def leave(self, reason: str = "SIGTERM") -> None:
        """A planned stop (safe from a signal handler): the agent loop tells the manager and
        leaves when told, or at the deadline (see the module docstring). Once only."""
        if self._leaving is None:
            self._leaving = PlannedStop(time.monotonic(), reason)

    @property
    def manager_index(self) -> int:
        """The place in ``MS_RECOVER_MANAGERS`` of the manager this agent talks to now."""
        return self._at

    @property
    def stopping(self) -> bool:
        """True once :meth:`stop` was called."""
        return self._stop.is_set()

    @property
    def leaving(self) -> bool:
        """True once :meth:`leave` was called."""
        return self._leaving is not None

    def run(self) -> int:
        """Register, start every local rank, and serve until the job ends for this node; a
        spare node first waits, its ranks warm, until the manager gives it a node."""
        if self.spare:
            return self.serve(start=self._as_spare())
        self.hello()
        return self.serve(start=True)

    def hello(self) -> None:
        """Announce this node to the manager (ZeroMQ queues it until the manager listens)."""
        cfg = self.config
        is_sched = cfg.node_rank == cfg.sched_node_rank
        self._link.since = time.monotonic()  # the manager has 2 * silence_s to welcome it
        self.chan.send(
            M.AgentHello(
                cfg.node_rank, cfg.pod_ip, list(cfg.ranks_of(cfg.node_rank)), os.getpid(), is_sched
            ),
            self._epoch,
        )

    def await_welcome(self, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` for the manager's answer to :meth:`hello`.

        True once it answered; a refusal sets the exit code, so :meth:`serve` returns at once.
        False when nothing came: no manager is reachable.

        It beats while it waits, as :meth:`serve` does: a new incarnation's hello whose node
        the manager still counts as held by the old agent (a pod recreated before its loss
        was noticed) is decided when the claimant speaks again, once the old agent has been
        silent long enough (:mod:`ms_recover.manager.slots`). Without the beats the claim
        would wait for nothing and the node would run without fault recovery.

        With standby managers it moves on as :meth:`serve` does (a recreated node 0's own
        manager stands by and never welcomes it: the active one is the next in the list).
        """
        now = time.monotonic()
        deadline, next_beat = now + timeout_s, now + self.config.agent_heartbeat_s
        while not self._stop.is_set() and self._leaving is None and now < deadline:
            self._fail_over()  # a standby that does not welcome it: the next manager
            if now >= next_beat:
                self.chan.send(M.AgentHeartbeat(self.config.node_rank, {}), self._epoch)
                next_beat = now + self.config.agent_heartbeat_s
            wait_s = min(0.1, max(0.0, min(deadline, next_beat) - now))
            env = self.chan.recv(int(wait_s * 1000))
            now = time.monotonic()
            if env is not None:
                self._epoch = max(self._epoch, env.epoch)
                self._handle(env.msg)
                if isinstance(env.msg, M.AgentWelcome):
                    return True
        return False

    def serve(self, start: bool = True) -> int:
        """Start the ranks (unless ``start`` is False) and run the agent loop; the exit code.

        A :class:`LauncherError` (msrun's callbacks failing) is one log line and exit 1:
        the node stops cleanly instead of retrying a broken launcher in a loop.
        """
        cfg = self.config
        next_beat = 0.0
        self._last_heard = time.monotonic()
        try:
            if start and self.exit_code is None and self._leaving is not None:
                log.warning("node %d got SIGTERM before its ranks started: leaving", cfg.node_rank)
                self._stop.set()
            elif start and self.exit_code is None:
                self.ranks.start_all(cfg.ranks_of(cfg.node_rank))
                log.info("agent node=%d started ranks %s", cfg.node_rank, self.ranks.pids())
            stall = StallWatch(STALL_S)
            while self.exit_code is None and not self._stop.is_set():
                stall.lap()
                if self._demoted:
                    self._step_down()
                    continue
                self._report(self.ranks.poll())
                self._report_frozen()
                if self._leaving is not None and self._planned_stop(self._leaving):
                    break
                if self._drain is not None:
                    self._drained()
                    if self.exit_code is not None:
                        break
                elif not self._manager_alive():
                    # Ranks that all left with 0 may have finished: as before, the node ends 0.
                    self.exit_code = exitcodes.OK if self._all_done() else exitcodes.FAILED
                    break
                else:
                    self._fail_over()
                now = time.monotonic()
                if self._grouped and self.group is not None and not self.group.usable(now):
                    next_beat = now  # the group's leader did not answer: to the manager now
                if now >= next_beat:
                    steps = self.relay.report(now) if self.relay is not None else {}
                    if steps or not self._exchanging(now):
                        health = self.relay.health if steps and self.relay is not None else {}
                        self._beat(M.AgentHeartbeat(cfg.node_rank, steps, health), now)
                    next_beat = now + cfg.agent_heartbeat_s
                self._note_training()
                self._wait(self.poll_s)
        except LauncherError as exc:
            log.error("node %d stops: %s", cfg.node_rank, exc)
            self.exit_code = exitcodes.FAILED
        finally:
            self.ranks.close()
            self.close()
        return self.exit_code if self.exit_code is not None else 128 + 15

    def _beat(self, beat: M.AgentHeartbeat, now: float) -> None:
        """Send a heartbeat: through the heartbeat group's leader while it answers, else (and
        while it does not) to the manager."""
        was = self._grouped
        self._grouped = self.group is not None and not self.group.send(beat, self._epoch, now)
        if not self._grouped:
            self.chan.send(beat, self._epoch)
        if self.group is not None and was != self._grouped:  # a leader silent, or back
            node, leader = self.config.node_rank, self.group.leader
            if self._grouped:
                log.info("node %d beats through node %d's agent", node, leader)
            else:
                why = "does not answer or lost the manager"
                log.warning("node %d beats to the manager: node %d's agent %s", node, leader, why)

    def _up(self, batch: M.RelayUp | M.RelayAcks) -> None:
        """Send a relayed batch to the manager: the STOPPED answering a STOP that came
        through the heartbeat group's leader go back through it while it answers."""
        group = self.group
        if (
            isinstance(batch, M.RelayAcks)
            and batch.kind == "stopped"
            and batch.epoch == self._led_stop
            and group is not None
            and group.usable(time.monotonic())
        ):
            group.chan.send(batch, self._epoch)
        else:
            self.chan.send(batch, self._epoch)

    def _exchanging(self, now: float) -> bool:
        """Whether a beat would tell the manager nothing new: this agent is registered, sent
        it another frame (which the manager counts as the node heard) and heard from it within
        the last beat interval. Then the beat is skipped; one that carries steps never is. This
        takes beats off the manager while it stops, rebuilds or forms the job, when nodes relay
        answers anyway (16k ranks: stop-all ~12 % faster). Both directions must be fresh: an agent
        relaying to a manager that answers nothing (a digest per rank every few steps) still
        beats every other interval, and hears the beat's answer."""
        beat = self.config.agent_heartbeat_s
        return self._welcomed and now - self._sent_at < beat and now - self._last_heard < beat

    def _note_training(self) -> None:
        """Tell the hands once every local rank's heartbeat named a committed step (within a
        heartbeat of the last one's first step)."""
        if self._training or self.relay is None:
            return
        if self.relay.stepped.issuperset(self.relay.mine):
            self._training = True
            self.ranks.training()

    def close(self) -> None:
        """Close the relay and the manager channel (:meth:`serve` does it on its way out)."""
        if self.relay is not None:
            self.relay.close()
        if self.group_leader is not None:
            self.group_leader.close()
        if self.group is not None:
            self.group.close()
        if self._monitor is not None:
            self.chan.sock.disable_monitor()
            self._monitor.close(0)
        self.chan.close()
        self._ctx.term()

    def _wait(self, timeout_s: float) -> None:
        """Sleep until a frame arrives (at most ``timeout_s``); relay what the ranks sent at
        once, then handle what the manager sent."""
        ready = dict(self._poller.poll(int(timeout_s * 1000)))
        if self.relay is not None and self.relay.sock in ready and self.relay.drain():
            for batch in self.relay.batches():
                self._up(batch)
            self._sent_at = time.monotonic()
        if ready and self.group is not None and self.group.chan.sock in ready:
            self._group_answers()
        leader = self.group_leader
        if leader is not None:
            now = time.monotonic()
            if leader.sock in ready:
                leader.drain(self._epoch, now - self._last_heard)
                for stopped in leader.stopped():
                    self.chan.send(stopped, self._epoch)
            if leader.due(now):
                self.chan.send(leader.batch(now), self._epoch)
                self._sent_at = now
        env = self.chan.recv_ready() if self.chan.sock in ready else None
        while env is not None:
            if not self._stale(env):
                self._last_heard = time.monotonic()
                self._epoch = max(self._epoch, env.epoch)
                self._handle(env.msg)
            if self.exit_code is not None:
                return
            env = self.chan.recv_ready()

    def _handle(self, msg: M.Message) -> None:
        if isinstance(msg, M.AgentWelcome):
            self._welcomed = msg.ok
            if msg.ok:
                self._link.welcomed()
            if msg.ok and self.group_leader is not None:
                opened = M.GroupOpen(self.config.node_rank, self.group_leader.endpoint)
                self.chan.send(opened, self._epoch)
            if not msg.ok:
                log.error("manager rejected this agent: %s", msg.reason)
                self.exit_code = exitcodes.USAGE
        elif isinstance(msg, M.ManagerBeat) and not self._welcomed:
            self._link.answered()  # the active manager holds this agent's hello
        elif isinstance(msg, M.KillRanks):
            self._report(self.ranks.kill(self._local(msg.ranks)), requested=True)
        elif isinstance(msg, M.StartRanks):
            for rank in self._local(msg.ranks):
                log.info("restarting rank %d in place (%s)", rank, msg.reason)
                self.ranks.start(rank)
        elif isinstance(msg, M.RelayDown):
            self._deliver(msg)
        elif isinstance(msg, M.GroupAt):
            self._join_group(msg)
        elif isinstance(msg, M.GroupStop) and self.group_leader is not None:
            self.group_leader.pass_stop(msg, self._epoch)
        elif isinstance(msg, M.BecomeSpare) and self._own is not None and not self.spare:
            log.warning("node %d: %s", self.config.node_rank, msg.reason)
            self._demoted = True
        elif isinstance(msg, M.Rejoin):
            self._rejoin(msg.reason)
        elif isinstance(msg, M.AgentExit) and msg.code == exitcodes.OK:
            # The job ended: the ranks are finishing (final save, atexit). Wait, bounded.
            log.info("job finished (%s): waiting for the ranks to exit", msg.reason)
            if self._drain is None:
                self._drain = (time.monotonic() + self.config.phase_timeout_s, msg.code)
        elif isinstance(msg, M.AgentExit):
            log.info("manager asks this agent to exit with %d: %s", msg.code, msg.reason)
            self._report(self.ranks.kill(list(self.ranks.pids())), requested=True)
            self.exit_code = msg.code

    def _lead(self) -> None:
        """Lead this node's heartbeat group if the node is its first one and the group has
        others (a spare node, once it took a node's place)."""
        if self.spare or not self.config.group_members(self.config.node_rank):
            return
        self.group_leader = GroupLeader(self._ctx, self.config)
        self._poller.register(self.group_leader.sock, zmq.POLLIN)

    def _join_group(self, msg: M.GroupAt) -> None:
        """Beat to the heartbeat group's leader at ``msg.endpoint`` ("": to the manager), under
        this agent's identity at the manager (the leader names it so in its batches, and the
        manager addresses its STOPs so): a new one after a move to another manager."""
        ident, group = self.chan.identity, self.group
        if group is not None and group.endpoint == msg.endpoint and group.chan.identity == ident:
            return  # said again (the leader registered again at the same place)
        if group is not None:
            self._poller.unregister(group.chan.sock)
            group.close()
            self.group, self._grouped = None, False
        if msg.endpoint:
            self.group = GroupLink(self._ctx, self.config, ident, msg.leader, msg.endpoint)
            self._poller.register(self.group.chan.sock, zmq.POLLIN)

    def _group_answers(self) -> None:
        """The leader's answers: the leader, and through it the manager, heard this agent."""
        assert self.group is not None
        env = self.group.chan.recv_ready()
        while env is not None:
            if isinstance(env.msg, M.GroupAck) and env.msg.node_rank == self.group.leader:
                heard = self.group.answered(env.msg, time.monotonic())
                self._last_heard = max(self._last_heard, heard)
            elif (
                isinstance(env.msg, M.RelayDown)
                and env.sender == f"agent:{self.group.leader}"
                and set(env.msg.kinds) == {"stop"}
            ):
                self._led(env.epoch, env.msg)
            else:
                self.group.chan.drops.drop(f"{env.msg.KIND.decode()} from a group leader", "")
            env = self.group.chan.recv_ready()

    def _led(self, epoch: int, msg: M.RelayDown) -> None:
        """A STOP from the manager through the heartbeat group's leader (never one of an
        epoch older than this agent knows): to the ranks that had none of its epoch yet."""
        if epoch < self._epoch:
            self.chan.drops.drop(f"stale stop of epoch {epoch} from the group leader", "")
        elif self.relay is not None:
            self._epoch, self._led_stop = epoch, epoch
            self.relay.deliver(msg, led=True)

    def _deliver(self, msg: M.RelayDown) -> None:
        if self.relay is None:  # msrun's ranks do not talk to this agent
            self.chan.drops.drop("relay batch for an agent without a relay", "manager")
        else:
            if "stop" in msg.kinds:  # a STOP sent directly: its STOPPED go directly too
                self._led_stop = -1
            self.relay.deliver(msg)

    def _local(self, ranks: list[int]) -> list[int]:
        mine = set(self.config.ranks_of(self.config.node_rank))
        return [r for r in ranks if r in mine]
