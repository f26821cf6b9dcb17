# shellcheck shell=bash
# ms_recover scheduler hook: source it from a job's start script (see samples/train_start.sh).
#
#   source ms_recover/integrations/hook/ms_recover_hook.sh   # starts the manager if this is the scheduler pod
#   trap ms_recover_hook_stop EXIT              # stops it when the script ends
#
# On the pod where MS_ROLE=MS_SCHED or MS_SCHED_HOST == POD_IP it starts `ms-recover manager`
# in the background (log and pid file under MS_RECOVER_RUN_DIR, default
# /tmp/ms-recover/$MINDX_TASK_ID) and waits until its port (MS_RECOVER_PORT, default 9601)
# accepts connections. Everywhere else it prints one line and does nothing. Sourcing it twice
# is harmless: a running manager is reused. A failure to start is reported as a warning and
# never stops the calling script, even under `set -euo pipefail`.
#
# Settings (all optional):
#   MS_RECOVER_PYTHON         python that has ms_recover installed (default: python3, python)
#   MS_RECOVER_HOOK_AUTOSTART 0 = only define the functions, do not start on source
#   MS_RECOVER_START_TIMEOUT  seconds to wait for the manager's port (default 60)
#   MS_RECOVER_RUN_DIR        directory for manager.pid, manager.log, events.jsonl

ms_recover_hook_python() {
    if [[ -n "${MS_RECOVER_PYTHON:-}" ]]; then
        printf '%s\n' "${MS_RECOVER_PYTHON}"
    elif command -v python3 >/dev/null 2>&1; then
        printf '%s\n' python3
    else
        printf '%s\n' python
    fi
}

ms_recover_hook_start() {
    local python rc=0
    python="$(ms_recover_hook_python)"
    "${python}" -m ms_recover hook start || rc=$?
    if [[ "${rc}" -ne 0 ]]; then
        echo "ms_recover hook: warning: manager not started (exit ${rc});" \
            "training goes on, but without process-level recovery" >&2
    fi
    return 0
}

ms_recover_hook_stop() {
    local python
    python="$(ms_recover_hook_python)"
    "${python}" -m ms_recover hook stop || \
        echo "ms_recover hook: warning: could not stop the manager" >&2
    return 0
}

ms_recover_hook_status() {
    "$(ms_recover_hook_python)" -m ms_recover hook status "$@"
}

if [[ "${MS_RECOVER_HOOK_AUTOSTART:-1}" != "0" ]]; then
    ms_recover_hook_start
fi
