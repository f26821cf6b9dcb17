"""LocalPods numbers each node's pods for fault plans (MS_RECOVER_FAULTS_POD): 0 in the
node's first pod, 1, 2, ... in every later one (recreated, a hot switch's backup), and a
spare pod never counts as a node's first. No process starts: ``_spawn`` is a recorder."""

from __future__ import annotations

from typing import Any

import pytest

from ms_recover.config import JobConfig
from ms_recover.localrun.pods import LocalPods


class _Proc:
    pid = 4242

    def poll(self) -> int | None:
        return None


@pytest.fixture
def pods(monkeypatch: pytest.MonkeyPatch) -> tuple[LocalPods, list[tuple[int, str]]]:
    cfg = JobConfig(job_id="p", node_nums=2, proc_per_node=1)
    pods = LocalPods(cfg, ["train.py"], spare_pods=1)
    launched: list[tuple[int, str]] = []

    def spawn(argv: list[str], log: str, node: int, group: Any, extra: Any = None) -> _Proc:
        launched.append((node, (extra or {}).get("MS_RECOVER_FAULTS_POD", "")))
        return _Proc()

    monkeypatch.setattr(pods, "_spawn", spawn)
    return pods, launched


def test_a_nodes_first_pod_is_pod_0_and_every_later_one_counts(
    pods: tuple[LocalPods, list[tuple[int, str]]],
) -> None:
    job, launched = pods
    job.start()
    assert launched == [(0, "0"), (1, "0"), (2, "1")]  # node 2 is the spare
    job._launch(1)  # recreated
    job.want_backup(1)
    job._start_backups()  # a hot switch's backup pod
    assert launched[3:] == [(1, "1"), (1, "2")]
