"""Optional Prometheus endpoint for the manager (needs ``ms-recover[metrics]``).

Exposes recoveries, MTTR, per-phase time, live ranks, the epoch and lost steps. Values are
read from the manager at scrape time (live ranks, epoch, state) or from its events
(recoveries, phases, lost steps), so the endpoint never touches the manager's hot loop.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from ms_recover.errors import ConfigError
from ms_recover.observability.events import Event, EventLog


class ManagerCollector:
    """A prometheus_client collector over a status function and the event stream."""

    def __init__(self, status: Callable[[], dict[str, Any]], events: EventLog) -> None:
        self._status = status
        self._recoveries: dict[tuple[str, str], int] = {}
        self._last: Event | None = None
        self._lost = 0
        self._phase_sum: dict[str, float] = {}
        events.subscribe(self._on_event)

    def _on_event(self, e: Event) -> None:
        if e["event"] != "recovery":
            return
        key = (e["strategy"], "true" if e["ok"] else "false")
        self._recoveries[key] = self._recoveries.get(key, 0) + 1
        self._last = e
        self._lost += int(e.get("lost_steps") or 0)
        for phase, seconds in e["phases"].items():
            self._phase_sum[phase] = self._phase_sum.get(phase, 0.0) + float(seconds)

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        status = self._status()
        rec = CounterMetricFamily(
            "ms_recover_recoveries", "Recoveries by strategy and outcome", labels=["strategy", "ok"]
        )
        for (strategy, ok), n in sorted(self._recoveries.items()):
            rec.add_metric([strategy, ok], n)
        yield rec
        mttr = GaugeMetricFamily("ms_recover_last_mttr_seconds", "MTTR of the last recovery")
        mttr.add_metric([], float(self._last["mttr_s"]) if self._last else 0.0)
        yield mttr
        phases = CounterMetricFamily(
            "ms_recover_phase_seconds",
            "Time spent in each recovery phase, summed over recoveries",
            labels=["phase"],
        )
        for phase, seconds in sorted(self._phase_sum.items()):
            phases.add_metric([phase], seconds)
        yield phases
        yield CounterMetricFamily("ms_recover_lost_steps", "Committed steps lost", value=self._lost)
        live = sum(1 for r in status["ranks"] if r["alive"])
        yield GaugeMetricFamily("ms_recover_live_ranks", "Ranks alive and registered", value=live)
        yield GaugeMetricFamily(
            "ms_recover_world_size", "Ranks in the job", value=status["world_size"]
        )
        yield GaugeMetricFamily("ms_recover_epoch", "Current epoch", value=status["epoch"])
        yield GaugeMetricFamily(
            "ms_recover_insecure",
            "1 when the job has no secret: anyone who can reach the manager can drive it",
            value=1 if status.get("insecure") else 0,
        )


def serve_metrics(
    port: int, status: Callable[[], dict[str, Any]], events: EventLog, host: str = "0.0.0.0"
) -> Any:
    """Start the endpoint on ``host:port`` in a daemon thread; returns the HTTP server."""
    try:
        from prometheus_client import start_http_server
        from prometheus_client.registry import CollectorRegistry
    except ImportError as exc:
        raise ConfigError(
            "the metrics endpoint needs prometheus-client: pip install 'ms-recover[metrics]'"
        ) from exc
    registry = CollectorRegistry()
    registry.register(ManagerCollector(status, events))
    server, _thread = start_http_server(port, addr=host, registry=registry)
    return server
