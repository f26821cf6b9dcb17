"""``taskd.api`` as MindCluster documents it, backed by ms_recover.

Every name of MindCluster's ``taskd.api.__all__`` is here:

* ``init_taskd_manager`` / ``start_taskd_manager``: ms_recover's manager
  (:mod:`ms_recover.integrations.taskd.manager_api`), so the documented ``manager.py`` runs
  unchanged;
* ``init_taskd_agent`` / ``register_func`` / ``start_taskd_agent``: the msrun agent
  (:mod:`ms_recover.integrations.taskd.agent`);
* ``init_taskd_worker`` / ``start_taskd_worker`` / ``init_taskd_proxy`` / ``destroy_taskd_proxy``:
  return False with one log line naming what ms_recover does instead (ranks join through
  ``ms_recover.init()``; agents reach the manager directly, so there is no proxy).
"""

from __future__ import annotations

from .taskd_agent_api import init_taskd_agent, register_func, start_taskd_agent
from .taskd_manager_api import init_taskd_manager, start_taskd_manager
from .taskd_proxy_api import destroy_taskd_proxy, init_taskd_proxy
from .taskd_worker_api import init_taskd_worker, start_taskd_worker

__all__ = [
    "init_taskd_manager",
    "start_taskd_manager",
    "init_taskd_worker",
    "start_taskd_worker",
    "init_taskd_agent",
    "start_taskd_agent",
    "register_func",
    "init_taskd_proxy",
    "destroy_taskd_proxy",
]
