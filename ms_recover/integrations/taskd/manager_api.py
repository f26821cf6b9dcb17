"""A manager API compatible with MindCluster's ``taskd.api``.

MindCluster's documented ``manager.py`` works by changing one import line::

    from ms_recover.integrations.taskd.manager_api import init_taskd_manager, start_taskd_manager

    job_id = os.getenv("MINDX_TASK_ID")
    init_taskd_manager({"job_id": job_id, "node_nums": 2, "proc_per_node": 8})
    start_taskd_manager()

Settings not given in the dict come from the environment (docs/design.md §6), then the defaults.
With ``ms-recover shim-path`` first on ``PYTHONPATH`` the documented import
``from taskd.api import ...`` reaches these functions too. ``TASKD_PROCESS_ENABLE=off``
(MindCluster's switch for process-level recovery) makes :func:`start_taskd_manager` return
at once without a manager.
"""

from __future__ import annotations

import logging
import os
from typing import Any

from ms_recover import env as E
from ms_recover.config import JobConfig
from ms_recover.errors import ConfigError
from ms_recover.manager.main import hold_sigterm, serve_in_foreground
from ms_recover.manager.server import ManagerServer

log = logging.getLogger("ms_recover.integrations.taskd.manager_api")

# taskd key -> JobConfig field
KEYS = {
    "job_id": "job_id",
    "node_nums": "node_nums",
    "proc_per_node": "proc_per_node",
    "recover_strategy": "strategies",
    "host": "manager_host",
    "port": "manager_port",
    "events": "events_path",
    "wait_reschedule_timeout": "wait_reschedule_timeout_s",
}

_config: JobConfig | None = None


def init_taskd_manager(config: dict[str, Any]) -> bool:
    """Validate the manager settings and keep them for :func:`start_taskd_manager`.

    Returns True. Raises ConfigError naming the bad key or value and the valid ones
    (for example ``node_nums`` must be a positive integer).
    """
    global _config
    if not isinstance(config, dict):
        raise ConfigError(f"init_taskd_manager expects a dict, got {type(config).__name__}")
    unknown = sorted(set(config) - set(KEYS))
    if unknown:
        raise ConfigError(
            f"unknown taskd manager key(s) {', '.join(unknown)}; valid: {', '.join(KEYS)}"
        )
    if config.get("job_id") in ("", None):
        config = {k: v for k, v in config.items() if k != "job_id"}
    _config = JobConfig.from_env(**{KEYS[k]: v for k, v in config.items()})
    log.info("taskd-compatible manager initialised: %s", _config.describe())
    return True


def start_taskd_manager() -> int:
    """Run the manager in the foreground until the job ends; returns its exit code."""
    if _config is None:
        raise ConfigError("call init_taskd_manager(config) before start_taskd_manager()")
    if os.environ.get(E.TASKD_PROCESS_ENABLE, "").strip().lower() == "off":
        log.warning(
            "%s=off: process-level recovery is off, no ms_recover manager runs",
            E.TASKD_PROCESS_ENABLE,
        )
        return 0
    hold_sigterm()
    return serve_in_foreground(ManagerServer(_config, bind=_config.pod_ip))
