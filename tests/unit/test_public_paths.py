"""Every import path a user can see resolves, and each module has one name.

The paths are read from docs/, samples/ and the hook script (so a path added to the docs is
checked too; README.md's on their own), plus the ones public docstrings and installed files
name. The old paths of moved modules are gone: no alias finder, stub or re-export serves them.
"""

from __future__ import annotations

import importlib
import importlib.util
import pathlib
import re
from typing import Any

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
DOCS = [*(ROOT / "docs").glob("*.md"), *(ROOT / "samples").glob("*")]
DOCS += list((ROOT / "ms_recover" / "integrations" / "hook").glob("*.sh"))
# Named by docstrings, by the installed autostart .pth, or by MindCluster users' scripts.
NAMED = [
    "ms_recover.init",
    "ms_recover.Session",
    "ms_recover.JobConfig",
    "ms_recover.worker.sampler.make_dataset",
    "ms_recover.worker.sampler.shard_indices",
    "ms_recover.worker.sampler.split_indices",
    "ms_recover.integrations.taskd.manager_api.init_taskd_manager",
    "ms_recover.integrations.taskd.manager_api.start_taskd_manager",
    "ms_recover.integrations.hook.command.main",
    "ms_recover.integrations.hook.autostart.maybe_start",
    "ms_recover.comm.ascend.AscendBackend",
    "ms_recover.mindspore.state.MindSporeState",
    "ms_recover.mindspore.step.DataParallelStep",
    "ms_recover.mindspore.fit",
    "ms_recover.mindspore.fit.fit",
    "ms_recover.mindspore.sharded.ShardedArrays",
    "ms_recover.mindspore.checkpoint.load_dump",
]
# Old paths of moved modules (each one's home is on the right): none of them imports any more.
GONE = {
    "ms_recover.api": "ms_recover.integrations.taskd.manager_api",
    "ms_recover.autostart": "ms_recover.integrations.hook.autostart",
    "ms_recover.hooks": "ms_recover.integrations.hook.command",
    "ms_recover.events": "ms_recover.observability.events",
    "ms_recover.metrics": "ms_recover.observability.metrics",
    "ms_recover.report": "ms_recover.observability.report",
    "ms_recover.status": "ms_recover.observability.status",
    "ms_recover.timeline": "ms_recover.observability.timeline",
    "ms_recover.transport": "ms_recover.protocol.transport",
    "ms_recover.checkjob": "ms_recover.jobcheck.check",
    "ms_recover.crdschema": "ms_recover.jobcheck.schema",
    "ms_recover.jobrules": "ms_recover.jobcheck.rules",
    "ms_recover.mindspore.demo_train": "ms_recover.mindspore.programs.demo_train",
    "ms_recover.mindspore.fit_train": "tests.kit.fit_train",
    "ms_recover.mindspore.allreduce_bench": "ms_recover.mindspore.programs.allreduce_bench",
    "ms_recover.bench.overhead_train": "ms_recover.mindspore.programs.overhead_train",
    "ms_recover.localrun.record": "ms_recover.worker.record",
    "ms_recover.agent.pods": "ms_recover.localrun.pods",
}
README = ROOT / "README.md"


def documented_paths(docs: list[pathlib.Path] = DOCS) -> list[str]:
    found: set[str] = set()
    for path in docs:
        if path.is_file():
            text = path.read_text(encoding="utf-8", errors="replace")
            found.update(re.findall(r"\bms_recover(?:\.[A-Za-z_]\w*)+", text))
    return sorted(found | set(NAMED))


def resolve(path: str) -> Any:
    """The object a dotted path names: the longest importable module, then attributes."""
    parts = path.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj: Any = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError as exc:
            if exc.name is not None and not ".".join(parts[:cut]).startswith(exc.name):
                raise  # the module exists but imports something missing
            continue
        for attr in parts[cut:]:
            obj = getattr(obj, attr)
        return obj
    raise ModuleNotFoundError(path)


def test_the_docs_name_paths_to_check() -> None:
    paths = documented_paths()
    assert "ms_recover.init" in paths and "ms_recover.integrations.taskd.manager_api" in paths
    assert any(p.startswith("ms_recover.mindspore.") for p in paths)


@pytest.mark.parametrize(
    "path", [p for p in documented_paths() if not p.startswith("ms_recover.mindspore")]
)
def test_a_documented_path_resolves(path: str) -> None:
    assert resolve(path) is not None


@pytest.mark.parametrize(
    "path", [p for p in documented_paths() if p.startswith("ms_recover.mindspore")]
)
def test_a_documented_mindspore_path_resolves(path: str) -> None:
    pytest.importorskip("mindspore")
    assert resolve(path) is not None


def test_mindspore_fit_is_the_function_on_both_paths() -> None:
    pytest.importorskip("mindspore")
    import ms_recover.mindspore as msr
    from ms_recover.mindspore.fit import fit

    assert msr.fit is fit and callable(fit)


@pytest.mark.parametrize("old", sorted(GONE))
def test_an_old_path_of_a_moved_module_does_not_import(old: str) -> None:
    assert importlib.util.find_spec(GONE[old]) is not None, f"{GONE[old]} is the home"
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module(old)


def test_no_alias_layer_is_left() -> None:
    package = ROOT / "ms_recover"
    assert not (package / "_moved.py").exists()
    assert sorted(p.name for p in package.glob("*.pyi")) == []
    for old in GONE:
        relative = old.split(".", 1)[1].replace(".", "/")
        assert not (package / f"{relative}.py").exists(), f"{old} still has a module"


def test_an_unknown_submodule_is_still_not_found() -> None:
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("ms_recover.no_such_module")


def test_the_docs_name_no_old_path() -> None:
    """docs/, samples/ and the hook script use each module's one name (README.md: below)."""
    named = set(documented_paths())
    assert sorted(p for p in named if p in GONE or p.rsplit(".", 1)[0] in GONE) == []


def test_the_readme_names_only_paths_that_resolve() -> None:
    unresolved = []
    for path in documented_paths([README]):
        try:
            resolve(path)
        except (ImportError, AttributeError):
            unresolved.append(path)
    assert unresolved == []
