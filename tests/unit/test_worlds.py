"""The world schedule a reference run replays to match an elastic run (issue 9 #14)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from ms_recover.errors import ConfigError
from ms_recover.localrun.worlds import ENV, WorldSchedule, encode, parse


class FakeComm:
    def __init__(self) -> None:
        self.groups: list[tuple[str, list[int]]] = []
        self.calls: list[tuple[str, Any]] = []

    def create_group(self, name: str, ranks: list[int]) -> None:
        self.groups.append((name, ranks))

    def allreduce(self, array: Any, op: str, group: str) -> Any:
        self.calls.append(("allreduce", group))
        return array * 10

    def broadcast(self, array: Any, root: int) -> Any:
        self.calls.append(("broadcast", root))
        return array + 1


class FakeSession:
    def __init__(self, rank: int, world: int = 4) -> None:
        self.rank, self.world_size, self.comm = rank, world, FakeComm()
        self.data_rank, self.data_world = rank, world

    def allreduce(self, array: Any, op: str) -> Any:
        self.comm.calls.append(("session", op))
        return array


SCHEDULE = [(0, [0, 1, 2, 3]), (21, [0, 2, 3]), (90, [0, 1, 2, 3])]


def test_encode_and_parse_round_trip() -> None:
    text = encode(SCHEDULE)
    assert text == "0:0,1,2,3;21:0,2,3;90:0,1,2,3"
    assert parse(text) == SCHEDULE
    assert parse("") == [] and parse(" ; ") == []


@pytest.mark.parametrize("bad", ["x:0,1", "3", "5:0,a", "9:0;4:0,1", "4:0;4:0,1"])
def test_a_bad_schedule_is_a_one_line_error(bad: str) -> None:
    with pytest.raises(ConfigError, match=ENV):
        parse(bad)


def test_members_follow_the_schedule_and_default_to_the_session() -> None:
    sched = WorldSchedule(FakeSession(0), SCHEDULE)  # type: ignore[arg-type]
    assert [sched.members(s) for s in (0, 20, 21, 89, 90)] == [
        [0, 1, 2, 3],
        [0, 1, 2, 3],
        [0, 2, 3],
        [0, 2, 3],
        [0, 1, 2, 3],
    ]
    assert WorldSchedule(FakeSession(2), []).where(50) == (2, 4)  # type: ignore[arg-type]


def test_a_shrunk_step_reduces_in_the_subgroup_and_broadcasts_to_the_rest() -> None:
    member, outsider = FakeSession(2), FakeSession(1)
    for session in (member, outsider):
        sched = WorldSchedule(session, SCHEDULE)  # type: ignore[arg-type]
        assert session.comm.groups == [("world-0-2-3", [0, 2, 3])]
        one = np.ones(2)
        assert np.array_equal(sched.allreduce(5, one, "sum"), one)  # the full world
        shrunk = sched.allreduce(30, one, "sum")
        if session is member:
            assert sched.where(30) == (1, 3)  # its index among the members
            assert np.array_equal(shrunk, one * 10 + 1)
        else:
            assert sched.where(30) == (0, 3)  # reads member 0's samples, unused
            assert np.array_equal(shrunk, one + 1)  # contributes nothing, gets the result
    assert member.comm.calls == [
        ("session", "sum"),
        ("allreduce", "world-0-2-3"),
        ("broadcast", 0),
    ]
    assert outsider.comm.calls == [("session", "sum"), ("broadcast", 0)]
