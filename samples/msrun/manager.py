# MindCluster's documented manager.py, unchanged but for its two placeholders, which this sample
# fills in from what the Ascend Operator injects (MS_WORKER_NUM, MS_LOCAL_WORKER). With
# `ms-recover shim-path` first on PYTHONPATH, `taskd.api` is ms_recover's, and this starts
# ms_recover's manager; it runs until the job ends.
from taskd.api import init_taskd_manager, start_taskd_manager
import os

job_id=os.getenv("MINDX_TASK_ID")
proc_per_node=int(os.getenv("MS_LOCAL_WORKER", "1"))
node_nums=int(os.getenv("MS_WORKER_NUM", str(proc_per_node))) // proc_per_node

init_taskd_manager({"job_id":job_id, "node_nums": node_nums, "proc_per_node": proc_per_node})
start_taskd_manager()
