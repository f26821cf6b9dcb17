"""The goodput ledger: every second of a job's wall time, accounted to one category.

Fed only by the manager's event stream (``EventLog.subscribe(ledger.on_event)``, or
:func:`ledger_from_file` for a JSONL log); pure: the clock is an argument of
:meth:`GoodputLedger.snapshot`. ETTR (effective training time ratio) = productive / wall.

How the time is painted onto the wall-clock span from the first event to ``now`` (or to
``job_end``), later rules over earlier ones:

* ``startup`` until ``job_start`` (or a restarted manager's ``restored``), then ``productive``;
  from a ``fault`` seen while training, ``other`` until its ``recovery`` event (an unfinished
  recovery), then ``productive`` again (``other`` after a recovery that gave up).
* a ``fault``'s ``detect_s`` before its timestamp, and a recovery's ``detect`` phase before its
  round's start, are ``detect``: the job ran, but its work was already lost. ``mttr_s`` runs
  from the incident's start (the last sign of life), so it holds the detection: the round
  began at ``ts - mttr_s + detect``.
* a recovery's round, up to ``ts``: ``rebuild``, ``repair`` and ``resume`` end at ``ts`` in
  that order (each phase starts when the previous ended); before them ``stop`` from the start,
  then ``replace`` (``stop`` and ``replace`` are both measured from the round's start, so they
  overlap: the replace time past the stop is counted). ``replace`` is ``reschedule`` when the
  decision restarted whole nodes (waiting for a rescheduled pod). A ``dump`` recovery's span
  is all ``dump``.
* ``lost_steps`` of a recovery are recomputed after it: the first ``lost_steps x step time``
  seconds of productive time after it are ``recompute`` (the step time is the training time
  so far over the steps it committed: up to ``target_step + lost_steps`` per recovery).

Events are kept (only the few kinds above) and sorted by ``ts`` when a snapshot follows a new
event, so events that arrive out of order are placed where they happened; the painted result
is kept until the next event. An event that does not follow the schema
(:mod:`ms_recover.observability.schema`) is counted in ``ignored`` and otherwise ignored. A
restarted manager's ledger starts at its own first event.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterable

from ms_recover.observability.events import Event, read_events
from ms_recover.observability.schema import (
    DecisionRecord,
    EventLine,
    FaultRecord,
    GoodputRecord,
    JobEndRecord,
    RecoveryRecord,
    SchemaError,
    decode,
)

PRODUCTIVE = "productive"
CATEGORIES: tuple[str, ...] = (
    PRODUCTIVE,
    "startup",
    "detect",
    "stop",
    "replace",
    "reschedule",
    "rebuild",
    "repair",
    "resume",
    "recompute",
    "dump",
    "other",
)
KINDS = frozenset({"job_start", "restored", "fault", "decision", "recovery", "job_end"})


def _usable(e: EventLine) -> bool:
    """Whether ``e`` (of the schema's types) has no negative duration or step to paint."""
    r = e.record
    if isinstance(r, FaultRecord):
        return r.detect_s >= 0
    if isinstance(r, RecoveryRecord):
        return (
            r.mttr_s >= 0
            and min(r.phases.values(), default=0.0) >= 0
            and (r.lost_steps or 0) >= 0
            and r.target_step >= 0
        )
    return True


class _Paint:
    """Disjoint ``[start, end) -> category`` segments covering ``[t0, t1)``; painting a span
    replaces whatever was there."""

    def __init__(self, t0: float, t1: float, category: str) -> None:
        self.starts: list[float] = [t0]
        self.cats: list[str] = [category]
        self.t1 = t1

    def _split(self, t: float) -> int:
        """Make ``t`` a segment boundary; return the index of the segment starting at ``t``."""
        i = bisect.bisect_right(self.starts, t) - 1
        if self.starts[i] == t:
            return i
        self.starts.insert(i + 1, t)
        self.cats.insert(i + 1, self.cats[i])
        return i + 1

    def paint(self, start: float, end: float, category: str) -> None:
        start, end = max(start, self.starts[0]), min(end, self.t1)
        if end <= start:
            return
        i = self._split(start)
        j = self._split(end) if end < self.t1 else len(self.starts)
        self.starts[i:j] = [start]
        self.cats[i:j] = [category]

    def segments(self) -> list[tuple[float, float, str]]:
        ends = [*self.starts[1:], self.t1]
        return list(zip(self.starts, ends, self.cats, strict=True))


class GoodputLedger:
    """Accounts a job's wall time to :data:`CATEGORIES` from its events.

    ``start``: the wall-clock origin (default: the earliest event seen).
    """

    def __init__(self, start: float | None = None) -> None:
        self.start = start
        self._fixed = start is not None
        self.ignored = 0
        self._events: list[EventLine] = []
        self._cache: list[tuple[float, float, str]] | None = None

    def on_event(self, e: Event) -> None:
        """An event listener (the event as its line's object): an event of :data:`KINDS` is
        decoded and kept (:meth:`add`), of another kind only its ``ts`` is read (the ledger's
        start); one that does not follow the schema is counted in ``ignored``. Never raises."""
        if not isinstance(e, dict):  # a listener may be handed anything
            self.ignored += 1
            return
        if e.get("event") not in KINDS:
            ts = e.get("ts")
            if isinstance(ts, (int, float)) and not isinstance(ts, bool) and 0 <= ts < math.inf:
                self._seen(float(ts))
            else:
                self.ignored += 1
            return
        try:
            self.add(decode(e))
        except SchemaError:
            self.ignored += 1

    def add(self, e: EventLine) -> None:
        """Account a decoded event (one with a negative duration is counted in ``ignored``)."""
        if not _usable(e):
            self.ignored += 1
            return
        self._seen(e.ts)
        if e.event in KINDS:
            self._events.append(e)
            self._cache = None

    def _seen(self, ts: float) -> None:
        if not self._fixed and (self.start is None or ts < self.start):
            self.start = ts
            self._cache = None

    def snapshot(self, now: float) -> dict[str, float]:
        """Seconds per category from the start to ``now`` (or to ``job_end``, if earlier)."""
        out = dict.fromkeys(CATEGORIES, 0.0)
        for start, end, cat in self._segments():
            if start >= now:
                break
            out[cat] += min(end, now) - start
        return out

    def wall(self, now: float) -> float:
        return sum(self.snapshot(now).values())

    def ettr(self, now: float) -> float:
        """Productive time over wall time (0.0 before any time has passed)."""
        times = self.snapshot(now)
        wall = sum(times.values())
        return times[PRODUCTIVE] / wall if wall > 0 else 0.0

    def record(self, now: float) -> GoodputRecord:
        """The ledger as a ``goodput`` event."""
        times = self.snapshot(now)
        wall = sum(times.values())
        return GoodputRecord(
            wall_s=round(wall, 4),
            ettr=round(times[PRODUCTIVE] / wall, 6) if wall > 0 else 0.0,
            seconds={k: round(v, 4) for k, v in times.items()},
        )

    def _segments(self) -> list[tuple[float, float, str]]:
        """The painted segments, the last one open-ended unless the job ended; recomputed only
        when an event arrived since the last call."""
        if self._cache is not None:
            return self._cache
        if self.start is None:
            return []
        events = sorted(self._events, key=lambda e: e.ts)  # stable: arrival breaks ties
        ends = [e.ts for e in events if isinstance(e.record, JobEndRecord)]
        canvas = _Paint(self.start, min(ends, default=math.inf), "startup")
        # One pass in time order: a state paints from its event on, an incident only before
        # its event, so neither hides a later one, and paints land near the end of the canvas.
        training = nodes = False  # nodes: the last decision restarted whole nodes
        for e in events:
            r, ts = e.record, e.ts
            if isinstance(r, DecisionRecord):
                nodes = bool(r.nodes)
            elif isinstance(r, FaultRecord):
                if training:
                    training = False
                    canvas.paint(ts, canvas.t1, "other")
                canvas.paint(ts - r.detect_s, ts, "detect")
            elif isinstance(r, RecoveryRecord):
                training = r.ok
                canvas.paint(ts, canvas.t1, PRODUCTIVE if training else "other")
                _paint_recovery(canvas, ts, r, nodes)
            elif e.event in ("job_start", "restored"):
                training = True
                canvas.paint(ts, canvas.t1, PRODUCTIVE)
        self._cache = self._recompute(canvas.segments(), events)
        return self._cache

    @staticmethod
    def _recompute(
        segments: list[tuple[float, float, str]], events: list[EventLine]
    ) -> list[tuple[float, float, str]]:
        """Charge each recovery's lost steps to the productive time right after it."""
        recoveries = [
            (e.ts, e.record) for e in events if isinstance(e.record, RecoveryRecord) and e.record.ok
        ]
        out: list[tuple[float, float, str]] = []
        trained, steps, debt, base_step = 0.0, 0.0, 0.0, 0.0  # trained: productive + recompute
        k = 0
        for start, end, cat in segments:
            while k < len(recoveries) and recoveries[k][0] <= start:
                rec = recoveries[k][1]
                lost = float(rec.lost_steps or 0)
                target = float(rec.target_step)
                steps += max(0.0, target + lost - base_step)
                base_step = target
                if lost and steps > 0:
                    debt += lost * trained / steps
                k += 1
            if cat == PRODUCTIVE and debt > 0:
                paid = min(debt, end - start)
                out.append((start, start + paid, "recompute"))
                debt -= paid
                trained += paid
                start += paid
                if start >= end:
                    continue
            if cat == PRODUCTIVE:
                trained += end - start
            out.append((start, end, cat))
        return out


def _paint_recovery(canvas: _Paint, ts: float, r: RecoveryRecord, nodes: bool) -> None:
    """A recovery's detection and phases, before its event at ``ts`` (see the module
    docstring)."""
    phases = {k: float(v) for k, v in r.phases.items()}
    # ``mttr_s`` runs from the incident's start, the last sign of life, so it holds the
    # detection: the round itself began ``detect`` later (else detection counted twice).
    detect = min(max(phases.get("detect", 0.0), 0.0), max(r.mttr_s, 0.0))
    begin = ts - r.mttr_s + detect
    canvas.paint(begin - detect, begin, "detect")
    if r.strategy == "dump":
        canvas.paint(begin, ts, "dump")
        return
    t = ts
    for phase in ("resume", "repair", "rebuild"):
        length = min(phases.get(phase, 0.0), t - begin)
        canvas.paint(t - length, t, phase)
        t -= length
    stop = min(phases.get("stop", 0.0), t - begin)
    canvas.paint(begin, begin + stop, "stop")
    canvas.paint(begin + stop, t, "reschedule" if nodes else "replace")


def ledger_from_events(events: Iterable[EventLine], start: float | None = None) -> GoodputLedger:
    ledger = GoodputLedger(start)
    for e in events:
        ledger.add(e)
    return ledger


def ledger_from_file(path: str) -> tuple[GoodputLedger, float]:
    """A ledger built from an events JSONL file, and the time it ends (its ``job_end``, else
    its last event): ``snapshot(end)`` is the whole job."""
    events, _bad = read_events(path)
    ledger = ledger_from_events(events)
    ends = [e.ts for e in events if isinstance(e.record, JobEndRecord)]
    last = max((e.ts for e in events), default=0.0)
    return ledger, (min(ends) if ends else last)
