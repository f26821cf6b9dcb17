"""``bench recovery``'s spare footprint: /proc readings of memory and CPU, and its rows."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

from ms_recover.bench import recoveryreport, sparecost
from ms_recover.localrun.wait import wait_for
from ms_recover.observability.schema import PHASES

HOLDER = (
    "import sys, time\n"
    "block = bytearray(int(sys.argv[1]) << 20)\n"  # zero-filled: every page written
    "print('ready', flush=True)\n"
    "t = time.process_time()\n"
    "while time.process_time() - t < float(sys.argv[2]): pass\n"  # burn this much CPU
    "sys.stdin.read()\n"
)


def _holder(mb: int, burn_s: float) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(mb), str(burn_s)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
    return proc


def test_private_memory_grows_with_what_a_process_writes_and_rss_includes_it():
    small, big = _holder(1, 0.0), _holder(200, 0.0)
    try:
        a, b = sparecost.memory_mb(small.pid), sparecost.memory_mb(big.pid)
        assert b["private"] - a["private"] > 190
        assert b["rss"] >= b["private"] and b["rss"] >= b["pss"] > 0
    finally:
        for proc in (small, big):
            proc.communicate("", timeout=30)


def test_cpu_seconds_counts_what_the_process_burned():
    """/proc counts in clock ticks, split between user and system time and each rounded
    down, while the process times its own burn in nanoseconds: two ticks of slack (a CI run
    once read 0.29 s for 0.3 s burned, then the process blocked)."""
    proc = _holder(1, 0.3)
    least = 0.3 - 2 / os.sysconf("SC_CLK_TCK")
    try:
        wait_for(lambda: sparecost.cpu_seconds(proc.pid) >= least, 30, "0.3 s of CPU used")
        assert sparecost.cpu_seconds(proc.pid) < 0.3 + 1.0  # and not much more: it idles
    finally:
        proc.communicate("", timeout=30)


def test_rows_report_medians_without_a_target():
    fp = {
        "spares": [{"rss": 500.0, "pss": 200.0, "private": 90.0}] * 2,
        "ranks": [{"rss": 600.0, "pss": 250.0, "private": 120.0}],
        "idle_cpu": 0.004,
    }
    rows = {r.name.strip(): r for r in sparecost.rows(fp)}
    assert rows["memory per warm spare (RSS, median)"].value == 500.0
    assert rows["memory per warm spare (private, median)"].value == 90.0
    assert rows["a training rank's RSS, for comparison"].value == 600.0
    assert abs(rows["CPU of a waiting spare"].value - 0.4) < 1e-9
    assert all(r.verdict == "-" for r in rows.values())


def _sample(mttr: float) -> dict:
    phases = dict.fromkeys(PHASES, mttr / len(PHASES))
    return {"mttr_s": mttr, "phases": phases, "lost_steps": 0}


def _restart() -> dict:
    parts = {name: 1.0 for name, *_ in recoveryreport.RESTART_PARTS}
    return {"restart_s": 10.0, "parts_median_over_ranks": parts}


def test_the_spare_row_carries_its_target_verdict_phases_and_cost():
    args = argparse.Namespace(nodes=2, procs_per_node=2, repeats=3, warm_steps=30)
    args.ckpt_every, args.spares = 100, 1
    fp = {
        "spares": [{"rss": 440.0, "pss": 220.0, "private": 177.0}],
        "ranks": [{"rss": 444.0, "pss": 230.0, "private": 180.0}],
        "idle_cpu": 0.0,
    }
    standby_fp = {**fp, "spares": [{"rss": 300.0, "pss": 100.0, "private": 60.0}]}
    inplace = {"step_s": 0.02, "samples": [_sample(1.0)] * 3, "footprint": standby_fp}
    cold = {"step_s": 0.02, "samples": [_sample(2.5)] * 3, "footprint": None}
    for mttrs, verdict in (([0.07, 0.11, 0.3], "PASS"), ([0.1, 0.2, 0.3], "MISS")):
        spare = {"step_s": 0.02, "samples": [_sample(m) for m in mttrs], "footprint": fp}
        base = {"step_s": 0.02, "samples": [_restart()] * 3}
        rep = recoveryreport.report(args, inplace, cold, spare, base, "/tmp/x")
        rows = {m.name.strip(): m for m in rep.measures}
        row = rows["MTTR with 1 pre-warmed spare(s)/node, median of 3"]
        assert (row.target, row.verdict) == ("<= 0.15 s", verdict)
        assert rows["spare MTTR, max"].value == 0.3
        assert all(f"spare phase {p}" in rows for p in PHASES)
        assert rows["memory per warm spare (RSS, median)"].value == 440.0
        assert rows["memory per standby (private, median)"].value == 60.0
        assert rows["recover-in-place MTTR, cold start (--standby off), median of 3"].value == 2.5
        floor = rows["spare MTTR below the cold floor (cold MTTR - spare MTTR)"]
        assert floor.value == 2.5 - sorted(mttrs)[1]  # against the cold start, not the standby
        assert sparecost.SPARES_DEFAULT in rep.notes
