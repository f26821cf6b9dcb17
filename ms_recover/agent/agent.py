"""The node agent: launches this node's ranks, reports their exits, obeys the manager.

Guarantees:

* every rank exit is reported to the manager within one poll interval (20 ms by default) with
  its exit code or signal;
* KillRanks and StartRanks are carried out in the order received, so "kill leftovers, then
  restart" never races;
* AgentExit kills every local rank and makes :meth:`Agent.run` return the given code (the pod
  supervisor recreates the pod on :data:`~ms_recover.exitcodes.RESCHEDULE`); at the normal end
  of the job (code 0) the ranks are instead given up to ``phase_timeout_s`` to leave on their
  own (``session.finish()`` returns, atexit runs), and their real exit codes are reported;
* on SIGTERM (or :meth:`Agent.stop`) every child is terminated and reaped before returning;
* a manager silent for ``heartbeat_s * liveness`` (it answers every heartbeat) gets a fresh
  DEALER socket, then again after twice as long, and so on (Paranoid Pirate); when a restarted
  manager asks (``Rejoin``) the agent registers again and re-sends the last exit of every local
  rank that is not running, so a fault that happened while the manager was away is handled;
* if the manager stays silent for ``lost_manager_grace_s`` (default ``phase_timeout_s``), the
  ranks are killed and the agent exits 1: without a manager nothing can be recovered.
"""

from __future__ import annotations

import logging
import os
import threading
import time

import zmq

from ms_recover import exitcodes
from ms_recover.agent.ranks import Exited, RankSet
from ms_recover.config import JobConfig
from ms_recover.protocol import messages as M
from ms_recover.protocol.codec import Codec
from ms_recover.transport import DealerChannel

log = logging.getLogger("ms_recover.agent")


