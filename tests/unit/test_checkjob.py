"""`ms-recover check-job`: the real MindCluster samples, our samples, and broken variants."""

from __future__ import annotations

import copy
import json
import pathlib
from collections.abc import Callable
from typing import Any

import pytest
import yaml

from ms_recover import cli
from ms_recover.jobcheck import schema as crdschema
from tests.shared_data import shared_data

pytestmark = pytest.mark.timeout(60)

ROOT = pathlib.Path(__file__).resolve().parents[2]
SAMPLES = ROOT / "samples"
OUR_SAMPLES = [
    "ascendjob-recover.yaml",
    "ascendjob-recover-in-place.yaml",
    "ascendjob-combined.yaml",
    "ascendjob-msrun.yaml",
]
WORKER = "spec.replicaSpecs.Worker.template.spec.containers[0]"
SCHEDULER = "spec.replicaSpecs.Scheduler.template.spec.containers[0]"
SECRET_WARNING = "no MS_RECOVER_SECRET"


def check(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    """Run the subcommand in-process; return (exit code, stdout + stderr)."""
    code = cli.main(["check-job", *argv])
    captured = capsys.readouterr()
    text = captured.out + captured.err
    assert "Traceback" not in text
    return code, text


def check_json(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, dict[str, Any]]:
    code = cli.main(["check-job", "--json", *argv])
    return code, json.loads(capsys.readouterr().out)


def findings(report: dict[str, Any], severity: str) -> set[tuple[str, str]]:
    """(path, first words of the message) of every finding of one severity."""
    return {
        (f["path"], " ".join(f["message"].split()[:4]))
        for f in report["findings"]
        if f["severity"] == severity
    }


# --- MindCluster's own samples -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "expected_warnings"),
    [
        # MindCluster jobs know nothing of ms_recover's HMAC secret: one warning per replica.
        (
            "qwen3_ms_multinodes_acjob_superpod.yaml",
            {
                (f"{SCHEDULER}.env", "no MS_RECOVER_SECRET; frames are"),
                (f"{WORKER}.env", "no MS_RECOVER_SECRET; frames are"),
            },
        ),
        # "retry" alone does not restart processes, so a missing 9601 is only a warning; the
        # sample predates TaskD and uses MindIO's ttp-port instead.
        (
            "llama2_ms_multinodes_acjob_910b.yaml",
            {
                (f"{SCHEDULER}.ports", "missing port 9601 (taskd-port);"),
                (f"{WORKER}.ports", "missing port 9601 (taskd-port);"),
                (f"{SCHEDULER}.env", "no MS_RECOVER_SECRET; frames are"),
                (f"{WORKER}.env", "no MS_RECOVER_SECRET; frames are"),
            },
        ),
        # No recover-strategy: nothing of ours applies.
        ("resnet50_fault-rescheduling_a800_AscendJob_910b.yaml", set()),
    ],
)
def test_mindcluster_samples_have_no_errors(
    capsys: pytest.CaptureFixture[str], name: str, expected_warnings: set[tuple[str, str]]
) -> None:
    code, report = check_json(capsys, str(shared_data("ascendjob", name)))
    assert code == 0
    assert findings(report, "error") == set()
    assert findings(report, "warning") == expected_warnings
    assert report["files"][0]["jobs"] == 1


def test_config_maps_are_skipped_and_documents_numbered(capsys: pytest.CaptureFixture[str]) -> None:
    code, text = check(
        capsys, str(shared_data("ascendjob", "qwen3_ms_multinodes_acjob_superpod.yaml"))
    )
    assert code == 0
    assert f"qwen3_ms_multinodes_acjob_superpod.yaml: doc 3: {WORKER}.env: warning:" in text


# --- our samples -------------------------------------------------------------------------------


@pytest.mark.parametrize("name", OUR_SAMPLES)
def test_our_samples_are_clean(capsys: pytest.CaptureFixture[str], name: str) -> None:
    code, report = check_json(capsys, "--strict", str(SAMPLES / name))
    assert (code, report["errors"], report["warnings"]) == (0, 0, 0), report["findings"]


