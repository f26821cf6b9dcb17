"""What a fresh interpreter sees: each test here starts ``python`` (moved out of the unit tier,
which starts no process). The CLI's JSON and exit codes, the product's import closure, the opt-in
shims, MindIO's patch list and the sampler's determinism across processes."""

from __future__ import annotations

import hashlib
import json
import os
import pathlib
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from ms_recover.observability import lastwords
from ms_recover.worker.sampler import make_dataset, shard_indices

pytestmark = pytest.mark.timeout(180)

SAMPLES = pathlib.Path(__file__).resolve().parents[2] / "samples"
# What a rank, an agent and a manager import: none of it may pull in test or bench code.
PRODUCT = (
    "ms_recover.worker.bootstrap",
    "ms_recover.worker.session",
    "ms_recover.comm.host.backend",
    "ms_recover.agent.main",
    "ms_recover.manager.main",
    "ms_recover.protocol.codec",
)


def _run(code: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **env},
    )


def test_subprocess_json_over_mixed_files(tmp_path: pathlib.Path) -> None:
    missing = tmp_path / "missing.yaml"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "ms_recover.cli",
            "check-job",
            "--json",
            str(SAMPLES / "ascendjob-combined.yaml"),
            str(missing),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    report = json.loads(result.stdout)
    assert report["ok"] is False
    assert [f["errors"] for f in report["files"]] == [0, 1]
    assert report["findings"] == [
        {
            "file": str(missing),
            "doc": None,
            "path": "",
            "severity": "error",
            "message": "no such file",
        }
    ]


def test_the_product_path_imports_no_test_or_bench_code() -> None:
    code = "\n".join(f"import {m}" for m in PRODUCT) + (
        "\nimport json, sys\nfrom ms_recover import faulthooks\n"
        "assert faulthooks.from_env(1, 0) is faulthooks.NO_FAULTS\n"
        "print(json.dumps(sorted(m for m in sys.modules"
        " if m.startswith(('ms_recover.localrun', 'ms_recover.bench')))))"
    )
    out = _run(code, {"MS_RECOVER_FAULTS": ""})
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout.splitlines()[-1]) == []


def test_the_manager_command_refuses_with_exit_2_and_one_line() -> None:
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("MS_RECOVER_SECRET", "MS_RECOVER_SECRET_FILE")
    }
    run = subprocess.run(
        [sys.executable, "-m", "ms_recover.cli", "manager", "--require-secret", "--port", "0"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 2
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and "a job secret is required" in lines[0], run.stderr


def test_mindio_not_importable_without_the_opt_in() -> None:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    code = "import importlib.util as u; print(u.find_spec('mindio_ttp') is None)"
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "True"
    out = subprocess.run(
        [sys.executable, "-m", "ms_recover.cli", "shim-path"],
        env=env, capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert Path(out.stdout.strip(), "mindio_ttp", "framework_ttp.py").is_file()


def test_mindio_kit_lifts_exactly_its_listed_gates() -> None:
    """In a fresh interpreter: install() changes only the listed globals of MindSpore's
    TFT module, and none of the handlers the processor is given."""
    pytest.importorskip("mindspore")
    code = textwrap.dedent(
        """
        import json
        from mindspore.train.callback import _train_fault_tolerance as m
        before = dict(vars(m))
        from tests.kit import mindio_kit as kit
        kit.install(0, None)
        changed = sorted(k for k, v in vars(m).items() if before.get(k) is not v)
        print(json.dumps({"changed": changed, "patched": list(kit.PATCHED)}))
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["changed"] == sorted(got["patched"])
    assert not any(name.startswith("_tft_") for name in got["changed"])


def test_same_answer_in_a_fresh_process() -> None:
    code = (
        "from ms_recover.worker.sampler import shard_indices, make_dataset;"
        "import hashlib;"
        "x, y = make_dataset(50, 3, 4, 5);"
        "print(shard_indices(21, 2, 3, 12, 100, 7).tolist(),"
        " hashlib.sha256(x.tobytes() + y.tobytes()).hexdigest())"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    x, y = make_dataset(50, 3, 4, 5)
    digest = hashlib.sha256(x.tobytes() + y.tobytes()).hexdigest()
    assert out.stdout.strip() == f"{shard_indices(21, 2, 3, 12, 100, 7).tolist()} {digest}"


def test_an_uncaught_exception_leaves_host_and_traceback(tmp_path: Path) -> None:
    path = tmp_path / "words.json"
    code = (
        "from ms_recover.observability import lastwords\n"
        f"lastwords.install({str(path)!r})\n"
        "def load_shard(step):\n"
        "    raise RuntimeError(f'shard {step} is corrupt')\n"
        "load_shard(40)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1
    assert "shard 40 is corrupt" in proc.stderr  # the previous hook still printed it
    record = json.loads(path.read_text())
    assert record["host"] == socket.gethostname() and record["pid"] > 0
    assert "load_shard" in record["traceback"] and "Traceback" in record["traceback"]
    host, tail = lastwords.collect(str(path), "")
    assert host == socket.gethostname() and "RuntimeError: shard 40 is corrupt" in tail
    assert not path.exists()  # read once
