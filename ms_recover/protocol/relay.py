"""The relay's wire rules, shared by the agent and the manager (docs/design.md §1c). Pure: no I/O.

Ranks launched by ``ms-recover agent`` talk to their node's agent, which relays their frames to
the manager in :class:`~ms_recover.protocol.messages.RelayUp` batches (runs of STOPPED,
REBUILT, REPAIRED and RESUME-closing reports in the columns of a
:class:`~ms_recover.protocol.messages.RelayAcks`: :data:`ACK_COLUMNS`) and fans the manager's
:class:`~ms_recover.protocol.messages.RelayDown` batches out to them. The manager addresses a
relayed rank by a **virtual identity** that names the agent's ROUTER identity and the rank's
own identity at the agent (:func:`virtual_identity`), so its handlers, epochs and replay rules
see a relayed rank exactly as a directly connected one.

Guarantees:

* only worker -> manager kinds travel up (:data:`UP_KINDS`) and only manager -> worker kinds
  travel down (:data:`DOWN_KINDS`); anything else in a batch is dropped with a reason;
* :func:`check_item` checks every item's envelope and message like :class:`Codec.decode
  <ms_recover.protocol.codec.Codec>` checks a frame, and yields a reason instead of raising
  for a bad one, so one bad item never costs the others.
"""

from __future__ import annotations

from typing import Any

from ms_recover.errors import ProtocolError
from ms_recover.protocol import messages as M
from ms_recover.protocol.bounds import EPOCH_RANGES, int_range
from ms_recover.protocol.codec import MAX_SENDER, Envelope, check_epoch, message_of

#: The first bytes of every virtual identity. libzmq's own generated identities start with a
#: zero byte too but are 5 bytes long (a zero and a counter, so one socket in 256 hands every
#: peer an identity starting with these very bytes); a virtual identity is longer. A peer may
#: not set an identity starting with a zero byte itself (libzmq refuses it); one that arrives
#: anyway in the virtual form is refused by the manager (:func:`is_virtual` in ``dispatch``).
PREFIX = b"\x00R"
ZMQ_ID_BYTES = 5  # libzmq's generated identities

#: What a rank may send through its agent.
UP_KINDS: frozenset[bytes] = frozenset(
    cls.KIND
    for cls in (
        M.WorkerHello,
        M.WorkerHeartbeat,
        M.GroupCreated,
        M.Stopped,
        M.StateDigest,
        M.Rebuilt,
        M.Repaired,
        M.WorkerFault,
        M.WorkerDone,
        M.Dumped,
    )
)

#: What the manager may send to a rank through its agent.
DOWN_KINDS: frozenset[bytes] = frozenset(
    cls.KIND
    for cls in (M.Welcome, M.Rejoin, M.Stop, M.Rebuild, M.Repair, M.Peers, M.Resume, M.Exit, M.Dump)
)


def virtual_identity(agent: bytes, local: bytes) -> bytes:
    """The manager's name for the rank whose identity at ``agent`` is ``local``."""
    if not 0 < len(agent) < 256:
        raise ValueError(f"agent identity of {len(agent)} bytes: ZeroMQ allows 1..255")
    return PREFIX + bytes([len(agent)]) + agent + local


def is_virtual(identity: bytes) -> bool:
    return identity[:2] == PREFIX and len(identity) > ZMQ_ID_BYTES


def split_identity(identity: bytes) -> tuple[bytes, bytes] | None:
    """``(agent identity, local identity)`` of a virtual identity, else None."""
    if not is_virtual(identity) or len(identity) < 4:
        return None
    n = identity[2]
    agent, local = identity[3 : 3 + n], identity[3 + n :]
    return (agent, local) if len(agent) == n and local else None


#: One relayed item as it travels: (local identity, sender, nonce, seq, epoch, kind, body).
RawItem = tuple[bytes, str, int, int, int, str, Any]

#: The fields after ``rank`` that :class:`~ms_recover.protocol.messages.RelayAcks` carries in
#: its ``steps`` and ``digests`` columns, in that order.
ACK_FIELDS = ("committed_step", "digest")

#: What an agent sends in RelayAcks columns: kind -> its fields after ``rank`` (a prefix of
#: :data:`ACK_FIELDS`; the columns past them are empty). Its other fields are implied
#: (:data:`ACK_IMPLIED`) or left out (:data:`ACK_DROPPED`).
ACK_COLUMNS: dict[str, tuple[str, ...]] = {
    "stopped": ACK_FIELDS,
    "rebuilt": (),
    "worker_hb": ACK_FIELDS[:1],
    "repaired": ACK_FIELDS[:1],
}

#: The values of a kind's fields without a column: only a message that has exactly these
#: travels in columns. A heartbeat in columns is not urgent (an urgent one's step timing is
#: judged at once); a REPAIRED in columns is the success of a round's first repair attempt (a
#: failure, or a retry's answer, travels in a RelayUp).
ACK_IMPLIED: dict[str, dict[str, Any]] = {
    "worker_hb": {"urgent": False},
    "repaired": {"attempt": 0, "ok": True, "failed_peer": -1, "reason": ""},
}

