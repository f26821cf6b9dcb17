"""The manager's pure layers (decide, model, planner, strategies) load no zmq, numpy, msgpack
or MindSpore: checked in a fresh interpreter.

The package ``__init__`` modules of ``ms_recover`` and ``ms_recover.protocol`` are bypassed
here (empty packages with the right path): they are the public entry points and import the
worker and the codec; making them lazy is another change with its own test. What this test
guards is that nothing inside ``ms_recover/manager`` pulls a heavy module in eagerly.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

import ms_recover

PURE = (
    "ms_recover.manager.decide",
    "ms_recover.manager.model",
    "ms_recover.manager.planner",
    "ms_recover.manager.strategies.registry",
)
HEAVY = ("zmq", "numpy", "msgpack", "mindspore")

_PROBE = """
import importlib, json, os, sys, types
root, targets = sys.argv[1], sys.argv[2:]
for name in ("ms_recover", "ms_recover.protocol"):
    package = types.ModuleType(name)
    package.__path__ = [os.path.join(root, *name.split("."))]
    sys.modules[name] = package
for target in targets:
    importlib.import_module(target)
print(json.dumps(sorted(sys.modules)))
"""


@pytest.mark.parametrize("target", PURE)
def test_a_pure_manager_layer_imports_nothing_heavy(target: str) -> None:
    root = os.path.dirname(os.path.dirname(os.path.abspath(ms_recover.__file__)))
    out = subprocess.run(
        [sys.executable, "-c", _PROBE, root, target],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    loaded = json.loads(out.stdout)
    assert target in loaded
    heavy = sorted({m.split(".")[0] for m in loaded} & set(HEAVY))
    assert heavy == [], f"{target} loads {heavy}"
    assert not [m for m in loaded if m.startswith(("ms_recover.worker", "ms_recover.agent"))]
