"""The MindIO-style processor: one per rank, an ms_recover worker link behind ``framework_ttp``.

MindSpore's training thread talks to it through ``tft_end_updating_os`` (the committed step),
``tft_pause_train`` (where the prelock holds it), ``tft_report_error`` and
``tft_wait_next_action``. The manager's commands arrive on the link thread and are carried out
on the processor's own action thread by calling the handlers MindSpore registered, in MindIO's
order:

* STOP: the stop handler (not on a rank whose training thread already reported its error: it
  has left the step; with the prelock armed, once the training thread parks there, bounded by
  the action timeout), the prelock released, then the training thread's report awaited
  (bounded by the action timeout); answered with STOPPED and the committed step;
* REBUILD: the clean handler, then the rebuild_group handler (and the host data plane, if the
  job attached one); answered with REBUILT;
* REPAIR: the repair handler with ``RT_SEND`` (``src``/``dst`` lists from our planner) and/or
  ``RT_RECV_REPAIR``, or ``RT_ROLLBACK`` for a rank ahead of the target; answered with REPAIRED;
* RESUME: the repair step set, ``tft_wait_next_action`` released with ``RETRY``;
* DUMP: the save_ckpt handler; EXIT: the rename handler once (after a dump), the training
  thread released with ``EXIT``, then the exit handler.

A handler that raises, or runs past the action timeout, is reported to the manager as a
``fatal`` fault, so the job escalates to its next strategy. The first formation round
(before any training) is acknowledged without calling handlers: MindSpore's communicators are
already built by then.

The link goes through the node agent's relay when ``ms-recover agent`` launched the process
(``MS_RECOVER_RELAY_ENDPOINT``); under msrun it connects to the manager directly.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import threading
import time
from collections.abc import Callable
from typing import Any

from ms_recover import exitcodes
from ms_recover.comm.base import CommBackend
from ms_recover.comm.grouplog import GroupLog
from ms_recover.comm.peers import own_rebuild
from ms_recover.config import JobConfig
from ms_recover.errors import CommError
from ms_recover.integrations.mindio.enums import Action, RepairType, ReportState
from ms_recover.integrations.mindio.handlers import (
    HANDLER_ARITY,
    HandlerFailed,
    TtpError,
    call_bounded,
    claim_rename,
    positional_count,
    saved_checkpoint,
)
from ms_recover.protocol import messages as M
from ms_recover.worker.dump import file_sha256
from ms_recover.worker.link import ManagerLink

log = logging.getLogger("ms_recover.integrations.mindio")

#: The strategy at the head of the manager's STOP reason -> MindIO's repair type. Our retry
#: rebuilds the communicators (MindIO's ``retry`` would only resume them), so it is MindIO's
#: ``recover`` path: clean, rebuild_group, repair.
REPAIR_TYPE_OF = {
    "retry": "recover",
    "recover-in-place": "recover",
    "recover": "recover",
    "elastic-training": "recover",
    "dump": "dump",
}

#: Reports after which the training thread has left its step with an error -> WorkerFault kind.
#: ``fatal``: MindSpore re-raises after RS_UNKNOWN, so the rank cannot redo the step.
FAULT_KIND = {
    ReportState.RS_UCE: "device_memory",
    ReportState.RS_UCE_CORRUPTED: "corrupt",
    ReportState.RS_HCCL_FAILED: "comm",
    ReportState.RS_UNKNOWN: "fatal",
}


class Processor:
    """One rank's processor. Build it, register handlers, then :meth:`start`."""

    def __init__(
        self, rank: int, world_size: int, config: JobConfig, action_timeout_s: float = 0.0
    ) -> None:
        if not 0 <= rank < world_size:
            raise TtpError(f"rank {rank} is outside the world 0..{world_size - 1}")
        self.rank, self.world_size, self.config = rank, world_size, config
        self.action_timeout_s = action_timeout_s or config.phase_timeout_s
        self.handlers: dict[str, tuple[Callable[..., Any], Any]] = {}
        self.step_args: Any = None
        self.replica_info: list[dict[str, Any]] = []
        self.data_plane: CommBackend | None = None
        self.link: ManagerLink | None = None
        self.committed = -1  # ms_recover's 0-based step index: tft_end_updating_os(n) -> n - 1
        self.repair_step = 0
        self.repair_type = "unknow"
        self.reboot = False
        self.trace: list[str] = []  # the handlers called, in order ("stop", "clean", ...)
        self.on_exit: Callable[[], object] | None = None  # stub mode: let the local manager end
        self._cv = threading.Condition()
        self._limit: int | None = None
        self._parked = False  # the training thread waits in the prelock
        self._report: ReportState | None = None
        self._next: Action | None = None
        self._stopping = False
        self._formed = False
        self._announce = False
        self._dump: tuple[int, str] | None = None
        self._done = False
        self._closed = threading.Event()
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------------ setup
    def register(self, name: str, fn: Callable[..., Any], ctx: Any) -> None:
        """Register a handler; a callable of another arity than MindIO's is refused."""
        if name not in HANDLER_ARITY:
            raise TtpError(f"unknown handler {name!r}: one of {', '.join(HANDLER_ARITY)}")
        if not callable(fn):
            raise TtpError(f"the {name} handler must be callable, got {type(fn).__name__}")
        want = HANDLER_ARITY[name]
        got = positional_count(fn)
        if want is not None and got is not None and got != want:
            raise TtpError(
                f"the {name} handler {getattr(fn, '__qualname__', fn)!r} takes {got} "
                f"positional parameters, MindIO passes {want} (MindSpore 2.10's signature)"
            )
        self.handlers[name] = (fn, ctx)

    def start(self, timeout_s: float = 60.0) -> None:
        """Register with the manager and wait for its welcome; TtpError if none comes."""
        ident = f"ttp{self.rank}.{os.getpid()}".encode()
        self.link = ManagerLink(self.config, self.rank, ident, self._wake)
        endpoint = self.data_plane.endpoint if self.data_plane is not None else ""
        self.link.send(
            M.WorkerHello(
                self.rank, self.config.node_of(self.rank), os.getpid(), 0, endpoint, -1, 0
            )
        )
        self.link.start()
        env = self.link.next_command(timeout_s)
        if env is None or not isinstance(env.msg, M.Welcome):
            self.link.close()
            raise TtpError(
                f"rank {self.rank}: no manager answered at {self.config.manager_endpoint} "
                f"within {timeout_s:g}s"
            )
        if not env.msg.ok:
            self.link.close()
            raise TtpError(f"manager rejected rank {self.rank}: {env.msg.reason}")
        self.reboot = self._formed = env.msg.reboot
        self._thread = threading.Thread(
            target=self._serve, name=f"ms-recover-ttp-{self.rank}", daemon=True
        )
        self._thread.start()

    def done(self) -> None:
        """Training ended normally: tell the manager (once)."""
        if self.link is not None and not self._done:
            self._done = True
            self.link.send(M.WorkerDone(self.rank, self.committed))

    def close(self) -> None:
        self._closed.set()
        self._wake()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)
        if self.link is not None:
            self.link.close(flush_s=1.0)
            self.link = None

    # ------------------------------------------------------------------ training thread
    def end_updating_os(self, step: int) -> None:
        """MindSpore finished the optimizer update of its ``step``-th step (1-based count)."""
        self.committed = step - 1
        if self.link is not None:
            self.link.committed = self.committed
            if self._announce:  # the manager waits for it to close a recovery
                self._announce = False
                self.link.send(M.WorkerHeartbeat(self.rank, self.committed))

    def pause_train(self, step: int) -> None:
        """The prelock: block while ``step`` has reached the limit step, until released."""
        with self._cv:
            while self._limit is not None and step >= self._limit and not self._closed.is_set():
                if not self._parked:
                    self._parked = True
                    self._cv.notify_all()
                self._cv.wait(0.5)
            self._parked = False

    def set_limit_step(self, step: int) -> None:
        with self._cv:
            self._limit = step
            self._cv.notify_all()

    def reset_limit_step(self) -> None:
        """No limit step: the prelock lets the training thread through."""
        with self._cv:
            self._limit = None
            self._cv.notify_all()

    def report_error(self, state: int) -> None:
        """The training thread left its step: ForceStop (RS_NORMAL), a fault, or a handshake."""
        try:
            st = ReportState(state)
        except ValueError:
            valid = ", ".join(f"{s.name}={s.value}" for s in ReportState)
            raise TtpError(f"tft_report_error({state!r}): not a ReportState ({valid})") from None
        with self._cv:
            self._report = st
            stopping = self._stopping
            self._cv.notify_all()
        kind = FAULT_KIND.get(st)
        log.warning("rank %d: training thread reports %s", self.rank, st.name)
        if kind and not stopping and self.link is not None:
            self.link.send(M.WorkerFault(self.rank, kind, f"training thread reported {st.name}"))
        if st is ReportState.RS_UNKNOWN:
            # MindSpore re-raises right after this call: hold the thread so the manager's
            # decision (dump, then exit) runs before the process ends, bounded.
            self._wait(lambda: self._next is not None, self._patience())

    def wait_next_action(self) -> int:
        """Block until the manager's decision: ``Action.RETRY.value`` or ``Action.EXIT.value``."""
        if not self._wait(lambda: self._next is not None, self._patience()):
            log.error("rank %d: no decision from the manager; exiting", self.rank)
            return Action.EXIT.value
        with self._cv:
            action, self._next = self._next, None
        assert action is not None
        if action is Action.EXIT:
            with self._cv:  # every later wait answers EXIT too
                self._next = Action.EXIT
        return action.value

    def can_do_uce_repair(self, error_time: int, opt_start: int, opt_end: int) -> bool:
        """A UCE outside the optimizer update leaves consistent state; inside it, only a
        replica can repair it."""
        inside = opt_start <= error_time and (opt_end < opt_start or error_time <= opt_end)
        replicas = max((int(i.get("replica_cnt", 1)) for i in self.replica_info), default=1)
        return not inside or replicas > 1

    # ------------------------------------------------------------------ action thread
    def _serve(self) -> None:
        while not self._closed.is_set():
            link = self.link
            env = link.next_command(0.5) if link is not None else None
            if env is None:
                continue
            try:
                self._handle(env.epoch, env.msg)
            except Exception as exc:  # a handler or the data plane failed: the manager decides
                log.error("rank %d: %s failed: %s", self.rank, env.msg.KIND.decode(), exc)
                if self.link is not None:
                    self.link.send(M.WorkerFault(self.rank, "fatal", str(exc)), env.epoch)

    def _handle(self, epoch: int, msg: M.Message) -> None:
        assert self.link is not None
        if isinstance(msg, M.Stop):
            self._on_stop(msg)
            self.link.send(M.Stopped(self.rank, self.committed, ""), epoch)
        elif isinstance(msg, M.Rebuild):
            self._on_rebuild(epoch, msg)
            self.link.send(M.Rebuilt(self.rank), epoch)
        elif isinstance(msg, M.Repair):
            self.link.send(self._on_repair(msg), epoch)
        elif isinstance(msg, M.Resume):
            self._on_resume(msg)
        elif isinstance(msg, M.Dump):
            self.link.send(self._on_dump(msg), epoch)
        elif isinstance(msg, M.Exit):
            self._on_exit(msg)

    def _on_stop(self, msg: M.Stop) -> None:
        self.repair_type = REPAIR_TYPE_OF.get(msg.reason.split(":", 1)[0].strip(), "unknow")
        with self._cv:
            self._stopping = True
            reported = self._report is not None
        if not self._formed or reported:
            return  # not training yet, or the training thread already left its step
        if self._limit is not None:
            # The prelock is armed: a survivor's state is consistent once it parks there.
            # Stopping it earlier, between its optimizer update and the step end's flag
            # reset, makes MindSpore's stop handler refuse ("inconsistent state").
            if not self._wait(
                lambda: self._parked or self._report is not None, self.action_timeout_s
            ):
                log.warning("rank %d: not parked in the prelock; stopping anyway", self.rank)
        try:
            if "stop" in self.handlers:
                fn, ctx = self.handlers["stop"]
                self._call("stop", fn, self.step_args, ctx)
        finally:
            self.reset_limit_step()  # the prelock lets the thread reach its safe point
        if not self._wait(lambda: self._report is not None, self.action_timeout_s):
            raise HandlerFailed(
                f"rank {self.rank}: the training thread did not report within "
                f"{self.action_timeout_s:g}s of the stop"
            )

    def _on_rebuild(self, epoch: int, msg: M.Rebuild) -> None:
        world = M.ranks_of(msg.world, self.world_size)
        # Only the peers this rank sends to keep an endpoint (ms_recover.comm.peers).
        members, groups = own_rebuild(self.rank, world, msg.endpoints, msg.group_log)
        if self._formed and not self.reboot:
            fn, ctx = self._handler("clean")
            is_uce = self._report in (ReportState.RS_UCE, ReportState.RS_UCE_CORRUPTED)
            ret = self._call("clean", fn, is_uce, self.step_args, ctx)
            if ret == 1:
                raise HandlerFailed(f"rank {self.rank}: the clean handler returned 1 (failed)")
            fn, ctx = self._handler("rebuild_group")
            faulty = [self.rank] if self._report in FAULT_KIND else []
            self._call("rebuild_group", fn, faulty, self.step_args, ctx)
        if self.data_plane is not None:
            if msg.full and not self._formed:
                self.data_plane.init(epoch, members)
            else:
                self.data_plane.rebuild(epoch, members, GroupLog.from_wire(groups))

    def _on_repair(self, msg: M.Repair) -> M.Repaired:
        ok = M.Repaired(self.rank, msg.attempt, True, self.committed, -1, "")
        if not self._formed:
            return ok
        if self.reboot:  # held until the survivors rebuilt: now the init handshake goes on
            self._release(Action.RETRY)
            if not self._wait(
                lambda: self._report is ReportState.RS_PREREPAIR_FINISH, self.action_timeout_s
            ):
                return M.Repaired(
                    self.rank, msg.attempt, False, self.committed, -1, "no RS_PREREPAIR_FINISH"
                )
        step = msg.target_step + 1  # MindSpore counts steps done
        infos: list[dict[str, Any]] = []
        if msg.send_to:
            infos.append(_info(RepairType.RT_SEND, [self.rank] * len(msg.send_to), msg.send_to))
        if msg.recv_from >= 0:
            infos.append(_info(RepairType.RT_RECV_REPAIR, [msg.recv_from], [self.rank]))
        elif self.committed > msg.target_step:
            infos.append(_info(RepairType.RT_ROLLBACK, [self.rank], [self.rank]))
        error_ranks = list(msg.send_to) if msg.send_to else [self.rank]
        try:
            if self.data_plane is not None and msg.endpoints:
                self.data_plane.add_peers(msg.endpoints)  # send_recv's destinations
            for info in infos:
                fn, ctx = self._handler("repair")
                self._call("repair", fn, step, True, error_ranks, info, self.step_args, ctx)
        except (HandlerFailed, CommError) as exc:
            return M.Repaired(
                self.rank, msg.attempt, False, self.committed, msg.recv_from, str(exc)
            )
        if msg.recv_from >= 0 or self.committed > msg.target_step:
            self.committed = msg.target_step
            if self.link is not None:
                self.link.committed = self.committed
        return M.Repaired(self.rank, msg.attempt, True, self.committed, -1, "")

    def _on_resume(self, msg: M.Resume) -> None:
        self._announce = True  # the first commit closes the round: report it at once
        if not self._formed:
            self._formed = True
            return
        self.repair_step = msg.step
        with self._cv:  # the incident is over, and so is its prelock
            self._report, self._stopping, self._limit = None, False, None
        log.info("rank %d: resume at step %d", self.rank, msg.step)
        self._release(Action.RETRY)

    def _on_dump(self, msg: M.Dump) -> M.Dumped:
        fn, ctx = self._handler("save_ckpt")
        try:
            self._call("save_ckpt", fn, msg.step + 1, self.replica_info, self.step_args, ctx)
        except HandlerFailed as exc:
            return M.Dumped(self.rank, False, msg.step, "", "", "", 0, str(exc))
        self._dump = (msg.step, msg.directory)
        name = f"rank_{self.rank}.ckpt"
        saved = saved_checkpoint(ctx, msg.step + 1, self.rank)
        if saved is None:  # a user save callback: its files are where it put them
            return M.Dumped(self.rank, True, msg.step, name, "mindspore", "", 0, "")
        # The manifest names files in the dump directory: link MindSpore's file there (its
        # directory is renamed later; the link stays valid), copying across file systems.
        os.makedirs(msg.directory, exist_ok=True)
        target = os.path.join(msg.directory, name)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(target)
        try:
            os.link(saved, target)
        except OSError:
            shutil.copyfile(saved, target)
        sha256, size = file_sha256(target)
        return M.Dumped(self.rank, True, msg.step, name, "mindspore", sha256, size, "")

    def _on_exit(self, msg: M.Exit) -> None:
        log.warning("rank %d: manager says exit %d: %s", self.rank, msg.code, msg.reason)
        if self._dump is not None and msg.code == exitcodes.DUMPED and claim_rename(*self._dump):
            fn, ctx = self._handler("rename")
            with contextlib.suppress(HandlerFailed):
                self._call("rename", fn, self._dump[0] + 1, ctx)
        self._release(Action.EXIT)
        self.reset_limit_step()
        if self.on_exit is not None:
            self.on_exit()
        if "exit" in self.handlers:
            fn, ctx = self.handlers["exit"]
            self.trace.append("exit")
            fn(ctx)  # MindSpore's exits the process
        else:  # registered nothing yet: leave as MindIO's processor does
            os._exit(1)

    # ------------------------------------------------------------------ helpers
    def _handler(self, name: str) -> tuple[Callable[..., Any], Any]:
        if name not in self.handlers:
            raise HandlerFailed(f"rank {self.rank}: no {name} handler registered")
        return self.handlers[name]

    def _call(self, name: str, fn: Callable[..., Any], *args: Any) -> Any:
        self.trace.append(name)
        return call_bounded(
            f"rank {self.rank}: the {name} handler", fn, args, self.action_timeout_s
        )

    def _release(self, action: Action) -> None:
        with self._cv:
            self._next = action
            self._cv.notify_all()

    def _wait(self, ready: Callable[[], bool], timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        with self._cv:
            while not ready():
                left = deadline - time.monotonic()
                if left <= 0 or self._closed.is_set():
                    return ready()
                self._cv.wait(min(left, 0.5))
        return True

    def _wake(self) -> None:
        with self._cv:
            self._cv.notify_all()

    def _patience(self) -> float:
        return self.config.wait_reschedule_timeout_s + 4 * self.config.phase_timeout_s


def _info(kind: RepairType, src: list[int], dst: list[int]) -> dict[str, Any]:
    return {"repair_type": kind.value, "src": list(src), "dst": list(dst)}
