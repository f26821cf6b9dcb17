"""``taskd.api.taskd_agent_api``: the agent msrun hands its workers to (ms_recover-backed).

See :mod:`ms_recover.integrations.taskd.agent` for what it does; this module only keeps
MindCluster's names.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Callable
from typing import Any

from ms_recover.integrations.taskd import agent as _agent


def init_taskd_agent(config: dict[str, Any] | None = None, cls: Any = None) -> bool:
    """Accept ``{"Framework": "MindSpore"}`` (and ServerRank / UpstreamAddr / UpstreamPort).
    False, with one log line, for anything else: msrun then runs its workers itself."""
    return _agent.init({} if config is None else config, cls)


def register_func(operator: str, func: Callable[..., Any]) -> bool:
    """Keep msrun's KILL_WORKER / START_ALL_WORKER / START_WORKER_LIST / MONITOR callback."""
    return _agent.register(operator, func)


def start_taskd_agent() -> None:
    """Run this node until its part of the job ends, then end the process with its exit code
    (msrun would exit 0 whatever its agent returned). Never returns."""
    code = _agent.start()
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    # os._exit: msrun's caller would turn any return into exit 0, and MindSpore's threads must
    # not keep a finished node alive.
    os._exit(code)
