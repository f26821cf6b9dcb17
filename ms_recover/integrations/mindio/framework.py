"""``mindio_ttp.framework_ttp``: every name MindSpore 2.10 calls, with MindIO's signatures.

One processor (and, on rank 0 in stub mode, one controller) per process, held here. Names of
MindIO's public API that MindSpore 2.10 does not call raise :class:`NotProvided` when called.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable
from typing import Any

from ms_recover.errors import MsRecoverError
from ms_recover.integrations.mindio.controller import Controller, ttp_config
from ms_recover.integrations.mindio.enums import REPAIR_TYPES, Action, RepairType, ReportState
from ms_recover.integrations.mindio.handlers import TtpError
from ms_recover.integrations.mindio.processor import Processor

log = logging.getLogger("ms_recover.integrations.mindio")

__all__ = ["Action", "RepairType", "ReportState", "REPAIR_TYPES"]

#: The MindSpore release whose calls this API follows.
MINDSPORE_VERSION = "2.10"


class NotProvided(MsRecoverError, NotImplementedError):
    """A MindIO TTP name that ms_recover does not provide."""


class _State:
    processor: Processor | None = None
    controller: Controller | None = None
    pending: tuple[int, int] | None = None  # (rank, world_size) between init and start
    data_plane: Any = None  # a CommBackend attached before start (the CPU test kit's)
    mindx_callbacks: dict[str, Callable[..., Any]] = {}  # registered before the controller


STATE = _State()


def _proc() -> Processor:
    if STATE.processor is None:
        raise TtpError("mindio_ttp: call tft_init_processor and tft_start_processor first")
    return STATE.processor


def _check_mindspore() -> None:
    """A MindSpore of another release may call with other signatures: say so at start."""
    ms = sys.modules.get("mindspore")
    version = str(getattr(ms, "__version__", ""))
    if version and not version.startswith(MINDSPORE_VERSION):
        log.warning(
            "mindio_ttp (ms_recover) follows MindSpore %s's calls; this is MindSpore %s: "
            "handler registration checks every signature and refuses a mismatch",
            MINDSPORE_VERSION,
            version,
        )


# ---------------------------------------------------------------------- controller
def tft_init_controller(
    rank: int, world_size: int, enable_local_copy: bool, enable_arf: bool = False
) -> None:
    STATE.controller = Controller(int(rank), int(world_size), bool(enable_arf))
    for name, fn in STATE.mindx_callbacks.items():
        STATE.controller.register_callback(name, fn)


def tft_start_controller(
    bind_ip: str, port: int, enable_tls: bool = False, tls_info: str = ""
) -> None:
    if STATE.controller is None:
        raise TtpError("mindio_ttp: call tft_init_controller before tft_start_controller")
    if enable_tls:
        raise NotProvided(
            "mindio_ttp: TLS between controller and processors is not provided "
            "by ms_recover (its frames are HMAC-authenticated instead)"
        )
    STATE.controller.start(bind_ip, int(port))


def tft_destroy_controller() -> None:
    ctl, STATE.controller = STATE.controller, None
    if ctl is not None:
        if STATE.processor is not None:  # rank 0's own rank must count as done first
            STATE.processor.done()
        ctl.destroy()


# ---------------------------------------------------------------------- processor
def tft_init_processor(
    rank: int,
    world_size: int,
    enable_local_copy: bool,
    enable_tls: bool = False,
    tls_info: str = "",
    enable_uce: bool = True,
    enable_arf: bool = False,
) -> None:
    _check_mindspore()
    if enable_tls:
        raise NotProvided("mindio_ttp: TLS is not provided by ms_recover")
    STATE.pending = (int(rank), int(world_size))


def tft_start_processor(master_ip: str, port: int, local_ip: str = "") -> None:
    if STATE.pending is None:
        raise TtpError("mindio_ttp: call tft_init_processor before tft_start_processor")
    rank, world = STATE.pending
    proc = Processor(rank, world, ttp_config(master_ip, int(port), world))
    proc.data_plane = STATE.data_plane
    if STATE.controller is not None:
        proc.on_exit = STATE.controller.wait_finished
    proc.start()
    STATE.processor = proc


def tft_destroy_processor() -> None:
    proc, STATE.processor = STATE.processor, None
    if proc is not None:
        proc.done()
        proc.close()


def tft_is_reboot_node() -> bool:
    return _proc().reboot


def tft_get_reboot_type() -> str:
    """Always ``arf``: a restarted rank rejoins the running job (no hot switch)."""
    return "arf"


def tft_report_error(error_type: int) -> None:
    _proc().report_error(int(getattr(error_type, "value", error_type)))


def tft_wait_next_action() -> int:
    return _proc().wait_next_action()


def tft_get_repair_step() -> int:
    return _proc().repair_step


def tft_get_repair_type() -> str:
    return _proc().repair_type


def tft_reset_limit_step() -> None:
    _proc().reset_limit_step()


def tft_can_do_uce_repair(hbm_error_time: int, start_time: int, end_time: int) -> bool:
    return _proc().can_do_uce_repair(int(hbm_error_time), int(start_time), int(end_time))


def tft_set_optimizer_replica(rank: int, replica_info: list[dict[str, Any]]) -> None:
    keys = {"type", "rank_list", "replica_cnt", "replica_shift"}
    if not isinstance(replica_info, list) or not all(
        isinstance(i, dict) and keys <= set(i) for i in replica_info
    ):
        raise TtpError(f"tft_set_optimizer_replica: need a list of dicts with keys {sorted(keys)}")
    _proc().replica_info = [dict(i) for i in replica_info]


def tft_end_updating_os(step: int) -> None:
    _proc().end_updating_os(int(step))


def tft_pause_train(step: int) -> None:
    _proc().pause_train(int(step))


def tft_set_step_args(args: Any) -> None:
    _proc().step_args = args


def _register(name: str) -> Callable[[Callable[..., Any], Any], None]:
    def register(func: Callable[..., Any], ctx: Any = None) -> None:
        _proc().register(name, func, ctx)

    register.__name__ = f"tft_register_{name}_handler"
    register.__doc__ = f"Register MindSpore's {name} handler (called with MindIO's arguments)."
    return register


tft_register_save_ckpt_handler = _register("save_ckpt")
tft_register_rename_handler = _register("rename")
tft_register_exit_handler = _register("exit")
tft_register_stop_handler = _register("stop")
tft_register_clean_handler = _register("clean")
tft_register_repair_handler = _register("repair")
tft_register_rebuild_group_handler = _register("rebuild_group")
tft_register_stream_sync_handler = _register("stream_sync")


#: MindIO public names MindSpore 2.10 never calls: present, failing clearly when called.
NOT_PROVIDED = (
    "tft_start_updating_os",
    "tft_set_dp_group_info",
    "tft_register_decrypt_handler",
    "tft_register_load_ckpt_handler",
    "tft_report_load_ckpt_step",
    "tft_query_high_availability_switch",
    "tft_register_zit_upgrade_rollback_handler",
    "tft_register_zit_upgrade_repair_handler",
    "tft_register_zit_upgrade_rebuild_handler",
    "tft_register_zit_downgrade_rebuild_handler",
    "tft_notify_controller_dump",
    "tft_get_node_info",
)


def not_provided(module: str, name: str) -> Callable[..., Any]:
    def missing(*args: Any, **kwargs: Any) -> Any:
        raise NotProvided(
            f"{module}.{name} is not provided by ms_recover (MindSpore 2.10 does not call it)"
        )

    missing.__name__ = name
    return missing
