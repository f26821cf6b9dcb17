"""Run ``tests.kit.mindio_train`` as a local msrun-style cluster (scheduler + ranks),
in stub mode (the manager inside rank 0) or manager mode (a manager in this process)."""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from ms_recover.bench.mscluster import _Cluster, free_port
from ms_recover.config import JobConfig
from ms_recover.integrations.shims import path as shim_path
from ms_recover.manager.server import ManagerServer
from ms_recover.observability.events import EventLog
from ms_recover.strategy import parse_strategies
from tests import kit

WORLD = 2
PROGRAM = [sys.executable, "-m", "tests.kit.mindio_train"]
DROP = ("MS_", "RANK_", "DEVICE_ID", "MINDX_", "PYTHONPATH")


@dataclasses.dataclass
class Run:
    out: Path
    codes: dict[str, int | None]
    events: list[dict[str, Any]]
    seconds: float

    def rank(self, r: int) -> dict[str, Any]:
        return json.loads((self.out / f"rank_{r}.json").read_text())

    def steps(self, r: int) -> dict[int, str]:
        lines = (self.out / f"steps_{r}.jsonl").read_text().splitlines()
        return {json.loads(ln)["step"]: json.loads(ln)["sha256"] for ln in lines}

    def logs(self) -> str:
        return "\n".join(f"--- {p.name}\n{p.read_text()[-3000:]}" for p in self.out.glob("*.log"))


def run(
    workdir: Path,
    *,
    tft: str,
    strategies: str,
    fault: str = "",
    manager: bool = False,
    timeout_s: float = 240.0,
) -> Run:
    """One cluster run to its end (every process exited, or ``timeout_s``)."""
    workdir.mkdir(parents=True, exist_ok=True)
    base = {k: v for k, v in os.environ.items() if not k.startswith(DROP)}
    sched_port, tft_port = free_port(), free_port()
    events_path = workdir / "events.jsonl"
    common = {
        "MS_SCHED_HOST": "127.0.0.1",
        "MS_SCHED_PORT": str(sched_port),
        "MS_WORKER_NUM": str(WORLD),
        "MS_LOCAL_WORKER": str(WORLD),
        "MS_TOPO_TIMEOUT": "90",
        "MS_ENABLE_TFT": tft,
        "MS_TFT_IP": "127.0.0.1",
        "MS_TFT_PORT": str(tft_port),
        "PYTHONPATH": kit.pythonpath(shim_path()),
        "MS_RECOVER_STRATEGY": strategies,
        "MS_RECOVER_HEARTBEAT_S": "0.2",
        "MS_RECOVER_PHASE_TIMEOUT_S": "30",
        "MS_RECOVER_RANK_SILENCE_S": "30",
        "MS_RECOVER_HANG_TIMEOUT_S": "90",
        "MS_RECOVER_EVENTS": str(events_path),
        "MS_RECOVER_DUMP_DIR": str(workdir / "dump"),
        "GLOG_v": "2",
    }
    server: ManagerServer | None = None
    if manager:
        common["MINDX_TASK_ID"] = "mindio-e2e"
        cfg = JobConfig.from_env(
            {**common, "MS_RECOVER_PORT": str(tft_port)},
        ).replace(manager_port=tft_port, strategies=parse_strategies(strategies))
        server = ManagerServer(cfg, events=EventLog(str(events_path)))
        server.start_thread()
    argv = [*PROGRAM, "--out", str(workdir), "--ckpt", str(workdir / "ckpt")]
    if fault:
        argv += ["--fault", fault]
    started = time.monotonic()
    try:
        with _Cluster(workdir) as cluster:
            cluster.start("scheduler", argv, {**base, **common, "MS_ROLE": "MS_SCHED"})
            for r in range(WORLD):
                env = {**base, **common, "MS_ROLE": "MS_WORKER", "MS_NODE_ID": str(r)}
                cluster.start(f"rank {r}", argv, env)
            deadline = time.monotonic() + timeout_s
            while time.monotonic() < deadline:
                codes = cluster.exit_codes()
                if all(c is not None for n, c in codes.items() if n != "scheduler"):
                    break
                time.sleep(0.2)
            codes = cluster.exit_codes()
    finally:
        if server is not None:
            server.stop()
    seconds = time.monotonic() - started
    events = []
    if events_path.exists():
        events = [json.loads(ln) for ln in events_path.read_text().splitlines() if ln.strip()]
    return Run(workdir, codes, events, seconds)
