"""Optional Prometheus endpoint for the manager (needs ``ms-recover[metrics]``).

Follows Prometheus conventions: counters end in ``_total``, durations are histograms in seconds,
``ms_recover_build_info`` carries the version, and the job state is one series per state (1 for
the current). Values come from the manager at scrape time (state, ranks, epoch, steps, flagged
ranks) or from its events (recoveries, faults, phases, lost steps), so the endpoint never
touches the manager's hot loop.

Nothing reads as a real value before it has one: recovery durations are histograms (no
"MTTR 0.0" before the first recovery), and ``ms_recover_committed_step`` is absent until every
rank has committed a step. Counters a rule watches (recoveries by configured strategy and
outcome, faults by kind) start at 0, so the first increment is seen by ``increase()``.
"""

from __future__ import annotations

import bisect
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from ms_recover import __version__
from ms_recover.errors import ConfigError
from ms_recover.observability import goodput
from ms_recover.observability.events import Event, EventLog
from ms_recover.observability.goodput import GoodputLedger
from ms_recover.observability.schema import (
    PHASES,
    FaultKind,
    FaultRecord,
    FlaggedRecord,
    JobState,
    RecoveryRecord,
    SchemaError,
    SubHealthRecord,
    decode,
)

#: Upper bounds (seconds) of the recovery duration histogram: a retry takes about a second, a
#: rescheduled pod minutes.
RECOVERY_BUCKETS: tuple[float, ...] = (1, 2, 5, 10, 20, 30, 60, 120, 300, 600, 1200)
#: Upper bounds (seconds) of the per-phase histogram.
PHASE_BUCKETS: tuple[float, ...] = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300)
OUTCOMES = ("ok", "failed")
#: The kinds of event read whole (decoded); of the others only the time is read.
COUNTED = frozenset(
    {RecoveryRecord.EVENT, FaultRecord.EVENT, FlaggedRecord.EVENT, SubHealthRecord.EVENT}
    | goodput.KINDS
)


class Histogram:
    """Cumulative bucket counts and the sum of observed values (no locking: see caller)."""

    def __init__(self, bounds: Sequence[float]) -> None:
        self.bounds = tuple(float(b) for b in bounds)
        self.counts = [0] * (len(self.bounds) + 1)  # the last one is +Inf
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.sum += value

    def buckets(self) -> list[tuple[str, float]]:
        """``(le, cumulative count)`` pairs ending with ``+Inf``, as prometheus_client wants."""
        out, total = [], 0
        for bound, n in zip((*self.bounds, float("inf")), self.counts, strict=True):
            total += n
            out.append(("+Inf" if bound == float("inf") else f"{bound:g}", float(total)))
        return out