class Agent:
    def __init__(
        self,
        config: JobConfig,
        command: list[str],
        log_dir: str = "",
        poll_s: float = 0.02,
        spares: int = 0,
    ) -> None:
        if not command:
            raise ValueError("agent needs a rank command, e.g. -- python train.py")
        self.config = config
        self.ranks = RankSet(config, command, log_dir, spares)
        self.poll_s = poll_s
        self._stop = threading.Event()
        self._epoch = 0
        self._ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        codec = Codec(config.job_id, config.effective_secret(), config.max_frame_bytes)
        ident = f"a{config.node_rank}.{os.getpid()}".encode()
        self.chan = DealerChannel(
            self._ctx, config.manager_endpoint, codec, f"agent:{config.node_rank}", ident
        )
        self.exit_code: int | None = None
        self._exits: dict[int, Exited] = {}  # the last exit of each local rank
        self._drain: tuple[float, int] | None = None  # (deadline, exit code) at the job's end
        self._last_heard = time.monotonic()
        self._reconnect_after = config.silence_s

    def stop(self) -> None:
        """Ask run() to terminate the children and return (safe from a signal handler)."""
        self._stop.set()

    def run(self) -> int:
        cfg = self.config
        self._hello()
        for rank in cfg.ranks_of(cfg.node_rank):
            self.ranks.start(rank)
        self.ranks.spares.fill()
        log.info("agent node=%d started ranks %s", cfg.node_rank, self.ranks.pids())
        next_beat = 0.0
        self._last_heard = time.monotonic()
        try:
            while self.exit_code is None and not self._stop.is_set():
                self._report(self.ranks.poll())
                if self._drain is not None:
                    self._drained()
                    if self.exit_code is not None:
                        break
                elif not self._manager_alive():
                    self.exit_code = exitcodes.FAILED
                    break
                if time.monotonic() >= next_beat:
                    self.chan.send(M.AgentHeartbeat(cfg.node_rank, self.ranks.pids()), self._epoch)
                    next_beat = time.monotonic() + cfg.heartbeat_s
                env = self.chan.recv(int(self.poll_s * 1000))
                if env is not None:
                    self._last_heard = time.monotonic()
                    self._reconnect_after = cfg.silence_s
                    self._epoch = max(self._epoch, env.epoch)
                    self._handle(env.msg)
                if self.exit_code is None and self._all_done():
                    self.exit_code = exitcodes.OK
        finally:
            self.ranks.close()
            self.chan.close()
            self._ctx.term()
        return self.exit_code if self.exit_code is not None else 128 + 15

    def _hello(self) -> None:
        cfg = self.config
        is_sched = cfg.node_rank == cfg.sched_node_rank
        hello = M.AgentHello(
            cfg.node_rank, cfg.pod_ip, list(cfg.ranks_of(cfg.node_rank)), os.getpid(), is_sched
        )
        self.chan.send(hello, self._epoch)

    def _manager_alive(self) -> bool:
        """False once the manager has been silent for the grace; meanwhile, reconnect with a
        doubling backoff so a restarted manager on the same address is found."""
        quiet = time.monotonic() - self._last_heard
        grace = self.config.lost_manager_grace_s
        if quiet > grace:
            log.error(
                "manager at %s silent for %.0fs: stopping this node",
                self.config.manager_endpoint,
                grace,
            )
            return False
        if quiet > self._reconnect_after:
            log.warning("manager silent for %.1fs: reconnecting", quiet)
            self.chan.reconnect()
            self._reconnect_after *= 2
        return True

    def _rejoin(self, reason: str) -> None:
        """A restarted manager does not know this node: register again, then report the last
        exit of each local rank that is not running (it may have died while no one listened)."""
        log.warning("%s: registering again", reason)
        self._hello()
        for rank, exited in sorted(self._exits.items()):
            if rank not in self.ranks.procs:
                self._send_exit(exited)

    def _drained(self) -> None:
        """At the job's end: exit once every rank left on its own, or kill the rest at the
        deadline (their exits are reported as they are)."""
        assert self._drain is not None
        deadline, code = self._drain
        if self.ranks.procs and time.monotonic() < deadline:
            return
        if self.ranks.procs:
            log.warning("ranks %s still running at the end of the job: killing", self.ranks.pids())
            self._report(self.ranks.kill(list(self.ranks.procs)))
        self.exit_code = code

    def _all_done(self) -> bool:
        """Every local rank's latest process exited cleanly and none is running."""
        mine = self.config.ranks_of(self.config.node_rank)
        return not self.ranks.procs and all(
            r in self._exits and self._exits[r].exit_code == 0 and not self._exits[r].signal
            for r in mine
        )

    def _report(self, exited: list[Exited]) -> None:
        for e in exited:
            log.info("rank %d exited code=%d signal=%d", e.rank, e.exit_code, e.signal)
            self._exits[e.rank] = e
            self._send_exit(e)

    def _send_exit(self, e: Exited) -> None:
        self.chan.send(
            M.RankExited(
                self.config.node_rank, e.rank, e.pid, e.exit_code, e.signal, e.observed_at
            ),
            self._epoch,
        )

    def _handle(self, msg: M.Message) -> None:
        if isinstance(msg, M.AgentWelcome) and not msg.ok:
            log.error("manager rejected this agent: %s", msg.reason)
            self.exit_code = exitcodes.USAGE
        elif isinstance(msg, M.KillRanks):
            self._report(self.ranks.kill(self._local(msg.ranks)))
        elif isinstance(msg, M.StartRanks):
            for rank in self._local(msg.ranks):
                log.info("restarting rank %d in place (%s)", rank, msg.reason)
                self.ranks.start(rank)
        elif isinstance(msg, M.Rejoin):
            self._rejoin(msg.reason)
        elif isinstance(msg, M.AgentExit) and msg.code == exitcodes.OK:
            # The job ended: the ranks are finishing (final save, atexit). Wait, bounded.
            log.info("job finished (%s): waiting for the ranks to exit", msg.reason)
            if self._drain is None:
                self._drain = (time.monotonic() + self.config.phase_timeout_s, msg.code)
        elif isinstance(msg, M.AgentExit):
            log.info("manager asks this agent to exit with %d: %s", msg.code, msg.reason)
            self._report(self.ranks.kill(list(self.ranks.procs)))
            self.exit_code = msg.code

    def _local(self, ranks: list[int]) -> list[int]:
        mine = set(self.config.ranks_of(self.config.node_rank))
        return [r for r in ranks if r in mine]
