"""The job-validation modules moved into ms_recover.jobcheck; every old import path still works."""

from __future__ import annotations

import ast
import importlib
import pathlib

import pytest

OLD_TO_NEW = {
    "ms_recover.checkjob": "ms_recover.jobcheck.check",
    "ms_recover.crdschema": "ms_recover.jobcheck.schema",
    "ms_recover.jobrules": "ms_recover.jobcheck.rules",
}


def _defined_names(module_name: str) -> list[str]:
    """Public names a module defines at top level (def, class, assignment), not imports."""
    module = importlib.import_module(module_name)
    tree = ast.parse(pathlib.Path(module.__file__ or "").read_text(encoding="utf-8"))
    names: list[str] = []
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names.append(node.name)
        elif isinstance(node, ast.Assign):
            names += [t.id for t in node.targets if isinstance(t, ast.Name)]
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.append(node.target.id)
    return [n for n in names if not n.startswith("_")]


@pytest.mark.parametrize("old", sorted(OLD_TO_NEW))
def test_old_path_reexports_the_public_names(old: str) -> None:
    new = OLD_TO_NEW[old]
    public = _defined_names(new)
    assert len(public) > 3
    old_module, new_module = importlib.import_module(old), importlib.import_module(new)
    missing = [n for n in public if getattr(old_module, n, None) is not getattr(new_module, n)]
    assert missing == []


def test_old_names_used_by_callers() -> None:
    from ms_recover.checkjob import FileReport, check_file, check_text, configure, run
    from ms_recover.crdschema import CrdInfo, SchemaIssue, format_path, load_crd, validate
    from ms_recover.jobrules import ERROR, RULES, WARNING, JobIssue, check_job

    assert callable(check_file) and callable(check_text) and callable(configure)
    assert callable(run) and FileReport.__name__ == "FileReport"
    assert load_crd().kind == "AscendJob" and isinstance(load_crd(), CrdInfo)
    assert validate(5, {"type": "string"}) == [SchemaIssue((), "must be a string, got integer 5")]
    assert format_path(("a", 0)) == "a[0]"
    assert (ERROR, WARNING) == ("error", "warning") and RULES and JobIssue and check_job
