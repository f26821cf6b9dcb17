"""``ms-recover status`` at a glance: a summary by default (world, alive, step range, state,
epoch, last recovery, last fault with host and traceback, flagged ranks, insecure), per-rank
lines on request, untrusted text escaped."""

from __future__ import annotations

from typing import Any

from ms_recover.observability.status import MAX_FLAGGED_SHOWN, render


def _rank(rank: int, step: int, alive: bool = True, registered: bool = True) -> dict[str, Any]:
    return {
        "rank": rank,
        "node_rank": rank // 2,
        "alive": alive,
        "done": False,
        "step": step,
        "pid": 100 + rank if registered else 0,
        "incarnation": 0,
        "silent_s": 0.1 if registered else None,
        "relayed": False,
    }


def _status(n: int = 1000, **extra: Any) -> dict[str, Any]:
    ranks = [_rank(i, 40 + i % 3) for i in range(n - 2)]
    ranks += [_rank(n - 2, 39, alive=False), _rank(n - 1, -1, alive=False, registered=False)]
    agents = [
        {"node_rank": i, "alive": i != 1, "pid": 9, "pod_ip": "10.0.0.1", "is_scheduler": i == 0}
        for i in range(n // 2)
    ]
    return {
        "job_id": "big",
        "state": "running",
        "epoch": 2,
        "world_size": n,
        "strategies": "recover-in-place,exit",
        "recoveries": 1,
        "insecure": False,
        "last_recovery": None,
        "ranks": ranks,
        "agents": agents,
        **extra,
    }


def test_the_summary_of_a_thousand_ranks_is_a_few_lines() -> None:
    out = render(_status())
    assert len(out.splitlines()) <= 4
    assert "job big: running, epoch 2, strategy recover-in-place,exit, recoveries 1" in out
    assert "ranks: world 1000, alive 998, done 0, not registered 1; steps 39..42" in out
    assert "nodes: 499 of 500 agents up" in out
    assert "pid=0" not in out and "step -1" not in out


def test_per_rank_lines_on_request_say_not_registered_instead_of_pid_0() -> None:
    out = render(_status(n=4), ranks=True)
    assert "rank   3 node 1: not registered" in out
    assert "rank   2 node 1: DOWN step     39 pid=102" in out
    assert "node 1: agent DOWN" in out


def test_last_fault_flagged_ranks_recovery_and_insecure_are_shown_escaped() -> None:
    fault = {
        "kind": "rank_exit",
        "rank": 3,
        "node_rank": 1,
        "host": "node-b\x1b[31m",
        "pid": 77,
        "exit_code": 1,
        "signal": 0,
        "detail": "rank 3 died (exit code 1)",
        "log_tail": "Traceback (most recent call last):\nRuntimeError: shard corrupt",
    }
    flagged = [
        {"rank": r, "node": 0, "host": "node-a", "step": 7, "reason": "slow"}
        for r in range(MAX_FLAGGED_SHOWN + 2)
    ]
    recovery = {
        "strategy": "recover-in-place",
        "ok": True,
        "mttr_s": 2.5,
        "lost_steps": 0,
        "phases": {"detect": 0.1, "resume": 0.2},
    }
    out = render(
        _status(n=4, last_faults=[fault], flagged=flagged, insecure=True, last_recovery=recovery)
    )
    assert "last fault (1 shown of the latest): rank_exit rank 3 node 1 on node-b\\x1b[31m" in out
    assert ", exit code 1: rank 3 died (exit code 1)" in out
    assert "    | RuntimeError: shard corrupt" in out and "\x1b" not in out
    assert f"flagged: {MAX_FLAGGED_SHOWN + 2} rank(s): rank 0 (node 0, node-a, step 7): slow" in out
    assert "; and 2 more" in out
    assert "INSECURE: no job secret" in out
    assert "last recovery: recover-in-place ok, mttr 2.500s, lost steps 0" in out
