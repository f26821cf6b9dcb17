"""Summarise a manager event log (JSONL) as a text timeline, and optionally a Gantt PNG.

Reads one JSON object per line, each decoded against the event schema
(:mod:`ms_recover.observability.schema`); a line that does not follow it (not JSON, an unknown
event, a missing field or one of the wrong type) is skipped and counted, and the first such
problem is named. Times are printed relative to the first event; text from the log is printed
escaped. Each ``recovery`` event closes a group: the
``fault`` and ``phase`` events since the previous one belong to it.

Exit status: 0 on success, 1 when the file is missing or unreadable, has no valid event, or the
plot cannot be written, 2 on a usage error.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from collections.abc import Iterable
from typing import Any, TextIO

from ms_recover.errors import ConfigError
from ms_recover.inputs import check_output_file
from ms_recover.observability import goodput
from ms_recover.observability.events import log_lines, open_log, read_lines
from ms_recover.observability.safetext import safe
from ms_recover.observability.schema import (
    PHASES,
    EventLine,
    FaultRecord,
    FlaggedRecord,
    JobEndRecord,
    PhaseRecord,
    RecoveryRecord,
    SubHealthRecord,
)

COLLAPSED = frozenset({"member", "group"})  # one line per run of these, not one per event


@dataclasses.dataclass(frozen=True)
class LoadResult:
    """Valid events in file order, how many lines were skipped, and why the first one was."""

    events: list[EventLine]
    skipped: int
    first_problem: str = ""


@dataclasses.dataclass(frozen=True)
class Bar:
    """One phase of one recovery, in seconds relative to the first event."""

    phase: str
    start: float
    duration: float


@dataclasses.dataclass(frozen=True)
class Incident:
    """A recovery with the faults and phases that led to it (``recovery`` None: unfinished)."""

    recovery: EventLine | None
    faults: tuple[EventLine, ...]
    phases: tuple[EventLine, ...]

    @property
    def label(self) -> str:
        rec = self.recovery
        if rec is None or not isinstance(rec.record, RecoveryRecord):
            return "epoch ? ? (unfinished)"
        status = "ok" if rec.record.ok else "FAILED"
        epoch = "?" if rec.epoch is None else rec.epoch
        return f"epoch {epoch} {rec.record.strategy} ({status})"


def load_events(lines: Iterable[str]) -> LoadResult:
    """Decode JSONL text; never raises on malformed content."""
    return LoadResult(*read_lines(lines))


def incidents(events: list[EventLine]) -> list[Incident]:
    """Group faults and phases by the recovery event that closes them, in order."""
    out: list[Incident] = []
    faults: list[EventLine] = []
    phases: list[EventLine] = []
    for event in events:
        if isinstance(event.record, FaultRecord):
            faults.append(event)
        elif isinstance(event.record, PhaseRecord):
            phases.append(event)
        elif isinstance(event.record, RecoveryRecord):
            out.append(Incident(event, tuple(faults), tuple(phases)))
            faults, phases = [], []
    if faults or phases:
        out.append(Incident(None, tuple(faults), tuple(phases)))
    return out


def bars(incident: Incident, t0: float) -> list[Bar]:
    """The phase bars of one incident, relative to ``t0``.

    ``phase`` events with ``start``/``end`` are drawn where they happened. Otherwise the
    recovery's ``phases`` durations are laid end to end in phase order, starting at the
    incident's start (recovery ``ts`` minus ``mttr_s``), which is an approximation.
    """
    phases = [p.record for p in incident.phases if isinstance(p.record, PhaseRecord)]
    timed = [p for p in phases if p.start is not None]
    if timed:
        out = []
        for p in timed:
            start = p.start or 0.0
            length = (p.end - start) if p.end is not None else p.duration_s
            out.append(Bar(p.phase, start - t0, max(0.0, length)))
        return out
    rec = incident.recovery.record if incident.recovery else None
    recovery = rec if isinstance(rec, RecoveryRecord) else None
    durations = dict(recovery.phases) if recovery else {}
    if not durations:
        durations = {p.phase: p.duration_s for p in phases}
    total = sum(durations.values())
    last = incident.recovery or (incident.phases[-1] if incident.phases else None)
    end = last.ts if last is not None else t0
    cursor = end - (recovery.mttr_s if recovery else total) - t0
    out = []
    for name in [p for p in PHASES if p in durations] + [p for p in durations if p not in PHASES]:
        length = max(0.0, durations[name])
        out.append(Bar(name, cursor, length))
        cursor += length
    return out


def describe(event: EventLine) -> str:
    """One event's own fields as ``key=value`` words, in the schema's order."""
    r = event.record
    if isinstance(r, PhaseRecord):
        return f"{r.phase} {r.duration_s:.3f}s"
    if isinstance(r, RecoveryRecord):
        detail = " ".join(f"{k}={v:.3f}" for k, v in r.phases.items())
        status = "ok" if r.ok else "FAILED"
        return (
            f"{status} strategy={r.strategy} mttr={r.mttr_s}s lost_steps={r.lost_steps} [{detail}]"
        )
    fields = r.fields()
    fields.pop("log_tail", None)  # the tail: its own lines below
    return " ".join(f"{k}={_short(v)}" for k, v in fields.items())


def _short(value: Any, limit: int = 60) -> str:
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def print_timeline(events: list[EventLine], out: TextIO) -> None:
    """The text timeline: one line per event (runs of member/group events collapsed)."""
    t0 = events[0].ts
    run_kind, run_count, run_start = "", 0, 0.0
    for event in [*events, None]:
        kind = event.event if event is not None else ""
        if run_count and kind != run_kind:
            out.write(f"{run_start:+10.3f}s            {run_kind:<10} x{run_count}\n")
            run_count = 0
        if event is None:
            break
        if kind in COLLAPSED:
            run_kind, run_start = kind, (run_start if run_count else event.ts - t0)
            run_count += 1
            continue
        # Whatever wrote the log chose the text: escaped (one line, no controls).
        epoch, text = safe("-" if event.epoch is None else event.epoch), safe(describe(event))
        out.write(f"{event.ts - t0:+10.3f}s  epoch {epoch:<4} {kind:<10} {text}\n")
        if isinstance(event.record, FaultRecord) and event.record.log_tail is not None:
            out.write(tail_lines(event.record.log_tail))


def tail_lines(tail: str, indent: str = " " * 12 + "| ") -> str:
    """A fault's log tail (a rank's traceback), indented, each line escaped."""
    return "".join(f"{indent}{safe(line)}\n" for line in tail.splitlines())


def print_summary(events: list[EventLine], out: TextIO) -> None:
    """Counts, and one line per recovery with its MTTR and lost steps."""
    recs = [e.record for e in events if isinstance(e.record, RecoveryRecord)]
    faults = sum(isinstance(e.record, FaultRecord) for e in events)
    good = [r for r in recs if r.ok]
    span = events[-1].ts - events[0].ts
    out.write(
        f"\n{len(events)} events over {span:.3f}s: {faults} fault(s), {len(recs)} "
        f"recovery(ies), {len(good)} ok\n"
    )
    mttrs = [r.mttr_s for r in good]
    if mttrs:
        out.write(f"MTTR: mean {sum(mttrs) / len(mttrs):.3f}s, max {max(mttrs):.3f}s\n")
    print_detections(events, out)


def print_detections(events: list[EventLine], out: TextIO) -> None:
    """One line per detection of what does not crash (a ``flagged`` rank, with its evidence)
    and per act of the sub-health policy on it."""
    for e in events:
        r = e.record
        if isinstance(r, FlaggedRecord):
            out.write(
                f"flagged: rank {r.rank} (node {r.node}) at step {r.step}, "
                f"{safe(r.reason)}: {safe(r.detail)}\n"
            )
        elif isinstance(r, SubHealthRecord):
            out.write(
                f"sub-health {safe(r.policy)}: node {r.node} {safe(r.action)}: {safe(r.reason)}\n"
            )


PHASE_COLOURS = {
    "detect": "#d62728",
    "stop": "#ff7f0e",
    "replace": "#9467bd",
    "rebuild": "#1f77b4",
    "repair": "#2ca02c",
    "resume": "#17becf",
}


def plot(events: list[EventLine], path: str) -> str:
    """Draw one Gantt row per incident into ``path``; return "" on success, else the problem.

    Each row is drawn on its own clock, starting at the incident's first fault; the label
    says when that was relative to the first event.
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.lines import Line2D
        from matplotlib.patches import Patch
    except ImportError:
        return "--plot needs matplotlib: install ms-recover[plot]"
    rows = incidents(events)
    if not rows:
        return "nothing to plot: the log has no fault, phase or recovery event"
    t0 = events[0].ts
    fig, ax = plt.subplots(figsize=(10, 1.2 + 0.6 * len(rows)))
    try:
        for row, incident in enumerate(rows):
            _draw_row(ax, row, incident, t0)
        labels = [f"{i.label}\nat +{incident_origin(i, t0):.1f}s" for i in rows]
        ax.set_yticks(range(len(rows)), labels)
        ax.invert_yaxis()
        ax.set_xlabel("seconds since the row's first fault")
        ax.set_title("ms_recover recoveries: phases and faults")
        handles: list[Any] = [Patch(color=c, label=p) for p, c in PHASE_COLOURS.items()]
        handles.append(Line2D([], [], color="black", marker="x", linestyle="", label="fault"))
        ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1))
    except ValueError as exc:
        plt.close(fig)
        return f"cannot draw {path}: {exc}"
    return _save(plt, fig, path)


