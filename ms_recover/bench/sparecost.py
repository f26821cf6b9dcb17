"""What a waiting spare costs (``ms-recover bench recovery --spares N``): memory and idle CPU.

Read from Linux ``/proc`` for the processes of a running job: each warm spare (blocked on its
assignment pipe) next to the job's training ranks. RSS counts MindSpore's shared libraries in
full in every process; *private* memory (clean + dirty pages no other process maps) is what
one more spare adds to a node.
"""

from __future__ import annotations

import os
import time
from typing import Any

from ms_recover.bench.jobdriver import JobDriver
from ms_recover.bench.table import Measure, median

#: The bench's answer to "should spares be on by default", printed under its table.
SPARES_DEFAULT = (
    "Spares stay off by default (--spares 0): each costs a whole process on every node (the "
    "memory above) and only helps when one process fails (a lost node's replacement pods start "
    "cold); on Ascend a spare would also need a device of its own to compile for. Where host "
    "memory allows, --spares 1 takes the import and the compile off the recovery path. The "
    "standby is on by default (--standby on): one waiting process per node, no device (its "
    "memory above); for a program that passes init(warm_up=...) on the host data plane it "
    "is warm (the program run up to init(), its step compiled), else an interpreter with "
    "MindSpore imported; it takes the interpreter start and the import, and when warm the "
    "compile, off the path."
)


def footprint(d: JobDriver, window_s: float = 2.0) -> dict[str, Any]:
    """Memory (MB, one entry per process) of every warm spare and training rank, and the
    median CPU of a waiting spare over ``window_s`` (fraction of one core)."""
    spares, ranks = d.warm_spare_pids(), d.rank_pids()
    cpu0, t0 = {p: cpu_seconds(p) for p in spares}, time.monotonic()
    d.wait(lambda: time.monotonic() - t0 >= window_s, "the idle window")
    elapsed = time.monotonic() - t0
    return {
        "spares": [memory_mb(p) for p in spares],
        "ranks": [memory_mb(p) for p in ranks],
        "idle_cpu": median([(cpu_seconds(p) - cpu0[p]) / elapsed for p in spares]),
    }


def rows(fp: dict[str, Any], what: str = "warm spare") -> list[Measure]:
    """The footprint as context rows of the recovery table (no target: a cost, not a goal);
    ``what`` names the waiting process (a warm spare, or the standby)."""

    def mb(who: str, kind: str) -> float | None:
        return median([m[kind] for m in fp[who]])

    private = mb("spares", "private")
    return [
        Measure(
            f"  memory per {what} (RSS, median)",
            mb("spares", "rss"),
            "MB",
            note=f"private {private or 0:.0f} MB: the rest is shared libraries, mapped once",
        ),
        Measure(f"  memory per {what} (private, median)", private, "MB"),
        Measure("  a training rank's RSS, for comparison", mb("ranks", "rss"), "MB"),
        Measure(
            f"  CPU of a waiting {what.split()[-1]}",
            (fp["idle_cpu"] or 0.0) * 100,
            "% of a core",
            note="blocked on its assignment pipe",
        ),
    ]


def memory_mb(pid: int) -> dict[str, float]:
    """``rss``, ``pss`` and ``private`` (clean + dirty) memory of a process in MB
    (``/proc/PID/smaps_rollup``)."""
    fields: dict[str, float] = {}
    with open(f"/proc/{pid}/smaps_rollup") as fh:
        for line in fh:
            name, _, rest = line.partition(":")
            if rest.strip().endswith("kB"):
                fields[name] = float(rest.split()[0]) / 1024
    private = fields.get("Private_Clean", 0.0) + fields.get("Private_Dirty", 0.0)
    return {"rss": fields.get("Rss", 0.0), "pss": fields.get("Pss", 0.0), "private": private}


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds a process has used so far (``/proc/PID/stat``)."""
    with open(f"/proc/{pid}/stat") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
