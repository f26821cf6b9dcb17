"""``bench overhead``'s 2-rank row: our step against msrun's in-graph mccl step, same job.

* **ours**: 2 ranks under a one-node LocalJob, :class:`~ms_recover.mindspore.graphstep.
  GraphStep` in GRAPH_MODE under ``session.steps()`` / ``guard()``, ``session.allreduce`` (the
  host data plane) as the reduction inside the graph
  (:mod:`~ms_recover.mindspore.programs.overhead_train` ``--mode session --graph-step``);
* **msrun's**: the same model and per-rank batches on MindSpore's own CPU cluster (formed with
  msrun's environment by :mod:`~ms_recover.bench.mscluster`), a data-parallel GRAPH_MODE
  ``nn.TrainOneStepCell`` whose ``DistributedGradReducer`` runs mccl's AllReduce inside the
  graph (:mod:`~ms_recover.mindspore.programs.msrun_step_bench`).

Both time whole loop iterations, each until the step's loss has been read. The two run one
after the other, in ABBA order over ``repeats`` pairs; a run's figure is the median over its
ranks of each rank's median step, and each arm's figure the median over its runs. Target
(docs/design.md §8): ours faster. A context row compares the first :data:`EARLY` timed steps of the
same runs alone: on some hosts our first few hundred steps run much slower than the rest
(4000-step runs on 2026-12-02: ours 3.6-3.8 ms against mccl's 4.7-5.5 ms over the whole run,
while 400-step runs read 5.1-7.8 ms against 3.5-5.5 ms), so a short run measures start-up.
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path
from typing import Any, Protocol

from ms_recover.bench import mscluster
from ms_recover.bench.table import Measure

PROGRAM = (sys.executable, "-m", "ms_recover.mindspore.programs.msrun_step_bench")
WHAT = "2 ranks, demo MLP, GRAPH_MODE"
#: Timed steps of the context row "first steps" (each arm's start, after the same warm-up).
EARLY = 400


def _median_of_ranks(per_rank: list[list[float]], stop: int | None = None) -> float:
    """The median over ranks of each rank's median step (of its first ``stop`` steps)."""
    return statistics.median(statistics.median(ts[:stop]) for ts in per_rank)


class Runner(Protocol):
    def job(self, mode: str, procs: int, extra: list[str] | None = None) -> list[dict[str, Any]]:
        """Run the overhead rank program under a one-node LocalJob; each rank's result."""


def measure(
    runner: Runner, workdir: Path, steps: int, repeats: int, timeout_s: float
) -> dict[str, Any]:
    """Step times of both arms (seconds), or the reason msrun's arm has none."""
    ours: list[float] = []
    theirs: list[float] = []
    ours_early: list[float] = []
    theirs_early: list[float] = []
    reason, elements = "", 0
    extra = ["--graph-mode", "--graph-step", "--steps", str(steps), "--warmup", "50"]
    for i in range(repeats):
        for arm in ("ours", "msrun") if i % 2 == 0 else ("msrun", "ours"):
            if arm == "ours":
                got = runner.job("session", procs=2, extra=extra)
                elements = int(got[0]["elements"])
                times = [r["step_times"] for r in got]
                ours.append(_median_of_ranks(times))
                ours_early.append(_median_of_ranks(times, EARLY))
                continue
            # The gradient's element count comes from our run: pair 1 runs it first.
            plan = mscluster.Plan((elements,), 2, steps, program=PROGRAM, extra=("--warmup", "50"))
            limits = mscluster.Limits(form_s=60.0, run_s=timeout_s, tries=2)
            out = mscluster.measure(plan, workdir / f"msrun-{i + 1}", limits)
            if out.times is None:
                reason = out.reason
                continue
            theirs.append(_median_of_ranks(out.times[elements]))
            theirs_early.append(_median_of_ranks(out.times[elements], EARLY))
    return {
        "ours_s": ours,
        "msrun_s": theirs,
        "ours_early_s": ours_early,
        "msrun_early_s": theirs_early,
        "reason": reason,
        "steps": steps,
    }


def rows(got: dict[str, Any]) -> list[Measure]:
    """The row names are stable; the ratio carries the target."""
    ours = statistics.median(got["ours_s"])
    note = f"median of {len(got['ours_s'])} run(s) of {got['steps']} steps"
    out = [
        Measure(
            f"{WHAT}: GraphStep under ms_recover (host allreduce in the graph), step",
            ours * 1e3,
            "ms",
            note=note,
        )
    ]
    if not got["msrun_s"]:
        return out + [
            Measure(
                f"{WHAT}: ours vs msrun's mccl DistributedGradReducer step",
                None,
                "x",
                "<",
                1.0,
                failed=f"msrun's cluster gave no time: {got['reason']}",
            )
        ]
    theirs = statistics.median(got["msrun_s"])
    return [
        *out,
        Measure(
            f"{WHAT}: msrun + mccl DistributedGradReducer TrainOneStepCell, step",
            theirs * 1e3,
            "ms",
            note=f"MindSpore's own data parallelism, no ms_recover; {note}",
        ),
        Measure(
            f"{WHAT}: ours vs msrun's mccl DistributedGradReducer step",
            ours / theirs,
            "x",
            "<",
            1.0,
            "our step time / msrun's: below 1 is faster; same model, batches, 2 ranks",
        ),
        *_early(got),
    ]


def _early(got: dict[str, Any]) -> list[Measure]:
    """The context row of the runs' first :data:`EARLY` steps (none in an older run's JSON)."""
    ours, theirs = got.get("ours_early_s"), got.get("msrun_early_s")
    if not ours or not theirs:
        return []
    return [
        Measure(
            f"{WHAT}: ours vs msrun's step, first {EARLY} timed steps of the same runs",
            statistics.median(ours) / statistics.median(theirs),
            "x",
            note=f"start-up, context: ours {statistics.median(ours) * 1e3:.2f} ms, "
            f"msrun's {statistics.median(theirs) * 1e3:.2f} ms",
        )
    ]
