#!/usr/bin/env bash
# Start one pod of an ms_recover AscendJob (see samples/ascendjob-*.yaml).
#
# The container runs `cd /job/code && exec bash samples/train_start.sh`, so this script is the
# container's main process and receives the pod's SIGTERM, which it forwards to the agent.
# On the scheduler pod the sourced hook starts the job's manager first and the EXIT trap stops
# it when the agent ends. The agent's exit status is the pod's exit status (ms_recover's
# `recover` strategy relies on it to have the pod recreated).
set -euo pipefail

script_dir="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
hook="${MS_RECOVER_HOOK:-${script_dir}/../ms_recover/integrations/hook/ms_recover_hook.sh}"

# shellcheck source=ms_recover/integrations/hook/ms_recover_hook.sh source-path=SCRIPTDIR/..
source "${hook}"
trap ms_recover_hook_stop EXIT

: "${MS_NODE_RANK:?MS_NODE_RANK is not set (the Ascend Operator injects it)}"

ms-recover agent --node-rank "${MS_NODE_RANK}" -- python train.py "$@" &
agent_pid=$!

trap 'kill -TERM "${agent_pid}" 2>/dev/null || true' TERM INT

status=0
wait "${agent_pid}" || status=$?
# `wait` also returns when a trapped signal arrives; keep waiting until the agent is gone.
while kill -0 "${agent_pid}" 2>/dev/null; do
    status=0
    wait "${agent_pid}" || status=$?
done
exit "${status}"
