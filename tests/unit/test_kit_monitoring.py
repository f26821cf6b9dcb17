"""The monitoring half of the Kubernetes kit names only what the manager exports: every series
in the dashboard's queries and the alert rules is one ms_recover's metrics endpoint serves, and
the PrometheusRule carries exactly the rules promtool tests."""

from __future__ import annotations

import json
import pathlib
import re
from typing import Any

import yaml

from ms_recover.observability.events import EventLog
from ms_recover.observability.metrics import registry_for
from tests.eventlines import record

ROOT = pathlib.Path(__file__).resolve().parents[2]
MONITORING = ROOT / "deploy" / "monitoring"
SERIES = re.compile(r"\b((?:ms_recover|process)_[a-z_]+)\b")
ALERTS = {
    "MsRecoverRecoveryFailed",
    "MsRecoverRecoveriesTooFrequent",
    "MsRecoverMTTRHigh",
    "MsRecoverInsecure",
    "MsRecoverRankFlagged",
}


def _exported() -> set[str]:
    """Every sample name the manager's endpoint serves (after a recovery, so the histograms
    have samples too)."""
    events = EventLog()

    def status() -> dict[str, Any]:
        ranks = [{"alive": True, "step": 5}, {"alive": True, "step": 6}]
        return {
            "world_size": 2,
            "epoch": 1,
            "state": "running",
            "strategies": "recover",
            "ranks": ranks,
        }

    registry = registry_for(status, events)
    phases = dict.fromkeys(("detect", "stop", "replace", "rebuild", "repair", "resume"), 0.1)
    events.write(
        record("recovery", ok=True, strategy="recover", mttr_s=3.0, phases=phases, lost_steps=0)
    )
    return {s.name for family in registry.collect() for s in family.samples}


def _dashboard_queries() -> list[str]:
    dash = json.loads((MONITORING / "dashboard.json").read_text())
    return [t["expr"] for p in dash["panels"] for t in p.get("targets", [])]


def _rules() -> list[dict[str, Any]]:
    groups = yaml.safe_load((MONITORING / "alerts.rules.yaml").read_text())["groups"]
    return [rule for g in groups for rule in g["rules"]]


def test_every_dashboard_query_names_an_exported_series() -> None:
    exported, queries = _exported(), _dashboard_queries()
    assert len(queries) >= 10
    for expr in queries:
        names = SERIES.findall(expr)
        assert names, f"query names no ms_recover series: {expr}"
        missing = [n for n in names if n not in exported]
        assert not missing, f"{expr}: {missing} not exported (exported: {sorted(exported)})"


def test_every_alert_names_an_exported_series_and_all_five_exist() -> None:
    exported, rules = _exported(), _rules()
    assert {r["alert"] for r in rules} == ALERTS
    for rule in rules:
        names = SERIES.findall(rule["expr"])
        assert names and all(n in exported for n in names), rule["expr"]


def test_the_prometheusrule_carries_exactly_the_tested_rules() -> None:
    crd = yaml.safe_load((MONITORING / "prometheusrule.yaml").read_text())
    plain = yaml.safe_load((MONITORING / "alerts.rules.yaml").read_text())
    assert crd["kind"] == "PrometheusRule"
    assert crd["spec"] == plain


def test_every_alert_is_unit_tested_firing() -> None:
    tests = yaml.safe_load((MONITORING / "alerts_test.yaml").read_text())
    fired = {
        case["alertname"]
        for t in tests["tests"]
        for case in t["alert_rule_test"]
        if case["exp_alerts"]
    }
    quiet = {
        case["alertname"]
        for t in tests["tests"]
        for case in t["alert_rule_test"]
        if not case["exp_alerts"]
    }
    assert fired == ALERTS == quiet
