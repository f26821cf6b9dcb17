"""Validate AscendJob YAML files before submission.

Each file may hold several YAML documents; only ``kind: AscendJob`` documents are checked, other
kinds (ConfigMap, Secret, ...) are skipped. A job is checked against the AscendJob CRD schema
shipped with ms_recover, then against ms_recover's rules (recover-strategy, fault-scheduling,
wait-reschedule-timeout, ports 2222/9601, the ``ascend`` container, ...).

Exit status: 0 when no file has an error (warnings allowed; ``--strict`` counts them as
errors), 1 when any file has an error or cannot be read or parsed, 2 on a usage error.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from collections.abc import Iterator
from typing import Any

from ms_recover.jobcheck import rules as jobrules
from ms_recover.jobcheck import schema as crdschema
from ms_recover.jobcheck import yamlread
from ms_recover.jobcheck.rules import ERROR, WARNING
from ms_recover.jobcheck.schema import Path, format_path

KIND = "AscendJob"
Issue = tuple[str, Path, str]  # (severity, path, message)
META_FIELDS = frozenset(
    {
        "name",
        "generateName",
        "namespace",
        "labels",
        "annotations",
        "finalizers",
        "ownerReferences",
        "uid",
        "resourceVersion",
        "generation",
        "creationTimestamp",
        "deletionTimestamp",
        "deletionGracePeriodSeconds",
        "managedFields",
        "selfLink",
    }
)


@dataclasses.dataclass(frozen=True)
class Finding:
    """One problem: file, 1-based YAML document number (None: the whole file), path, message."""

    file: str
    doc: int | None
    path: str
    severity: str
    message: str

    def text(self) -> str:
        parts = [self.file] + ([f"doc {self.doc}"] if self.doc else [])
        parts += [self.path] if self.path else []
        return ": ".join(parts + [f"{self.severity}: {self.message}"])


@dataclasses.dataclass(frozen=True)
class FileReport:
    """The findings for one file and how many AscendJob documents it held."""

    file: str
    jobs: int
    findings: tuple[Finding, ...]

    def count(self, severity: str) -> int:
        return sum(f.severity == severity for f in self.findings)


def check_file(name: str) -> FileReport:
    """Check one file (``-`` is stdin). Never raises for unreadable or malformed input."""
    try:
        text = yamlread.read_text(name)
    except yamlread.ReadError as exc:
        return FileReport(name, 0, (Finding(name, None, "", ERROR, str(exc)),))
    return check_text(text, name)


def check_text(text: str, name: str) -> FileReport:
    """Check every document of a YAML stream; ``name`` is only used in messages."""
    findings: list[Finding] = []
    jobs, kinds = 0, []
    for index, doc in _documents(text, name, findings):
        kind = doc.get("kind") if isinstance(doc, dict) else None
        if not isinstance(doc, dict):
            findings.append(
                Finding(
                    name, index, "", ERROR, f"is a {type(doc).__name__}, not a Kubernetes object"
                )
            )
        elif kind == KIND:
            jobs += 1
            findings += [Finding(name, index, format_path(p), s, m) for s, p, m in check_job(doc)]
        else:
            kinds.append(str(kind))
    if jobs == 0 and not any(f.severity == ERROR for f in findings):
        found = ", ".join(kinds) if kinds else "no documents"
        findings.append(
            Finding(name, None, "", ERROR, f"has no kind: {KIND} document (found: {found})")
        )
    return FileReport(name, jobs, tuple(findings))


def _documents(text: str, name: str, findings: list[Finding]) -> Iterator[tuple[int, Any]]:
    """Non-empty documents with their 1-based numbers; a bad document ends the stream."""
    try:
        yield from yamlread.documents(text)
    except yamlread.ReadError as exc:
        findings.append(Finding(name, None, "", ERROR, str(exc)))


def check_job(doc: dict[str, Any]) -> list[Issue]:
    """(severity, path, message) for one AscendJob document: CRD schema, metadata, our rules."""
    crd = crdschema.load_crd()
    out = _check_api_version(doc.get("apiVersion"), crd.api_versions)
    out += _check_metadata(doc.get("metadata"))
    out += [(ERROR, i.path, i.message) for i in crdschema.validate(doc, crd.schema)]
    spec = doc.get("spec")
    if spec is None:
        out.append((ERROR, ("spec",), "is missing; an AscendJob needs spec.replicaSpecs"))
    specs = spec.get("replicaSpecs") if isinstance(spec, dict) else None
    if isinstance(specs, dict) and not specs:
        out.append((ERROR, ("spec", "replicaSpecs"), "is empty; add Scheduler and Worker"))
    # The rules read only what they can and skip malformed parts (the schema reports those),
    # so they run on every job: a job without replicas still needs its framework label.
    out += [(i.severity, i.path, i.message) for i in jobrules.check_job(doc)]
    return out


def _check_api_version(version: Any, served: tuple[str, ...]) -> list[Issue]:
    valid = ", ".join(served)
    if version is None:
        return [(ERROR, ("apiVersion",), f"is missing; valid: {valid}")]
    if version not in served:
        return [(ERROR, ("apiVersion",), f"{version!r} is not served by the CRD; valid: {valid}")]
    return []


def _check_metadata(meta: Any) -> list[Issue]:
    """What the API server checks in ObjectMeta that matters before submission."""
    if meta is None:
        return [(ERROR, ("metadata",), "is missing; it needs at least a name")]
    if not isinstance(meta, dict):
        return []  # the schema check reports the wrong type
    out: list[Issue] = []
    if not meta.get("name") and not meta.get("generateName"):
        out.append((ERROR, ("metadata", "name"), "is missing"))
    for key in meta:
        if key not in META_FIELDS:
            out.append((ERROR, ("metadata", str(key)), f"unknown field {key!r} of ObjectMeta"))
    for section in ("labels", "annotations"):
        values = meta.get(section)
        if values is not None and not isinstance(values, dict):
            out.append((ERROR, ("metadata", section), "must be a mapping of strings"))
            continue
        for key, value in (values or {}).items():
            if not isinstance(value, str):
                out.append(
                    (
                        ERROR,
                        ("metadata", section, str(key)),
                        (
                            f"must be a string, got {value!r}; quote it in YAML "
                            f'({key}: "{_yaml_spelling(value)}")'
                        ),
                    )
                )
    return out


def _yaml_spelling(value: Any) -> str:
    return (
        {True: "on", False: "off"}.get(value, str(value)) if isinstance(value, bool) else str(value)
    )


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("files", nargs="+", metavar="FILE", help="AscendJob YAML files (- = stdin)")
    parser.add_argument("--json", action="store_true", help="print the findings as JSON")
    parser.add_argument("--strict", action="store_true", help="treat warnings as errors")


def run(args: argparse.Namespace) -> int:
    """Check every file, print the findings, return the exit status (0 clean, 1 errors)."""
    reports = [check_file(name) for name in args.files]
    errors = sum(r.count(ERROR) for r in reports)
    warnings = sum(r.count(WARNING) for r in reports)
    if args.json:
        print(json.dumps(_as_json(reports, errors, warnings), indent=2))
    else:
        _print_text(reports, errors, warnings)
    return 1 if errors or (args.strict and warnings) else 0


def _print_text(reports: list[FileReport], errors: int, warnings: int) -> None:
    for report in reports:
        for finding in report.findings:
            print(finding.text())
        if not report.count(ERROR):
            extra = f", {report.count(WARNING)} warning(s)" if report.count(WARNING) else ""
            print(f"{report.file}: ok ({report.jobs} {KIND} document(s){extra})")
    print(f"check-job: {len(reports)} file(s), {errors} error(s), {warnings} warning(s)")


def _as_json(reports: list[FileReport], errors: int, warnings: int) -> dict[str, Any]:
    return {
        "ok": errors == 0,
        "errors": errors,
        "warnings": warnings,
        "files": [
            {"file": r.file, "jobs": r.jobs, "errors": r.count(ERROR), "warnings": r.count(WARNING)}
            for r in reports
        ],
        "findings": [dataclasses.asdict(f) for r in reports for f in r.findings],
    }
