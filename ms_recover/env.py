"""Names of the environment variables ms_recover reads or sets (docs/design.md §6).

The MindCluster / msrun names come first; ours are prefixed ``MS_RECOVER_``. Only
:func:`ms_recover.config.JobConfig.from_env`, the agent's child-env builder and the MindSpore
cluster of ``ms-recover bench allreduce`` (:mod:`ms_recover.bench.mscluster`) touch them.
"""

from __future__ import annotations

# Injected by the Ascend Operator / msrun.
TASK_ID = "MINDX_TASK_ID"
SCHED_HOST = "MS_SCHED_HOST"
SCHED_PORT = "MS_SCHED_PORT"
TOPO_TIMEOUT = "MS_TOPO_TIMEOUT"
POD_IP = "POD_IP"
WORKER_NUM = "MS_WORKER_NUM"
LOCAL_WORKER = "MS_LOCAL_WORKER"
NODE_RANK = "MS_NODE_RANK"
ROLE = "MS_ROLE"
ENABLE_TFT = "MS_ENABLE_TFT"
RESTART_FAULT_PROCESS = "ENABLE_RESTART_FAULT_PROCESS"

# Set by our agent for every rank process, as msrun does.
NODE_ID = "MS_NODE_ID"
RANK_ID = "RANK_ID"
RANK_SIZE = "RANK_SIZE"
DEVICE_ID = "DEVICE_ID"
LOCAL_RANK = "MS_RECOVER_LOCAL_RANK"
INCARNATION = "MS_RECOVER_INCARNATION"
#: Set by the taskd shim in msrun: the pid a worker must not outlive (msrun's own).
LAUNCHER_PID = "MS_RECOVER_LAUNCHER_PID"

# Ours.
STRATEGY = "MS_RECOVER_STRATEGY"
PORT = "MS_RECOVER_PORT"
TFT_PORT = "MS_TFT_PORT"  # MindSpore's MindIO processors connect to MS_TFT_IP:MS_TFT_PORT
TTP_PORT = "TTP_PORT"  # the same port as MindCluster's AscendJob samples pass it
SECRET = "MS_RECOVER_SECRET"
SECRET_FILE = "MS_RECOVER_SECRET_FILE"
REQUIRE_SECRET = "MS_RECOVER_REQUIRE_SECRET"
CURVE = "MS_RECOVER_CURVE"
DATA_CURVE = "MS_RECOVER_DATA_CURVE"
NODE_NUMS = "MS_RECOVER_NODE_NUMS"
HEARTBEAT = "MS_RECOVER_HEARTBEAT_S"
HANG_TIMEOUT = "MS_RECOVER_HANG_TIMEOUT_S"
#: 0: a hang is declared after MS_RECOVER_HANG_TIMEOUT_S alone, 1: by the adaptive rule (when
#: unset: 0 if MS_RECOVER_HANG_TIMEOUT_S is set, else 1).
HANG_ADAPTIVE = "MS_RECOVER_HANG_ADAPTIVE"
RANK_SILENCE = "MS_RECOVER_RANK_SILENCE_S"
PHASE_TIMEOUT = "MS_RECOVER_PHASE_TIMEOUT_S"
MANAGER_GRACE = "MS_RECOVER_MANAGER_GRACE_S"
WAIT_RESCHEDULE = "MS_RECOVER_WAIT_RESCHEDULE_TIMEOUT"
#: The pod's terminationGracePeriodSeconds: how long an agent has between SIGTERM and SIGKILL.
TERMINATION_GRACE = "MS_RECOVER_TERMINATION_GRACE_S"
MAX_TRIES = "MS_RECOVER_MAX_TRIES"
RANK_RESTARTS = "MS_RECOVER_RANK_RESTARTS_PER_HOUR"
EVENTS = "MS_RECOVER_EVENTS"
SCHED_NODE_RANK = "MS_RECOVER_SCHED_NODE_RANK"
BACKEND = "MS_RECOVER_BACKEND"
FAULTS = "MS_RECOVER_FAULTS"
FAULTS_POD = "MS_RECOVER_FAULTS_POD"  # LocalPods: 0 in a node's first pod, >0 in any later one
AUTOSTART = "MS_RECOVER_AUTOSTART"
DUMP_DIR = "MS_RECOVER_DUMP_DIR"
MANAGER_WAIT = "MS_RECOVER_MANAGER_WAIT_S"
NO_MANAGER = "MS_RECOVER_NO_MANAGER"
TASKD_PROCESS_ENABLE = "TASKD_PROCESS_ENABLE"
SPARE_FD = "MS_RECOVER_SPARE_FD"  # a pre-warmed spare reads its rank's environment from it
SPARE_SETTLED_FD = "MS_RECOVER_SPARE_SETTLED_FD"  # ... and writes a byte once it committed
STANDBY = "MS_RECOVER_STANDBY"  # ms-recover agent: keep a pre-imported standby (on/off)
SPARE = "MS_RECOVER_SPARE"  # ms-recover agent: a spare node (on/off; unset: node rank >= nodes)
STANDBY_LOG = "MS_RECOVER_STANDBY_LOG"  # the rank log a standby writes to once it took a rank
#: what a standby imports ahead (comma list; unset: ms_recover.worker.standby.PRELOAD). The
#: agent sets it when its ranks do not load MindSpore (tests' numpy programs).
STANDBY_PRELOAD = "MS_RECOVER_STANDBY_PRELOAD"
WARM_UP_MARK = "MS_RECOVER_WARM_UP_MARK"  # a rank creates this file if its init() has a warm_up
DIE_WITH = "MS_RECOVER_DIE_WITH_PID"  # LocalPods: the agent dies with this (parent) process
DIGEST_EVERY = "MS_RECOVER_DIGEST_EVERY_STEPS"
GROUP_NODES = "MS_RECOVER_GROUP_NODES"  # nodes per heartbeat group (0: automatic, 1: none)
MANAGERS = "MS_RECOVER_MANAGERS"  # host:port of every manager of the job, in takeover order
RELAY_ENDPOINT = "MS_RECOVER_RELAY_ENDPOINT"  # set by the agent: its local relay for this rank
SUB_HEALTHY = "MS_RECOVER_SUB_HEALTHY_STRATEGY"  # the job's subHealthyStrategy label
HOT_SWITCH_TIMEOUT = "MS_RECOVER_HOT_SWITCH_TIMEOUT_S"  # how long a hot switch waits for its pod

ROLE_WORKER = "MS_WORKER"
ROLE_SCHED = "MS_SCHED"