def test_samples_carry_what_the_brief_promises() -> None:
    docs = {n: yaml.safe_load((SAMPLES / n).read_text()) for n in OUR_SAMPLES}
    strategies = {n: d["metadata"]["annotations"]["recover-strategy"] for n, d in docs.items()}
    assert strategies == {
        "ascendjob-recover.yaml": "recover",
        "ascendjob-recover-in-place.yaml": "recover-in-place",
        "ascendjob-combined.yaml": "retry,recover,dump,exit",
        "ascendjob-msrun.yaml": "recover-in-place,recover",
    }
    assert any("wait-reschedule-timeout" in d["metadata"]["annotations"] for d in docs.values())
    for doc in docs.values():
        for spec in doc["spec"]["replicaSpecs"].values():
            env = {e["name"]: e for e in spec["template"]["spec"]["containers"][0]["env"]}
            assert "secretKeyRef" in env["MS_RECOVER_SECRET"]["valueFrom"]


# --- broken variants of our sample -------------------------------------------------------------


def _worker(doc: dict[str, Any]) -> dict[str, Any]:
    container: dict[str, Any] = doc["spec"]["replicaSpecs"]["Worker"]["template"]["spec"][
        "containers"
    ][0]
    return container


def _set(path: tuple[str, ...], value: Any) -> Callable[[dict[str, Any]], None]:
    def mutate(doc: dict[str, Any]) -> None:
        node = doc
        for key in path[:-1]:
            node = node[key]
        node[path[-1]] = value

    return mutate


def _drop_9601(doc: dict[str, Any]) -> None:
    _worker(doc)["ports"] = [p for p in _worker(doc)["ports"] if p["containerPort"] != 9601]


def _rename_container(doc: dict[str, Any]) -> None:
    _worker(doc)["name"] = "main"


def _unknown_field(doc: dict[str, Any]) -> None:
    _worker(doc)["imagePullPolice"] = "IfNotPresent"


def _drop_replica_specs(doc: dict[str, Any]) -> None:
    del doc["spec"]["replicaSpecs"]


ANNOTATIONS = ("metadata", "annotations")
BROKEN = {
    "bad strategy": (
        _set(ANNOTATIONS + ("recover-strategy",), "recovr"),
        "metadata.annotations.recover-strategy: error: recover-strategy 'recovr' "
        "is not one of: retry, recover-in-place, recover, elastic-training, dump, "
        "exit",
    ),
    "duplicate strategy": (
        _set(ANNOTATIONS + ("recover-strategy",), "recover,recover"),
        "recover-strategy 'recover' is listed twice in 'recover,recover'; "
        "valid: retry, recover-in-place",
    ),
    "bad fault-scheduling": (
        _set(("metadata", "labels", "fault-scheduling"), "gracefull"),
        "metadata.labels.fault-scheduling: error: 'gracefull' is not one of: grace, force, off",
    ),
    "bad subHealthyStrategy": (
        _set(("metadata", "labels", "subHealthyStrategy"), "hotswitch"),
        "metadata.labels.subHealthyStrategy: error: 'hotswitch' is not one of: ignore, "
        "graceExit, forceExit, hotSwitch",
    ),
    "timeout 20": (
        _set(ANNOTATIONS + ("wait-reschedule-timeout",), "20"),
        "metadata.annotations.wait-reschedule-timeout: error: '20' must be an "
        "integer number of seconds in 30..270",
    ),
    "timeout 300": (
        _set(ANNOTATIONS + ("wait-reschedule-timeout",), "300"),
        "error: '300' must be an integer number of seconds in 30..270",
    ),
    "missing 9601": (_drop_9601, f"{WORKER}.ports: error: missing port 9601 (taskd-port)"),
    "scheduler replicas 2": (
        _set(("spec", "replicaSpecs", "Scheduler", "replicas"), 2),
        "spec.replicaSpecs.Scheduler.replicas: error: Scheduler replicas is 2; it must be 1",
    ),
    "container renamed": (
        _rename_container,
        "spec.replicaSpecs.Worker.template.spec.containers: error: no "
        "container named 'ascend' (found: 'main')",
    ),
    "replicas two": (
        _set(("spec", "replicaSpecs", "Worker", "replicas"), "two"),
        "spec.replicaSpecs.Worker.replicas: error: must be an integer, got string 'two'",
    ),
    "unknown field": (
        _unknown_field,
        f"{WORKER}.imagePullPolice: error: unknown field 'imagePullPolice'",
    ),
    "unquoted on": (
        _set(("metadata", "labels", "process-recover-enable"), True),
        "metadata.labels.process-recover-enable: error: must be a string, got True; "
        'quote it in YAML (process-recover-enable: "on")',
    ),
    "missing replicaSpecs": (
        _drop_replica_specs,
        "spec.replicaSpecs: error: required field is missing",
    ),
}


