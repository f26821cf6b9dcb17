"""The group log: every communicator group a rank created, in creation order.

The manager keeps the job's copy (mirrored from the workers). After a restart every rank
rebuilds the world group and then each logged group, in order and with the same names, so a
restarted rank does not depend on user code creating its groups again in the same order.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from ms_recover.errors import CommError

WORLD = "world"


class GroupLog:
    """An ordered, duplicate-free record of (name, ranks) groups; the world group is implicit."""

    def __init__(self, entries: list[tuple[str, tuple[int, ...]]] | None = None) -> None:
        self._entries: list[tuple[str, tuple[int, ...]]] = []
        for name, ranks in entries or []:
            self.add(name, ranks)

    def add(self, name: str, ranks: tuple[int, ...] | list[int]) -> bool:
        """Record a group; returns False if it was already logged with the same ranks.

        Raises CommError if the name is reused for different ranks, or is the world group.
        """
        key = tuple(int(r) for r in ranks)
        if name == WORLD:
            raise CommError(f"group name {WORLD!r} is reserved for the world group")
        if not key or len(set(key)) != len(key):
            raise CommError(f"group {name!r} needs distinct ranks, got {list(key)}")
        for existing, existing_ranks in self._entries:
            if existing == name:
                if existing_ranks != key:
                    raise CommError(
                        f"group {name!r} already exists with ranks {list(existing_ranks)}, "
                        f"not {list(key)}"
                    )
                return False
        self._entries.append((name, key))
        return True

    def __iter__(self) -> Iterator[tuple[str, tuple[int, ...]]]:
        return iter(list(self._entries))

    def __len__(self) -> int:
        return len(self._entries)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, GroupLog) and self._entries == other._entries

    def ranks_of(self, name: str) -> tuple[int, ...]:
        for existing, ranks in self._entries:
            if existing == name:
                return ranks
        raise CommError(f"unknown group {name!r}; known: {', '.join([WORLD] + self.names())}")

    def names(self) -> list[str]:
        return [name for name, _ in self._entries]

    def to_wire(self) -> list[list[Any]]:
        return [[name, list(ranks)] for name, ranks in self._entries]

    @classmethod
    def from_wire(cls, data: list[list[Any]]) -> GroupLog:
        try:
            return cls([(str(name), tuple(int(r) for r in ranks)) for name, ranks in data])
        except (TypeError, ValueError) as exc:
            raise CommError(f"malformed group log {data!r:.200}") from exc