#: The list fields a column item leaves out, read as empty: the step timing of a heartbeat in
#: columns (the one that closes a RESUME; the folded ones' timing rides on the agent's
#: heartbeat).
ACK_DROPPED: dict[str, tuple[str, ...]] = {"worker_hb": ("health",)}


def ack_run(msg: M.Message, epoch: int) -> tuple[str, int] | None:
    """The (kind, epoch) of the RelayAcks batch that carries ``msg`` of ``epoch``, None if it
    travels in a RelayUp (a kind without columns, or one whose fields are not the implied
    ones: :data:`ACK_IMPLIED`): consecutive items with one such key share a batch."""
    kind = msg.KIND.decode()
    if kind not in ACK_COLUMNS:
        return None
    implied = ACK_IMPLIED.get(kind, {})
    if any(getattr(msg, name) != value for name, value in implied.items()):
        return None
    return kind, epoch


def relay_acks(
    node: int, kind: str, epoch: int, envelopes: list[tuple[bytes, str, int, int]], msgs: list[Any]
) -> M.RelayAcks:
    """The RelayAcks of ``msgs``, all of ``kind`` (in :data:`ACK_COLUMNS`) and ``epoch``, each
    with its ``(local identity, sender, nonce, seq)``."""
    names = ACK_COLUMNS[kind]
    idents, senders, nonces, seqs = (list(col) for col in zip(*envelopes, strict=True))
    columns = [[getattr(m, f) for m in msgs] if f in names else [] for f in ACK_FIELDS]
    ranks = [m.rank for m in msgs]
    return M.RelayAcks(node, kind, epoch, idents, senders, nonces, seqs, ranks, *columns)


def ack_columns(msg: M.RelayAcks) -> str | None:
    """Why a RelayAcks batch cannot be read item by item (a kind it may not carry, columns of
    unequal length), or None."""
    fields = ACK_COLUMNS.get(msg.kind)
    if fields is None:
        return f"{msg.kind[:32]!r} is not relayed in columns (only {sorted(ACK_COLUMNS)})"
    n = len(msg.ranks)
    sizes = {len(msg.idents), len(msg.senders), len(msg.nonces), len(msg.seqs)}
    filled = [len(col) == (n if i < len(fields) else 0) for i, col in enumerate(_extra(msg))]
    if not (sizes <= {n} and all(filled)):
        return f"{UNEQUAL} ({msg.kind})"
    lo, hi = int_range("committed_step", msg.kind.encode())
    if msg.steps and not lo <= min(msg.steps) <= max(msg.steps) <= hi:  # as each frame's own
        return f"relayed {msg.kind}.committed_step must be in {lo}..{hi}"
    return None


def ack_item(msg: M.RelayAcks, i: int) -> RawItem:
    """Item ``i`` of a checked (:func:`ack_columns`) RelayAcks batch, as a RelayUp item."""
    body: dict[str, Any] = {"rank": msg.ranks[i]}
    for name, col in zip(ACK_COLUMNS[msg.kind], _extra(msg), strict=False):
        body[name] = col[i]
    body.update(ACK_IMPLIED.get(msg.kind, {}))
    body.update({name: [] for name in ACK_DROPPED.get(msg.kind, ())})
    return (msg.idents[i], msg.senders[i], msg.nonces[i], msg.seqs[i], msg.epoch, msg.kind, body)


def _extra(msg: M.RelayAcks) -> tuple[list[Any], ...]:
    return msg.steps, msg.digests  # in the order of ACK_FIELDS


#: Why a whole batch is dropped.
UNEQUAL = "relay batch with lists of unequal length"


def raw_items(msg: M.RelayUp) -> list[RawItem] | None:
    """The items of ``msg``, unchecked, or None if its lists differ in length."""
    lists = (msg.idents, msg.senders, msg.nonces, msg.seqs, msg.epochs, msg.kinds, msg.bodies)
    if len({len(x) for x in lists}) != 1:
        return None
    return list(zip(*lists, strict=True))


def check_item(job_id: str, raw: RawItem) -> Envelope | str:
    """One raw item as the envelope of its rank's own frame, or the reason to drop it."""
    ident, sender, nonce, seq, epoch, kind, body = raw
    return _item(job_id, ident, sender, nonce, seq, epoch, kind.encode(), body)


def _item(
    job_id: str,
    ident: bytes,
    sender: str,
    nonce: int,
    seq: int,
    epoch: int,
    kind: bytes,
    body: dict[str, object],
) -> Envelope | str:
    if not ident:
        return "relayed item without a local identity"
    if len(sender) > MAX_SENDER:
        return f"relayed sender longer than {MAX_SENDER}"
    if kind not in UP_KINDS:
        return f"{kind[:32].decode(errors='replace')} may not be relayed to the manager"
    try:
        message = message_of(kind, body)
        if kind in EPOCH_RANGES:
            check_epoch(kind, epoch)
    except ProtocolError as exc:
        return f"relayed {exc}"
    return Envelope(job_id, epoch, sender, seq, message, nonce)


def rank_of(msg: M.Message) -> int | None:
    """The rank a worker -> manager message speaks for (all :data:`UP_KINDS` carry one)."""
    rank = getattr(msg, "rank", None)
    return rank if isinstance(rank, int) else None
