"""Relayed acknowledgements in one pass: the common case of a node's STOPPED, REBUILT,
REPAIRED and the heartbeat that closes a RESUME.

A stop-all at 16,384 ranks brings the manager 16,384 STOPPED items from 2,048 agents
(docs/design.md §1c), and formation as many REBUILT. An agent sends a run of such answers in the
columns of one :class:`~ms_recover.protocol.messages.RelayAcks` (no map per rank: 402 bytes
for 8 STOPPED instead of 676, decoded in 13 % less time), and
:meth:`FastAcks.columns` records them; anything else arrives as
:class:`~ms_recover.protocol.messages.RelayUp` items, which :meth:`FastAcks.take` records where
it can (a REPAIRED). Each item on the general path becomes an envelope and a message object and goes
through the server's dispatch (replay check, handler table, handler), about 9 us of Python per
item. :class:`FastAcks` records such an item in one function instead, **only** when every check
of the general path passes and its outcome is known: the body has exactly the message's fields
and each passes the codec's own compiled check, the local identity is set and the sender name
short enough, the rank is the node's and is registered, alive and known under this very virtual
identity, the item is of the current epoch, and (for a RelayUp item) it is not a replay. The
replay check comes last, so an item that fails it is dropped with the general path's reason
and nothing else was done. (RelayAcks items are not checked for replay again: see
:meth:`FastAcks.columns`.)

Whatever else an item holds (a stale epoch, an unregistered rank, a bad body) is left to the
general path, untouched: its drops, logs and answers (a ``Rejoin``) stay exactly those of the
item's own frame. What is recorded is what ``WorkerHandlers.on_stopped`` / ``on_rebuilt``
record (and ``on_repaired`` / ``on_heartbeat``), with the same ``last_seen`` refresh, and
the cadence hears the kind. (A heartbeat's general path takes one of any epoch; this one only
of the current epoch, the others still take the general path.)
"""

from __future__ import annotations

from collections.abc import Callable, Container
from typing import Any

from ms_recover.manager.cadence import Cadence
from ms_recover.manager.model import Ack, JobModel, RankInfo
from ms_recover.protocol import messages as M
from ms_recover.protocol.codec import MAX_SENDER, DropLog, field_checks
from ms_recover.protocol.replay import ReplayGuard


def _call(test: Callable[[Any], bool], value: Any) -> bool:
    return test(value)  # operator.call, which Python 3.10 (still supported) lacks


_STOP, _REBUILD, _REPAIR = (Ack.STOP, 0), (Ack.REBUILD, 0), (Ack.REPAIR, 0)  # RankInfo.ack's keys


def _stop(info: RankInfo, epoch: int, step: int, digest: str) -> None:
    info.acks[_STOP] = epoch  # info.ack(Ack.STOP, epoch): every rank of a stop-all
    info.committed_step = step
    info.stop_digest = digest


def _rebuild(info: RankInfo, epoch: int, step: int, digest: str) -> None:
    info.acks[_REBUILD] = epoch


def _repaired_first(info: RankInfo, epoch: int, step: int, digest: str) -> None:
    info.acks[_REPAIR] = epoch  # info.ack(Ack.REPAIR, epoch, 0): the first attempt's success
    info.committed_step = step


def _beat(info: RankInfo, epoch: int, step: int, digest: str) -> None:
    if step > info.committed_step:  # ``last_progress`` follows ``last_seen``, set just before
        info.committed_step, info.last_progress = step, info.last_seen


#: kind -> (message class, what its handler records for a current, registered rank, given
#: the message's ``committed_step`` and ``digest`` where it has them). A relayed heartbeat is
#: one that closes a RESUME (the agent folds the others into its own); a REPAIRED in columns
#: is the success of the round's first attempt (:data:`~ms_recover.protocol.relay.ACK_IMPLIED`).
COLUMNS: dict[str, tuple[type[M.Message], Callable[[RankInfo, int, int, str], None]]] = {
    "stopped": (M.Stopped, _stop),
    "rebuilt": (M.Rebuilt, _rebuild),
    "worker_hb": (M.WorkerHeartbeat, _beat),
    "repaired": (M.Repaired, _repaired_first),
}


def _from_body(
    column: Callable[[RankInfo, int, int, str], None],
) -> Callable[[RankInfo, int, dict[str, Any]], None]:
    return lambda info, epoch, body: column(
        info, epoch, body.get("committed_step", -1), body.get("digest", "")
    )


def _repaired(info: RankInfo, epoch: int, body: dict[str, Any]) -> None:
    if body["ok"]:
        info.ack(Ack.REPAIR, epoch, body["attempt"])
        info.committed_step = body["committed_step"]
    else:
        info.repair_failure = (body["attempt"], body["failed_peer"], body["reason"])