def _save(plt: Any, fig: Any, path: str) -> str:
    """Write ``fig`` to ``path`` and close it; "" on success, else the problem."""
    try:
        fig.tight_layout()
        fig.savefig(path, dpi=100)
    except (OSError, ValueError) as exc:
        return f"cannot write {path}: {exc}"
    finally:
        plt.close(fig)
    return ""


def incident_origin(incident: Incident, t0: float) -> float:
    """Where a row's clock starts: its first fault, else its first phase (relative to t0)."""
    starts = [f.ts - t0 for f in incident.faults] + [b.start for b in bars(incident, t0)]
    return min(starts, default=0.0)


def _draw_row(ax: Any, row: int, incident: Incident, t0: float) -> None:
    # Each row has its own origin so that recoveries hours apart stay readable side by side.
    origin = t0 + incident_origin(incident, t0)
    for bar in bars(incident, origin):
        ax.broken_barh(
            [(bar.start, max(bar.duration, 1e-3))],
            (row - 0.3, 0.6),
            color=PHASE_COLOURS.get(bar.phase, "grey"),
        )
    for fault in incident.faults:
        kind = fault.record.kind if isinstance(fault.record, FaultRecord) else "fault"
        ax.plot(fault.ts - origin, row, marker="x", color="black", markersize=9)
        ax.annotate(
            kind,
            (fault.ts - origin, row - 0.35),
            fontsize=7,
            ha="center",
        )


