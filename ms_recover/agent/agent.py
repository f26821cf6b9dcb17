"""The node agent: launches this node's ranks, reports their exits, obeys the manager.

Guarantees:

* every rank exit is reported to the manager within one poll interval (20 ms by default) with
  its exit code or signal;
* KillRanks and StartRanks are carried out in the order received, so "kill leftovers, then
  restart" never races;
* AgentExit kills every local rank and makes :meth:`Agent.run` return the given code (the pod
  supervisor recreates the pod on :data:`~ms_recover.exitcodes.RESCHEDULE`);
* on SIGTERM (or :meth:`Agent.stop`) every child is terminated and reaped before returning;
* if the manager stays silent for ``phase_timeout_s`` (it answers every heartbeat), the
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
from ms_recover.protocol.codec import Envelope
from ms_recover.transport import manager_channel

log = logging.getLogger("ms_recover.agent")

_COMMANDS = (M.KillRanks, M.StartRanks, M.AgentExit)


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
        ident = f"a{config.node_rank}.{os.getpid()}".encode()
        self.chan = manager_channel(self._ctx, config, f"agent:{config.node_rank}", ident)
        self._manager_nonce, self._manager_epoch = -1, 0
        self.exit_code: int | None = None
        self._last_exit: dict[int, int] = {}

    def stop(self) -> None:
        """Ask run() to terminate the children and return (safe from a signal handler)."""
        self._stop.set()

    def run(self) -> int:
        cfg = self.config
        is_sched = cfg.node_rank == cfg.sched_node_rank
        self.chan.send(
            M.AgentHello(
                cfg.node_rank, cfg.pod_ip, list(cfg.ranks_of(cfg.node_rank)), os.getpid(), is_sched
            ),
            0,
        )
        for rank in cfg.ranks_of(cfg.node_rank):
            self.ranks.start(rank)
        self.ranks.spares.fill()
        log.info("agent node=%d started ranks %s", cfg.node_rank, self.ranks.pids())
        next_beat = 0.0
        last_heard = time.monotonic()
        try:
            while self.exit_code is None and not self._stop.is_set():
                self._report(self.ranks.poll())
                if time.monotonic() - last_heard > cfg.phase_timeout_s:
                    log.error(
                        "manager at %s silent for %.0fs: stopping this node",
                        cfg.manager_endpoint,
                        cfg.phase_timeout_s,
                    )
                    self.exit_code = exitcodes.FAILED
                    break
                if time.monotonic() >= next_beat:
                    self.chan.send(M.AgentHeartbeat(cfg.node_rank, self.ranks.pids()), self._epoch)
                    next_beat = time.monotonic() + cfg.heartbeat_s
                env = self.chan.recv(int(self.poll_s * 1000))
                if env is not None and not self._stale(env):
                    last_heard = time.monotonic()
                    self._epoch = max(self._epoch, env.epoch)
                    self._handle(env.msg)
                if self.exit_code is None and self._all_done():
                    self.exit_code = exitcodes.OK
        finally:
            self.ranks.close()
            self.chan.close()
            self._ctx.term()
        return self.exit_code if self.exit_code is not None else 128 + 15

    def _all_done(self) -> bool:
        """Every local rank's latest process exited cleanly and none is running."""
        mine = self.config.ranks_of(self.config.node_rank)
        return not self.ranks.procs and all(self._last_exit.get(r) == 0 for r in mine)

    def _report(self, exited: list[Exited]) -> None:
        for e in exited:
            log.info("rank %d exited code=%d signal=%d", e.rank, e.exit_code, e.signal)
            self._last_exit[e.rank] = e.exit_code if e.signal == 0 else -e.signal
            self.chan.send(
                M.RankExited(
                    self.config.node_rank, e.rank, e.pid, e.exit_code, e.signal, e.observed_at
                ),
                self._epoch,
            )

    def _stale(self, env: Envelope) -> bool:
        """A command of an older epoch from the same manager incarnation is never carried out
        (a restarted manager, with a new nonce, starts its own epoch count)."""
        if env.nonce != self._manager_nonce:
            self._manager_nonce, self._manager_epoch = env.nonce, env.epoch
        elif env.epoch < self._manager_epoch and isinstance(env.msg, _COMMANDS):
            self.chan.drops.drop(f"stale {env.msg.KIND.decode()} of epoch {env.epoch}", "manager")
            return True
        self._manager_epoch = max(self._manager_epoch, env.epoch)
        return False

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
        elif isinstance(msg, M.AgentExit):
            log.info("manager asks this agent to exit with %d: %s", msg.code, msg.reason)
            self._report(self.ranks.kill(list(self.ranks.procs)))
            self.exit_code = msg.code

    def _local(self, ranks: list[int]) -> list[int]:
        mine = set(self.config.ranks_of(self.config.node_rank))
        return [r for r in ranks if r in mine]
