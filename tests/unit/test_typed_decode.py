"""Compiled envelope decoding (ms_recover.protocol.typed): the hot kinds skip the Python field
checks, and for every compiled kind the outcome is the Python path's, frame for frame."""

from __future__ import annotations

import math
import typing
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ms_recover.errors import ProtocolError
from ms_recover.protocol import bounds as B
from ms_recover.protocol import codec as codec_mod
from ms_recover.protocol import messages as M
from ms_recover.protocol import typed
from ms_recover.protocol.codec import Codec
from tests.unit.test_codec import JOB, SAMPLES, SECRET, _envelope, _frames, _values

COMPILED = sorted(typed.compiled_kinds())
WITH_FIELDS = [kind for kind in COMPILED if SAMPLES[kind].to_wire()]
FAST = Codec(JOB, SECRET, nonce=7)
SLOW = Codec(JOB, SECRET, nonce=7, compiled=False)


def _outcome(codec: Codec, frames: list[bytes]) -> tuple[str, Any]:
    try:
        env = codec.decode(frames)
    except ProtocolError as exc:
        return "refused", str(exc)
    return "accepted", (env.job_id, env.epoch, env.sender, env.seq, env.nonce, env.msg)


def _same(kind: bytes, envelope: Any) -> None:
    """The compiled and the Python path agree on this envelope: the same message (values
    equal), or the same error text."""
    frames = _frames(FAST, kind, envelope)
    fast, slow = _outcome(FAST, frames), _outcome(SLOW, frames)
    assert fast == slow, (kind, envelope)
    if fast[0] == "accepted":  # and of the same types (an int for a float field aside)
        for name, value in fast[1][5].to_wire().items():
            other = slow[1][5].to_wire()[name]
            assert type(value) is type(other) or {type(value), type(other)} == {int, float}


def test_the_hot_kinds_are_compiled_and_the_untyped_ones_are_not() -> None:
    assert {M.AgentHeartbeat.KIND, M.RelayAcks.KIND, M.Stopped.KIND, M.WorkerHello.KIND} <= set(
        COMPILED
    )
    assert not {M.RelayUp.KIND, M.RelayDown.KIND, M.StatusReply.KIND} & set(COMPILED)


def test_the_hot_kinds_skip_the_python_field_checks(monkeypatch: pytest.MonkeyPatch) -> None:
    """A node agent's heartbeat and a stop-all's RelayAcks are parsed and bounded in one
    compiled pass: neither msgpack.unpackb nor a per-field check runs for them."""

    def boom(*_: Any, **__: Any) -> Any:
        raise AssertionError("the Python path ran")

    monkeypatch.setattr(codec_mod, "_message", boom)
    monkeypatch.setattr(codec_mod.msgpack, "unpackb", boom)
    for kind in (M.AgentHeartbeat.KIND, M.RelayAcks.KIND):
        frames = FAST.encode(SAMPLES[kind], 3, "agent:1", 9)
        assert FAST.decode(frames).msg == SAMPLES[kind]
    beat = FAST.encode(SAMPLES[M.AgentHeartbeat.KIND], 3, "agent:1", 9)[0]
    assert FAST.quick(beat, M.AgentHeartbeat.KIND) == (
        3,
        "agent:1",
        9,
        7,
        SAMPLES[M.AgentHeartbeat.KIND].to_wire(),
    )


@pytest.mark.parametrize("kind", COMPILED)
def test_samples_decode_alike(kind: bytes) -> None:
    body = SAMPLES[kind].to_wire()
    _same(kind, _envelope(body))
    _same(kind, _envelope({**body, "extra": 1}))
    _same(kind, _envelope({k: v for k, v in list(body.items())[1:]}))
    _same(kind, {**_envelope(body), "more": 1})
    _same(kind, _envelope(body, job_id="job-2"))
    for key in ("epoch", "seq", "nonce"):
        for value in (-1, 0, B.STEP_MAX - 1, B.STEP_MAX, B.STEP_MAX + 1, 2**63 - 1, True, 1.0):
            _same(kind, _envelope(body, **{key: value}))
    for sender in ("x" * 64, "x" * 65, b"agent:1", 5):
        _same(kind, _envelope(body, sender=sender))


def _edges(hint: Any, name: str, kind: bytes) -> list[Any]:
    """Values at and just past the bounds of a field of ``hint``, and of the wrong types."""
    wrong: list[Any] = [None, True, 1.5, "text", b"bin", [], {}]
    if hint is int:
        lo, hi = B.int_range(name, kind)
        packable = [v for v in (lo, hi, lo - 1, hi + 1) if -(2**63) <= v < 2**64]
        return [*packable, *wrong]
    if hint is float:
        lo, hi = B.FLOAT_RANGES.get(name, (-(2.0**63), 2.0**63))
        return [0, 3, lo, hi, math.nextafter(hi, 0), math.inf, math.nan, -math.inf, *wrong]
    if hint is str:
        most = B.STR_LIMITS.get(name, B.MAX_STR)
        return ["", "x" * most, "x" * (most + 1), "é" * most, *wrong]
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is list:
        return [[x] for x in _edges(args[0], name, kind)] + wrong
    if origin is dict:
        keys = _edges(args[0], name, kind)
        vals = _edges(args[1], name, kind)
        return [{k: vals[0]} for k in keys if _hashable(k)] + [{keys[0]: v} for v in vals] + wrong
    return wrong


def _hashable(value: Any) -> bool:
    return not isinstance(value, (list, dict))


@pytest.mark.parametrize("kind", COMPILED)
def test_every_field_at_its_bounds_decodes_alike(kind: bytes) -> None:
    body = SAMPLES[kind].to_wire()
    for name, hint in M.field_types(M.KINDS[kind]).items():
        for value in _edges(hint, name, kind):
            _same(kind, _envelope({**body, name: value}))


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(WITH_FIELDS), st.data())
def test_random_field_values_decode_alike(kind: bytes, data: st.DataObject) -> None:
    body = SAMPLES[kind].to_wire()
    name = data.draw(st.sampled_from(sorted(body)))
    _same(kind, _envelope({**body, name: data.draw(_values)}))


@settings(max_examples=100, deadline=None)
@given(st.sampled_from(COMPILED), _values, _values)
def test_random_bodies_decode_alike(kind: bytes, body: Any, epoch: Any) -> None:
    _same(kind, _envelope(body))
    _same(kind, _envelope(body, epoch=epoch))
    _same(kind, body)
