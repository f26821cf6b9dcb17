"""The report of ``ms-recover bench recovery`` (:mod:`ms_recover.bench.recovery`): its rows,
targets and notes from the measured samples."""

from __future__ import annotations

import argparse
import os
from typing import Any

from ms_recover.bench import sparecost
from ms_recover.bench.table import Measure, Report, median, summary
from ms_recover.observability.schema import PHASES

TARGET_RATIO = 0.25
TARGET_SPARE_S = 0.15  # docs/design.md §8: recovery time with a pre-warmed spare
TARGET_DEFAULT_S = 0.3  # docs/design.md §8: recover-in-place MTTR, default settings
RESTART_PARTS = (
    ("launch", "kill -> interpreter up", None, "start"),
    ("import", "import mindspore", "start", "imported"),
    ("build", "build net and optimizer", "imported", "built"),
    ("load", "load_checkpoint into the state", "built", "loaded"),
    ("join", "rendezvous (every rank registered)", "loaded", "joined"),
    ("first step", "first step (jit compile)", "joined", "first_step"),
)


def add_msrun(rep: Report, inplace: dict[str, Any], under: dict[str, Any]) -> None:
    """The msrun-launched job's MTTR next to ms-recover agent's (same job, same kills)."""
    agent = summary(s["mttr_s"] for s in inplace["samples"])
    msrun = summary(s["mttr_s"] for s in under["samples"])
    rep.add(
        Measure(
            f"recover-in-place MTTR under msrun (taskd shim), median of {msrun['n']}",
            msrun["median"],
            "s",
            note="the same kills on the job launched by real msrun, ms_recover's taskd as its "
            "agent",
        ),
        Measure(
            "  msrun MTTR - ms-recover agent MTTR",
            (msrun["median"] or 0.0) - (agent["median"] or 0.0),
            "s",
        ),
    )
    for phase in PHASES:
        rep.add(
            Measure(
                f"  msrun phase {phase}",
                median([x["phases"][phase] for x in under["samples"]]),
                "s",
            )
        )


