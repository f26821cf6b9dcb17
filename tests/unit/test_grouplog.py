"""GroupLog: the ordered record of communicator groups that a restarted rank replays."""

from __future__ import annotations

import pytest

from ms_recover.comm.grouplog import WORLD, GroupLog
from ms_recover.errors import CommError


def test_keeps_creation_order_and_ranks_order() -> None:
    log = GroupLog()
    assert log.add("dp0", [3, 1]) and log.add("mp", (0, 1, 2))
    assert list(log) == [("dp0", (3, 1)), ("mp", (0, 1, 2))]
    assert log.names() == ["dp0", "mp"] and len(log) == 2
    assert log.ranks_of("dp0") == (3, 1)


def test_same_group_again_is_a_no_op_and_a_changed_one_is_an_error() -> None:
    log = GroupLog([("dp0", (0, 2))])
    assert log.add("dp0", [0, 2]) is False
    assert len(log) == 1
    with pytest.raises(CommError, match=r"'dp0' already exists with ranks \[0, 2\], not \[2, 0\]"):
        log.add("dp0", [2, 0])


@pytest.mark.parametrize(
    ("name", "ranks", "match"),
    [(WORLD, [0], "reserved"), ("g", [], "distinct ranks"), ("g", [1, 1], "distinct ranks")],
)
def test_rejects_invalid_groups(name: str, ranks: list[int], match: str) -> None:
    with pytest.raises(CommError, match=match):
        GroupLog().add(name, ranks)


def test_unknown_group_lists_the_known_ones() -> None:
    with pytest.raises(CommError, match="unknown group 'x'; known: world, a"):
        GroupLog([("a", (0,))]).ranks_of("x")


def test_wire_round_trip_and_equality() -> None:
    log = GroupLog([("a", (1, 0)), ("b", (2,))])
    copy = GroupLog.from_wire(log.to_wire())
    assert copy == log and copy is not log
    assert log != GroupLog([("b", (2,)), ("a", (1, 0))])  # order matters
    assert log != [("a", (1, 0)), ("b", (2,))]


def test_iteration_is_a_snapshot() -> None:
    log = GroupLog([("a", (0,))])
    for _ in log:
        log.add("b", (1,))
    assert log.names() == ["a", "b"]


@pytest.mark.parametrize("data", [[["a"]], [["a", ["x"]]], [["a", 5]], "nope"])
def test_malformed_wire_data_is_a_comm_error(data: object) -> None:
    with pytest.raises(CommError, match="malformed group log"):
        GroupLog.from_wire(data)  # type: ignore[arg-type]