def print_goodput(events: list[EventLine], out: TextIO) -> None:
    """The goodput ledger: seconds and share of the wall time per category, and ETTR."""
    times, ettr = _goodput(events)
    wall = sum(times.values())
    out.write(f"\ngoodput ledger over {wall:.3f}s of wall time:\n")
    for name, seconds in times.items():
        share = 100.0 * seconds / wall if wall > 0 else 0.0
        out.write(f"  {name:<11} {seconds:>12.3f}s {share:>6.2f}%\n")
    out.write(f"ETTR (productive / wall): {100.0 * ettr:.2f}%\n")


def _goodput(events: list[EventLine]) -> tuple[dict[str, float], float]:
    """Seconds per category up to the job's end (else its last event), and ETTR."""
    ledger = goodput.ledger_from_events(events)
    ends = (e.ts for e in events if isinstance(e.record, JobEndRecord))
    end = min(ends, default=events[-1].ts)
    return ledger.snapshot(end), ledger.ettr(end)


def plot_goodput(events: list[EventLine], path: str) -> str:
    """One stacked bar of the wall time by category into ``path``; "" on success."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "--goodput-plot needs matplotlib: install ms-recover[plot]"
    times, ettr = _goodput(events)
    fig, ax = plt.subplots(figsize=(10, 2.2))
    left = 0.0
    for name, seconds in times.items():
        if seconds > 0:
            ax.barh(0, seconds, left=left, color=GOODPUT_COLOURS.get(name), label=name)
            left += seconds
    ax.set_yticks([])
    ax.set_xlabel("seconds of wall time")
    ax.set_title(f"ms_recover goodput: ETTR {100.0 * ettr:.2f}% of {left:.1f}s")
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1), fontsize=7)
    return _save(plt, fig, path)


GOODPUT_COLOURS = {
    **PHASE_COLOURS,
    "productive": "#2ca02c",
    "startup": "#7f7f7f",
    "repair": "#bcbd22",
    "reschedule": "#e377c2",
    "recompute": "#8c564b",
    "dump": "#000000",
    "other": "#c7c7c7",
}


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("events", metavar="EVENTS.jsonl", help="the manager's event log")
    parser.add_argument("--plot", metavar="PNG", help="also draw a Gantt chart of the phases")
    parser.add_argument(
        "--goodput-plot", metavar="PNG", help="also draw the wall time by category, stacked"
    )


def run(args: argparse.Namespace) -> int:
    """Print the timeline (and write the plot); return the exit status."""
    if args.plot:
        check_output_file("--plot", args.plot)
    if args.goodput_plot:
        check_output_file("--goodput-plot", args.goodput_plot)
    try:
        with open_log(args.events) as fh:  # a regular file of bounded size
            # Bounded lines: one huge line is skipped, never held whole.
            loaded = load_events(log_lines(fh))
    except ConfigError as exc:
        print(f"ms-recover report: error: {exc}", file=sys.stderr)
        return 1
    if loaded.skipped:
        print(
            f"ms-recover report: warning: skipped {loaded.skipped} malformed line(s) "
            f"(first at {safe(loaded.first_problem)})",
            file=sys.stderr,
        )
    if not loaded.events:
        print(f"ms-recover report: error: {args.events}: no events", file=sys.stderr)
        return 1
    loaded.events.sort(key=lambda e: e.ts)  # stable: file order breaks ties
    print_timeline(loaded.events, sys.stdout)
    print_summary(loaded.events, sys.stdout)
    print_goodput(loaded.events, sys.stdout)
    for drawer, png in ((plot_goodput, args.goodput_plot), (plot, args.plot)):
        problem = drawer(loaded.events, png) if png else ""
        if problem:
            print(f"ms-recover report: error: {problem}", file=sys.stderr)
            return 1
        if png:
            print(f"wrote {png}")
    return 0
