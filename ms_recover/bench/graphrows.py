"""``bench overhead``'s GRAPH_MODE rows: GraphStep's arms against a plain ``TrainOneStepCell``.

The arms (:mod:`~ms_recover.mindspore.programs.overhead_graph`) run interleaved step by step
in one process, on one model, (g), (gc), (gf) and (gb) on one GraphStep (one compiled graph),
in a fresh random order each round; each row is the median of the differences of the same
round's steps, relative to the cell's median step. The null row (a second TrainOneStepCell) is
the method's own noise. Every arm but (gb) and (gf) times a step on the batch its untimed step
just used; (gb) takes the session's next step's batch, and (gf) the same batches without the
session, so (gb) - (gf) is the session alone. The (gb) row carries the
targets: <= +4 % at the demo's ~1 ms step (docs/design.md §8 aims at +2 %), <= +2 % at the wide
MLP's ~10 ms one; (g) keeps the earlier +10 % at ~1 ms.
"""

from __future__ import annotations

import statistics
from typing import Any

from ms_recover.bench.table import Measure

VS_CELL_TARGET_PCT = 10.0  # (g), the demo MLP
SESSION_TARGET_PCT = 4.0  # (gb), the demo MLP (~1 ms step)
WIDE_TARGET_PCT = 2.0  # (g) and (gb), the wide MLP (~10 ms step)


def graph_stats(inter: dict[str, Any]) -> dict[str, Any]:
    """GraphStep's arms against the TrainOneStepCell arm: median paired differences, in %."""
    cell_times = inter["cell_times"]
    cell = statistics.median(cell_times)
    half = len(cell_times) // 2

    def vs_cell(kind: str, lo: int = 0, hi: int | None = None) -> float:
        diffs = [
            y - x for x, y in zip(cell_times[lo:hi], inter[f"{kind}_times"][lo:hi], strict=True)
        ]
        return float(statistics.median(diffs) / cell * 100)

    # As in the PyNative rows: the replica digest runs on one commit in ``every``, which a
    # median of adjacent steps cannot see; its amortized cost is added to the (gb) row.
    calls = inter.get("calls", {})
    every = calls.get("digest_every_steps", 0)
    digest_pct = calls.get("digest_s", 0.0) / every / cell * 100 if every else 0.0
    return {
        "hidden": inter.get("hidden", 0),
        "elements": inter.get("graph_elements"),
        "cell_step_s": cell,
        "graph_step_s": statistics.median(inter["graph_times"]),
        "gsession_step_s": statistics.median(inter["gsession_times"]),
        "graph_pct": vs_cell("graph"),
        "gsession_pct": vs_cell("gsession") + digest_pct,
        "digest_pct": digest_pct,
        "gsession_halves_pct": [vs_cell("gsession", 0, half), vs_cell("gsession", half)],
        "null_pct": vs_cell("null") if "null_times" in inter else None,
        "plain_pct": vs_cell("plain") if "plain_times" in inter else None,
        "floor_pct": vs_cell("floor") if "floor_times" in inter else None,
        "gcomm_pct": vs_cell("gcomm") if "gcomm_times" in inter else None,
        "gskip_pct": vs_cell("gskip") if "gskip_times" in inter else None,
        "gfresh_pct": vs_cell("gfresh") if "gfresh_times" in inter else None,
    }


def graph_rows(inter: dict[str, Any], wide: dict[str, Any] | None) -> list[Measure]:
    rows = []
    demo = (inter, VS_CELL_TARGET_PCT, SESSION_TARGET_PCT, "demo MLP")
    for got, target, gb_target, what in (demo, (wide, WIDE_TARGET_PCT, WIDE_TARGET_PCT, "")):
        if got is None:
            continue
        g = graph_stats(got)
        what = (what or f"wide MLP 64-{g['hidden']}-{g['hidden']}-8") + ", GRAPH_MODE"
        halves = " / ".join(f"{h:+.2f} %" for h in g["gsession_halves_pct"])
        rows += [
            Measure(
                f"{what}: TrainOneStepCell step, median",
                g["cell_step_s"] * 1e3,
                "ms",
                note=f"{g['elements']} gradient values",
            ),
            Measure(
                f"{what}: null, a second TrainOneStepCell vs the first",
                g["null_pct"],
                "%",
                note="the same step on another model copy: should read about 0; the "
                "resolution of every row below",
            ),
            Measure(
                f"{what}: (g) GraphStep, identity reduce, vs TrainOneStepCell",
                g["graph_pct"],
                "%",
                "<=",
                target,
                "one compiled graph, the reduction op called once per step",
            ),
            Measure(
                f"{what}: floor, the op with an empty body, vs TrainOneStepCell",
                g["floor_pct"],
                "%",
                note="TrainOneStepCell whose grad_reducer is GraphStep's op doing nothing (no "
                "callback, no reduction): what any in-graph op costs; reference, no target",
            ),
            Measure(
                f"{what}: (a) DataParallelStep, identity reduce, vs TrainOneStepCell",
                g["plain_pct"],
                "%",
                note="today's step (two graphs, numpy round trip), same job, for comparison",
            ),
            Measure(
                f"{what}: (gb) GraphStep under ms_recover vs TrainOneStepCell",
                g["gsession_pct"],
                "%",
                "<=",
                gb_target,
                f"steps()/guard()/commit + session.allreduce in the op + the digest check "
                f"amortized; halves (without it): {halves}",
            ),
            Measure(
                f"{what}: (gf) GraphStep, identity reduce, a new batch each step, "
                "vs TrainOneStepCell",
                g["gfresh_pct"],
                "%",
                note="(g) on a new batch each call, as (gb) takes the session's next step's: "
                "the other arms repeat the batch of their untimed step, still in the caches; "
                "(gb) - (gf): the session alone; reference, no target",
            ),
            Measure(
                f"{what}: (gs) GraphStep on_failure='skip', identity reduce, vs TrainOneStepCell",
                g["gskip_pct"],
                "%",
                note="the graph branches around the optimizer instead of failing: a failed "
                "reduction costs no 3 s wait and no recompile; reference, no target (it once "
                "read -25 % on the wide MLP, on its own model copy: a placement artifact; its "
                "optimizer runs every step, the same bits as the cell's)",
            ),
            Measure(
                f"{what}: (gc) GraphStep, the backend's allreduce directly, vs TrainOneStepCell",
                g["gcomm_pct"],
                "%",
                note="the data plane in the op without the session (allreduce out= the "
                "bucket: one rank copies nothing); (gb) - (gc): the session",
            ),
            Measure(
                f"{what}:   of which the replica digest check, amortized",
                g["digest_pct"],
                "%",
                note="one state copy + CRC-32 every digest_every_steps commits",
            ),
        ]
    return [r for r in rows if r.value is not None]  # no DataParallelStep arm in the wide job
