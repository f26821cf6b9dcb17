"""ms_recover's stand-in for MindCluster's ``taskd`` package
(see :mod:`ms_recover.integrations.shims`).

Only ``taskd.api`` is provided: the msrun agent (``taskd.api.taskd_agent_api``) and the manager
API (``init_taskd_manager`` / ``start_taskd_manager``), both backed by ms_recover.
"""

from __future__ import annotations

import logging
import os
import sys

_log = logging.getLogger("ms_recover.integrations.shims")


def _announce() -> None:
    """Never shadow a real MindCluster ``taskd`` silently: name it once, with the reason."""
    if __name__ != "taskd":  # imported as ms_recover.integrations.shims.taskd: nothing is shadowed
        return
    from ms_recover.integrations.shims import path, shadowed

    other = shadowed("taskd", sys.path)
    if other is not None:
        _log.warning(
            "ms_recover's taskd (%s) shadows the taskd at %s: the shim directory comes first "
            "on sys.path (PYTHONPATH precedes site-packages); drop it from PYTHONPATH to use "
            "the other one",
            os.path.join(path(), "taskd"),
            other,
        )


_announce()
