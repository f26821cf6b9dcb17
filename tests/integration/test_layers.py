"""Layering at import time: the pure layers load no transport, array or framework library.

Each import runs in a fresh interpreter, so nothing an earlier test imported can hide a heavy
import (``sys.modules`` of this process already holds zmq and numpy).
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys

import pytest

HEAVY = ("zmq", "numpy", "msgpack", "mindspore")
PURE = (
    "ms_recover.config",
    "ms_recover.strategy",
    "ms_recover.protocol.messages",
    "ms_recover.manager.model",
    "ms_recover.manager.decide",
    "ms_recover.manager.planner",
    "ms_recover.comm.peers",
)
# Added by the strategy plug-in work; checked as soon as it exists.
STRATEGIES = "ms_recover.manager.strategies"


def _loaded_after(code: str) -> dict[str, list[str]]:
    """Run ``code`` in a fresh interpreter; which heavy modules and ms_recover modules it left."""
    probe = (
        f"{code}\nimport json, sys\n"
        f"print(json.dumps({{'heavy': [m for m in {HEAVY!r} if m in sys.modules],"
        " 'ours': sorted(m for m in sys.modules if m.startswith('ms_recover'))}))"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=True
    )
    result: dict[str, list[str]] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def _strategies_param() -> object:
    present = importlib.util.find_spec("ms_recover.manager") is not None and (
        importlib.util.find_spec(STRATEGIES) is not None
    )
    reason = f"{STRATEGIES} does not exist in this tree yet"
    return pytest.param(STRATEGIES, marks=pytest.mark.skipif(not present, reason=reason))


@pytest.mark.parametrize("module", [*PURE, _strategies_param()])
def test_a_pure_layer_imports_no_heavy_library(module: str) -> None:
    loaded = _loaded_after(f"import {module}")
    assert module in loaded["ours"]
    assert loaded["heavy"] == [], f"import {module} loads {loaded['heavy']}"


def test_all_pure_layers_together_stay_light() -> None:
    loaded = _loaded_after("\n".join(f"import {m}" for m in PURE))
    assert loaded["heavy"] == []
    assert not [m for m in loaded["ours"] if m.startswith("ms_recover.worker")]


def test_the_package_loads_its_public_names_on_first_use() -> None:
    loaded = _loaded_after("import ms_recover")
    assert loaded["heavy"] == []
    assert loaded["ours"] == ["ms_recover"]
    names = _loaded_after(
        "import ms_recover\n"
        "missing = [n for n in ms_recover.__all__ if getattr(ms_recover, n, None) is None]\n"
        "assert not missing, missing\n"
        "assert ms_recover.init.__module__ == 'ms_recover.worker.bootstrap'\n"
        "from ms_recover import *"
    )
    assert "ms_recover.worker.session" in names["ours"]


def test_an_unknown_name_is_an_attribute_error() -> None:
    import ms_recover
    import ms_recover.comm
    import ms_recover.protocol

    for package in (ms_recover, ms_recover.comm, ms_recover.protocol):
        with pytest.raises(AttributeError, match="has no attribute 'nope'"):
            package.nope  # noqa: B018 - the access is the test


def test_lazy_package_names_are_the_defining_modules_objects() -> None:
    import ms_recover
    from ms_recover import comm, protocol
    from ms_recover.comm import base
    from ms_recover.protocol import codec
    from ms_recover.worker import bootstrap, session

    assert ms_recover.init is bootstrap.init
    assert ms_recover.Session is session.Session
    assert protocol.Codec is codec.Codec and protocol.Envelope is codec.Envelope
    assert comm.CommBackend is base.CommBackend and comm.ReduceOp is base.ReduceOp
