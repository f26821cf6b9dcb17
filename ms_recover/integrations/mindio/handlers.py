"""The handlers MindSpore registers with MindIO: their arity, and calling them bounded.

A handler runs on a helper thread joined with the action timeout: one that raises, or hangs,
becomes :class:`HandlerFailed` (the processor reports it and the job escalates).
"""

from __future__ import annotations

import glob
import inspect
import os
import threading
from collections.abc import Callable
from typing import Any

from ms_recover.errors import MsRecoverError

#: Handler name -> the number of positional parameters MindIO passes (MindSpore 2.10's).
HANDLER_ARITY: dict[str, int | None] = {
    "save_ckpt": 4,  # (step, save_info, args, ctx)
    "rename": 2,  # (step, ctx)
    "exit": 1,  # (ctx)
    "stop": 2,  # (args, ctx)
    "clean": 3,  # (is_uce, args, ctx) -> 0 | 1 | 2
    "repair": 6,  # (step, need_rebuild, error_ranks, repair_info, args, ctx)
    "rebuild_group": 3,  # (fault_ranks, args, ctx)
    "stream_sync": None,  # runtime.synchronize: called as MindSpore registered it
}


class TtpError(MsRecoverError):
    """A misuse of the framework_ttp API, or a handler that failed."""


class HandlerFailed(TtpError):
    """A registered handler raised, hung past the action timeout, or returned failure."""


def call_bounded(what: str, fn: Callable[..., Any], args: tuple[Any, ...], timeout_s: float) -> Any:
    """``fn(*args)`` on a helper thread; HandlerFailed if it raises or outlasts ``timeout_s``."""
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["ret"] = fn(*args)
        except BaseException as exc:  # noqa: BLE001 - reported, never lost
            box["exc"] = exc

    worker = threading.Thread(target=run, name="ttp-handler", daemon=True)
    worker.start()
    worker.join(timeout_s)
    if worker.is_alive():
        raise HandlerFailed(f"{what} hung past {timeout_s:g}s")
    if "exc" in box:
        raise HandlerFailed(f"{what} raised {box['exc']!r}")
    return box.get("ret")


def saved_checkpoint(ctx: Any, step: int, rank: int) -> str | None:
    """The file MindSpore's default save handler wrote for ``step`` (its layout under the
    callback's ``ckpt_save_path``), or None (a user save callback, or nothing found)."""
    root = getattr(ctx, "ckpt_save_path", None)
    if not isinstance(root, str) or getattr(ctx, "save_cb", None):
        return None
    found = sorted(
        glob.glob(
            os.path.join(root, f"ttp_saved_checkpoints-step_{step}_tmp", f"rank_{rank}", "*.ckpt")
        )
    )
    return found[-1] if found else None


def claim_rename(step: int, directory: str) -> bool:
    """True for exactly one process of the job (a file created exclusively on shared storage):
    MindIO renames the dump once, after every chosen rank saved."""
    os.makedirs(directory, exist_ok=True)
    try:
        fd = os.open(os.path.join(directory, f"ttp-rename-{step}.claim"), os.O_CREAT | os.O_EXCL)
    except FileExistsError:
        return False
    os.close(fd)
    return True


def positional_count(fn: Callable[..., Any]) -> int | None:
    """Positional parameters of ``fn``, or None when it takes ``*args`` or has no signature."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return None
    if any(p.kind is p.VAR_POSITIONAL for p in params):
        return None
    return sum(1 for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD))
