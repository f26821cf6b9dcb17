"""``taskd.api.taskd_worker_api``: no TaskD worker in ms_recover; the calls say what to use."""

from __future__ import annotations

import logging

_log = logging.getLogger("ms_recover.integrations.shims")

INSTEAD = (
    "ms_recover has no TaskD worker: a training process joins recovery through "
    "ms_recover.init() (or MindSpore's TrainFaultTolerance with the mindio_ttp shim)"
)


def init_taskd_worker(rank_id: int, upper_limit_of_disk_in_mb: int = 5000) -> bool:
    """Returns False: see :data:`INSTEAD`."""
    _log.error("init_taskd_worker(%r): %s", rank_id, INSTEAD)
    return False


def start_taskd_worker() -> bool:
    """Returns False: see :data:`INSTEAD`."""
    _log.error("start_taskd_worker(): %s", INSTEAD)
    return False
