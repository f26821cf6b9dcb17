"""Process exit codes with a meaning to ms_recover, the pod supervisor and Kubernetes."""

OK = 0
FAILED = 1
USAGE = 2
#: The agent exits with this when its pod must be recreated elsewhere (the ``recover`` strategy).
RESCHEDULE = 86
#: Every process of the job exits with this under the ``exit`` strategy (recovery gave up).
JOB_EXIT = 87
#: Every process exits with this after an end-of-life checkpoint (the ``dump`` strategy).
DUMPED = 88
