"""Building the in-graph reduction op: a per-user cache keyed by the source, clear errors.

The library is plain C++ loaded with ctypes; MindSpore is only needed because the package
``ms_recover.mindspore`` imports it.
"""

from __future__ import annotations

import ctypes
import shutil
from pathlib import Path

import pytest

pytest.importorskip("mindspore")

from ms_recover.errors import MsRecoverError  # noqa: E402
from ms_recover.mindspore import graphop  # noqa: E402

pytestmark = pytest.mark.timeout(120)


def test_a_missing_compiler_is_a_one_line_error_naming_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setenv("CXX", "no-such-compiler-xyz")
    with pytest.raises(MsRecoverError, match="CXX='no-such-compiler-xyz' was not found"):
        graphop.build_library()
    assert not list(tmp_path.rglob("*.so"))


@pytest.mark.skipif(shutil.which("g++") is None, reason="no g++ on this host")
def test_builds_once_into_the_cache_and_exports_the_op(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.delenv("CXX", raising=False)
    path = graphop.build_library()
    assert path.parent == tmp_path / "ms_recover" and path.name.startswith("graphreduce-")
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # no temp file left behind
    mtime = path.stat().st_mtime_ns
    assert graphop.build_library() == path and path.stat().st_mtime_ns == mtime  # cached
    lib = ctypes.CDLL(str(path))
    assert lib.msr_slots() == 256
    for name in ("MsrReduce", "msr_register"):
        assert hasattr(lib, name)
