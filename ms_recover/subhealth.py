"""MindCluster's sub-health policies (the ``subHealthyStrategy`` label of an AscendJob): what
the manager does with a node whose rank it flagged (fail-slow, or a replica that diverged again
soon after its repair). Pure: no zmq, no MindSpore.

MindCluster reads the label ``subHealthyStrategy`` from the job's PodGroup (the Ascend Operator
copies the AscendJob's labels onto it); Volcano takes an absent or unknown value as ``ignore``.
ms_recover takes it from ``MS_RECOVER_SUB_HEALTHY_STRATEGY`` (set it from the job's label) or
``--sub-healthy-strategy``, and refuses an unknown value:

* ``ignore``: report the flag only (the event, the metric, the status line);
* ``graceExit``: stop the job at a step boundary, dump the last committed step from one healthy
  replica per shard, and exit (:data:`~ms_recover.exitcodes.DUMPED`);
* ``forceExit``: exit at once (:data:`~ms_recover.exitcodes.JOB_EXIT`), no dump;
* ``hotSwitch``: ask for a new pod for the flagged node's ranks while training goes on, then
  swap it in at a step boundary and repair its ranks from replicas (no step lost). If no new
  pod comes within ``hot_switch_timeout_s``, the switch is abandoned: the node stays, training
  goes on, and the node's policy becomes ``ignore`` (as MindCluster's ClusterD does when its
  hot switch fails); there is no job-level fallback.
"""

from __future__ import annotations

import enum

from ms_recover.errors import ConfigError

#: The label (and the name MindCluster's docs use).
LABEL = "subHealthyStrategy"


class SubHealthy(str, enum.Enum):
    """One sub-health policy; the value is the label's value."""

    IGNORE = "ignore"
    GRACE_EXIT = "graceExit"
    FORCE_EXIT = "forceExit"
    HOT_SWITCH = "hotSwitch"

    def __str__(self) -> str:
        return self.value


VALID_NAMES = ", ".join(p.value for p in SubHealthy)


def parse_sub_healthy(text: str) -> SubHealthy:
    """The policy named ``text`` (exact spelling, as MindCluster compares it); ``ignore`` for
    an empty one. Raises ConfigError naming the valid values."""
    token = text.strip()
    if not token:
        return SubHealthy.IGNORE
    try:
        return SubHealthy(token)
    except ValueError:
        raise ConfigError(f"{LABEL} {token!r} is not one of: {VALID_NAMES}") from None
