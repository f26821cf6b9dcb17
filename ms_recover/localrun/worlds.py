"""The data-parallel world schedule of an elastic run, replayed by its reference run.

An elastic run (``elastic-training``) trains some steps with fewer ranks: the world shrinks
when a rank is lost and grows back when it returns. Its gradients are summed over a different
set of ranks in a different ring order, so it can only be compared bit for bit with a run
that follows the same schedule. The schedule is a list of ``(first_step, members)``: from
``first_step`` on, the data-parallel world is ``members`` (the session's ``worlds``, written to
each rank's record).

A reference run replays it with every process alive and uninterrupted. During a step whose
world is a subset, the members reduce in a sub-group of exactly those ranks (the host ring over
the same sorted ranks, the same segments and order as the elastic run's shrunk world: the same
bits), and the result is broadcast to the ranks outside it, which apply the same update and so
hold the bits a repair would have given them when the world grows back. The data position of
a member is its index in the sorted members, as the shrunk world's ``data_rank``.

``MS_RECOVER_WORLD_SCHEDULE`` carries the schedule to the ranks: ``;``-separated
``first_step:r,r,...`` entries.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

from numpy.typing import NDArray

from ms_recover.errors import ConfigError
from ms_recover.worker.session import Session

ENV = "MS_RECOVER_WORLD_SCHEDULE"
Schedule = list[tuple[int, list[int]]]


def encode(schedule: Sequence[tuple[int, Sequence[int]]]) -> str:
    """The environment form of ``schedule``."""
    return ";".join(f"{step}:{','.join(str(r) for r in ranks)}" for step, ranks in schedule)


def parse(text: str) -> Schedule:
    """Parse :data:`ENV`; raises ConfigError naming the bad entry and the expected form."""
    schedule: Schedule = []
    for raw in filter(None, (t.strip() for t in text.split(";"))):
        try:
            step, ranks = raw.split(":", 1)
            schedule.append((int(step), sorted(int(r) for r in ranks.split(","))))
        except ValueError:
            raise ConfigError(
                f"{ENV} entry {raw!r} must look like first_step:rank,rank,..."
            ) from None
    steps = [s for s, _ in schedule]
    if steps != sorted(set(steps)) or any(not ranks for _, ranks in schedule):
        raise ConfigError(f"{ENV} needs increasing first steps and non-empty worlds: {text!r}")
    return schedule


class WorldSchedule:
    """Where a rank's data comes from and how it reduces, step by step (see the module doc).

    Without a schedule both defer to the session (the run's own world), so a training
    program can always go through it.
    """

    def __init__(self, session: Session, schedule: Schedule) -> None:
        self.session = session
        self.schedule = schedule
        self._groups: dict[tuple[int, ...], str] = {}
        world = tuple(range(session.world_size))
        for _, ranks in schedule:
            key = tuple(ranks)
            if key != world and key not in self._groups:
                name = "world-" + "-".join(str(r) for r in key)
                session.comm.create_group(name, list(key))
                self._groups[key] = name

    @classmethod
    def from_env(cls, session: Session, environ: Mapping[str, str] | None = None) -> WorldSchedule:
        """The schedule in :data:`ENV`, if any (the environment is read only here)."""
        return cls(session, parse((os.environ if environ is None else environ).get(ENV, "")))

    def members(self, step: int) -> list[int] | None:
        """The scheduled world of ``step``, or None to use the session's own."""
        current = None
        for first, ranks in self.schedule:
            if first <= step:
                current = ranks
        return current

    def where(self, step: int) -> tuple[int, int]:
        """(data rank, data world) of this rank at ``step``; a rank outside the scheduled
        world reads the first member's samples (its gradient is not used)."""
        members = self.members(step)
        if members is None:
            return self.session.data_rank, self.session.data_world
        rank = self.session.rank
        return (members.index(rank) if rank in members else 0), len(members)

    def allreduce(self, step: int, array: NDArray[Any], op: str) -> NDArray[Any]:
        """The reduction of ``step``: the session's own, or the scheduled world's."""
        members = self.members(step) or []
        group = self._groups.get(tuple(members))
        if group is None:
            return self.session.allreduce(array, op)
        comm = self.session.comm
        out = comm.allreduce(array, op, group=group) if self.session.rank in members else array
        return comm.broadcast(out, members[0])
