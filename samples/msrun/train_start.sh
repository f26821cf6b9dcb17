#!/usr/bin/env bash
# Start one pod of an msrun-launched MindSpore AscendJob (samples/ascendjob-msrun.yaml) with
# ms_recover in place of MindCluster TaskD.
#
# Everything below the first two commands is what MindCluster's guide has users write; the
# opt-in line is the whole switch. msrun ends up as the container's main process (exec): it gets
# the pod's SIGTERM, and its exit status is the pod's (86 asks for the pod to be recreated under
# `recover`). manager.py, started in the background on the scheduler pod, becomes msrun's child
# and is waited for when the job ends.
cd "$(dirname "${BASH_SOURCE[0]}")" || exit 2

# The opt-in: `taskd` (msrun's agent, manager.py's import) is now ms_recover's.
export PYTHONPATH="$(ms-recover shim-path):${PYTHONPATH:-}"
# msrun hands its workers to a taskd agent only when MS_ENABLE_TFT names a MindX feature; the
# Ascend Operator sets it from the job's fault-tolerance settings. RSC:1 is the plain
# "processes controlled by MindX" switch, used when the operator set nothing.
if [[ -z "${MS_ENABLE_TFT:-}" ]]; then export MS_ENABLE_TFT='{RSC:1}'; fi

# --- MindCluster's documented lines (LD_PRELOAD stays empty: no taskd distribution is installed)
TASKD_SO_PATH="$(pip show taskd | awk '/^Location: / {print $2"/taskd/python/cython_api/libs/libtaskd.so"}')"
export LD_PRELOAD=$TASKD_SO_PATH:$LD_PRELOAD
export TASKD_PROCESS_ENABLE="on"
if [[ "${MS_SCHED_HOST}" == "${POD_IP}" ]]; then
   python manager.py &
fi
# ---

exec msrun \
    --worker_num "${MS_WORKER_NUM}" \
    --local_worker_num "${MS_LOCAL_WORKER}" \
    --master_addr "${MS_SCHED_HOST}" \
    --master_port "${MS_SCHED_PORT:-8118}" \
    --node_rank "${MS_NODE_RANK}" \
    --log_dir "${MS_RECOVER_LOG_DIR:-/job/output/msrun}" \
    python ../train.py "$@"
