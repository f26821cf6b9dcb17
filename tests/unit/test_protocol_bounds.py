"""Decode-time bounds (issue 9 #6) and the replay guard (#7), on the pure protocol layer."""

from __future__ import annotations

from typing import Any

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ms_recover.errors import ProtocolError
from ms_recover.protocol import bounds as B
from ms_recover.protocol import messages as M
from ms_recover.protocol.codec import Codec
from ms_recover.protocol.messages import field_types
from ms_recover.protocol.replay import ReplayGuard

JOB = "job-b"


def _signed(codec: Codec, kind: bytes, body: Any, **env: Any) -> list[bytes]:
    envelope = {"job_id": JOB, "epoch": 0, "sender": "rank:0", "seq": 1, "nonce": 5, "body": body}
    envelope.update(env)
    payload = msgpack.packb(envelope, use_bin_type=True)
    return codec.sign(kind, payload)


def _nested(depth: int) -> Any:
    value: Any = 1
    for _ in range(depth):
        value = [value]
    return value


@pytest.fixture
def codec() -> Codec:
    return Codec(JOB, b"s")


@pytest.mark.parametrize("depth", [9, 200, 1000])
def test_deep_nesting_is_a_protocol_error_not_a_recursion_error(codec: Codec, depth: int) -> None:
    # 1000 levels pass msgpack's own stack limit and made the error path's repr() recurse.
    welcome = {"ok": True, "reason": "", "reboot": False, "world_size": 2}
    for frames, why in (
        (_signed(codec, M.Welcome.KIND, {**welcome, "group_log": [_nested(depth)]}), "nests"),
        # A kind without untyped fields is not walked: a list where a str belongs is refused.
        (_signed(codec, M.Resume.KIND, {"step": 1}, job_id=_nested(depth)), "job_id a list"),
        (
            _signed(codec, M.AgentHeartbeat.KIND, {"node_rank": 0, "steps": {0: _nested(depth)}}),
            "steps",
        ),
        (_signed(codec, M.Resume.KIND, {"step": 1}, seq=_nested(depth)), "'seq' must be int"),
        (_signed(codec, M.StatusReply.KIND, {"status": {"x": _nested(depth)}}), "nests"),
    ):
        with pytest.raises(ProtocolError, match=why):
            codec.decode(frames)


def test_the_deepest_real_message_is_within_the_bound(codec: Codec) -> None:
    status = {"ranks": [{"rank": 0, "phases": {"a": [1.5]}}]}
    env = codec.decode(codec.encode(M.StatusReply(status), 0, "manager", 0))
    assert env.msg == M.StatusReply(status)


_FROZEN = {"node_rank": 0, "rank": 1, "pid": 9, "stopped_s": 1.0, "host": ""}


@pytest.mark.parametrize(
    ("kind", "body", "field"),
    [
        (
            M.WorkerHeartbeat.KIND,
            {"rank": 0, "committed_step": 2**63 - 1, "health": [], "urgent": False},
            "committed_step",
        ),
        (
            M.WorkerHeartbeat.KIND,
            {"rank": 0, "committed_step": 2**64 - 1, "health": [], "urgent": False},
            "committed_step",
        ),
        (
            M.WorkerHeartbeat.KIND,
            {"rank": 0, "committed_step": -2, "health": [], "urgent": False},
            "committed_step",
        ),
        (
            M.WorkerHeartbeat.KIND,
            {"rank": 2**40, "committed_step": 1, "health": [], "urgent": False},
            "rank",
        ),
        (M.Resume.KIND, {"step": B.STEP_MAX + 1}, "step"),
        (M.KillRanks.KIND, {"ranks": [0, 2**33], "reason": ""}, "ranks"),
        (
            M.AgentHeartbeat.KIND,
            {"node_rank": 0, "steps": {0: B.STEP_MAX + 1}, "health": {}},
            "steps",
        ),
        (M.Exit.KIND, {"code": 2**40, "reason": ""}, "code"),
        (M.Exit.KIND, {"code": 1, "reason": "x" * (B.MAX_STR + 1)}, "reason"),
        (M.StateDigest.KIND, {"rank": 0, "step": B.STEP_MAX + 1, "digest": "ab"}, "step"),
        (M.StateDigest.KIND, {"rank": -2, "step": 9, "digest": "ab"}, "rank"),
        (M.StateDigest.KIND, {"rank": 0, "step": 9, "digest": "a" * 65}, "digest"),
        (M.NodeLeaving.KIND, {"node_rank": 0, "reason": "", "deadline_s": -1.0}, "deadline_s"),
        (M.NodeLeaving.KIND, {"node_rank": 0, "reason": "", "deadline_s": 1e6}, "deadline_s"),
        (M.NodeLeaving.KIND, {"node_rank": -2, "reason": "", "deadline_s": 1.0}, "node_rank"),
        (M.RankFrozen.KIND, {**_FROZEN, "stopped_s": -1.0}, "stopped_s"),
        (M.RankFrozen.KIND, {**_FROZEN, "stopped_s": 1e9}, "stopped_s"),
        (M.Stopped.KIND, {"rank": 0, "committed_step": 9, "digest": "a" * 65}, "digest"),
    ],
)
def test_out_of_range_fields_are_refused(
    codec: Codec, kind: bytes, body: dict[str, Any], field: str
) -> None:
    with pytest.raises(ProtocolError, match=f"{kind.decode()}.{field} must be"):
        codec.decode(_signed(codec, kind, body))


