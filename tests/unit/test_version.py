"""One version source: ``ms_recover.__version__``, read by setuptools and ``--version``."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import tomllib

import ms_recover
from ms_recover import cli

ROOT = Path(__file__).resolve().parents[2]


def test_version_flag_prints_the_package_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        cli.main(["--version"])
    assert done.value.code == 0
    assert capsys.readouterr().out.strip() == f"ms-recover {ms_recover.__version__}"
    assert re.fullmatch(r"\d+\.\d+\.\d+", ms_recover.__version__)


def test_pyproject_reads_the_version_from_the_package() -> None:
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "version" not in meta["project"] and "version" in meta["project"]["dynamic"]
    dynamic = meta["tool"]["setuptools"]["dynamic"]["version"]
    assert dynamic == {"attr": "ms_recover.__version__"}
    for key in ("license", "authors", "keywords", "classifiers"):
        assert meta["project"].get(key), f"pyproject [project] has no {key}"


def test_the_changelog_names_the_current_version() -> None:
    text = (ROOT / "CHANGELOG.md").read_text()
    assert f"## [{ms_recover.__version__}]" in text
    assert text.index("## [Unreleased]") < text.index(f"## [{ms_recover.__version__}]")
