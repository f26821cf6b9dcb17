"""Reference data is found relative to the repository; absent data skips, or fails under CI."""

from __future__ import annotations

import pathlib

import pytest

from tests import shared_data as sd

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_missing_data_skips_outside_ci(
    monkeypatch: pytest.MonkeyPatch, tmp_path: pathlib.Path
) -> None:
    monkeypatch.setattr(sd, "SHARED_DATA", tmp_path)
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception, match="absent"):
        sd.shared_data("ascendjob", "missing.yaml")


def test_missing_data_fails_under_ci(
    monkeypatch: pytest.MonkeyPatch, tmp_path: pathlib.Path
) -> None:
    monkeypatch.setattr(sd, "SHARED_DATA", tmp_path)
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="CI=true requires it"):
        sd.shared_data("ascendjob", "missing.yaml")


def test_present_data_is_returned(monkeypatch: pytest.MonkeyPatch, tmp_path: pathlib.Path) -> None:
    (tmp_path / "ascendjob").mkdir()
    (tmp_path / "ascendjob" / "x.yaml").write_text("kind: AscendJob\n")
    monkeypatch.setattr(sd, "SHARED_DATA", tmp_path)
    assert sd.shared_data("ascendjob", "x.yaml") == tmp_path / "ascendjob" / "x.yaml"


def test_shared_data_sits_beside_the_repository() -> None:
    assert sd.SHARED_DATA == ROOT.parent / "shared" / "data"


def test_no_absolute_machine_paths_in_code_or_tests() -> None:
    """No module or test names one machine's checkout (a path under /work)."""
    needle = "/" + "work/"  # spelled apart so that this file does not match itself
    offenders = [
        str(path.relative_to(ROOT))
        for folder in ("ms_recover", "tests", "samples", "docs")
        for path in sorted((ROOT / folder).rglob("*"))
        if path.is_file()
        and path.suffix in {".py", ".yaml", ".sh", ".md", ""}
        and needle in path.read_text(encoding="utf-8", errors="replace")
    ]
    assert offenders == []
