"""Relayed acknowledgements in one pass: the common case of a node's STOPPED, REBUILT,
REPAIRED and the heartbeat that closes a RESUME.

A stop-all at 16,384 ranks brings the manager 16,384 STOPPED items in 2,048
:class:`~ms_recover.protocol.messages.RelayUp` batches (DESIGN.md §1c), and formation as many
REBUILT. Each item on the general path becomes an envelope and a message object and goes
through the server's dispatch (replay check, handler table, handler), about 9 us of Python per
item. :class:`FastAcks` records such an item in one function instead, **only** when every check
of the general path passes and its outcome is known: the body has exactly the message's fields
and each passes the codec's own compiled check, the local identity is set and the sender name
short enough, the rank is the node's and is registered, alive and known under this very virtual
identity, the item is of the current epoch, and it is not a replay. The replay check comes last,
so an item that fails it is dropped with the general path's reason and nothing else was done.

Whatever else an item holds (a stale epoch, an unregistered rank, a bad body) is left to the
general path, untouched: its drops, logs and answers (a ``Rejoin``) stay exactly those of the
item's own frame. What is recorded is what ``WorkerHandlers.on_stopped`` / ``on_rebuilt``
record (and ``on_repaired`` / ``on_heartbeat``), with the same ``last_seen`` refresh, and
the cadence hears the kind. (A heartbeat's general path takes one of any epoch; this one only
of the current epoch, the others still take the general path.)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ms_recover.manager.cadence import Cadence
from ms_recover.manager.model import Ack, JobModel, RankInfo
from ms_recover.protocol import messages as M
from ms_recover.protocol.codec import MAX_SENDER, DropLog, field_checks
from ms_recover.protocol.replay import ReplayGuard


def _call(test: Callable[[Any], bool], value: Any) -> bool:
    return test(value)  # operator.call, which Python 3.10 (still supported) lacks


def _stopped(info: RankInfo, epoch: int, body: dict[str, Any]) -> None:
    info.ack(Ack.STOP, epoch)
    info.committed_step = body["committed_step"]
    info.stop_digest = body["digest"]


def _rebuilt(info: RankInfo, epoch: int, body: dict[str, Any]) -> None:
    info.ack(Ack.REBUILD, epoch)


def _repaired(info: RankInfo, epoch: int, body: dict[str, Any]) -> None:
    if body["ok"]:
        info.ack(Ack.REPAIR, epoch, body["attempt"])
        info.committed_step = body["committed_step"]
    else:
        info.repair_failure = (body["attempt"], body["failed_peer"], body["reason"])


def _heartbeat(info: RankInfo, epoch: int, body: dict[str, Any]) -> None:
    step = body["committed_step"]
    if step > info.committed_step:  # ``last_progress`` follows ``last_seen``, set just before
        info.committed_step, info.last_progress = step, info.last_seen


#: kind -> (message class, what its handler records for a current, registered rank). A
#: relayed heartbeat is one that closes a RESUME (the agent folds the others into its own).
RECORD: dict[str, tuple[type[M.Message], Callable[[RankInfo, int, dict[str, Any]], None]]] = {
    "stopped": (M.Stopped, _stopped),
    "rebuilt": (M.Rebuilt, _rebuilt),
    "repaired": (M.Repaired, _repaired),
    "worker_hb": (M.WorkerHeartbeat, _heartbeat),
}


class FastAcks:
    """Records a relayed acknowledgement whose general path is known to end in the record."""

    def __init__(
        self,
        model: JobModel,
        replay: ReplayGuard,
        drops: DropLog,
        cadence: Cadence,
        clock: Callable[[], float],
    ) -> None:
        self.model = model
        self.replay = replay
        self.drops = drops
        self.cadence = cadence
        self.clock = clock
        self._checks = {
            kind: (
                cls,
                frozenset(field_checks(cls.KIND)),
                tuple(field_checks(cls.KIND)),
                tuple(field_checks(cls.KIND).values()),
                record,
            )
            for kind, (cls, record) in RECORD.items()
        }

    def take(
        self,
        prefix: bytes,
        mine: set[int],
        item: tuple[bytes, str, int, int, int, str, Any],
    ) -> bool:
        """Record ``item`` = ``(local identity, sender, nonce, seq, epoch, kind, body)``,
        relayed by the agent whose virtual identities start with ``prefix`` for the ranks
        ``mine``; True if it was handled here (recorded, or dropped as a replay), False if
        it must take the general path (nothing was done)."""
        local, sender, nonce, seq, epoch, kind, body = item
        checks = self._checks.get(kind)
        if checks is None or type(body) is not dict or not local or len(sender) > MAX_SENDER:
            return False
        cls, names, order, tests, record = checks
        # Every field's compiled check, in one C-level pass: all(test(body[name]) ...).
        if body.keys() != names or not all(map(_call, tests, map(body.__getitem__, order))):
            return False
        rank = body["rank"]
        info = self.model.ranks.get(rank)
        if (
            info is None
            or rank not in mine
            or epoch != self.model.epoch
            or not (info.registered and info.alive)
            or info.identity != prefix + local
        ):
            return False
        replayed = self.replay.check(sender, nonce, seq)
        if replayed:
            self.drops.drop(replayed, sender[:64])
            return True
        self.cadence.heard(cls, epoch)
        info.last_seen = self.clock()
        record(info, epoch, body)
        return True