def report(
    args: argparse.Namespace,
    inplace: dict[str, Any],
    cold: dict[str, Any],
    spare: dict[str, Any] | None,
    baseline: dict[str, Any],
    workdir: str,
) -> Report:
    ins, base = inplace["samples"], baseline["samples"]
    mttr = summary(s["mttr_s"] for s in ins)
    cold_mttr = summary(s["mttr_s"] for s in cold["samples"])
    restart = summary(s["restart_s"] for s in base)
    step_s = baseline["step_s"]
    lost_s = args.ckpt_every / 2 * step_s
    total = (restart["median"] or 0.0) + lost_s
    ratio = (mttr["median"] or 0.0) / total
    rep = Report(
        "recovery",
        f"ms-recover bench recovery: MindSpore demo job, {args.nodes} nodes "
        f"x {args.procs_per_node} ranks, kill -9 of one rank",
    )
    rep.add(
        Measure(
            f"recover-in-place MTTR, median of {mttr['n']}",
            mttr["median"],
            "s",
            "<=",
            TARGET_DEFAULT_S,
            note="the recovery event's mttr_s: process seen dead -> every rank "
            "committed the first step after recovery; ms-recover agent's default: the node's "
            "standby runs the restarted rank, warm (its step compiled: the demo passes "
            "init(warm_up=...))",
        ),
        Measure("recover-in-place MTTR, max", mttr["max"], "s"),
    )
    for phase in PHASES:
        rep.add(Measure(f"  phase {phase}", median([s["phases"][phase] for s in ins]), "s"))
    if inplace["footprint"] is not None:
        rep.add(*sparecost.rows(inplace["footprint"], "standby"))
    rep.add(
        Measure(
            f"recover-in-place MTTR, cold start (--standby off), median of {cold_mttr['n']}",
            cold_mttr["median"],
            "s",
            note="a new interpreter imports MindSpore for the restarted rank",
        )
    )
    for phase in ("replace", "resume"):
        rep.add(
            Measure(
                f"  cold phase {phase}",
                median([s["phases"][phase] for s in cold["samples"]]),
                "s",
            )
        )
    if spare is not None:
        warm = summary(s["mttr_s"] for s in spare["samples"])
        rep.add(
            Measure(
                f"MTTR with {args.spares} pre-warmed spare(s)/node, median of {warm['n']}",
                warm["median"],
                "s",
                "<=",
                TARGET_SPARE_S,
                note="a warm spare (MindSpore imported, model built, step compiled) takes the "
                "killed rank",
            ),
            Measure("  spare MTTR, max", warm["max"], "s"),
            Measure(
                "  spare MTTR below the cold floor (cold MTTR - spare MTTR)",
                (cold_mttr["median"] or 0.0) - (warm["median"] or 0.0),
                "s",
                ">=",
                0.0,
            ),
            Measure(
                "  spare MTTR / baseline (restart + lost work, below)",
                (warm["median"] or 0.0) / total * 100,
                "%",
                "<=",
                TARGET_RATIO * 100,
            ),
        )
        for phase in PHASES:
            rep.add(
                Measure(
                    f"  spare phase {phase}",
                    median([s["phases"][phase] for s in spare["samples"]]),
                    "s",
                )
            )
        rep.add(*sparecost.rows(spare["footprint"]))
    runs = ins + cold["samples"] + (spare["samples"] if spare else [])
    lost = max(s["lost_steps"] for s in runs)
    rep.add(Measure("committed steps lost (max)", lost, "steps", "<=", 0))
    rep.add(
        Measure(
            f"job restart from checkpoint, median of {restart['n']}",
            restart["median"],
            "s",
            note="kill of every process -> every rank committed its first step "
            "after load_checkpoint",
        )
    )
    for name, label, _, _ in RESTART_PARTS:
        rep.add(
            Measure(f"  {label}", median([s["parts_median_over_ranks"][name] for s in base]), "s")
        )
    rep.add(
        Measure("steady step time (baseline job)", step_s * 1e3, "ms"),
        Measure("steady step time (in-place job)", inplace["step_s"] * 1e3, "ms"),
        Measure(
            f"expected lost work, {args.ckpt_every}/2 steps",
            lost_s,
            "s",
            note=f"checkpoint every {args.ckpt_every} steps; a fault at a random time "
            "loses half an interval on average",
        ),
        Measure("baseline = restart + expected lost work", total, "s"),
        Measure("MTTR / baseline", ratio * 100, "%", "<=", TARGET_RATIO * 100),
        Measure(
            "MTTR / restart alone (fault right after a checkpoint)",
            (mttr["median"] or 0.0) / (restart["median"] or 1.0) * 100,
            "%",
        ),
    )
    rep.settings = {
        "nodes": args.nodes,
        "procs_per_node": args.procs_per_node,
        "repeats": args.repeats,
        "warm_steps": args.warm_steps,
        "ckpt_every": args.ckpt_every,
        "spares": args.spares,
        "workdir": workdir,
        "baseline_definition": "restart (kill -> every rank's first step after "
        "load_checkpoint) + ckpt_every/2 * steady step time; detection not added",
    }
    rep.samples = {
        "in_place": inplace,
        "cold": cold,
        "spare": spare,
        "restart": baseline,
        "mttr": mttr,
        "restart_summary": restart,
    }
    world, cores = args.nodes * args.procs_per_node, os.cpu_count() or 1
    rep.notes = [
        "Baseline: every process killed, a fresh job started on the same checkpoint directory; "
        "detection of the fault is not added to it, MTTR includes it.",
        "recover-in-place restarts one rank in the node's standby: the demo passes "
        "init(warm_up=...), so the standby ran it up to init() and compiled its step there "
        "(a program without a warm_up gets a bare standby, MindSpore imported, and pays its "
        "first step's compile); the cold row pays the import and the compile; the restart "
        "pays both for every rank at once.",
        "With the demo's --graph-step, GraphStep must skip the optimizer inside the graph when "
        "the reduction is interrupted (on_failure='skip'): with 'abort' MindSpore answers a "
        "failed graph with a fixed 3 s wait and a recompile on every survivor (measured: MTTR "
        "6.2 s, phases stop 3.0 s and resume 3.1 s).",
    ]
    if world > cores:
        rep.notes.append(
            f"{world} ranks on {cores} cores: the restart's simultaneous imports queue for the "
            "cores, which a cluster (cores per rank) would not; that flatters the ratio. "
            f"For one rank per core: --nodes {min(cores, args.nodes)} --procs-per-node 1."
        )
    rep.notes.append(sparecost.SPARES_DEFAULT)
    return rep
