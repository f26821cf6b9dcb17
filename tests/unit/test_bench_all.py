"""``ms-recover bench all``: the Markdown table from the reports of one run, the README splice,
and its bad input."""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

import pytest

from ms_recover.bench import everything
from ms_recover.bench.table import Measure, Report
from ms_recover.errors import ConfigError


def _run_dir(tmp_path: Path) -> Path:
    rep = Report("detect", "t")
    rep.add(
        Measure("rank kill -> fault event", 16.0, "ms", "<=", 200.0),
        Measure("node kill -> node_lost", 3.4, "s", "<=", 3.0),
        Measure("samples", 5, ""),
        Measure("16384 ranks: formation", None, "s", "<=", 5.0, failed="did not form in 60 s"),
    )
    (tmp_path / "detect.json").write_text(json.dumps(rep.to_json()))
    meta = {
        "started": "2026-12-01 05:00 UTC",
        "cores": 2,
        "runs": [
            {"bench": "detect", "exit_code": 0, "seconds": 40.0, "load_before": [0.5, 0, 0],
             "load_after": [1.25, 0, 0]},
            {"bench": "overhead", "exit_code": 1, "seconds": 3.0, "load_before": [1.0, 0, 0],
             "load_after": [1.0, 0, 0]},
        ],
    }  # fmt: skip
    (tmp_path / "run.json").write_text(json.dumps(meta))
    return tmp_path


def test_render_has_every_row_with_its_verdict_and_the_load(tmp_path: Path) -> None:
    table = everything.render(str(_run_dir(tmp_path)))
    assert "| detect | rank kill -> fault event | 16 ms | <= 200 ms | PASS |" in table
    assert "| detect | node kill -> node_lost | 3.4 s | <= 3 s | MISS |" in table
    assert "| detect | samples | 5 | - | - |" in table
    assert "| detect | 16384 ranks: formation | n/a | <= 5 s | MISS |" in table
    assert "did not form in 60 s" in table
    # a bench that wrote no report is a MISS row, never silently absent
    assert "| overhead | (no report) | exit 1 | - | MISS |" in table
    assert "detect 0.5 -> 1.25 (40 s)" in table and "on 2 cores" in table


def test_splice_replaces_only_the_marked_block(tmp_path: Path) -> None:
    readme = tmp_path / "README.md"
    readme.write_text(f"# x\n\nintro\n{everything.BEGIN}\nold table\n{everything.END}\n\nafter\n")
    everything.splice(str(readme), "| new |\n")
    text = readme.read_text()
    assert "old table" not in text and "| new |" in text
    assert text.startswith("# x\n\nintro\n") and text.endswith(f"{everything.END}\n\nafter\n")
    everything.splice(str(readme), "| newer |\n")  # idempotent on its own output
    assert readme.read_text().count("| newer |") == 1 and "| new |\n" not in readme.read_text()


def _args(**kw: object) -> argparse.Namespace:
    base: dict[str, object] = {"out": None, "only": None, "args": [], "readme": None, "doc": None}
    base["render"] = None
    base.update(kw)
    return argparse.Namespace(**base)


def test_bad_input_is_one_line_naming_the_valid_values(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="valid: detect, recovery"):
        everything.run(_args(out=str(tmp_path), only=["nope"]))
    with pytest.raises(ConfigError, match="BENCH one of detect"):
        everything.run(_args(out=str(tmp_path), args=["--repeats 3"]))
    with pytest.raises(ConfigError, match="needs --out"):
        everything.run(_args())
    with pytest.raises(ConfigError, match="no run.json"):
        everything.run(_args(render=str(tmp_path)))
    plain = tmp_path / "plain.md"
    plain.write_text("no markers\n")
    with pytest.raises(ConfigError, match="no <!-- bench-all:begin -->"):
        everything.run(_args(render=str(_run_dir(tmp_path)), readme=str(plain)))
    assert plain.read_text() == "no markers\n", "nothing is lost on bad input"


def test_render_cli_writes_measured_md(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = _run_dir(tmp_path)
    assert everything.run(_args(render=str(out))) == 0
    assert (out / "measured.md").read_text() == capsys.readouterr().out


def test_the_published_run_names_no_path_of_the_machine_it_ran_on() -> None:
    """docs/measured is the run behind the README's table: it must stand on any checkout."""
    measured = Path(__file__).resolve().parents[2] / "docs" / "measured"
    files = sorted(measured.glob("*.json"))
    assert {f.name for f in files} >= {"run.json", "detect.json", "recovery.json"}

    def strings(node: object) -> list[str]:
        if isinstance(node, str):
            return [node]
        if isinstance(node, dict):
            return [s for v in node.values() for s in strings(v)]
        if isinstance(node, list):
            return [s for v in node for s in strings(v)]
        return []

    for f in files:
        # a path has a directory ("/tmp/x"); a unit such as "/s" does not
        absolute = [s for s in strings(json.loads(f.read_text())) if re.match(r"/[^/\s]+/", s)]
        assert not absolute, f"{f.name}: {absolute[:3]}"


def test_doc_is_created_then_only_its_block_is_replaced(tmp_path: Path) -> None:
    """``--doc docs/benchmarks.md``: the benchmarks document comes from one run's reports."""
    (tmp_path / "run").mkdir()
    out = _run_dir(tmp_path / "run")
    doc = tmp_path / "benchmarks.md"
    assert everything.run(_args(render=str(out), doc=str(doc))) == 0
    text = doc.read_text()
    assert text.startswith("# Benchmarks\n") and "docs/design.md" in text
    assert (
        text.index(everything.BEGIN)
        < text.index("| detect | rank kill")
        < text.index(everything.END)
    )
    doc.write_text(text.replace("# Benchmarks\n", "# Benchmarks\n\nkept by hand\n"))
    assert everything.run(_args(render=str(out), doc=str(doc))) == 0
    again = doc.read_text()
    assert "kept by hand" in again and again.count("| detect | rank kill") == 1
    with pytest.raises(ConfigError, match="--doc: no such directory"):
        everything.run(_args(render=str(out), doc=str(tmp_path / "nope" / "b.md")))


def test_the_run_names_its_commit_when_it_has_one(tmp_path: Path) -> None:
    out = _run_dir(tmp_path)
    meta = json.loads((out / "run.json").read_text())
    (out / "run.json").write_text(json.dumps({**meta, "commit": "abc1234"}))
    assert "on 2 cores, commit abc1234." in everything.render(str(out))
    (tmp_path / "b").mkdir()
    assert "on 2 cores." in everything.render(str(_run_dir(tmp_path / "b")))


def test_the_repository_benchmarks_doc_has_the_markers() -> None:
    text = (Path(__file__).resolve().parents[2] / "docs" / "benchmarks.md").read_text()
    assert text.index(everything.BEGIN) < text.index(everything.END)
