"""Compiled decoding of a frame's envelope: msgpack parsed and every field bounded in one C pass.

:class:`~ms_recover.protocol.codec.Codec` checks each decoded value in Python against its
field's type and bounds (:mod:`~ms_recover.protocol.bounds`). For every kind whose fields are
all typed (no ``Any``), this module builds a ``msgspec`` decoder of the whole envelope
(``{job_id, epoch, sender, seq, nonce, body}``) whose struct types carry the very same bounds:
int ranges per field name (:func:`~ms_recover.protocol.bounds.int_range`), string lengths,
finite floats within the field's range, the list and map sizes of
:data:`~ms_recover.protocol.bounds.UNPACK_LIMITS`, exactly the message's fields, no bool where
an int belongs. The decoder parses and checks in one pass, several times faster than
``msgpack.unpackb`` followed by the Python checks.

Guarantee: a payload this decoder accepts is one the Python path accepts too, with equal
values (only an int given for a float field comes back as that float). Whatever it refuses
goes down the Python path, which names what is wrong (or accepts a value msgspec is stricter
about), so errors and drop reasons do not change. Without ``msgspec`` installed,
:func:`decoder` returns None and the Python path does all the work.
"""

from __future__ import annotations

import typing
from collections.abc import Callable
from typing import Annotated, Any

from ms_recover.protocol import bounds as B
from ms_recover.protocol.messages import KINDS, Message, field_types

try:
    import msgspec
except ImportError:  # pragma: no cover - a base dependency; the Python path covers it
    msgspec = None  # type: ignore[assignment]

#: Envelope fields and their Python checks' bounds (codec.HEADER_KEYS, codec.MAX_SENDER).
MAX_SENDER = 64

#: A decoded, checked envelope (job id still to compare): ``job_id``, ``epoch``, ``sender``,
#: ``seq``, ``nonce`` and ``body``, a struct of the message's fields in their order.
Decoded = Any
Decode = Callable[[Any], Decoded]


class Refused(Exception):
    """The compiled decoder refused a payload: the Python path decides what it is."""


def _int(name: str, kind: bytes) -> Any:
    lo, hi = B.int_range(name, kind)
    return Annotated[int, msgspec.Meta(ge=lo, le=hi)]


def _float(name: str) -> Any:
    if name in B.FLOAT_RANGES:
        lo, hi = B.FLOAT_RANGES[name]
        return Annotated[float, msgspec.Meta(ge=lo, le=hi)]
    return Annotated[float, msgspec.Meta(gt=-(2.0**63), lt=2.0**63)]  # finite, and so on


def _type(hint: Any, name: str, kind: bytes) -> Any:
    """The msgspec type of a field hint with its bounds, or None if it has an untyped part."""
    if hint is int:
        return _int(name, kind)
    if hint is float:
        return _float(name)
    if hint is str:
        return Annotated[str, msgspec.Meta(max_length=B.STR_LIMITS.get(name, B.MAX_STR))]
    if hint is bytes:
        return Annotated[bytes, msgspec.Meta(max_length=B.MAX_STR)]
    if hint is bool:
        return bool
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    parts = [_type(arg, name, kind) for arg in args]
    if any(part is None for part in parts):
        return None
    if origin is list and len(parts) == 1:
        return Annotated[list[parts[0]], msgspec.Meta(max_length=B.MAX_ITEMS)]  # type: ignore[valid-type]
    if origin is dict and len(parts) == 2:
        return Annotated[dict[parts[0], parts[1]], msgspec.Meta(max_length=B.MAX_ITEMS)]  # type: ignore[valid-type]
    return None  # Any, or a hint this module does not know: the Python path


def _envelope_type(kind: bytes, cls: type[Message]) -> Any:
    fields = []
    for name, hint in field_types(cls).items():
        typ = _type(hint, name, kind)
        if typ is None:
            return None
        fields.append((name, typ))
    tag = kind.decode()
    body = msgspec.defstruct(f"Body_{tag}", fields, forbid_unknown_fields=True)
    lo, hi = B.epoch_range(kind)
    return msgspec.defstruct(
        f"Envelope_{tag}",
        [
            ("job_id", Annotated[str, msgspec.Meta(max_length=B.MAX_STR)]),
            ("epoch", Annotated[int, msgspec.Meta(ge=lo, le=hi)]),
            ("sender", Annotated[str, msgspec.Meta(max_length=MAX_SENDER)]),
            ("seq", _int("seq", b"")),
            ("nonce", _int("nonce", b"")),
            ("body", body),
        ],
        forbid_unknown_fields=True,
    )


def _compile(kind: bytes, cls: type[Message]) -> Decode | None:
    typ = _envelope_type(kind, cls)
    if typ is None:
        return None
    decode = msgspec.msgpack.Decoder(typ).decode
    errors = (msgspec.ValidationError, msgspec.DecodeError)

    def run(payload: Any) -> Decoded:
        try:
            return decode(payload)
        except errors as exc:
            raise Refused(str(exc)) from None

    return run


def message(kind: bytes, body: Any) -> Message:
    """The message of kind ``kind`` of a decoded envelope's ``body``."""
    return KINDS[kind](*msgspec.structs.astuple(body))


def fields(body: Any) -> dict[str, Any]:
    """A decoded envelope's ``body`` as the map of its fields (as ``Message.to_wire``)."""
    return dict(msgspec.structs.asdict(body))


_DECODERS: dict[bytes, Decode] = {}
if msgspec is not None:
    for _kind, _cls in KINDS.items():
        _run = _compile(_kind, _cls)
        if _run is not None:
            _DECODERS[_kind] = _run


def decoder(kind: bytes) -> Decode | None:
    """The compiled decoder of envelopes of ``kind``: ``payload -> envelope`` (see
    :data:`Decoded`), raising :class:`Refused` for anything it does not accept; None for a
    kind with untyped fields (or without ``msgspec``)."""
    return _DECODERS.get(kind)


def compiled_kinds() -> frozenset[bytes]:
    """The kinds with a compiled decoder."""
    return frozenset(_DECODERS)
