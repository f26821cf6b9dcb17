"""Frame codec: ``[b"msr1", kind, msgpack(envelope), hmac_sha256]``.

:meth:`Codec.decode` either returns a fully validated :class:`Envelope` or raises
:class:`ProtocolError`; receivers log the error (rate limited, see :class:`DropLog`) and drop
the frame. Nothing here can crash a receiver on hostile input.
"""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
import logging
import re
import time
import typing
from typing import Any

import msgpack

from ms_recover.errors import ProtocolError
from ms_recover.protocol.messages import KINDS, Message, field_types

MAGIC = b"msr1"
HEADER_KEYS = ("job_id", "epoch", "sender", "seq", "body")
_TYPES = {kind: field_types(cls) for kind, cls in KINDS.items()}


@dataclasses.dataclass(frozen=True)
class Envelope:
    """A decoded frame: who sent which message, in which job and epoch."""

    job_id: str
    epoch: int
    sender: str
    seq: int
    msg: Message


class Codec:
    """Encodes and authenticates frames for one job."""

    def __init__(self, job_id: str, secret: bytes, max_bytes: int = 4 << 20) -> None:
        self.job_id = job_id
        self._key = secret
        self.max_bytes = max_bytes

    def encode(self, msg: Message, epoch: int, sender: str, seq: int) -> list[bytes]:
        body = {
            "job_id": self.job_id,
            "epoch": epoch,
            "sender": sender,
            "seq": seq,
            "body": msg.to_wire(),
        }
        payload = msgpack.packb(body, use_bin_type=True)
        return [MAGIC, msg.KIND, payload, self._mac(msg.KIND, payload)]

    def decode(self, frames: list[bytes]) -> Envelope:
        """Validate and decode; raises ProtocolError naming what is wrong."""
        if len(frames) != 4:
            raise ProtocolError(f"expected 4 frames, got {len(frames)}")
        magic, kind, payload, mac = (bytes(f) for f in frames)
        if magic != MAGIC:
            raise ProtocolError(f"bad magic/version {magic[:8]!r}, expected {MAGIC!r}")
        if len(payload) > self.max_bytes:
            raise ProtocolError(f"body of {len(payload)} bytes exceeds the {self.max_bytes} limit")
        if not hmac.compare_digest(mac, self._mac(kind, payload)):
            raise ProtocolError("bad MAC (wrong secret or tampered frame)")
        if kind not in KINDS:
            raise ProtocolError(f"unknown kind {kind[:32]!r}")
        try:
            data = msgpack.unpackb(payload, raw=False, strict_map_key=False)
        except Exception as exc:  # msgpack raises several unrelated types on garbage
            raise ProtocolError(f"malformed msgpack body: {exc}") from exc
        return self._envelope(kind, data)

    def _envelope(self, kind: bytes, data: Any) -> Envelope:
        if not isinstance(data, dict) or set(data) != set(HEADER_KEYS):
            raise ProtocolError(f"envelope must be a map with keys {HEADER_KEYS}")
        if data["job_id"] != self.job_id:
            raise ProtocolError(
                f"foreign job_id {str(data['job_id'])[:64]!r} (this job: {self.job_id!r})"
            )
        for key, typ in (("epoch", int), ("seq", int), ("sender", str)):
            if not _is(data[key], typ):
                raise ProtocolError(f"envelope field {key!r} must be {typ.__name__}")
        return Envelope(
            self.job_id, data["epoch"], data["sender"], data["seq"], _message(kind, data["body"])
        )

    def _mac(self, kind: bytes, payload: bytes) -> bytes:
        return hmac.new(self._key, MAGIC + b"\0" + kind + b"\0" + payload, hashlib.sha256).digest()


def _is(value: Any, hint: Any) -> bool:
    """Whether a decoded value matches a field's type hint, elements and keys included."""
    if hint is Any:
        return True
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is list:
        return isinstance(value, list) and all(_is(v, args[0]) for v in value)
    if origin is dict:
        return isinstance(value, dict) and all(
            _is(k, args[0]) and _is(v, args[1]) for k, v in value.items()
        )
    return isinstance(value, hint)


def _message(kind: bytes, body: Any) -> Message:
    types = _TYPES[kind]
    if not isinstance(body, dict) or set(body) != set(types):
        raise ProtocolError(f"{kind.decode()} body must have exactly the fields {sorted(types)}")
    for name, hint in types.items():
        if not _is(body[name], hint):
            shown = getattr(hint, "__name__", None) if not typing.get_args(hint) else None
            raise ProtocolError(f"{kind.decode()}.{name} must be {shown or hint}")
    return KINDS[kind](**body)


class DropLog:
    """Logs dropped frames at most once per ``interval_s`` per reason, with a count."""

    def __init__(self, logger: logging.Logger, interval_s: float = 1.0) -> None:
        self._log = logger
        self._interval = interval_s
        self._last: dict[str, float] = {}
        self._count: dict[str, int] = {}
        self.total = 0

    def drop(self, reason: str, peer: str = "?") -> None:
        """Count a dropped frame; the rate limit is per reason, ignoring numbers and quotes."""
        self.total += 1
        key = re.sub(r"[0-9]+|'[^']*'|\"[^\"]*\"", "#", reason)[:60]
        self._count[key] = self._count.get(key, 0) + 1
        now = time.monotonic()
        if now - self._last.get(key, -1e9) >= self._interval:
            self._last[key] = now
            n = self._count.pop(key)
            self._log.warning(
                "dropped frame from %s: %s (%d dropped since last report)", peer, reason, n
            )