#: kind -> (message class, what its handler records for a current, registered rank).
RECORD: dict[str, tuple[type[M.Message], Callable[[RankInfo, int, dict[str, Any]], None]]] = {
    **{kind: (cls, _from_body(column)) for kind, (cls, column) in COLUMNS.items()},
    "repaired": (M.Repaired, _repaired),
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
        mine: Container[int],
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
        if body.get("urgent") is True:  # its step timing is recorded on the general path
            return False
        cls, names, order, tests, record = checks
        # Every field's compiled check, in one C-level pass: all(test(body[name]) ...).
        if body.keys() != names or not all(map(_call, tests, map(body.__getitem__, order))):
            return False
        info = self._member(body["rank"], mine, prefix + local)
        if info is None or epoch != self.model.epoch:
            return False
        replayed = self.replay.check(sender, nonce, seq)
        if replayed:
            self.drops.drop(replayed, sender[:64])
            return True
        self.cadence.heard(cls, epoch)
        info.last_seen = self.clock()
        record(info, epoch, body)
        return True

    def columns(self, prefix: bytes, mine: Container[int], msg: M.RelayAcks) -> list[int]:
        """Record the items of a RelayAcks batch whose columns passed
        :func:`~ms_recover.protocol.relay.ack_columns`, relayed by the agent whose virtual
        identities start with ``prefix`` for the ranks ``mine``; the indices of the items left
        to the general path (nothing was done for those), as :meth:`take` leaves them.

        No replay check per item here: the agent checked each of these frames when its rank
        sent it (:class:`~ms_recover.agent.relay.LocalRelay`), and the batch itself passed the
        manager's check as the agent's frame. The second check would stop nothing: whoever
        can sign an agent's frame holds the job's secret and can sign any rank's."""
        n = len(msg.ranks)
        epoch = msg.epoch
        if epoch != self.model.epoch or max(map(len, msg.senders), default=0) > MAX_SENDER:
            return list(range(n))
        cls, record = COLUMNS[msg.kind]
        steps = msg.steps or [-1] * n
        digests = msg.digests or [""] * n
        left = self._record(prefix, mine, epoch, record, msg.idents, msg.ranks, steps, digests)
        self.cadence.heard(cls, epoch, n - len(left))
        return left

    def stopped(
        self, prefix: bytes, mine: range, epoch: int, msg: M.GroupStopped, start: int, end: int
    ) -> int:
        """Record items ``start:end`` of a group leader's GroupStopped batch, STOPPED answers
        of epoch ``epoch`` (the current one) relayed by the agent whose virtual identities
        start with ``prefix`` for the ranks ``mine``, as :meth:`columns` records a RelayAcks'
        (the leader checked each member's frame, as an agent checks its ranks'); how many were
        recorded. The others are dropped: a rank that is not the node's, not registered and
        alive, or not known under that identity (the round's STOP goes again to a survivor
        that has not answered, :func:`~ms_recover.manager.progress.stop_again`)."""
        cut = slice(start, end)
        columns = msg.locals[cut], msg.ranks[cut], msg.steps[cut], msg.digests[cut]
        return end - start - len(self._record(prefix, mine, epoch, _stop, *columns))

    def _record(
        self,
        prefix: bytes,
        mine: Container[int],
        epoch: int,
        record: Callable[[RankInfo, int, int, str], None],
        idents: list[bytes],
        ranks: list[int],
        steps: list[int],
        digests: list[str],
    ) -> list[int]:
        """``record`` each item of the columns whose rank is one of ``mine``, registered,
        alive and known under the virtual identity ``prefix`` + its local identity; the
        indices of the others (nothing was done for those)."""
        get, now, left = self.model.ranks.get, self.clock(), []
        for i, (local, rank, step, digest) in enumerate(
            zip(idents, ranks, steps, digests, strict=True)
        ):
            info = get(rank)  # self._member, inlined: every rank of a stop-all passes here
            if (
                info is None
                or rank not in mine
                or not (info.registered and info.alive)
                or info.identity != prefix + local
            ):
                left.append(i)
                continue
            info.last_seen = now
            record(info, epoch, step, digest)
        return left

    def _member(self, rank: int, mine: Container[int], identity: bytes) -> RankInfo | None:
        """``rank``'s record if it is one of ``mine``, registered, alive and known under this
        very virtual ``identity``, else None."""
        info = self.model.ranks.get(rank)
        if info is None or rank not in mine or not (info.registered and info.alive):
            return None
        return info if info.identity == identity else None
