"""ms_recover's own rules for an AscendJob, on top of the CRD schema.

Each rule looks at one parsed AscendJob document and returns :class:`JobIssue` values; none
raises on malformed input (the schema check reports shapes, rules skip what they cannot read).
Errors are what the Ascend Operator, Volcano or ClusterD reject or silently misread, or what
stops ms_recover from working. Warnings are deviations from MindCluster's samples that still run.
Sources: MindCluster's sample AscendJobs, the AscendJob CRD and the Ascend Operator's
``ascendjob_validate.go``.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Iterator
from typing import Any

from ms_recover.errors import ConfigError
from ms_recover.jobcheck.schema import Path
from ms_recover.strategy import VALID_NAMES, Strategy, parse_strategies
from ms_recover.subhealth import LABEL, SubHealthy
from ms_recover.subhealth import VALID_NAMES as SUB_HEALTHY_NAMES

ERROR = "error"
WARNING = "warning"

CONTAINER = "ascend"  # the operator finds the training container by this name
JOB_PORT, JOB_PORT_NAME = 2222, "ascendjob-port"
TASKD_PORT, TASKD_PORT_NAME = 9601, "taskd-port"
FRAMEWORK_REPLICAS = {
    "mindspore": ("Scheduler", "Worker"),
    "pytorch": ("Master", "Worker"),
    "tensorflow": ("Chief", "Worker"),
}
FAULT_SCHEDULING = ("grace", "force", "off")
PROCESS_RECOVER = ("on", "pause", "off")
RESTART_POLICIES = ("Always", "OnFailure", "Never", "ExitCode")
WAIT_RESCHEDULE = (30, 270)
NPU_PREFIX = "huawei.com/Ascend"
# Strategies that restart or move processes: the manager must be reachable by newcomers.
#: A decimal integer as Kubernetes' and ClusterD's parsers read one: ASCII digits (no Unicode
#: digits, no '_'), an optional sign, at most 18 digits (an int64, never a 4300-digit string).
_DECIMAL = re.compile(r"[+-]?[0-9]{1,18}")
RESCHEDULING = {Strategy.RECOVER, Strategy.RECOVER_IN_PLACE, Strategy.ELASTIC_TRAINING}


@dataclasses.dataclass(frozen=True)
class JobIssue:
    """One finding inside a document: severity, YAML path and a message naming valid values."""

    severity: str
    path: Path
    message: str


@dataclasses.dataclass(frozen=True)
class Replica:
    """One entry of ``spec.replicaSpecs`` with its ``ascend`` container, if it has one."""

    name: str
    spec: dict[str, Any]
    path: Path
    containers: list[Any]
    container_index: int | None
    container: dict[str, Any]

    @property
    def container_path(self) -> Path:
        return self.path + ("template", "spec", "containers", self.container_index or 0)


@dataclasses.dataclass(frozen=True)
class Job:
    """The parts of an AscendJob the rules read, extracted defensively."""

    labels: dict[str, Any]
    annotations: dict[str, Any]
    replicas: tuple[Replica, ...]
    strategies: tuple[Strategy, ...] | None  # None: no (valid) recover-strategy annotation

    @property
    def framework(self) -> str:
        value = self.labels.get("framework")
        return value if isinstance(value, str) else ""

    @property
    def is_mindspore(self) -> bool:
        return self.framework == "mindspore" or any(
            r.name.lower() == "scheduler" for r in self.replicas
        )


def check_job(doc: dict[str, Any]) -> list[JobIssue]:
    """Every ms_recover rule applied to one AscendJob document (already a mapping)."""
    job = _extract(doc)
    issues: list[JobIssue] = []
    for rule in RULES:
        issues.extend(rule(job))
    return issues


def _error(path: Path, message: str) -> JobIssue:
    return JobIssue(ERROR, path, message)


def _warning(path: Path, message: str) -> JobIssue:
    return JobIssue(WARNING, path, message)


def _as_dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _extract(doc: dict[str, Any]) -> Job:
    meta = _as_dict(doc.get("metadata"))
    annotations = _as_dict(meta.get("annotations"))
    raw = annotations.get("recover-strategy")
    strategies: tuple[Strategy, ...] | None = None
    if isinstance(raw, str):
        try:
            strategies = parse_strategies(raw)
        except ConfigError:
            strategies = None
    specs = _as_dict(_as_dict(doc.get("spec")).get("replicaSpecs"))
    replicas = tuple(_replica(str(name), _as_dict(spec)) for name, spec in specs.items())
    return Job(_as_dict(meta.get("labels")), annotations, replicas, strategies)


def _replica(name: str, spec: dict[str, Any]) -> Replica:
    path: Path = ("spec", "replicaSpecs", name)
    containers = _as_list(_as_dict(_as_dict(spec.get("template")).get("spec")).get("containers"))
    for index, container in enumerate(containers):
        if isinstance(container, dict) and container.get("name") == CONTAINER:
            return Replica(name, spec, path, containers, index, container)
    return Replica(name, spec, path, containers, None, {})


def _env(container: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {str(e.get("name")): e for e in _as_list(container.get("env")) if isinstance(e, dict)}


# --- metadata ----------------------------------------------------------------------------------


def rule_recover_strategy(job: Job) -> Iterator[JobIssue]:
    path: Path = ("metadata", "annotations", "recover-strategy")
    raw = job.annotations.get("recover-strategy")
    if not isinstance(raw, str):
        return
    try:
        parsed = parse_strategies(raw)
    except ConfigError as exc:
        text = str(exc) if "valid" in str(exc) else f"{exc}; valid: {VALID_NAMES}"
        yield _error(path, text)
        return
    if not parsed:
        yield _warning(path, "is empty: no process-level recovery; valid: " + VALID_NAMES)
    if Strategy.ELASTIC_TRAINING in parsed and job.is_mindspore:
        yield _warning(
            path,
            "elastic-training with MindSpore: ms_recover supports it, but MindCluster's Ascend "
            "Operator applies elastic-training to PyTorch jobs only and ignores it here, so only "
            "ms_recover's manager will act on it",
        )


def rule_fault_scheduling(job: Job) -> Iterator[JobIssue]:
    path: Path = ("metadata", "labels", "fault-scheduling")
    value = job.labels.get("fault-scheduling")
    if isinstance(value, str) and value not in FAULT_SCHEDULING:
        yield _error(path, f"{value!r} is not one of: {', '.join(FAULT_SCHEDULING)}")
    moves_pods = job.strategies and {Strategy.RECOVER, Strategy.ELASTIC_TRAINING} & set(
        job.strategies
    )
    if moves_pods and value in (None, "off"):
        shown = "absent (treated as off)" if value is None else "off"
        yield _warning(
            path,
            f"is {shown}: MindCluster then does no fault rescheduling and a failed pod only "
            "counts against backoffLimit, but the 'recover' strategy needs the faulty pod "
            "recreated; set grace or force",
        )


def rule_sub_healthy(job: Job) -> Iterator[JobIssue]:
    """MindCluster's ``subHealthyStrategy`` label (Volcano takes an unknown value as ignore;
    ms_recover refuses it: :mod:`ms_recover.subhealth`)."""
    path: Path = ("metadata", "labels", LABEL)
    value = job.labels.get(LABEL)
    if value is not None and str(value) not in {p.value for p in SubHealthy}:
        yield _error(path, f"{str(value)!r} is not one of: {SUB_HEALTHY_NAMES}")


def rule_wait_reschedule(job: Job) -> Iterator[JobIssue]:
    path: Path = ("metadata", "annotations", "wait-reschedule-timeout")
    value = job.annotations.get("wait-reschedule-timeout")
    if not isinstance(value, str):
        return
    low, high = WAIT_RESCHEDULE
    seconds = _parse_int(value)
    if seconds is None or not low <= seconds <= high:
        yield _error(
            path,
            f"{value!r} must be an integer number of seconds in {low}..{high} (ClusterD falls "
            f"back to 270 otherwise)",
        )


def rule_process_recover(job: Job) -> Iterator[JobIssue]:
    path: Path = ("metadata", "labels", "process-recover-enable")
    value = job.labels.get("process-recover-enable")
    if job.strategies is None:
        return
    if value is None:
        yield _warning(
            path,
            "is absent while recover-strategy is set; the Ascend Operator adds it to the "
            'PodGroup itself, but MindCluster\'s samples also set process-recover-enable: "on" '
            "on the job; add it so the job and its PodGroup agree",
        )
    elif isinstance(value, str) and value not in PROCESS_RECOVER:
        yield _warning(
            path,
            f"{value!r} is not one of: {', '.join(PROCESS_RECOVER)}; Volcano and ClusterD "
            "treat it as off",
        )


def rule_framework(job: Job) -> Iterator[JobIssue]:
    path: Path = ("metadata", "labels", "framework")
    valid = ", ".join(FRAMEWORK_REPLICAS)
    if "framework" not in job.labels:
        yield _error(path, f"is missing; the Ascend Operator rejects the job; valid: {valid}")
        return
    allowed = FRAMEWORK_REPLICAS.get(job.framework)
    if allowed is None:
        yield _error(path, f"{job.labels['framework']!r} is not one of: {valid}")
        return
    for replica in job.replicas:
        if replica.name.lower() not in {a.lower() for a in allowed}:
            yield _error(
                replica.path,
                f"replica type {replica.name!r} is not valid for framework {job.framework}; "
                f"valid: {', '.join(allowed)}",
            )


# --- replica specs -----------------------------------------------------------------------------


def rule_replicas(job: Job) -> Iterator[JobIssue]:
    for replica in job.replicas:
        count = replica.spec.get("replicas", 1)
        if isinstance(count, int) and not isinstance(count, bool):
            if count == 0:
                yield _error(
                    replica.path + ("replicas",),
                    "is 0; the Ascend Operator rejects replica types with 0 replicas",
                )
            elif replica.name.lower() != "worker" and count != 1:
                yield _error(
                    replica.path + ("replicas",),
                    f"{replica.name} replicas is {count}; it must be 1 (the Ascend Operator "
                    "allows exactly one leader pod)",
                )
        yield from _restart_policy(job, replica)


def _restart_policy(job: Job, replica: Replica) -> Iterator[JobIssue]:
    path = replica.path + ("restartPolicy",)
    policy = replica.spec.get("restartPolicy")
    if isinstance(policy, str) and policy not in RESTART_POLICIES:
        yield _error(path, f"{policy!r} is not one of: {', '.join(RESTART_POLICIES)}")
    elif job.strategies and policy in ("Always", "OnFailure"):
        yield _warning(
            path,
            f"is {policy}: the kubelet restarts a failed container in the same pod on the same "
            "node, outside ms_recover's control; MindCluster's process-recovery samples use "
            "Never",
        )


def rule_containers(job: Job) -> Iterator[JobIssue]:
    for replica in job.replicas:
        base = replica.path + ("template", "spec", "containers")
        containers = replica.containers
        for index, container in enumerate(containers):
            if isinstance(container, dict) and not container.get("image"):
                yield _error(
                    base + (index, "image"),
                    "is missing; the Ascend Operator rejects containers without one",
                )
        if replica.container_index is None:
            names = ", ".join(repr(c.get("name")) for c in containers if isinstance(c, dict))
            yield _error(
                base,
                f"no container named {CONTAINER!r} (found: {names or 'none'}); the Ascend "
                f"Operator rejects the job and injects its env and ports only into the "
                f"container named {CONTAINER!r}; do not rename it",
            )
        elif replica.name.lower() != "scheduler" and _npu_request(replica.container) <= 0:
            yield _error(
                replica.container_path + ("resources", "requests"),
                f"requests no {NPU_PREFIX}* resource; the Ascend Operator rejects a "
                f"{replica.name} without NPUs",
            )


def _npu_request(container: dict[str, Any]) -> int:
    resources = _as_dict(container.get("resources"))
    # Kubernetes defaults an extended resource's request to its limit.
    for section in ("requests", "limits"):
        for name, amount in _as_dict(resources.get(section)).items():
            if str(name).startswith(NPU_PREFIX):
                return _parse_int(amount) or 0
    return 0


def _parse_int(value: Any) -> int | None:
    """An int field of a manifest (an int, or its decimal text, spaces around allowed) as an
    int; None for anything else. Never raises, whatever the value."""
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        return None
    if isinstance(value, int):
        return value
    text = value.strip()
    return int(text) if _DECIMAL.fullmatch(text) else None


# --- ms_recover's runtime needs ----------------------------------------------------------------


def rule_ports(job: Job) -> Iterator[JobIssue]:
    for replica in job.replicas:
        if replica.container_index is None:
            continue
        path = replica.container_path + ("ports",)
        ports = [p for p in _as_list(replica.container.get("ports")) if isinstance(p, dict)]
        if not any(p.get("name") == JOB_PORT_NAME for p in ports):
            yield _warning(
                path,
                f"no port named {JOB_PORT_NAME} ({JOB_PORT}); the Ascend Operator appends it "
                "itself, but declare it as MindCluster's samples do",
            )
        if job.strategies:
            yield from _taskd_port(job.strategies, replica, ports, path)


def _taskd_port(
    strategies: tuple[Strategy, ...], replica: Replica, ports: list[dict[str, Any]], path: Path
) -> Iterator[JobIssue]:
    wanted = _manager_port(replica.container)
    match = [p for p in ports if p.get("containerPort") == wanted]
    if not match:
        needs = sorted(s.value for s in RESCHEDULING & set(strategies))
        severity = ERROR if needs else WARNING
        why = (
            f"{', '.join(needs)} need the manager reachable from restarted processes"
            if needs
            else "ms_recover's manager listens on it for every strategy"
        )
        message = (
            f"missing port {wanted} ({TASKD_PORT_NAME}); recover-strategy is set and {why}; "
            f"add {{containerPort: {wanted}, name: {TASKD_PORT_NAME}}} to every replica"
        )
        yield JobIssue(severity, path, message)
    elif all(p.get("name") != TASKD_PORT_NAME for p in match):
        yield _warning(path, f"port {wanted} should be named {TASKD_PORT_NAME}")


def _manager_port(container: dict[str, Any]) -> int:
    """The port the manager binds: a literal MS_RECOVER_PORT in the env, else 9601."""
    value = _env(container).get("MS_RECOVER_PORT", {}).get("value")
    port = _parse_int(value)
    return TASKD_PORT if port is None else port


def rule_env(job: Job) -> Iterator[JobIssue]:
    if not job.strategies:
        return
    for replica in job.replicas:
        if replica.container_index is None:
            continue
        env = _env(replica.container)
        path = replica.container_path + ("env",)
        if "POD_IP" not in env:
            yield _warning(
                path,
                "no POD_IP (valueFrom.fieldRef.fieldPath: status.podIP); ms_recover uses it to "
                "find the scheduler pod and for rank-to-rank addresses",
            )
        secret = env.get("MS_RECOVER_SECRET")
        if secret is None and "MS_RECOVER_SECRET_FILE" not in env:
            yield _warning(
                path,
                "no MS_RECOVER_SECRET; frames are then signed with a key derived from the job "
                "id, which anyone can compute: whoever reaches the manager's port can drive the "
                "job; set it from a Kubernetes Secret (secretKeyRef) or MS_RECOVER_SECRET_FILE",
            )
        elif secret is not None and "value" in secret:
            yield _warning(
                path,
                "MS_RECOVER_SECRET is written in plain text; take it from a Kubernetes Secret "
                "(valueFrom.secretKeyRef)",
            )


def rule_ttp_port(job: Job) -> Iterator[JobIssue]:
    """MindSpore's MindIO processors reach the manager at MS_TFT_PORT; MindCluster's samples
    pass it as ``TTP_PORT`` (8000) with a container port of the same number on every replica."""
    for replica in job.replicas:
        if replica.container_index is None:
            continue
        env = _env(replica.container)
        name = next((n for n in ("MS_TFT_PORT", "TTP_PORT") if n in env), None)
        if name is None:
            continue
        raw = env[name].get("value")
        path = replica.container_path + ("env",)
        if raw is None:
            continue  # from a fieldRef or a Secret: not checkable here
        port = _parse_int(raw)
        if port is None or not 0 < port < 65536:
            yield _error(path, f"{name}={raw!r} is not a port number (1..65535)")
            continue
        ports = [p for p in _as_list(replica.container.get("ports")) if isinstance(p, dict)]
        if not any(p.get("containerPort") == port for p in ports):
            yield _warning(
                replica.container_path + ("ports",),
                f"{name}={port} but no containerPort {port}; MindIO processors reach the "
                f"manager there: add {{containerPort: {port}, name: ttp-port}}",
            )


RULES: tuple[Callable[[Job], Iterator[JobIssue]], ...] = (
    rule_framework,
    rule_recover_strategy,
    rule_fault_scheduling,
    rule_sub_healthy,
    rule_wait_reschedule,
    rule_process_recover,
    rule_replicas,
    rule_containers,
    rule_ports,
    rule_env,
    rule_ttp_port,
)
