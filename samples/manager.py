"""Start the ms_recover manager the way MindCluster's TaskD ``manager.py`` is started.

MindCluster's documentation has users drop a ``manager.py`` next to their training script and run
it in the background on the scheduler pod (``if [[ "$MS_SCHED_HOST" == "$POD_IP" ]]``). This is
the same script for ms_recover: only the import changes, from ``taskd.api`` to
``ms_recover.integrations.taskd.manager_api``. With ``ms_recover/integrations/hook/ms_recover_hook.sh`` you do not need it at all.

``node_nums`` and ``proc_per_node`` default to what the Ascend Operator injects
(``MS_WORKER_NUM`` and ``MS_LOCAL_WORKER``); set ``MS_RECOVER_NODE_NUMS`` /
``MS_LOCAL_WORKER`` or edit the two lines below to pin them.
"""

from __future__ import annotations

import logging
import os
import sys

from ms_recover.integrations.taskd.manager_api import init_taskd_manager, start_taskd_manager


def _env_int(name: str, default: int) -> int:
    raw = os.getenv(name, "").strip()
    return int(raw) if raw.isdigit() else default


logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
job_id = os.getenv("MINDX_TASK_ID")  # None: ms_recover falls back to its default
proc_per_node = max(1, _env_int("MS_LOCAL_WORKER", 1))  # training processes per node
world_size = _env_int("MS_WORKER_NUM", proc_per_node)  # all training processes of the job
node_nums = _env_int("MS_RECOVER_NODE_NUMS", max(1, world_size // proc_per_node))

config = {"job_id": job_id, "node_nums": node_nums, "proc_per_node": proc_per_node}
if not init_taskd_manager(config):
    print(f"manager.py: init_taskd_manager({config}) failed", file=sys.stderr)
    sys.exit(1)
sys.exit(start_taskd_manager())  # runs until the job ends; its exit code is the job's verdict
