"""The per-rank session: registration, the step loop's safe point, and recovery on command.

The training thread is the only one that touches the backend and the state. Commands from the
manager are latched by the link thread and acted on here, at a safe point between steps:

* STOP: answer with the committed step and a state digest, then wait;
* REBUILD: rebuild every communicator of the group log at the new epoch;
* REPAIR: send and/or receive whole state, checksummed, and load it in place;
* RESUME: continue at the given step;
* EXIT: close and leave the process with the manager's code.

After the last step, :meth:`Session.finish` keeps serving these commands (a finished rank is a
repair source for a rank that fails at the very end) until the manager ends the job.

The rank's :attr:`Session.phase` follows these commands through the transition table of
:mod:`ms_recover.worker.phase`; a command out of order raises RecoveryError and does nothing.

A collective interrupted by a STOP raises :class:`Interrupted`; the step is not committed and
is redone after recovery, so no rank ever goes backwards. A rank whose step was interrupted
while a peer committed it is behind the recovery's target: REPAIR gives it that step's state from
a replica, so it never runs the step itself (:attr:`Session.skipped` records such steps).
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from types import TracebackType
from typing import Any

from numpy.typing import NDArray

from ms_recover.comm.base import CommBackend, ReduceOp
from ms_recover.comm.grouplog import GroupLog
from ms_recover.comm.peers import own_rebuild
from ms_recover.config import JobConfig
from ms_recover.dumpfiles import check_dump_dir
from ms_recover.errors import CommError, Interrupted, RecoveryError, RepairError
from ms_recover.faulthooks import NO_FAULTS, FaultHooks
from ms_recover.protocol import messages as M
from ms_recover.strategy import Strategy
from ms_recover.worker import repair
from ms_recover.worker.dump import write_rank_dump
from ms_recover.worker.health import StepClock
from ms_recover.worker.link import ManagerLink
from ms_recover.worker.phase import COMMANDS, Phase, check
from ms_recover.worker.state import StateProvider, state_digest

log = logging.getLogger("ms_recover.worker")


class Session:
    """One rank's connection to the job. Build it with :func:`ms_recover.init`."""

    def __init__(
        self,
        config: JobConfig,
        rank: int,
        backend: CommBackend,
        state: StateProvider | None = None,
        shard: int = 0,
        incarnation: int = 0,
        faults: FaultHooks | None = None,
        standalone: bool = False,
    ) -> None:
        self.config = config
        self.rank = rank
        self.comm = backend
        self.state = state
        self.shard = shard
        self.incarnation = incarnation
        self.faults = faults if faults is not None else NO_FAULTS
        self._digest_every = config.digest_every_steps
        self.standalone = standalone
        self.committed = -1
        self.next_step = 0
        self.reboot = False
        self.recoveries = 0
        self.phase = Phase.NEW  # moved only through the table of ms_recover.worker.phase
        # (first, last) step ranges whose state this rank received by repair instead of running
        # them: its own step code (and a fit() callback) never saw those steps.
        self.skipped: list[tuple[int, int]] = []
        # (first step, members) of each data-parallel world this rank trained in, in order:
        # what a reference run replays to compare an elastic run bit for bit.
        self.worlds: list[tuple[int, list[int]]] = []
        self._interrupted = False
        self._await_manager = False
        self.total: int | None = None  # the steps of the training loop (steps()), once known
        self.finished = False  # finish() was called: the rank waits for the job's end
        self._report_next_commit = False
        self.members: list[int] = list(range(backend.world_size))
        # Peers answers by group name (the link thread writes, create_group waits for one).
        self._peers: dict[str, dict[int, str]] = {}
        self._peers_cond = threading.Condition()
        self._guard = _Guard(self)
        #: Called once, after the first commit (a former spare tells its agent it settled).
        self.on_first_commit: Callable[[], None] | None = None
        self.link: ManagerLink | None = None
        #: Step and collective timing for the manager's hang and fail-slow detection.
        self.clock = StepClock(config.hang_k, config.hang_floor_s)
        if not standalone:
            ident = f"r{rank}.{incarnation}.{os.getpid()}".encode()
            self.link = ManagerLink(config, rank, ident, backend.abort)
            self.link.health = self.clock.report
            self.link.on_peers = self._on_peers
            backend.on_group_created = self._group_created
        backend.faults = self.faults
        # The backend's per-step hook, or None when it has none (the host backend): then
        # commit() makes no call for it at all (a frame on every step, see commit()).
        hook = getattr(type(backend), "on_step_end", None)
        self._on_step_end = (
            None if hook is None or hook is CommBackend.on_step_end else backend.on_step_end
        )

    @property
    def world_size(self) -> int:
        return self.comm.world_size

    @property
    def data_rank(self) -> int:
        """This rank's position in the current data-parallel world (elastic training)."""
        return self.members.index(self.rank)

    @property
    def data_world(self) -> int:
        """Ranks in the current data-parallel world: ``world_size`` unless running shrunk."""
        return len(self.members)

    # ------------------------------------------------------------------ lifecycle
    def connect(self, timeout_s: float = 60.0) -> None:
        """Register, then wait for the manager's first rebuild/repair/resume.

        Raises RecoveryError if the manager does not answer within ``timeout_s``.
        """
        if self.link is None:
            self.phase = check(self.rank, self.phase, Phase.TRAINING, "a run without a manager")
            self.comm.init(0, {0: self.comm.endpoint})
            return
        if Strategy.DUMP in self.config.strategies:  # now, not at the fault that needs it
            check_dump_dir(self.config.effective_dump_dir())
        self.phase = check(self.rank, self.phase, Phase.REGISTERING, "registration")
        self.link.send(self._hello())
        self.link.registration = self._registration
        self.link.start()
        if not self.wait_for_manager(timeout_s):
            self.link.close()
            raise RecoveryError(
                f"rank {self.rank}: no manager answered at "
                f"{self.config.manager_endpoint} within {timeout_s:g}s"
            )
        self._recover()

    def _hello(self) -> M.WorkerHello:
        return M.WorkerHello(
            self.rank,
            self.config.node_rank,
            os.getpid(),
            self.incarnation,
            self.comm.endpoint,
            self.committed,
            self.shard,
        )

    def _registration(self) -> list[M.Message]:
        """What a restarted manager needs from this rank (called on the link thread): the
        hello with the committed step and data endpoint, every group of the log, and, once
        it waits in :meth:`finish`, that it is done."""
        groups: list[M.Message] = [
            M.GroupCreated(self.rank, name, list(ranks)) for name, ranks in self.comm.group_log
        ]
        if self.finished:  # it waits in finish(): the new manager must know it is done
            groups.append(M.WorkerDone(self.rank, self.committed, True))
        return [self._hello(), *groups]

    def wait_for_manager(self, timeout_s: float) -> bool:
        """True once the manager has answered the registration (Welcome latched)."""
        assert self.link is not None
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.link.has_command():
                return True
            time.sleep(0.01)
        return False

    def finish(self, timeout_s: float | None = None) -> None:
        """Tell the manager this rank is done, stay a member until the job is over, then
        release the sockets.

        Until every rank has finished, this rank is a data-parallel replica at the last step:
        if another rank fails now, it stops, rebuilds and repairs the replacement like any
        survivor (so keep the state provider usable until ``finish()`` returns). It returns
        when the manager says the job is over (Exit 0); an Exit with another code ends the
        process with that code, as anywhere else. If the manager says nothing for
        ``timeout_s`` (default: as long as a recovery may take), it returns anyway: a dead
        manager never hangs a finished rank. A second call does nothing.
        """
        if self.finished:
            return
        self.finished = True
        self.clock.paused = True
        if self.link is None:
            self.comm.close()
            return
        self.link.send(M.WorkerDone(self.rank, self.committed, True))
        try:
            end = self._serve_until_end(self._silence_limit() if timeout_s is None else timeout_s)
        finally:
            self.link.close(flush_s=2.0)
            self.comm.close()
        if end is not None and end.code != 0:
            log.warning("rank %d: manager says exit %d: %s", self.rank, end.code, end.reason)
            sys.exit(end.code)

    def _serve_until_end(self, limit: float) -> M.Exit | None:
        """Carry out the manager's commands until its Exit; None after ``limit`` s of silence."""
        assert self.link is not None
        last = time.monotonic()
        while True:
            env = self.link.next_command(0.5)
            if env is None:
                if time.monotonic() - last > limit:
                    log.warning(
                        "rank %d: finished, and no word from the manager for %gs: leaving",
                        self.rank,
                        limit,
                    )
                    return None
                continue
            last = time.monotonic()
            if isinstance(env.msg, M.Exit):
                self.phase = check(self.rank, self.phase, Phase.EXITED, "exit")
                return env.msg
            try:
                if self._handle(env.epoch, env.msg):
                    self._resumed_after_finish()
            except Interrupted:
                log.info("rank %d: recovery step interrupted by a newer command", self.rank)

    def _resumed_after_finish(self) -> None:
        """A recovery resumed the world while this rank waits in ``finish()``. It is normally
        at the last step already; if the recovery took it back to an earlier step (a replica
        found diverged), it cannot run those steps again: it says so, and the manager
        replaces it."""
        if self.total is not None and self.next_step < self.total:
            why = (
                f"finished training, but the recovery resumed it at step {self.next_step} "
                f"of {self.total}"
            )
            self.report_fault("fatal", why)
            self._await_manager = False  # it serves the manager's commands anyway

    # ------------------------------------------------------------------ the step loop
    def commit(self, step: int) -> None:
        """Record that ``step``'s optimizer update finished on this rank.

        Every ``digest_every_steps`` steps it also sends the digest of the whole state, which
        the manager compares across replicas (one state copy and CRC-32 per check).

        It runs on every step, right after MindSpore's graph (cold caches): every call and
        attribute here costs several times what it costs in a loop of its own, so the usual
        commit is a few stores and tests, with no call at all.
        """
        self.committed = step
        self.next_step = step + 1
        self.clock.committed(time.monotonic())
        if self.faults.armed:
            self.faults.at_commit(step, self)
        link = self.link
        if link is not None:
            link.committed = step  # the heartbeat thread reports it
            if self._report_next_commit:  # the manager waits for it to close a recovery
                self._report_next_commit = False
                link.send(M.WorkerHeartbeat(self.rank, step))
            every = self._digest_every
            if every and (step + 1) % every == 0 and self.state is not None:
                link.send(M.StateDigest(self.rank, step, self._digest()))
        if self._on_step_end is not None:
            self._on_step_end()
        if self.faults.armed:
            self.faults.after_commit(step, flush=self.comm.close)
        if self.on_first_commit is not None:
            callback, self.on_first_commit = self.on_first_commit, None
            callback()

    def safe_point(self) -> None:
        """Handle any latched command; returns once training may go on."""
        if self.link is not None and (self._await_manager or self.link.has_command()):
            self._await_manager = False
            self._recover()

    def steps(self, total: int) -> Iterator[int]:
        """Yield the steps to run, handling recovery between them.

        The loop body should run inside :meth:`guard`; a step whose body returns normally is
        committed, a step interrupted by recovery is redone.
        """
        self.total = total
        # safe_point()'s test, here, with no call: the link's inbox is tested directly
        inbox = self.link.inbox if self.link is not None else ()
        while True:
            if self._await_manager or inbox:
                self.safe_point()
            if self.next_step >= total:
                return
            step, self._interrupted = self.next_step, False
            yield step
            if not self._interrupted:
                self.commit(step)

    def guard(self) -> _Guard:
        """Make the step redoable: an :class:`Interrupted` collective, or a data-plane error
        this rank survived (reported to the manager, which then decides: ``retry`` rebuilds
        and redoes the step), leaves the step uncommitted. Other errors propagate."""
        return self._guard

    def report_fault(self, kind: str, message: str) -> None:
        """Tell the manager this rank hit an error it survived, and wait for its decision at
        the next safe point. ``kind="corrupt"`` (or ``"device_memory"``) marks this rank's state
        as untrustworthy: under ``retry`` it is repaired from a replica."""
        if self.link is None:
            raise RecoveryError(f"rank {self.rank}: {kind}: {message} (no manager to recover)")
        log.warning("rank %d reports %s: %s", self.rank, kind, message)
        self.link.send(M.WorkerFault(self.rank, kind, message))
        self._await_manager = True

    def run(self, step_fn: Callable[[int], Any], total: int) -> int:
        """Call ``step_fn(step)`` for every step up to ``total``; returns the last committed."""
        for step in self.steps(total):
            with self.guard():
                step_fn(step)
        return self.committed

    def allreduce(
        self,
        array: NDArray[Any],
        op: ReduceOp | str = ReduceOp.MEAN,
        out: NDArray[Any] | None = None,
    ) -> NDArray[Any]:
        """The world allreduce of the current step, with its fault-injection point.

        ``out``: where the result goes (``array`` itself: in place), as
        :meth:`CommBackend.allreduce <ms_recover.comm.base.CommBackend.allreduce>`."""
        if self.faults.armed:
            self.faults.at_allreduce(self.next_step, self)
        # StepClock.enter_collective and leave_collective, inline: under GraphStep this runs
        # inside the graph's callback on every step, where each call costs several times more.
        clock = self.clock
        clock.coll_since = since = time.monotonic()
        try:
            if out is None:  # positional: backends (and test doubles) without ``out`` still work
                return self.comm.allreduce(array, op)
            return self.comm.allreduce(array, op, out=out)
        finally:
            if clock.coll_since:
                clock.coll_sum += time.monotonic() - since
            clock.coll_since = 0.0

    def long_stretch(self, name: str) -> contextlib.AbstractContextManager[None]:
        """Mark a stretch of steps that are long on purpose (``with session.long_stretch(
        "eval"):``): the manager's adaptive hang limit does not apply while a rank is inside
        one (the fixed ``hang_timeout_s`` does), and its steps are not timed."""
        log.debug("rank %d: long stretch %r", self.rank, name)
        return self.clock.long_stretch()

    # ------------------------------------------------------------------ recovery
    def _recover(self) -> None:
        assert self.link is not None
        self.clock.paused = True
        try:
            self._serve_recovery()
        finally:
            self.clock.restart(time.monotonic())

    def _serve_recovery(self) -> None:
        assert self.link is not None
        limit = self._silence_limit()
        last = time.monotonic()
        while True:
            env = self.link.next_command(0.5)
            if env is None:
                if time.monotonic() - last > limit:
                    raise RecoveryError(
                        f"rank {self.rank}: no word from the manager for {limit:g}s"
                    )
                continue
            last = time.monotonic()
            try:
                if self._handle(env.epoch, env.msg):
                    return
            except Interrupted:
                log.info("rank %d: recovery step interrupted by a newer command", self.rank)

    def _silence_limit(self) -> float:
        """How long a rank waits for the manager's next command: a whole recovery may pass
        (a pod rescheduled, then every phase) before it hears again."""
        return self.config.wait_reschedule_timeout_s + 4 * self.config.phase_timeout_s

    def _handle(self, epoch: int, msg: M.Message) -> bool:
        """Carry out one command; True when training resumes. A command the rank's phase does
        not allow raises RecoveryError (:mod:`ms_recover.worker.phase`)."""
        assert self.link is not None
        if self.faults.armed and self.committed >= 0:  # fault injection: a recovery phase
            self.faults.at_command(msg.KIND.decode())
        target = COMMANDS.get(type(msg))
        if target is None:
            return False
        log.debug("rank %d: %s -> %s (epoch %d)", self.rank, self.phase, target, epoch)
        self.phase = check(self.rank, self.phase, target, msg.KIND.decode())
        if isinstance(msg, M.Welcome):
            if not msg.ok:
                raise RecoveryError(f"manager rejected rank {self.rank}: {msg.reason}", 2)
            self.reboot = msg.reboot
            self.faults.at_registration()
            log.info("rank %d registered (reboot=%s)", self.rank, msg.reboot)
        elif isinstance(msg, M.Stop):
            self.link.send(M.Stopped(self.rank, self.committed, self._digest()), epoch)
        elif isinstance(msg, M.Rebuild):
            members, groups = self._members_of(msg)
            self.comm.rebuild(epoch, members, GroupLog.from_wire(groups))
            self.members = sorted(members)
            self.link.send(M.Rebuilt(self.rank), epoch)
        elif isinstance(msg, M.Repair):
            self._repair(epoch, msg)
        elif isinstance(msg, M.Resume):
            self.next_step = msg.step
            if not self.worlds or self.worlds[-1][1] != self.members:
                self.worlds.append((msg.step, list(self.members)))
            self._report_next_commit = True
            if msg.step > 0:
                self.recoveries += 1
            log.info("rank %d resumes at step %d (epoch %d)", self.rank, msg.step, epoch)
            return True
        elif isinstance(msg, M.Dump):
            self._dump(epoch, msg)
        elif isinstance(msg, M.Exit):
            self._exit(msg)
        return False

    def _members_of(self, msg: M.Rebuild) -> tuple[dict[int, str], list[list[Any]]]:
        """Rank -> data endpoint of the new world, "" for a member this rank does not send to,
        and the logged groups it is a member of: its own part of its node's REBUILD
        (:func:`~ms_recover.comm.peers.own_rebuild`)."""
        try:
            world = M.ranks_of(msg.world, self.comm.world_size)
        except ValueError as exc:
            raise RecoveryError(f"rank {self.rank}: malformed REBUILD: {exc}") from exc
        strangers = sorted(set(msg.endpoints) - set(world))
        if strangers:
            raise RecoveryError(
                f"rank {self.rank}: malformed REBUILD: endpoints of ranks {strangers} "
                "outside its world"
            )
        return own_rebuild(self.rank, world, msg.endpoints, msg.group_log)

    def _dump(self, epoch: int, msg: M.Dump) -> None:
        assert self.link is not None
        try:
            if self.committed != msg.step:
                raise RepairError(f"rank {self.rank} is at step {self.committed}, not {msg.step}")
            f = write_rank_dump(self._state(), msg.directory, self.rank, self.committed)
        except Exception as exc:  # any failure is reported: the manager then exits the job
            log.error("rank %d: dump failed: %s", self.rank, exc)
            self.link.send(M.Dumped(self.rank, False, msg.step, "", "", "", 0, str(exc)), epoch)
            return
        self.link.send(
            M.Dumped(self.rank, True, f.step, f.file, f.format, f.sha256, f.size, ""), epoch
        )

    def _repair(self, epoch: int, msg: M.Repair) -> None:
        assert self.link is not None
        tag = f"repair.{epoch}.{msg.attempt}"
        try:
            if msg.send_to:
                self.comm.add_peers(msg.endpoints)  # repair pairs are rarely ring neighbours
                payload = repair.pack(self._state_dict(), self.committed)
                if self.faults.armed:
                    self.faults.before_repair_send(payload)
                for dst in msg.send_to:
                    self.comm.send(payload, dst, tag)
            if msg.recv_from >= 0:
                arrays, step = repair.unpack(self.comm.recv(msg.recv_from, tag), msg.recv_from)
                if step != msg.target_step:
                    raise RepairError(
                        f"rank {msg.recv_from} sent step {step}, expected {msg.target_step}"
                    )
                self._load(arrays, msg.recv_from)
                if step > self.committed:
                    self.skipped.append((self.committed + 1, step))
                self.committed = step
                self.link.committed = step
        except (RepairError, CommError) as exc:
            if isinstance(exc, Interrupted):
                raise
            log.error("rank %d: repair failed: %s", self.rank, exc)
            self.link.send(
                M.Repaired(self.rank, msg.attempt, False, self.committed, msg.recv_from, str(exc)),
                epoch,
            )
            return
        self.link.send(M.Repaired(self.rank, msg.attempt, True, self.committed, -1, ""), epoch)

    def _state_dict(self) -> dict[str, Any]:
        """What a repair sends: the whole state, or nothing but the step (in the manifest) for
        a session without a state provider: its only state ms_recover knows of is the step."""
        return self.state.state_dict() if self.state is not None else {}

    def _load(self, arrays: dict[str, Any], src: int) -> None:
        """Load a repair's state; a session without a state provider takes only the step, and
        refuses tensors it has nowhere to put (RepairError)."""
        if self.state is not None:
            if not arrays and self.state.state_dict():
                raise RepairError(
                    f"rank {self.rank} received no state (its source has no state provider); "
                    "pass state= to ms_recover.init() on every rank"
                )
            self.state.load_state_dict(arrays)
        elif arrays:
            raise RepairError(
                f"rank {self.rank} received state {sorted(arrays)[:3]} from rank {src} but has "
                "no state provider; pass state= to ms_recover.init() on every rank"
            )

    def _state(self) -> StateProvider:
        if self.state is None:
            raise RepairError(
                f"rank {self.rank} has no state provider; pass state= to ms_recover.init()"
            )
        return self.state

    def _digest(self) -> str:
        return state_digest(self.state) if self.state is not None else ""

    def _exit(self, msg: M.Exit) -> None:
        log.warning("rank %d: manager says exit %d: %s", self.rank, msg.code, msg.reason)
        if self.link is not None:
            self.link.close()
        self.comm.close()
        sys.exit(msg.code)

    def _group_created(self, name: str, ranks: tuple[int, ...]) -> None:
        """Log the group with the manager and, as a member, wait for the endpoints of the
        peers this rank sends to in it (CommError if they do not come in a phase timeout)."""
        if self.link is None:
            return
        self.link.send(M.GroupCreated(self.rank, name, list(ranks)))
        if self.rank not in ranks:
            return
        timeout = self.config.phase_timeout_s
        with self._peers_cond:
            got = self._peers_cond.wait_for(lambda: name in self._peers, timeout)
            endpoints = self._peers.pop(name, {})
        if not got:
            raise CommError(
                f"rank {self.rank}: the manager sent no data endpoints for group {name!r} "
                f"within {timeout:g}s (a group of that name with other ranks? see its log)"
            )
        self.comm.add_peers(endpoints)

    def _on_peers(self, msg: M.Peers) -> None:
        with self._peers_cond:
            self._peers[msg.name] = dict(msg.endpoints)
            self._peers_cond.notify_all()


class _Guard:
    """:meth:`Session.guard`. A class, not ``contextlib.contextmanager``: a generator-based
    guard around a MindSpore step cost about 1 % of a 1 ms step (``bench overhead``)."""

    def __init__(self, session: Session) -> None:
        self.session = session

    def __enter__(self) -> None:
        return None

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> bool:
        if kind is None:
            return False
        session = self.session
        if isinstance(exc, Interrupted):
            session._interrupted = True
            return True
        if isinstance(exc, CommError) and session.link is not None:
            session._interrupted = True
            session.report_fault("comm", str(exc))
            return True
        return False