@pytest.mark.parametrize("value", [float("nan"), float("inf"), -float("inf"), 1e300])
def test_non_finite_or_huge_floats_are_refused(codec: Codec, value: float) -> None:
    body = {
        "node_rank": 0,
        "rank": 0,
        "pid": 1,
        "exit_code": 1,
        "signal": 0,
        "observed_at": value,
        "requested": False,
        "host": "h",
        "log_tail": "",
    }
    with pytest.raises(ProtocolError, match="rank_exited.observed_at must be float"):
        codec.decode(_signed(codec, M.RankExited.KIND, body))


@pytest.mark.parametrize(
    "bad",
    [
        {"s": float("nan")},
        {"s": 2**64 - 1},
        ["x" * (B.MAX_STR + 1)],
    ],
)
def test_untyped_values_are_bounded_too(codec: Codec, bad: Any) -> None:
    with pytest.raises(ProtocolError, match="status_req|status.status must be"):
        codec.decode(_signed(codec, M.StatusReply.KIND, {"status": {"v": bad}}))


def test_msgpack_caps_lengths_before_allocating(codec: Codec) -> None:
    payload = b"\xdd" + (B.MAX_ITEMS + 1).to_bytes(4, "big")  # an array header, no items
    with pytest.raises(ProtocolError, match="malformed msgpack body"):
        codec.decode(codec.sign(M.Resume.KIND, payload))


def test_a_long_sender_is_refused(codec: Codec) -> None:
    with pytest.raises(ProtocolError, match="sender"):
        codec.decode(_signed(codec, M.Resume.KIND, {"step": 1}, sender="r" * 65))


def test_an_unencodable_value_is_a_protocol_error(codec: Codec) -> None:
    with pytest.raises(ProtocolError, match="cannot encode resume"):
        codec.encode(M.Resume(2**64), 0, "manager", 0)


def test_each_codec_signs_its_own_nonce() -> None:
    a, b = Codec(JOB, b"s"), Codec(JOB, b"s")
    assert a.nonce != b.nonce
    env = b.decode(a.encode(M.Resume(1), 0, "manager", 3))
    assert (env.nonce, env.seq) == (a.nonce, 3)
    assert Codec(JOB, b"s", nonce=7).nonce == 7


def test_depth_ok_is_iterative() -> None:
    assert B.depth_ok(_nested(8)) and not B.depth_ok(_nested(9))
    assert not B.depth_ok(_nested(100_000))  # no RecursionError however deep
    assert B.depth_ok({"a": [1, {"b": 2}]}, 3) and not B.depth_ok({"a": [1, {"b": [2]}]}, 3)


# ----------------------------------------------------------------------------- replay guard
def test_replayed_and_reordered_frames_are_dropped() -> None:
    guard = ReplayGuard()
    assert guard.check("agent:0", 11, 0) == ""
    assert guard.check("agent:0", 11, 1) == ""
    assert "replayed" in guard.check("agent:0", 11, 0)  # the hello, again
    assert "replayed" in guard.check("agent:0", 11, 1)
    assert guard.check("agent:0", 11, 5) == ""  # a gap is fine (a send dropped on a full queue)
    assert "replayed" in guard.check("agent:0", 11, 4)
    assert guard.replays == 3


def test_a_new_incarnation_starts_again_at_zero() -> None:
    guard = ReplayGuard()
    for seq in range(3):
        assert guard.check("rank:1", 1, seq) == ""
    assert guard.check("rank:1", 2, 0) == ""  # restarted process: new nonce
    assert guard.check("rank:2", 1, 0) == ""  # another sender with the same nonce value
    assert "replayed" in guard.check("rank:1", 1, 2)  # the old incarnation is still known


def test_a_restarted_receiver_accepts_members_next_frames() -> None:
    before, after = ReplayGuard(), ReplayGuard()  # a manager, then its restarted successor
    for seq in range(10):
        before.check("agent:0", 9, seq)
    assert after.check("agent:0", 9, 10) == ""  # the member's next frame re-registers it
    assert "replayed" in after.check("agent:0", 9, 3)


def test_memory_is_bounded() -> None:
    guard = ReplayGuard(max_senders=3, max_nonces_per_sender=2)
    for sender in range(10):
        for nonce in range(10):
            guard.check(f"s{sender}", nonce, 0)
    assert len(guard._seen) == 3 and all(len(n) == 2 for n in guard._seen.values())
    assert guard.known("s9", 9) and not guard.known("s9", 7) and not guard.known("s0", 9)


@pytest.mark.parametrize("where", ["whole", "tag"])
def test_a_deeply_nested_data_plane_header_is_a_protocol_error(where: str) -> None:
    from ms_recover.comm.host.wire import Header

    deep = _nested(1000)  # repr() of it raised RecursionError on the training thread
    fields = deep if where == "whole" else [1, 1, 0, "g", deep, "p2p", 0, ""]
    with pytest.raises(ProtocolError, match="flat list"):
        Header.decode(msgpack.packb(fields))


_ANY = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**64), 2**64)
    | st.floats()
    | st.text(max_size=70)
    | st.binary(max_size=4),
    lambda kids: (
        st.lists(kids, max_size=3)
        | st.dictionaries(st.integers(-2, 3) | st.text(max_size=2), kids, max_size=3)
    ),
    max_leaves=8,
)


@settings(max_examples=300, deadline=None)
@given(value=_ANY, data=st.data())
def test_compiled_checks_agree_with_check_field(value: Any, data: Any) -> None:
    """The codec's per-kind compiled checks answer exactly as check_field, field by field."""
    kind = data.draw(st.sampled_from(sorted(M.KINDS)))
    for name, hint in field_types(M.KINDS[kind]).items():
        compiled = B.compile_check(hint, name, kind)(value)
        assert compiled == B.check_field(value, hint, name, kind), (kind, name)