@pytest.fixture(scope="module")
def sample() -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load((SAMPLES / "ascendjob-recover.yaml").read_text())
    return doc


@pytest.mark.parametrize("case", sorted(BROKEN))
def test_broken_variant_is_an_error(
    capsys: pytest.CaptureFixture[str],
    tmp_path: pathlib.Path,
    sample: dict[str, Any],
    case: str,
) -> None:
    mutate, expected = BROKEN[case]
    doc = copy.deepcopy(sample)
    mutate(doc)
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    code, text = check(capsys, str(path))
    assert code == 1
    assert expected in text
    assert f"{path}: doc 1: " in text


def test_duplicate_port_and_duplicate_key(
    capsys: pytest.CaptureFixture[str], tmp_path: pathlib.Path, sample: dict[str, Any]
) -> None:
    doc = copy.deepcopy(sample)
    _worker(doc)["ports"].append({"containerPort": 9601, "name": "again"})
    dup_port = tmp_path / "dup-port.yaml"
    dup_port.write_text(yaml.safe_dump(doc))
    dup_key = tmp_path / "dup-key.yaml"
    dup_key.write_text("kind: AscendJob\nkind: AscendJob\n")
    code, text = check(capsys, str(dup_port), str(dup_key))
    assert code == 1
    assert f"{WORKER}.ports[2]: error: duplicate entry (containerPort=9601, protocol=TCP)" in text
    assert "is not valid YAML: line 2, column 1: duplicate key 'kind'" in text


def test_elastic_training_with_mindspore_is_a_warning(
    capsys: pytest.CaptureFixture[str], tmp_path: pathlib.Path, sample: dict[str, Any]
) -> None:
    doc = copy.deepcopy(sample)
    doc["metadata"]["annotations"]["recover-strategy"] = "recover,elastic-training"
    path = tmp_path / "elastic.yaml"
    path.write_text(yaml.safe_dump(doc))
    code, report = check_json(capsys, str(path))
    assert code == 0
    [warning] = report["findings"]
    assert warning["severity"] == "warning"
    assert "Operator applies elastic-training to PyTorch jobs only" in warning["message"]
    assert cli.main(["check-job", "--strict", str(path)]) == 1


# --- files that are not jobs -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        (None, "error: no such file"),
        (
            "kind: AscendJob\nmetadata: {name: [unclosed\n",
            "error: is not valid YAML: line 3, column 1",
        ),
        (
            "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: x}\n",
            "error: has no kind: AscendJob document (found: Deployment)",
        ),
        ("", "error: has no kind: AscendJob document (found: no documents)"),
        ("- just\n- a list\n", "doc 1: error: is a list, not a Kubernetes object"),
    ],
)
def test_files_that_are_not_jobs(
    capsys: pytest.CaptureFixture[str],
    tmp_path: pathlib.Path,
    content: str | None,
    expected: str,
) -> None:
    path = tmp_path / "input.yaml"
    if content is not None:
        path.write_text(content)
    code, text = check(capsys, str(path))
    assert code == 1
    assert expected in text


def test_usage_error_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        cli.main(["check-job"])
    assert exc.value.code == 2
    assert "Traceback" not in capsys.readouterr().err


# --- the schema validator on its own -----------------------------------------------------------


