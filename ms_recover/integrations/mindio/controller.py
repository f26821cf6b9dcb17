"""The MindIO controller for MindSpore's stub mode: the ms_recover manager, inside rank 0.

Without ``MINDX_TASK_ID`` MindSpore starts the controller in rank 0's process
(``tft_init_controller`` / ``tft_start_controller``) at ``MS_TFT_IP:MS_TFT_PORT``. Here that is
a :class:`~ms_recover.manager.server.ManagerServer` on a thread, so processors of every rank
register with it like ms_recover workers. What this gives up against a stand-alone manager
(``ms-recover manager`` on the scheduler host, ``MINDX_TASK_ID`` set): the manager dies with
rank 0, so neither a fault of rank 0's process nor the loss of node 0 can be recovered, and
the manager cannot be restarted without ending the job.

MindX callbacks (``tft_register_mindx_callback``) are called on the manager's fault and
decision events. MindIO's controller calls ``report_fault_ranks`` with two arguments while
MindSpore 2.10's stub takes one: each callback gets as many as it accepts.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from ms_recover.config import JobConfig
from ms_recover.errors import ConfigError
from ms_recover.integrations.mindio.handlers import TtpError, positional_count
from ms_recover.manager.server import ManagerServer
from ms_recover.observability.events import Event, EventLog
from ms_recover.observability.schema import (
    DecisionRecord,
    FaultRecord,
    JobState,
    MindxNoticeRecord,
    RecoveryRecord,
    SchemaError,
    decode,
)

log = logging.getLogger("ms_recover.integrations.mindio")

MINDX_CALLBACKS = (
    "report_fault_ranks",
    "report_stop_complete",
    "report_strategies",
    "report_result",
)


def check_callback(name: str, fn: object) -> None:
    """TtpError unless ``name`` is a MindX callback name and ``fn`` is callable."""
    if name not in MINDX_CALLBACKS:
        raise TtpError(f"unknown MindX callback {name!r}: one of {', '.join(MINDX_CALLBACKS)}")
    if not callable(fn):
        raise TtpError(f"MindX callback {name} must be callable")


def ttp_config(ip: str, port: int, world_size: int) -> JobConfig:
    """The job config of a TTP rank or controller: the environment (msrun's MS_WORKER_NUM and
    MS_LOCAL_WORKER), with the manager at ``ip:port`` (MS_TFT_IP / MS_TFT_PORT)."""
    if not 0 < int(port) < 65536:
        raise TtpError(f"MS_TFT_PORT={port!r}: need a TCP port 1..65535")
    try:
        cfg = JobConfig.from_env(manager_host=ip or "127.0.0.1", manager_port=int(port))
    except ConfigError as exc:
        raise TtpError(f"mindio_ttp: {exc}") from exc
    if cfg.world_size != world_size:  # no msrun layout in the environment: one node
        cfg = cfg.replace(node_nums=1, proc_per_node=world_size, node_rank=0)
    return cfg


class Controller:
    """The manager of a stub-mode job, with MindX callbacks fed from its events."""

    def __init__(self, rank: int, world_size: int, enable_arf: bool = False) -> None:
        self.rank, self.world_size, self.enable_arf = rank, world_size, enable_arf
        self.callbacks: dict[str, Callable[..., Any]] = {}
        self.notices: list[tuple[str, Any]] = []  # tft_notify_controller_* calls, in order
        self.server: ManagerServer | None = None
        self._thread: threading.Thread | None = None

    def register_callback(self, name: str, fn: Callable[..., Any]) -> None:
        check_callback(name, fn)
        self.callbacks[name] = fn

    def notify(self, what: str, arg: Any) -> None:
        """A ``tft_notify_controller_*`` call: recorded in the event log. The manager has
        already decided and acted; MindSpore's stub only echoes its reports back."""
        self.notices.append((what, arg))
        if self.server is not None:
            self.server.events.write(MindxNoticeRecord(what, repr(arg)))

    def start(self, ip: str, port: int) -> None:
        cfg = ttp_config(ip, port, self.world_size)
        events = EventLog(cfg.events_path)
        events.subscribe(self._on_event)
        self.server = ManagerServer(cfg, events=events, bind=ip or "127.0.0.1")
        self._thread = self.server.start_thread()
        log.info("ms_recover manager serving MindIO processors on %s:%d", ip, self.server.port)

    def wait_finished(self, timeout_s: float = 10.0) -> bool:
        """Wait for the manager to end the job (and flush its events); True if it did."""
        if self._thread is None:
            return True
        self._thread.join(timeout_s)
        return not self._thread.is_alive()

    def destroy(self, timeout_s: float = 60.0) -> None:
        """End of training on rank 0: let the other ranks finish, then stop the manager."""
        server = self.server
        if server is None:
            return
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and server.model.state not in (
            JobState.FINISHED,
            JobState.EXITING,
        ):
            if self._thread is not None and not self._thread.is_alive():
                break
            time.sleep(0.05)
        server.stop()
        self.wait_finished(5.0)
        self.server = None

    def _on_event(self, event: Event) -> None:
        if event.get("event") not in ("fault", "decision", "recovery"):
            return
        try:
            r = decode(event).record
        except SchemaError:
            return
        if isinstance(r, FaultRecord):
            ranks = {r.rank: r.kind} if r.rank >= 0 else {}
            self._call("report_fault_ranks", ranks, {"detail": r.detail})
        elif isinstance(r, DecisionRecord):
            self._call("report_strategies", {}, [r.strategy])
        elif isinstance(r, RecoveryRecord):
            self._call("report_result", 0 if r.ok else 1, "", {}, r.strategy)

    def _call(self, name: str, *args: Any) -> None:
        fn = self.callbacks.get(name)
        if fn is None:
            return
        n = positional_count(fn)
        try:
            fn(*(args if n is None else args[:n]))
        except Exception:  # a MindX callback must not stop the manager
            log.exception("MindX callback %s failed", name)
