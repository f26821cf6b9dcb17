"""Frame codec: one ZeroMQ frame per message (wire layout ``msr2``)::

    b"msr2" | len(kind): 1 byte | kind | msgpack(envelope) | HMAC-SHA256 tag: 32 bytes

The tag is HMAC-SHA256 with the job secret over every byte before it (magic, kind length,
kind, envelope), so the layout version and the kind are signed with the body. The envelope is
a msgpack map ``{job_id, epoch, sender, seq, nonce, body}``. (Until this layout a message was
four ZeroMQ frames, ``[b"msr1", kind, envelope, tag]``: four frames to read and write per
message instead of one. Such a message is dropped and logged by name: both ends of a job run
the same version.)

:meth:`Codec.decode` either returns a fully validated :class:`Envelope` or raises
:class:`ProtocolError`; receivers log the error (rate limited, see :class:`DropLog`) and drop
the frame. Nothing here can crash a receiver on hostile input, even a validly signed one: every
value is bounded in type, size, nesting and range (:mod:`~ms_recover.protocol.bounds`) before
anything else touches it.

Every envelope carries the sender's **incarnation nonce**, a random 63-bit number each
:class:`Codec` (one per process) draws at construction and signs into every frame; receivers
use it with ``seq`` to drop replays (:class:`~ms_recover.protocol.replay.ReplayGuard`).
"""

from __future__ import annotations

import dataclasses
import hmac
import logging
import re
import secrets
import time
import typing
from typing import Any

import msgpack

from ms_recover.errors import ProtocolError
from ms_recover.protocol import bounds as B
from ms_recover.protocol import typed
from ms_recover.protocol.messages import KINDS, Message, RelayDown, RelayUp, field_types

MAGIC = b"msr2"
#: The first frame of a message in the layout before ``msr2`` (four frames per message).
OLD_MAGIC = b"msr1"
TAG_BYTES = 32  # HMAC-SHA256
HEADER_KEYS = ("job_id", "epoch", "sender", "seq", "nonce", "body")
_HEADER_SET = frozenset(HEADER_KEYS)
MAX_SENDER = 64  # characters of a sender name ("rank:65535", "agent:8191", "status")
_TYPES = {kind: field_types(cls) for kind, cls in KINDS.items()}
#: Kinds with untyped (``Any``) fields: only their bodies can nest deeply once the field checks
#: pass; the other kinds' checks reject any container where a scalar belongs, without recursion.
_DEEP = frozenset(kind for kind, types in _TYPES.items() if "Any" in repr(types))
_CHECKS = {
    kind: {name: B.compile_check(hint, name, kind) for name, hint in types.items()}
    for kind, types in _TYPES.items()
}
_HEADER_CHECKS = {
    key: (typ, B.compile_check(typ, key))
    for key, typ in (("epoch", int), ("seq", int), ("nonce", int), ("sender", str))
}
_EPOCH_OK, _SEQ_OK, _NONCE_OK = (_HEADER_CHECKS[key][1] for key in ("epoch", "seq", "nonce"))
# Relay batches carry other messages' bodies: each is checked as its own frame would be when
# the batch is unwrapped (:func:`message_of`), so the batch's own check only sees maps.
_RELAYS = frozenset({RelayUp.KIND, RelayDown.KIND})
for _kind in _RELAYS:
    _CHECKS[_kind]["bodies"] = lambda v: type(v) is list and all(type(b) is dict for b in v)
_DEEP -= _RELAYS
#: Every byte of a frame before its envelope, per kind with only typed scalar and int-map
#: fields and no narrower envelope epoch (see :meth:`Codec.quick`).
_QUICK = KINDS.keys() - _DEEP - _RELAYS - B.EPOCH_RANGES.keys()
_HEADS = {kind: MAGIC + bytes((len(kind),)) + kind for kind in _QUICK}
_LIMITS = B.UNPACK_LIMITS
_hmac, _compare = hmac.digest, hmac.compare_digest


@dataclasses.dataclass(frozen=True)
class Envelope:
    """A decoded frame: who sent which message, in which job and epoch."""

    job_id: str
    epoch: int
    sender: str
    seq: int
    msg: Message
    nonce: int = 0  # the sender's incarnation nonce


