"""``mindio_ttp.controller_ttp`` backed by the ms_recover manager (stub mode, rank 0)."""

from collections.abc import Callable
from typing import Any

from ms_recover.integrations.mindio import framework as _impl
from ms_recover.integrations.mindio.controller import check_callback
from ms_recover.integrations.mindio.framework import (  # noqa: F401 - the module's public surface
    tft_destroy_controller,
    tft_init_controller,
    tft_start_controller,
)


def tft_register_mindx_callback(action: str, func: Callable[..., Any]) -> None:
    """Register a MindX callback; one registered before the controller starts is kept."""
    if _impl.STATE.controller is not None:
        _impl.STATE.controller.register_callback(action, func)
    else:
        check_callback(action, func)
        _impl.STATE.mindx_callbacks[action] = func


def _notify(what: str, arg: Any) -> int:
    if _impl.STATE.controller is not None:
        _impl.STATE.controller.notify(what, arg)
    return 0


def tft_notify_controller_stop_train(
    fault_ranks: dict[int, int], stop_type: str = "stop", timeout: int | None = None
) -> int:
    return _notify("stop_train", fault_ranks)


def tft_notify_controller_on_global_rank(fault_ranks: dict[int, int], time: int = 1) -> int:
    return _notify("on_global_rank", fault_ranks)


def tft_notify_controller_change_strategy(strategy: str, params: str = "") -> int:
    return _notify("change_strategy", strategy)


def tft_notify_controller_prepare_action(action: str, fault_ranks: list[int]) -> int:
    return _notify("prepare_action", {"action": action, "fault_ranks": fault_ranks})


def __getattr__(name: str) -> Any:
    if name in _impl.NOT_PROVIDED:
        return _impl.not_provided(__name__, name)
    raise AttributeError(f"{__name__}.{name} is not provided by ms_recover")
