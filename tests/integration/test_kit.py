"""The Kubernetes kit renders and holds (issue 29, items 2 and 4): every kustomization under
deploy/ renders with ``kubectl kustomize`` (no apiserver), each rendered AscendJob passes
``ms-recover check-job``, the kit has its monitoring objects, and promtool checks and
unit-tests the alert rules. kubectl and promtool (Debian's ``prometheus``) are required."""

from __future__ import annotations

import pathlib
import shutil
import subprocess
import sys

import pytest
import yaml

pytestmark = pytest.mark.timeout(180)

ROOT = pathlib.Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
KUSTOMIZATIONS = sorted(p.parent for p in DEPLOY.rglob("kustomization.yaml"))


def _tool(name: str, package: str) -> str:
    path = shutil.which(name)
    assert path, f"{name} is not installed: install {package} (.ci/run does)"
    return path


def _render(directory: pathlib.Path) -> list[dict]:
    out = subprocess.run(
        [_tool("kubectl", "kubectl"), "kustomize", str(directory)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    return [d for d in yaml.safe_load_all(out.stdout) if d]


@pytest.mark.parametrize("directory", KUSTOMIZATIONS, ids=lambda p: str(p.relative_to(DEPLOY)))
def test_every_kustomization_renders_and_its_job_passes_check_job(
    directory: pathlib.Path, tmp_path: pathlib.Path
) -> None:
    docs = _render(directory)
    jobs = [d for d in docs if d["kind"] == "AscendJob"]
    if not jobs:
        assert directory.name == "monitoring", f"{directory} renders no AscendJob"
        return
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump_all(jobs))
    check = subprocess.run(
        [sys.executable, "-m", "ms_recover.cli", "check-job", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert check.returncode == 0, check.stdout + check.stderr
    assert "0 warning(s)" in check.stdout, check.stdout
    scheduler = jobs[0]["spec"]["replicaSpecs"]["Scheduler"]["template"]
    ports = {p["name"] for c in scheduler["spec"]["containers"] for p in c.get("ports", [])}
    assert {"ascendjob-port", "taskd-port", "metrics"} <= ports
    assert scheduler["spec"]["terminationGracePeriodSeconds"] >= 300


def test_the_overlays_cover_agent_msrun_and_a_manager_container() -> None:
    names = {p.name for p in KUSTOMIZATIONS}
    assert {"agent", "msrun", "manager-container", "monitoring"} <= names
    docs = _render(DEPLOY / "overlays" / "manager-container")
    kinds = {d["kind"] for d in docs}
    assert {"AscendJob", "PodMonitor", "PrometheusRule", "ConfigMap"} <= kinds
    job = next(d for d in docs if d["kind"] == "AscendJob")
    containers = job["spec"]["replicaSpecs"]["Scheduler"]["template"]["spec"]["containers"]
    manager = next(c for c in containers if c["name"] == "ms-recover-manager")
    assert manager["readinessProbe"]["tcpSocket"]["port"] == 9601
    assert "ms-recover manager" in " ".join(manager["args"])
    training = next(c for c in containers if c["name"] == "ascend")
    env = {e["name"]: e.get("value") for e in training["env"]}
    assert env["MS_RECOVER_HOOK_AUTOSTART"] == "0"  # no second manager in the training container
    assert env["POD_IP"] is None  # from the downward API


def _promtool(*args: str) -> subprocess.CompletedProcess[str]:
    promtool = _tool("promtool", "Debian's prometheus package")
    return subprocess.run(
        [promtool, *args], cwd=DEPLOY / "monitoring", capture_output=True, text=True, timeout=60
    )


def test_promtool_checks_and_unit_tests_the_alert_rules() -> None:
    check = _promtool("check", "rules", "alerts.rules.yaml")
    assert check.returncode == 0 and "SUCCESS: 5 rules found" in check.stdout, check.stdout
    test = _promtool("test", "rules", "alerts_test.yaml")
    assert test.returncode == 0 and "SUCCESS" in test.stdout, test.stdout + test.stderr