def new_nonce() -> int:
    """A random incarnation nonce (63 bits: a positive msgpack int64)."""
    return secrets.randbits(63)


class Codec:
    """Encodes and authenticates frames for one job, as one process incarnation (``nonce``)."""

    def __init__(
        self,
        job_id: str,
        secret: bytes,
        max_bytes: int = 4 << 20,
        nonce: int | None = None,
        compiled: bool = True,
    ) -> None:
        self.job_id = job_id
        self._key = secret
        self.max_bytes = max_bytes
        self.nonce = new_nonce() if nonce is None else nonce
        # Compiled envelope decoders (:mod:`~ms_recover.protocol.typed`), per kind; without
        # one (``compiled=False``, an untyped kind, no msgspec) only the Python checks run.
        kinds = typed.compiled_kinds() if compiled else frozenset()
        self._typed = {kind: typed.decoder(kind) for kind in kinds}
        # encode_packed's constant envelope parts, packed once (a stop-all's frame per node).
        self._packer = msgpack.Packer(use_bin_type=True).pack
        packer = msgpack.Packer(use_bin_type=True)
        pack = packer.pack
        self._head = b"".join(
            (packer.pack_map_header(len(HEADER_KEYS)), pack("job_id"), pack(job_id), pack("epoch"))
        )
        self._sender_key, self._seq_key = pack("sender"), pack("seq")
        self._tail = b"".join((pack("nonce"), pack(self.nonce), pack("body")))

    def encode(self, msg: Message, epoch: int, sender: str, seq: int) -> list[bytes]:
        """The signed frames of ``msg``. Raises ProtocolError (never crashes the caller's loop
        with msgpack's OverflowError/TypeError) if a value cannot be encoded."""
        body = {
            "job_id": self.job_id,
            "epoch": epoch,
            "sender": sender,
            "seq": seq,
            "nonce": self.nonce,
            "body": msg.to_wire(),
        }
        try:
            payload = msgpack.packb(body, use_bin_type=True)
        except (OverflowError, TypeError, ValueError) as exc:
            raise ProtocolError(f"cannot encode {msg.KIND.decode()}: {exc}") from exc
        return self.sign(msg.KIND, payload)

    def encode_packed(
        self, kind: bytes, packed_body: bytes, epoch: int, sender: str, seq: int
    ) -> list[bytes]:
        """The signed frames of a message of ``kind`` whose body is already msgpack-encoded
        (``msgpack.packb(msg.to_wire())`` or an equivalent concatenation): what :meth:`encode`
        produces, without packing the body again. The manager's relay packs a broadcast body
        once and splices it into one frame per node. The caller guarantees ``packed_body``
        is one msgpack map; :meth:`decode` checks it like any other body."""
        pack = self._packer
        payload = b"".join(
            (self._head, pack(epoch), self._sender_key, pack(sender), self._seq_key, pack(seq))
        )
        payload += self._tail + packed_body
        return self.sign(kind, payload)

    def sign(self, kind: bytes, payload: bytes) -> list[bytes]:
        """The message (one frame, in a list as ZeroMQ sends it) of ``kind`` whose envelope is
        the msgpack ``payload``: the layout in the module docstring, tag included."""
        head = MAGIC + bytes((len(kind),)) + kind + payload
        return [head + hmac.digest(self._key, head, "sha256")]

    def decode(self, frames: list[bytes]) -> Envelope:
        """Validate and decode one message (its ZeroMQ frames); raises ProtocolError naming
        what is wrong."""
        if len(frames) != 1:
            if frames and bytes(frames[0]) == OLD_MAGIC:
                raise ProtocolError(
                    f"an msr1 message ({len(frames)} frames: the layout before {MAGIC!r}, one "
                    "frame per message): a member of an older ms_recover version"
                )
            raise ProtocolError(f"expected 1 frame, got {len(frames)}")
        frame = frames[0] if type(frames[0]) is bytes else bytes(frames[0])
        if frame[:4] != MAGIC:
            raise ProtocolError(f"bad magic/version {frame[:8]!r}, expected {MAGIC!r}")
        size = len(frame)
        end = size - TAG_BYTES
        start = 5 + frame[4] if size > 4 else size
        if start > end:
            raise ProtocolError(f"truncated frame of {size} bytes")
        if end - start > self.max_bytes:
            raise ProtocolError(f"body of {end - start} bytes exceeds the {self.max_bytes} limit")
        view = memoryview(frame)
        if not hmac.compare_digest(view[end:], hmac.digest(self._key, view[:end], "sha256")):
            raise ProtocolError("bad MAC (wrong secret or tampered frame)")
        kind, payload = bytes(view[5:start]), view[start:end]
        if kind not in KINDS:
            raise ProtocolError(f"unknown kind {kind[:32]!r}")
        fast = self._typed.get(kind)
        if fast is not None:
            try:
                env = fast(payload)
            except typed.Refused:
                pass  # the Python checks below name what is wrong
            else:
                if env.job_id == self.job_id:
                    msg = typed.message(kind, env.body)
                    return Envelope(env.job_id, env.epoch, env.sender, env.seq, msg, env.nonce)
        try:
            data = msgpack.unpackb(payload, raw=False, strict_map_key=False, **B.UNPACK_LIMITS)
        except Exception as exc:  # msgpack raises several unrelated types on garbage
            raise ProtocolError(f"malformed msgpack body: {type(exc).__name__}: {exc}") from exc
        # Only a kind with untyped fields needs the depth walk: every other field check, and
        # the envelope's own, rejects a container where a scalar belongs without recursing.
        if kind in _DEEP and not B.depth_ok(data, B.MAX_DEPTH):
            raise ProtocolError(f"body nests deeper than {B.MAX_DEPTH} levels")
        return self._envelope(kind, data)

    def quick(self, frame: bytes, kind: bytes) -> tuple[int, str, int, int, dict[str, Any]] | None:
        """``(epoch, sender, seq, nonce, body)`` of a valid one-frame message of ``kind`` whose
        body has exactly its fields, each passing its check, or None: the same checks as
        :meth:`decode` without building the envelope and message objects. For the manager's
        commonest frame (a node agent's heartbeat, thousands a second); None sends the frame
        down the :meth:`decode` path, which names what is wrong. ``kind`` has no untyped
        field and is not a relay batch (KeyError otherwise: those need :meth:`decode`)."""
        head = _HEADS[kind]
        end = len(frame) - TAG_BYTES
        start = len(head)
        if not frame.startswith(head) or not 0 <= end - start <= self.max_bytes:
            return None
        view = memoryview(frame)
        if not _compare(view[end:], _hmac(self._key, view[:end], "sha256")):
            return None
        fast = self._typed.get(kind)
        if fast is not None:
            try:
                env = fast(view[start:end])
            except typed.Refused:
                pass  # the Python checks below decide (decode() says what is wrong)
            else:
                if env.job_id == self.job_id:
                    return env.epoch, env.sender, env.seq, env.nonce, typed.fields(env.body)
        try:
            data = msgpack.unpackb(view[start:end], raw=False, strict_map_key=False, **_LIMITS)
        except Exception:  # any garbage: decode() says what
            return None
        if type(data) is not dict or data.keys() != _HEADER_SET or data["job_id"] != self.job_id:
            return None
        epoch, sender, seq, nonce, body = (
            data["epoch"],
            data["sender"],
            data["seq"],
            data["nonce"],
            data["body"],
        )
        if not (
            _EPOCH_OK(epoch)
            and _SEQ_OK(seq)
            and _NONCE_OK(nonce)
            and type(sender) is str
            and len(sender) <= MAX_SENDER
            and type(body) is dict
            and body.keys() == _TYPES[kind].keys()
        ):
            return None
        for name, check in _CHECKS[kind].items():
            if not check(body[name]):
                return None
        return epoch, sender, seq, nonce, body

    def _envelope(self, kind: bytes, data: Any) -> Envelope:
        if type(data) is not dict or data.keys() != _HEADER_SET:
            raise ProtocolError(f"envelope must be a map with keys {HEADER_KEYS}")
        if data["job_id"] != self.job_id:
            raise ProtocolError(
                f"foreign job_id {B.show(data['job_id'])} (this job: {self.job_id!r})"
            )
        epoch, sender, seq, nonce = data["epoch"], data["sender"], data["seq"], data["nonce"]
        if (
            not (_EPOCH_OK(epoch) and _SEQ_OK(seq) and _NONCE_OK(nonce) and type(sender) is str)
            or len(sender) > MAX_SENDER
        ):
            for key, (typ, check) in _HEADER_CHECKS.items():
                if not check(data[key]):
                    raise ProtocolError(f"envelope field {key!r} must be {typ.__name__} in range")
            raise ProtocolError(f"envelope field 'sender' is longer than {MAX_SENDER}")
        if kind in B.EPOCH_RANGES:
            check_epoch(kind, epoch)
        return Envelope(self.job_id, epoch, sender, seq, _message(kind, data["body"]), nonce)


