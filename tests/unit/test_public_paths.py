"""Every import path a user can see keeps working, also after modules moved to new homes.

The paths are read from README.md, docs/, samples/ and scheduler_hooks/ (so a path added to
the docs is checked too), plus the ones public docstrings and installed files name.
"""

from __future__ import annotations

import importlib
import pathlib
import re
import subprocess
import sys
from typing import Any

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *(ROOT / "docs").glob("*.md"), *(ROOT / "samples").glob("*")]
DOCS += list((ROOT / "scheduler_hooks").glob("*"))
# Named by docstrings, by the installed autostart .pth, or by MindCluster users' scripts.
NAMED = [
    "ms_recover.init",
    "ms_recover.Session",
    "ms_recover.JobConfig",
    "ms_recover.worker.sampler.make_dataset",
    "ms_recover.worker.sampler.shard_indices",
    "ms_recover.worker.sampler.split_indices",
    "ms_recover.api.init_taskd_manager",
    "ms_recover.api.start_taskd_manager",
    "ms_recover.hooks.main",
    "ms_recover.autostart.maybe_start",
    "ms_recover.comm.ascend.AscendBackend",
    "ms_recover.mindspore.state.MindSporeState",
    "ms_recover.mindspore.step.DataParallelStep",
    "ms_recover.mindspore.fit",
    "ms_recover.mindspore.fit.fit",
    "ms_recover.mindspore.sharded.ShardedArrays",
    "ms_recover.mindspore.checkpoint.load_dump",
]
# Old path -> new home: the old path must be the very same module.
MOVED = {
    "ms_recover.hooks": "ms_recover.scheduler.hooks",
    "ms_recover.autostart": "ms_recover.scheduler.autostart",
    "ms_recover.api": "ms_recover.scheduler.api",
    "ms_recover.events": "ms_recover.observability.events",
    "ms_recover.timeline": "ms_recover.observability.timeline",
    "ms_recover.report": "ms_recover.observability.report",
    "ms_recover.metrics": "ms_recover.observability.metrics",
    "ms_recover.status": "ms_recover.observability.status",
    "ms_recover.transport": "ms_recover.protocol.transport",
}


def documented_paths() -> list[str]:
    found: set[str] = set()
    for path in DOCS:
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
    assert "ms_recover.init" in paths and "ms_recover.api" in paths
    assert any(p.startswith("ms_recover.mindspore.") for p in paths)


@pytest.mark.parametrize(
    "path", [p for p in documented_paths() if not p.startswith("ms_recover.mindspore")]
)
def test_a_documented_path_resolves(path: str) -> None:
    assert resolve(path) is not None


@pytest.mark.e2e
@pytest.mark.parametrize(
    "path", [p for p in documented_paths() if p.startswith("ms_recover.mindspore")]
)
def test_a_documented_mindspore_path_resolves(path: str) -> None:
    pytest.importorskip("mindspore")
    assert resolve(path) is not None


@pytest.mark.e2e
def test_mindspore_fit_is_the_function_on_both_paths() -> None:
    pytest.importorskip("mindspore")
    import ms_recover.mindspore as msr
    from ms_recover.mindspore.fit import fit

    assert msr.fit is fit and callable(fit)


@pytest.mark.parametrize(("old", "new"), sorted(MOVED.items()))
def test_an_old_path_is_the_moved_module_itself(old: str, new: str) -> None:
    assert importlib.import_module(old) is importlib.import_module(new)
    package, _, name = old.rpartition(".")
    assert getattr(importlib.import_module(package), name) is importlib.import_module(new)


def test_every_old_path_is_served_and_has_no_file_left() -> None:
    from ms_recover import _moved

    assert set(MOVED.items()) <= set(_moved.MOVED.items())
    package = ROOT / "ms_recover"
    for old, new in _moved.MOVED.items():
        assert importlib.import_module(old) is importlib.import_module(new)
        relative = old.split(".", 1)[1].replace(".", "/")
        assert not (package / f"{relative}.py").exists(), f"{old}: a file would hide the move"
    for old in MOVED:  # the public old paths keep their names for type checkers
        stub = package / f"{old.split('.', 1)[1]}.pyi"
        assert f"from {MOVED[old]} import *" in stub.read_text(encoding="utf-8")


def test_an_unknown_submodule_is_still_not_found() -> None:
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("ms_recover.no_such_module")


def test_old_paths_resolve_in_a_fresh_interpreter() -> None:
    code = (
        "import ms_recover.events, ms_recover.api, ms_recover.hooks\n"
        "from ms_recover.status import run\n"
        "from ms_recover.transport import DealerChannel\n"
        "import ms_recover.observability.events as e\n"
        "assert ms_recover.events is e\n"
        "__import__('ms_recover.autostart').autostart.maybe_start\n"  # the .pth's own line
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr


def test_python_m_old_hooks_path_runs_the_hooks() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "ms_recover.hooks", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert "install-pth" in out.stdout and "python -m ms_recover.hooks" in out.stdout
