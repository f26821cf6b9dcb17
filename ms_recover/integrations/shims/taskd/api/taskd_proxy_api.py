"""``taskd.api.taskd_proxy_api``: no proxy in ms_recover; the calls say why."""

from __future__ import annotations

import logging
from typing import Any

_log = logging.getLogger("ms_recover.integrations.shims")

INSTEAD = (
    "ms_recover needs no TaskD proxy: each node's agent reaches the manager directly on "
    "MS_SCHED_HOST:9601 (authenticated with MS_RECOVER_SECRET)"
)


def init_taskd_proxy(config: dict[str, Any]) -> bool:
    """Returns False: see :data:`INSTEAD`."""
    _log.error("init_taskd_proxy: %s", INSTEAD)
    return False


def destroy_taskd_proxy() -> bool:
    """Returns False: see :data:`INSTEAD`."""
    _log.error("destroy_taskd_proxy: %s", INSTEAD)
    return False
