"""The node agent: launches this node's ranks, reports their exits, obeys the manager.

It touches rank processes only through its hands (:mod:`ms_recover.agent.hands`): processes it
spawns itself, or msrun's callbacks when msrun is the launcher (:mod:`ms_recover.agent.taskd`).

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
from ms_recover.agent.hands import Exited, LauncherError, RankHands
from ms_recover.agent.ranks import RankSet
from ms_recover.config import JobConfig
from ms_recover.protocol import messages as M
from ms_recover.protocol.codec import Envelope
from ms_recover.protocol.transport import manager_channel

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
        hands: RankHands | None = None,
    ) -> None:
        if not command and hands is None:
            raise ValueError("agent needs a rank command, e.g. -- python train.py")
        self.config = config
        # Our own child processes, unless another launcher (msrun) lends its hands.
        self.ranks: RankHands = (
            hands if hands is not None else RankSet(config, command, log_dir, spares)
        )
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

    @property
    def stopping(self) -> bool:
        """True once :meth:`stop` was called."""
        return self._stop.is_set()

    def run(self) -> int:
        """Register, start every local rank, and serve until the job ends for this node."""
        self.hello()
        return self.serve(start=True)

    def hello(self) -> None:
        """Announce this node to the manager (ZeroMQ queues it until the manager listens)."""
        cfg = self.config
        is_sched = cfg.node_rank == cfg.sched_node_rank
        self.chan.send(
            M.AgentHello(
                cfg.node_rank, cfg.pod_ip, list(cfg.ranks_of(cfg.node_rank)), os.getpid(), is_sched
            ),
            0,
        )

    def await_welcome(self, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` for the manager's answer to :meth:`hello`.

        True once it answered; a refusal sets the exit code, so :meth:`serve` returns at once.
        False when nothing came: no manager is reachable.
        """
        deadline = time.monotonic() + timeout_s
        while not self._stop.is_set() and time.monotonic() < deadline:
            env = self.chan.recv(int(min(0.1, max(0.0, deadline - time.monotonic())) * 1000))
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
        last_heard = time.monotonic()
        try:
            if start and self.exit_code is None:
                self.ranks.start_all(cfg.ranks_of(cfg.node_rank))
                log.info("agent node=%d started ranks %s", cfg.node_rank, self.ranks.pids())
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
        except LauncherError as exc:
            log.error("node %d stops: %s", cfg.node_rank, exc)
            self.exit_code = exitcodes.FAILED
        finally:
            self.ranks.close()
            self.chan.close()
            self._ctx.term()
        return self.exit_code if self.exit_code is not None else 128 + 15

    def _all_done(self) -> bool:
        """Every local rank's latest process exited cleanly and none is running."""
        mine = self.config.ranks_of(self.config.node_rank)
        return not self.ranks.pids() and all(self._last_exit.get(r) == 0 for r in mine)

    def _report(self, exited: list[Exited], requested: bool = False) -> None:
        """Report exits; ``requested``: this agent ended them on the manager's command."""
        for e in exited:
            log.info("rank %d exited code=%d signal=%d", e.rank, e.exit_code, e.signal)
            self._last_exit[e.rank] = e.exit_code if e.signal == 0 else -e.signal
            self.chan.send(
                M.RankExited(
                    self.config.node_rank,
                    e.rank,
                    e.pid,
                    e.exit_code,
                    e.signal,
                    e.observed_at,
                    requested,
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
            self._report(self.ranks.kill(self._local(msg.ranks)), requested=True)
        elif isinstance(msg, M.StartRanks):
            for rank in self._local(msg.ranks):
                log.info("restarting rank %d in place (%s)", rank, msg.reason)
                self.ranks.start(rank)
        elif isinstance(msg, M.AgentExit):
            log.info("manager asks this agent to exit with %d: %s", msg.code, msg.reason)
            self._report(self.ranks.kill(list(self.ranks.pids())), requested=True)
            self.exit_code = msg.code

    def _local(self, ranks: list[int]) -> list[int]:
        mine = set(self.config.ranks_of(self.config.node_rank))
        return [r for r in ranks if r in mine]