class ManagerCollector:
    """A prometheus_client collector over a status function and the event stream."""

    def __init__(self, status: Callable[[], dict[str, Any]], events: EventLog) -> None:
        self._status = status
        self._lock = threading.Lock()
        self._recoveries: dict[tuple[str, str], int] = {}
        self._faults: dict[str, int] = dict.fromkeys((k.value for k in FaultKind), 0)
        self._lost = 0
        self._flags: dict[str, int] = dict.fromkeys(FLAG_REASONS, 0)  # flagged, by reason
        self._sub_health: dict[tuple[str, str], int] = {}  # (policy, action) -> count
        self._duration = Histogram(RECOVERY_BUCKETS)
        self._phases = {phase: Histogram(PHASE_BUCKETS) for phase in PHASES}
        self._goodput = GoodputLedger()
        events.subscribe(self._on_event)

    def _on_event(self, e: Event) -> None:
        if e.get("event") not in COUNTED:
            with self._lock:
                self._goodput.on_event(e)  # its clock
            return
        try:
            line = decode(e)
        except SchemaError:  # not the manager's: nothing to count
            return
        with self._lock:  # scrapes read the same state from their own thread
            self._goodput.add(line)
            if isinstance(line.record, RecoveryRecord):
                self._on_recovery(line.record)
            elif isinstance(line.record, FaultRecord):
                name = line.record.kind
                self._faults[name] = self._faults.get(name, 0) + 1
            elif isinstance(line.record, FlaggedRecord):
                reason = line.record.reason
                self._flags[reason] = self._flags.get(reason, 0) + 1
            elif isinstance(line.record, SubHealthRecord):
                key = (line.record.policy, line.record.action)
                self._sub_health[key] = self._sub_health.get(key, 0) + 1

    def _on_recovery(self, r: RecoveryRecord) -> None:
        key = (r.strategy, OUTCOMES[0] if r.ok else OUTCOMES[1])
        self._recoveries[key] = self._recoveries.get(key, 0) + 1
        self._duration.observe(r.mttr_s)
        self._lost += r.lost_steps or 0
        for phase, seconds in r.phases.items():
            self._phases.setdefault(phase, Histogram(PHASE_BUCKETS)).observe(seconds)

    def collect(self) -> Iterator[Any]:
        status = self._status()
        with self._lock:
            yield from self._from_events(status)
        yield from self._from_status(status)

    def _from_events(self, status: dict[str, Any]) -> Iterator[Any]:
        from prometheus_client.core import (
            CounterMetricFamily,
            HistogramMetricFamily,
        )

        rec = CounterMetricFamily(
            "ms_recover_recoveries",
            "Recovery rounds that ended, by strategy and outcome (ok or failed)",
            labels=["strategy", "outcome"],
        )
        counts = {
            **{(s, o): 0 for s in _strategies(status) for o in OUTCOMES},
            **self._recoveries,
        }
        for (strategy, outcome), n in sorted(counts.items()):
            rec.add_metric([strategy, outcome], n)
        yield rec
        faults = CounterMetricFamily(
            "ms_recover_faults", "Faults detected, by kind", labels=["kind"]
        )
        for kind, n in sorted(self._faults.items()):
            faults.add_metric([kind], n)
        yield faults
        yield CounterMetricFamily(
            "ms_recover_lost_steps", "Committed steps lost to recoveries", value=self._lost
        )
        flags = CounterMetricFamily(
            "ms_recover_flags",
            "Ranks flagged by the detector (slow: fail-slow; diverged: a replica that diverged "
            "again after a repair), by reason",
            labels=["reason"],
        )
        for reason, n in sorted(self._flags.items()):
            flags.add_metric([reason], n)
        yield flags
        acts = CounterMetricFamily(
            "ms_recover_sub_health_actions",
            "What the sub-health policy (subHealthyStrategy) did with flagged nodes",
            labels=["policy", "action"],
        )
        for (policy, action), n in sorted(self._sub_health.items()):
            acts.add_metric([policy, action], n)
        yield acts
        duration = HistogramMetricFamily(
            "ms_recover_recovery_duration_seconds",
            "Time from the fault to training again (MTTR) of each recovery round",
        )
        duration.add_metric([], self._duration.buckets(), self._duration.sum)
        yield duration
        phases = HistogramMetricFamily(
            "ms_recover_recovery_phase_seconds",
            "Time each recovery round spent in each phase",
            labels=["phase"],
        )
        for phase, hist in self._phases.items():
            phases.add_metric([phase], hist.buckets(), hist.sum)
        yield phases
        yield from self._goodput_series()

    def _goodput_series(self) -> Iterator[Any]:
        """ETTR and the wall time by category, from the goodput ledger (the events' wall clock);
        absent until the ledger has seen an event."""
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        times = self._goodput.snapshot(time.time())
        wall = sum(times.values())
        if wall <= 0:
            return
        yield GaugeMetricFamily(
            "ms_recover_goodput_ratio",
            "Productive training time over wall time (ETTR)",
            value=times.get("productive", 0.0) / wall,
        )
        spent = CounterMetricFamily(
            "ms_recover_time_seconds", "The job's wall time by category", labels=["category"]
        )
        for category, seconds in sorted(times.items()):
            spent.add_metric([category], seconds)
        yield spent

    def _from_status(self, status: dict[str, Any]) -> Iterator[Any]:
        from prometheus_client.core import GaugeMetricFamily, InfoMetricFamily

        yield InfoMetricFamily(
            "ms_recover_build", "The ms_recover version", value={"version": __version__}
        )
        state = GaugeMetricFamily(
            "ms_recover_job_state", "1 for the job's current state", labels=["state"]
        )
        for s in JobState:
            state.add_metric([s.value], 1.0 if status["state"] == s.value else 0.0)
        yield state
        ranks = status["ranks"]
        steps = [r["step"] for r in ranks]
        if steps and min(steps) >= 0:  # absent until every rank has committed a step
            yield GaugeMetricFamily(
                "ms_recover_committed_step",
                "The job's committed step (the lowest over its ranks)",
                value=min(steps),
            )
        alive = sum(1 for r in ranks if r["alive"])
        yield GaugeMetricFamily("ms_recover_ranks_alive", "Ranks alive and registered", alive)
        yield GaugeMetricFamily("ms_recover_world_size", "Ranks in the job", status["world_size"])
        yield GaugeMetricFamily("ms_recover_epoch", "Current epoch", value=status["epoch"])
        yield GaugeMetricFamily(
            "ms_recover_ranks_flagged",
            "Ranks the detector flagged (slow or suspect) and not replaced since",
            value=len(status.get("flagged") or ()),
        )
        yield GaugeMetricFamily(
            "ms_recover_hot_switches_waiting",
            "Flagged nodes whose hot switch waits for their new pod",
            value=len(status.get("hot_switch") or ()),
        )
        yield GaugeMetricFamily(
            "ms_recover_spare_nodes",
            "Spare nodes waiting to take a lost node's place (ms-recover agent --spare)",
            value=len(status.get("spares") or ()),
        )
        yield GaugeMetricFamily(
            "ms_recover_insecure",
            "1 when the job has no secret: anyone who can reach the manager can drive it",
            value=1 if status.get("insecure") else 0,
        )


#: The reasons a ``flagged`` event gives (each series starts at 0).
FLAG_REASONS = ("slow", "diverged")


def _strategies(status: dict[str, Any]) -> list[str]:
    """The configured strategies of a status snapshot (``"recover-in-place,exit"``)."""
    return [s for s in str(status.get("strategies", "")).split(",") if s]


def registry_for(status: Callable[[], dict[str, Any]], events: EventLog) -> Any:
    """A registry with the manager's collector and the process collector."""
    try:
        from prometheus_client.process_collector import ProcessCollector
        from prometheus_client.registry import CollectorRegistry
    except ImportError as exc:
        raise ConfigError(
            "the metrics endpoint needs prometheus-client: pip install 'ms-recover[metrics]'"
        ) from exc
    registry = CollectorRegistry()
    registry.register(ManagerCollector(status, events))
    ProcessCollector(registry=registry)
    return registry


def serve_metrics(
    port: int, status: Callable[[], dict[str, Any]], events: EventLog, host: str = "0.0.0.0"
) -> Any:
    """Start the endpoint on ``host:port`` in a daemon thread; returns the HTTP server."""
    registry = registry_for(status, events)
    from prometheus_client import start_http_server

    server, _thread = start_http_server(port, addr=host, registry=registry)
    return server
