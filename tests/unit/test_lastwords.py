"""A rank's last words: bounded, written by an uncaught exception, read once by its agent;
under msrun they give the real cause of a worker msrun shows only as gone (300)."""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

from ms_recover.config import JobConfig
from ms_recover.integrations.msrun.hands import UNKNOWN_NOTE, MsrunHands
from ms_recover.observability import lastwords


def test_bounded_keeps_the_end() -> None:
    text = "\n".join(f"line {i}" for i in range(100))
    out = lastwords.bounded(text, max_lines=5)
    assert out.splitlines() == [f"line {i}" for i in range(95, 100)]
    long = lastwords.bounded("x" * 10_000 + "END", max_chars=100)
    assert len(long) == 100 and long.endswith("END") and long.startswith("...")


def test_without_last_words_the_log_tail_is_used(tmp_path: Path) -> None:
    log = tmp_path / "rank_1.log"
    log.write_text("".join(f"out {i}\n" for i in range(200)) + "Segmentation fault\n")
    host, tail = lastwords.collect(str(tmp_path / "absent.json"), str(log))
    assert host == socket.gethostname()
    assert tail.endswith("Segmentation fault") and len(tail.splitlines()) == lastwords.MAX_LINES


class FakeMsrun:
    """msrun's callbacks over a table: a started worker runs until ``end`` marks it gone."""

    def __init__(self) -> None:
        self.status: dict[int, dict[str, Any]] = {}
        self.next_pid = 1000

    def start(self, local_ranks: list[int]) -> None:
        for lr in local_ranks:
            self.next_pid += 1
            self.status[lr] = {"pid": self.next_pid, "status": None}

    def monitor(self, local_ranks: list[int]) -> dict[int, dict[str, Any]]:
        return dict(self.status)

    def callbacks(self) -> dict[str, Any]:
        return {
            "KILL_WORKER": lambda pids: None,
            "START_ALL_WORKER": lambda: None,
            "START_WORKER_LIST": self.start,
            "MONITOR": self.monitor,
        }


def test_msrun_hidden_status_is_explained_or_said_unknown() -> None:
    fake, environ = FakeMsrun(), dict[str, str]()
    hands = MsrunHands(JobConfig(node_nums=1, proc_per_node=2), fake.callbacks(), environ=environ)
    try:
        hands.start(0)
        words = environ[lastwords.ERROR_FILE]
        lastwords.write(words, "Traceback (most recent call last):\nValueError: bad batch\n")
        hands.start(1)
        fake.status[0]["status"] = fake.status[1]["status"] = 300  # msrun: "pid gone"
        exits = {e.rank: e for e in hands.poll()}
        assert "ValueError: bad batch" in exits[0].log_tail and exits[0].exit_code == 1
        assert exits[0].host == socket.gethostname()
        assert exits[1].log_tail == UNKNOWN_NOTE
    finally:
        hands.close()
