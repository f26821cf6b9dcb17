"""children.settle: what msrun's taskd agent does with msrun's leftover children on its way out."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.timeout(60)

SCRIPT = """
import json, os, subprocess, sys, time
from ms_recover.integrations.msrun import children
ok, lifetime = sys.argv[1] == "ok", float(sys.argv[2])
p = subprocess.Popen([sys.executable, "-c", f"import time; time.sleep({lifetime})"])
t0 = time.monotonic()
ended = children.settle(os.getpid(), ok=ok, wait_s=20.0, grace_s=1.0)
print(json.dumps({"ended": ended, "child": p.pid, "took": time.monotonic() - t0,
                  "left": children.of(os.getpid()), "alive": os.path.exists(f"/proc/{p.pid}")}))
"""


def _settle(mode: str, lifetime: float) -> dict:
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, mode, str(lifetime)],
        capture_output=True,
        text=True,
        timeout=50,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_on_success_a_child_that_finishes_is_waited_for_not_killed():
    out = _settle("ok", 0.5)
    assert out["ended"] == [] and out["left"] == [] and not out["alive"]
    assert out["took"] >= 0.3  # it waited for the child to finish by itself


def test_on_failure_leftovers_are_ended_after_the_grace():
    out = _settle("failed", 30.0)
    assert out["ended"] == [out["child"]] and out["left"] == [] and not out["alive"]
    assert out["took"] < 10
