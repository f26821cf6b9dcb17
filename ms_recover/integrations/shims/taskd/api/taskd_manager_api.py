"""``taskd.api.taskd_manager_api``: MindCluster's manager entry points, served by ms_recover."""

from __future__ import annotations

from ms_recover.integrations.taskd.manager_api import init_taskd_manager, start_taskd_manager

__all__ = ["init_taskd_manager", "start_taskd_manager"]
