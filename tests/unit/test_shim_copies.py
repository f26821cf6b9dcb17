"""A second copy of ms_recover's shim directory on the path is ms_recover's own shim, never a
MindCluster package the shim would warn that it shadows."""

from __future__ import annotations

from pathlib import Path

from ms_recover.integrations import shims


def _package(root: Path, name: str) -> Path:
    pkg = root / name
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    return pkg


def test_another_copy_of_the_shims_is_not_reported_as_shadowed(tmp_path: Path) -> None:
    checkout = tmp_path / "checkout" / "ms_recover" / "integrations" / "shims"
    _package(checkout, "taskd")
    _package(checkout, "mindio_ttp")
    assert shims.shadowed("taskd", [str(checkout), shims.path()]) is None
    assert shims.shadowed("mindio_ttp", [str(checkout) + "/"]) is None


def test_a_real_package_is_still_reported(tmp_path: Path) -> None:
    checkout = tmp_path / "checkout" / "ms_recover" / "integrations" / "shims"
    _package(checkout, "taskd")
    real = _package(tmp_path / "site", "taskd")
    found = shims.shadowed("taskd", [str(checkout), str(tmp_path / "site")])
    assert found == str(real)
