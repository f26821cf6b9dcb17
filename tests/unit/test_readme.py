"""The README is a front door: two commands first, the fast path with public imports, short."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text(encoding="utf-8")


def test_it_opens_with_the_demo_and_the_test_commands() -> None:
    blocks = re.findall(r"```(\w*)\n(.*?)```", README, re.S)
    (k1, demo), (k2, tests) = blocks[0], blocks[1]
    assert (k1, k2) == ("sh", "sh")
    assert demo.count("\n") == 1 and "ms-recover demo" in demo
    assert tests.count("\n") == 1 and tests.rstrip().endswith("python -m pytest -q")


def test_the_first_script_is_graphstep_in_graph_mode_with_public_imports() -> None:
    script = re.findall(r"```python\n(.*?)```", README, re.S)[0]
    assert "GraphStep" in script and "GRAPH_MODE" in script
    assert "DataParallelStep" not in script and "PYNATIVE" not in script
    imports = [x for x in script.splitlines() if re.match(r"(from|import) ms_recover", x)]
    assert imports == [
        "import ms_recover",
        "from ms_recover.mindspore import GraphStep, MindSporeState",
    ]
    compile(script, "README.md", "exec")


def test_it_is_short_and_tells_no_run_narrative() -> None:
    lines = README.splitlines()
    assert len(lines) <= 250
    narrative = [
        x for x in lines if re.search(r"this host|this session|morning|\d\d:\d\d UTC", x, re.I)
    ]
    assert len(narrative) <= 2, narrative
    for link in re.findall(r"\]\(([^)#]+)\)", README):
        assert link.startswith("http") or (ROOT / link).exists(), link
