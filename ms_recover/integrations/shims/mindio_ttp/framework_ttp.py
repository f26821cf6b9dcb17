"""``mindio_ttp.framework_ttp`` backed by ms_recover
(see :mod:`ms_recover.integrations.mindio.framework`)."""

from typing import Any

from ms_recover.integrations.mindio import framework as _impl
from ms_recover.integrations.mindio.framework import (  # noqa: F401 - the module's public surface
    REPAIR_TYPES,
    Action,
    NotProvided,
    RepairType,
    ReportState,
    tft_can_do_uce_repair,
    tft_destroy_controller,
    tft_destroy_processor,
    tft_end_updating_os,
    tft_get_reboot_type,
    tft_get_repair_step,
    tft_get_repair_type,
    tft_init_controller,
    tft_init_processor,
    tft_is_reboot_node,
    tft_pause_train,
    tft_register_clean_handler,
    tft_register_exit_handler,
    tft_register_rebuild_group_handler,
    tft_register_rename_handler,
    tft_register_repair_handler,
    tft_register_save_ckpt_handler,
    tft_register_stop_handler,
    tft_register_stream_sync_handler,
    tft_report_error,
    tft_reset_limit_step,
    tft_set_optimizer_replica,
    tft_set_step_args,
    tft_start_controller,
    tft_start_processor,
    tft_wait_next_action,
)


def __getattr__(name: str) -> Any:
    if name in _impl.NOT_PROVIDED:
        return _impl.not_provided(__name__, name)
    raise AttributeError(f"{__name__}.{name} is not provided by ms_recover")
