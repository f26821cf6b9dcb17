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
#: Every process exits with this when the job was asked to stop: every node got SIGTERM (the
#: job deleted, every node drained), after a final dump when ``dump`` is configured
#: (128 + SIGTERM, what a shell reports for a process ended by SIGTERM).
STOPPED = 143