def check_epoch(kind: bytes, epoch: int) -> None:
    """ProtocolError unless ``epoch`` is within what a ``kind`` may carry
    (:data:`~ms_recover.protocol.bounds.EPOCH_RANGES`: a restarted manager acts on it)."""
    lo, hi = B.epoch_range(kind)
    if not lo <= epoch <= hi:
        raise ProtocolError(f"{kind.decode()} envelope field 'epoch' must be in {lo}..{hi}")


def field_checks(kind: bytes) -> dict[str, typing.Callable[[Any], bool]]:
    """The compiled check of each field of a known ``kind``: what :func:`message_of` applies
    to a body that has exactly these fields."""
    return _CHECKS[kind]


def message_of(kind: bytes, body: Any) -> Message:
    """The message of a decoded ``body`` of a known ``kind``, every field checked against its
    type and bounds; raises ProtocolError naming the first bad field (relayed items)."""
    if kind not in _TYPES:
        raise ProtocolError(f"unknown kind {kind[:32]!r}")
    if kind in _DEEP and not B.depth_ok(body, B.MAX_DEPTH - 1):  # as deep as in its own frame
        raise ProtocolError(f"{kind.decode()} body nests deeper than {B.MAX_DEPTH - 1} levels")
    return _message(kind, body)


def _message(kind: bytes, body: Any) -> Message:
    types, checks = _TYPES[kind], _CHECKS[kind]
    if type(body) is not dict or body.keys() != types.keys():
        raise ProtocolError(f"{kind.decode()} body must have exactly the fields {sorted(types)}")
    for name, check in checks.items():
        if not check(body[name]):
            hint = types[name]
            shown = getattr(hint, "__name__", None) if not typing.get_args(hint) else None
            lo, hi = B.int_range(name, kind)
            bound = f" in {lo}..{hi}" if "int" in str(hint) else ""
            if hint is float and name in B.FLOAT_RANGES:
                bound = " in {:g}..{:g}".format(*B.FLOAT_RANGES[name])
            raise ProtocolError(f"{kind.decode()}.{name} must be {shown or hint}{bound}")
    return KINDS[kind](**body)


class DropLog:
    """Logs dropped frames at most once per ``interval_s`` per reason, with a count."""

    def __init__(self, logger: logging.Logger, interval_s: float = 1.0) -> None:
        self._log = logger
        self._interval = interval_s
        self._last: dict[str, float] = {}
        self._count: dict[str, int] = {}
        self.total = 0

    def drop(self, reason: str, peer: str = "?", exc: BaseException | None = None) -> None:
        """Count a dropped frame; the rate limit is per reason, ignoring numbers and quotes.
        With ``exc`` (an unexpected error while handling it) the report carries its traceback."""
        self.total += 1
        key = re.sub(r"[0-9]+|'[^']*'|\"[^\"]*\"", "#", reason)[:60]
        self._count[key] = self._count.get(key, 0) + 1
        now = time.monotonic()
        if now - self._last.get(key, -1e9) >= self._interval:
            self._last[key] = now
            n = self._count.pop(key)
            self._log.warning(
                "dropped frame from %s: %s (%d dropped since last report)",
                peer,
                reason,
                n,
                exc_info=exc,
            )