def test_int_or_string_pattern_and_nulls() -> None:
    schema = crdschema.load_crd().schema
    quantity = {"x-kubernetes-int-or-string": True, "pattern": r"^[0-9]+$"}
    assert crdschema.validate(8, quantity) == []
    assert crdschema.validate("8", quantity) == []
    assert [i.message for i in crdschema.validate("eight", quantity)] == [
        "'eight' does not match the pattern ^[0-9]+$"
    ]
    assert "must be an integer or a string" in crdschema.validate(1.5, quantity)[0].message
    assert crdschema.validate({"spec": {"replicaSpecs": {"Worker": None}}}, schema) == []
    issues = crdschema.validate({"spec": {"replicaSpecs": {"Worker": {"replicas": 2**40}}}}, schema)
    assert [i.message for i in issues] == [f"{2**40} is out of range for int32"]


def test_format_path_quotes_odd_keys() -> None:
    path = ("spec", "resources", "limits", "huawei.com/Ascend910")
    assert crdschema.format_path(path) == 'spec.resources.limits["huawei.com/Ascend910"]'
    assert crdschema.format_path(("a", 0, "b")) == "a[0].b"


@pytest.mark.parametrize(
    "text",
    [
        "kind: AscendJob\nspec: 5\n",
        "kind: AscendJob\nmetadata: 5\nspec: {replicaSpecs: {Worker: 5}}\n",
        "kind: AscendJob\nmetadata: {labels: [1], annotations: {recover-strategy: 5}}\n"
        "spec: {replicaSpecs: {Worker: {template: {spec: {containers: [5, {name: ascend, "
        "ports: [{containerPort: {a: 1}}, {containerPort: {a: 1}}]}]}}}}}\n",
    ],
)
def test_mistyped_documents_are_reported_not_raised(
    capsys: pytest.CaptureFixture[str], tmp_path: pathlib.Path, text: str
) -> None:
    path = tmp_path / "odd.yaml"
    path.write_text(text)
    code, out = check(capsys, str(path))
    assert code == 1
    assert "apiVersion: error: is missing; valid: mindxdl.gitee.com/v1" in out


# --- a job without spec (issue 9 #10) ----------------------------------------------------------


def test_a_job_without_spec_is_an_error_and_its_labels_are_still_checked(
    capsys: pytest.CaptureFixture[str], tmp_path: pathlib.Path, sample: dict[str, Any]
) -> None:
    doc = copy.deepcopy(sample)
    del doc["spec"]
    del doc["metadata"]["labels"]["framework"]
    path = tmp_path / "nospec.yaml"
    path.write_text(yaml.safe_dump(doc))
    code, report = check_json(capsys, str(path))
    assert code == 1
    errors = findings(report, "error")
    assert ("spec", "is missing; an AscendJob") in errors
    assert ("metadata.labels.framework", "is missing; the Ascend") in errors


def test_ttp_port_needs_its_container_port_and_a_number(
    capsys: pytest.CaptureFixture[str], tmp_path: pathlib.Path, sample: dict[str, Any]
) -> None:
    # MindCluster's samples pass MindIO's port as TTP_PORT with a containerPort of the same
    # number: MindSpore's processors reach the manager there (ms_recover serves it too).
    doc = copy.deepcopy(sample)
    _worker(doc).setdefault("env", []).append({"name": "TTP_PORT", "value": "8000"})
    no_port = tmp_path / "no-port.yaml"
    no_port.write_text(yaml.safe_dump(doc))
    _worker(doc)["ports"].append({"containerPort": 8000, "name": "ttp-port"})
    ok = tmp_path / "ok.yaml"
    ok.write_text(yaml.safe_dump(doc))
    _worker(doc)["env"][-1]["value"] = "80x0"
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(doc))
    _, report = check_json(capsys, str(no_port))
    assert (f"{WORKER}.ports", "TTP_PORT=8000 but no containerPort") in findings(report, "warning")
    _, report = check_json(capsys, str(ok))
    assert not [f for f in report["findings"] if "TTP_PORT" in f["message"]]
    code, text = check(capsys, str(bad))
    assert code == 1 and "TTP_PORT='80x0' is not a port number (1..65535)" in text
