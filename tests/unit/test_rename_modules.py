"""tools/rename_modules.py: the map is the tree's layout; the rewrite is right and idempotent."""

from __future__ import annotations

import importlib.util
import pathlib
import re
from types import ModuleType

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _tool() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "rename_modules", ROOT / "tools" / "rename_modules.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


R = _tool()


def _file(dotted: str) -> pathlib.Path:
    base = ROOT / dotted.replace(".", "/")
    return base / "__init__.py" if base.is_dir() else base.with_suffix(".py")


def test_every_new_name_is_a_module_of_the_tree_and_no_old_path_is_left() -> None:
    missing = [new for new in R.MODULES.values() if not _file(new).is_file()]
    assert missing == []
    assert R.stale_paths(ROOT) == []
    assert (ROOT / "ms_recover" / "integrations" / "hook" / "ms_recover_hook.sh").is_file()


def test_the_product_never_imports_the_tests() -> None:
    pattern = re.compile(r"^\s*(from|import) tests(\.|\s)", re.M)
    offenders = [
        str(p.relative_to(ROOT))
        for p in sorted((ROOT / "ms_recover").rglob("*.py"))
        if pattern.search(p.read_text(encoding="utf-8"))
    ]
    assert offenders == []


OLD = '''"""See :mod:`~ms_recover.comm.hostlane` and ms_recover/testing/faults.py."""
import ms_recover.comm.hostring as hr
from ms_recover.comm import base, hostring, lanesmall as small
from ms_recover.comm.host import HostBackend
from ms_recover.scheduler import hooks
from ms_recover.testing import floats


def f() -> None:
    from ms_recover.shims import path
    cmd = ["python", "-m", "ms_recover.testing.numpy_trainer"]
    code = "from ms_recover.worker.scheduler import bind_to_launcher; import os"
'''

NEW = '''"""See :mod:`~ms_recover.comm.host.lane.lanes` and ms_recover/localrun/faults.py."""
import ms_recover.comm.host.ring as hr
from ms_recover.comm import base
from ms_recover.comm.host import ring as hostring
from ms_recover.comm.host.lane import small
from ms_recover.comm.host.backend import HostBackend
from ms_recover.integrations.hook import command as hooks
from tests.kit import floats


def f() -> None:
    from ms_recover.integrations.shims import path
    cmd = ["python", "-m", "ms_recover.localrun.numpy_trainer"]
    code = "from ms_recover.integrations.msrun.sched_process import bind_to_launcher; import os"
'''


def test_rewrite_keeps_local_names_and_splits_mixed_imports() -> None:
    assert R.rewrite(OLD, python=True) == NEW


def test_rewrite_is_idempotent_on_the_new_names() -> None:
    assert R.rewrite(NEW, python=True) == NEW
    new_package = "from ms_recover.comm.host import backend, ring\nx = ms_recover.comm.host.lane\n"
    assert R.rewrite(new_package, python=True) == new_package


def test_rewrite_of_docs_and_shell_paths() -> None:
    doc = "source scheduler_hooks/ms_recover_hook.sh; see `ms_recover.ttp.framework`\n"
    want = (
        "source ms_recover/integrations/hook/ms_recover_hook.sh; "
        "see `ms_recover.integrations.mindio.framework`\n"
    )
    assert R.rewrite(doc, python=False) == want
    assert R.rewrite(want, python=False) == want
