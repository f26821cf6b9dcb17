"""Frame codec: round trips of every message kind, and rejection of every kind of bad frame."""

from __future__ import annotations

import dataclasses
import hmac
import logging
from typing import Any, ClassVar

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ms_recover.errors import ProtocolError
from ms_recover.protocol import codec as codec_mod
from ms_recover.protocol import messages as M
from ms_recover.protocol.codec import MAGIC, Codec, DropLog, Envelope

JOB = "job-1"
SECRET = b"k8s-secret"

SAMPLES: dict[bytes, M.Message] = {
    m.KIND: m
    for m in (
        M.AgentHello(node_rank=1, pod_ip="10.0.0.2", ranks=[2, 3], pid=4242, is_scheduler=False),
        M.AgentHeartbeat(node_rank=1, steps={2: 41}),
        M.RelayUp(
            node_rank=1,
            idents=[b"r2.0.77"],
            senders=["rank:2"],
            nonces=[2**62],
            seqs=[5],
            epochs=[1],
            kinds=["stopped"],
            bodies=[
                {
                    "rank": 2,
                    "committed_step": 12,
                    "digest": "deadbeef",
                    "health": [],
                    "urgent": False,
                }
            ],
        ),
        M.RelayAcks(
            node_rank=1,
            kind="stopped",
            epoch=3,
            idents=[b"r2.0.77", b"r3.0.78"],
            senders=["rank:2", "rank:3"],
            nonces=[2**62, 5],
            seqs=[5, 9],
            ranks=[2, 3],
            steps=[12, 12],
            digests=["deadbeef", ""],
        ),
        M.RelayDown(
            kinds=["stop", "resume"],
            epochs=[3, 3],
            targets=[[b"r2.0.77", b"r3.0.78"], [b"r2.0.77"]],
            bodies=[{"reason": "rank 1 died"}, {"step": 13}],
        ),
        M.RankExited(
            node_rank=1, rank=3, pid=4321, exit_code=-9, signal=9, observed_at=1700000000.25
        ),
        M.RankFrozen(node_rank=1, rank=3, pid=4321, stopped_s=1.05, host="node-1"),
        M.GroupOpen(node_rank=16, endpoint="tcp://10.0.0.16:40123"),
        M.GroupBeats(
            node_rank=16,
            nodes=[17, 19],
            idents=[b"a17.901", b"a19.902"],
            steps=[{136: 40, 137: 40}, {}],
            health=[{136: [0.01, 0.02, 0.0]}, {}],
        ),
        M.GroupAck(node_rank=16, manager_age_s=0.12),
        M.GroupStopped(
            node_rank=16,
            epoch=3,
            nodes=[17, 19],
            idents=[b"a17.901", b"a19.902"],
            counts=[2, 1],
            locals=[b"r136.0", b"r137.0", b"r152.1"],
            ranks=[136, 137, 152],
            steps=[40, 40, 39],
            digests=["", "", "deadbeef"],
        ),
        M.GroupAt(leader=16, endpoint="tcp://10.0.0.16:40123"),
        M.GroupStop(
            node_rank=16,
            reason="rank 3 died",
            nodes=[17, 19],
            idents=[b"a17.901", b"a19.902"],
            targets=[[b"r136.0", b"r137.0"], [b"r152.1"]],
        ),
        M.NodeLeaving(node_rank=1, reason="SIGTERM: pod deletion or node drain", deadline_s=25.0),
        M.AgentWelcome(ok=False, reason="node_rank 9 is outside 0..1"),
        M.SpareHello(pod_ip="10.0.0.9", pid=4400, warm=2),
        M.SpareAssign(node_rank=1, reason="node 1's pod is gone"),
        M.BecomeSpare(reason="node 1 was taken by a spare node"),
        M.ManagerBeat(state="running"),
        M.Rejoin(reason="manager restarted: rank 3 must register again"),
        M.KillRanks(ranks=[3], reason="rank 3 died"),
        M.StartRanks(ranks=[2, 3], reason="restart in place"),
        M.AgentExit(code=86, reason="reschedule pod"),
        M.WorkerHello(
            rank=3,
            node_rank=1,
            pid=77,
            incarnation=2,
            data_endpoint="tcp://10.0.0.2:40001",
            committed_step=-1,
            shard=0,
        ),
        M.WorkerHeartbeat(rank=3, committed_step=12),
        M.GroupCreated(rank=0, name="dp0", ranks=[0, 2]),
        M.Stopped(rank=0, committed_step=12, digest="deadbeef"),
        M.StateDigest(rank=1, step=99, digest="0badc0de"),
        M.Rebuilt(rank=0),
        M.Repaired(
            rank=3,
            attempt=1,
            ok=False,
            committed_step=-1,
            failed_peer=1,
            reason="checksum mismatch on tensor 'w'",
        ),
        M.WorkerFault(rank=2, kind="comm", message="peer 1 reset"),
        M.WorkerDone(rank=2, committed_step=100),
        M.Dump(step=12, directory="/shared/dump"),
        M.Dumped(
            rank=0,
            ok=True,
            step=12,
            file="rank_0.ckpt",
            format="mindspore",
            sha256="ab" * 32,
            size=1024,
            reason="",
        ),
        M.Welcome(
            ok=True,
            reason="",
            reboot=True,
            world_size=4,
            group_log=[["dp0", [0, 2]], ["dp1", [1, 3]]],
        ),
        M.Stop(reason="rank 3 died"),
        M.Rebuild(
            world=[[0, 3]],
            endpoints={0: "tcp://a:1", 1: "tcp://b:2", 2: "tcp://c:3", 3: "tcp://d:4"},
            full=True,
            group_log=[["dp0", [0, 2]]],
        ),
        M.Repair(target_step=12, attempt=0, send_to=[3], recv_from=-1, endpoints={3: "tcp://d:4"}),
        M.Peers(name="dp0", endpoints={2: "tcp://c:3"}),
        M.Resume(step=13),
        M.Exit(code=87, reason="no feasible strategy"),
        M.StatusRequest(),
        M.StatusReply(
            status={
                "state": "running",
                "epoch": 3,
                "ranks": [{"rank": 0, "step": 5}],
                "last_recovery": None,
                "ratio": 0.5,
            }
        ),
    )
}


@pytest.fixture
def codec() -> Codec:
    return Codec(JOB, SECRET)


def _sign(codec: Codec, kind: bytes, payload: bytes) -> list[bytes]:
    """A correctly authenticated frame around an arbitrary payload (to reach later checks)."""
    return codec.sign(kind, payload)


def _frames(codec: Codec, kind: bytes, envelope: Any) -> list[bytes]:
    return _sign(codec, kind, msgpack.packb(envelope, use_bin_type=True))


def _envelope(body: Any, **changes: Any) -> dict[str, Any]:
    env = {"job_id": JOB, "epoch": 1, "sender": "rank:0", "seq": 7, "nonce": 3, "body": body}
    env.update(changes)
    return env


def test_samples_cover_every_kind() -> None:
    assert set(SAMPLES) == set(M.KINDS)


@pytest.mark.parametrize("kind", sorted(M.KINDS))
def test_encode_packed_is_encode(codec: Codec, kind: bytes) -> None:
    """A body packed ahead (the manager's relay splices one per node) decodes as encode's."""
    msg = SAMPLES[kind]
    packed = msgpack.packb(msg.to_wire(), use_bin_type=True)
    frames = codec.encode_packed(kind, packed, epoch=5, sender="manager", seq=9)
    env = codec.decode(frames)
    assert (env.msg, env.epoch, env.sender, env.seq, env.nonce) == (
        msg,
        5,
        "manager",
        9,
        codec.nonce,
    )


@pytest.mark.parametrize("kind", sorted(M.KINDS))
def test_round_trip(codec: Codec, kind: bytes) -> None:
    msg = SAMPLES[kind]
    frames = codec.encode(msg, epoch=5, sender="agent:1", seq=42)
    assert len(frames) == 1 and frames[0][:4] == MAGIC == b"msr2"
    assert frames[0][4] == len(kind) and frames[0][5 : 5 + len(kind)] == kind
    env = codec.decode(frames)
    assert env == Envelope(JOB, 5, "agent:1", 42, msg, codec.nonce)
    assert type(env.msg) is type(msg)


def test_int_keys_survive_the_wire(codec: Codec) -> None:
    env = codec.decode(codec.encode(SAMPLES[M.Rebuild.KIND], 1, "manager", 1))
    assert isinstance(env.msg, M.Rebuild)
    assert sorted(env.msg.endpoints) == [0, 1, 2, 3]
    hb = codec.decode(codec.encode(SAMPLES[M.AgentHeartbeat.KIND], 1, "agent:1", 1)).msg
    assert isinstance(hb, M.AgentHeartbeat) and hb.steps == {2: 41}


def test_an_int_is_accepted_for_a_float_field(codec: Codec) -> None:
    msg = M.RankExited(node_rank=0, rank=0, pid=99, exit_code=1, signal=0, observed_at=5)
    assert codec.decode(codec.encode(msg, 0, "agent:0", 0)).msg == msg


def test_decode_accepts_bytearray_frames(codec: Codec) -> None:
    frames = [bytearray(f) for f in codec.encode(M.Resume(3), 2, "manager", 1)]
    assert codec.decode(frames).msg == M.Resume(3)  # type: ignore[arg-type]


# ----------------------------------------------------------------------------- rejections
@pytest.mark.parametrize("count", [0, 2, 3, 5])
def test_wrong_frame_count(codec: Codec, count: int) -> None:
    frames = codec.encode(M.Resume(3), 1, "manager", 1)
    frames = (frames + [b"extra"] * 4)[:count]
    with pytest.raises(ProtocolError, match=f"expected 1 frame, got {count}"):
        codec.decode(frames)


def test_an_msr1_message_is_dropped_by_name(codec: Codec) -> None:
    """The layout before msr2: four frames, the MAC over magic, kind and envelope."""
    payload = msgpack.packb(_envelope({"step": 3}), use_bin_type=True)
    mac = hmac.digest(SECRET, b"msr1\0resume\0" + payload, "sha256")
    with pytest.raises(ProtocolError, match="an msr1 message \\(4 frames: the layout before"):
        codec.decode([b"msr1", M.Resume.KIND, payload, mac])


@pytest.mark.parametrize("magic", [b"msr0", b"MSR2", b"msr1", b""])
def test_bad_magic(codec: Codec, magic: bytes) -> None:
    frame = codec.encode(M.Resume(3), 1, "manager", 1)[0]
    with pytest.raises(ProtocolError, match="bad magic/version"):
        codec.decode([magic + frame[4:] if magic else b""])


@pytest.mark.parametrize("frame", [MAGIC, MAGIC + b"\x06resume" + bytes(31), MAGIC + b"\xff"])
def test_truncated_frame(codec: Codec, frame: bytes) -> None:
    with pytest.raises(ProtocolError, match="truncated frame"):
        codec.decode([frame])


def test_bad_mac_from_another_secret(codec: Codec) -> None:
    frames = Codec(JOB, b"other-secret").encode(M.Resume(3), 1, "manager", 1)
    with pytest.raises(ProtocolError, match="bad MAC"):
        codec.decode(frames)


@pytest.mark.parametrize("part", ["kind", "body", "tag"])
def test_tampered_frame(codec: Codec, part: str) -> None:
    frame = codec.encode(M.Exit(code=0, reason="all good"), 1, "manager", 1)[0]
    if part == "kind":  # relabel the kind (same length), keep the MAC
        assert frame[5:9] == b"exit"
        buf = bytearray(frame[:5] + b"stop" + frame[9:])
    else:
        buf = bytearray(frame)
        buf[len(buf) // 2 if part == "body" else -1] ^= 0x01
    with pytest.raises(ProtocolError, match="bad MAC"):
        codec.decode([bytes(buf)])


def test_foreign_job_with_the_same_secret(codec: Codec) -> None:
    frames = Codec("other-job", SECRET).encode(M.Resume(3), 1, "manager", 1)
    with pytest.raises(ProtocolError, match=r"foreign job_id 'other-job' \(this job: 'job-1'\)"):
        codec.decode(frames)


@dataclasses.dataclass(frozen=True)
class _Bogus(M.Message):
    KIND: ClassVar[bytes] = b"bogus"
    x: int


def test_unknown_kind_even_when_authenticated(codec: Codec) -> None:
    frames = codec.encode(_Bogus(1), 1, "rank:0", 1)
    with pytest.raises(ProtocolError, match="unknown kind b'bogus'"):
        codec.decode(frames)


def test_oversize_body() -> None:
    small = Codec(JOB, SECRET, max_bytes=256)
    ok = small.encode(M.Stop(reason="x" * 10), 1, "manager", 1)
    assert small.decode(ok).msg == M.Stop("x" * 10)
    big = small.encode(M.Stop(reason="x" * 1000), 1, "manager", 1)
    with pytest.raises(ProtocolError, match=r"body of \d+ bytes exceeds the 256 limit"):
        small.decode(big)


@pytest.mark.parametrize("payload", [b"\xc1", b"\x92\x01", b"\xdb\xff\xff\xff\xff", b""])
def test_malformed_msgpack(codec: Codec, payload: bytes) -> None:
    with pytest.raises(ProtocolError, match="malformed msgpack body"):
        codec.decode(_sign(codec, M.Resume.KIND, payload))


def test_trailing_garbage_after_the_body_is_malformed(codec: Codec) -> None:
    payload = msgpack.packb(_envelope({"step": 1}), use_bin_type=True) + b"\x00"
    with pytest.raises(ProtocolError, match="malformed msgpack body"):
        codec.decode(_sign(codec, M.Resume.KIND, payload))


@pytest.mark.parametrize("missing", ["job_id", "epoch", "sender", "seq", "nonce", "body"])
def test_envelope_missing_key(codec: Codec, missing: str) -> None:
    env = _envelope({"step": 1})
    del env[missing]
    with pytest.raises(ProtocolError, match="envelope must be a map with keys"):
        codec.decode(_frames(codec, M.Resume.KIND, env))


@pytest.mark.parametrize("envelope", [[1, 2, 3], "text", 5, None])
def test_envelope_that_is_not_a_map(codec: Codec, envelope: Any) -> None:
    with pytest.raises(ProtocolError, match="envelope must be a map"):
        codec.decode(_frames(codec, M.Resume.KIND, envelope))


def test_envelope_extra_key(codec: Codec) -> None:
    with pytest.raises(ProtocolError, match="envelope must be a map with keys"):
        codec.decode(_frames(codec, M.Resume.KIND, _envelope({"step": 1}, extra=1)))


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("epoch", "1"),
        ("epoch", True),
        ("epoch", 1.0),
        ("seq", None),
        ("sender", 3),
        ("nonce", "n"),
        ("nonce", -1),
        ("seq", 2**64 - 1),
        ("epoch", -(2**63)),
    ],
)
def test_envelope_field_types(codec: Codec, key: str, value: Any) -> None:
    env = _envelope({"step": 1}, **{key: value})
    with pytest.raises(ProtocolError, match=f"envelope field '{key}' must be"):
        codec.decode(_frames(codec, M.Resume.KIND, env))


@pytest.mark.parametrize(
    "body",
    [{}, {"step": 1, "extra": 2}, {"stp": 1}, [1], "step", None],
)
def test_wrong_field_set(codec: Codec, body: Any) -> None:
    with pytest.raises(ProtocolError, match=r"resume body must have exactly the fields \['step'\]"):
        codec.decode(_frames(codec, M.Resume.KIND, _envelope(body)))


@pytest.mark.parametrize(
    ("kind", "body", "field"),
    [
        (M.Resume.KIND, {"step": True}, "step"),  # bool is not an int
        (M.Resume.KIND, {"step": "3"}, "step"),
        (M.Resume.KIND, {"step": 3.0}, "step"),
        (M.Exit.KIND, {"code": 0, "reason": b"bytes"}, "reason"),
        (M.AgentWelcome.KIND, {"ok": 1, "reason": ""}, "ok"),  # int is not a bool
        (M.KillRanks.KIND, {"ranks": {"0": 1}, "reason": ""}, "ranks"),
        (M.AgentHeartbeat.KIND, {"node_rank": 0, "steps": [1, 2], "health": {}}, "steps"),
        (
            M.RankExited.KIND,
            {
                "node_rank": 0,
                "rank": 0,
                "pid": 1,
                "exit_code": 1,
                "signal": 0,
                "observed_at": "now",
                "requested": False,
                "host": "h",
                "log_tail": "",
            },
            "observed_at",
        ),
    ],
)
def test_wrong_field_types(codec: Codec, kind: bytes, body: dict[str, Any], field: str) -> None:
    with pytest.raises(ProtocolError, match=f"{kind.decode()}.{field} must be"):
        codec.decode(_frames(codec, kind, _envelope(body)))


@pytest.mark.parametrize(
    ("kind", "body"),
    [
        (M.GroupCreated.KIND, {"rank": 0, "name": "dp0", "ranks": ["a"]}),
        (M.AgentHeartbeat.KIND, {"node_rank": 0, "steps": {"x": "y"}, "health": {}}),
        (M.Rebuild.KIND, {"world": [[0, 1]], "endpoints": {"0": 5}, "full": True, "group_log": []}),
        (M.Rebuild.KIND, {"world": [["a", 1]], "endpoints": {}, "full": True, "group_log": []}),
    ],
)
def test_wrong_element_types(codec: Codec, kind: bytes, body: dict[str, Any]) -> None:
    with pytest.raises(ProtocolError):
        codec.decode(_frames(codec, kind, _envelope(body)))


# ----------------------------------------------------------------------------- fuzz
@settings(max_examples=150, deadline=None)
@given(st.lists(st.binary(max_size=64), max_size=6))
def test_random_frames_only_ever_raise_protocol_error(frames: list[bytes]) -> None:
    codec = Codec(JOB, SECRET, max_bytes=4096)
    try:
        codec.decode(frames)
    except ProtocolError:
        pass
    else:  # pragma: no cover - a random frame that authenticates is a broken MAC
        pytest.fail(f"random frames decoded: {frames!r}")


@settings(max_examples=150, deadline=None)
@given(st.sampled_from(sorted(M.KINDS) + [b"bogus"]), st.binary(max_size=256))
def test_random_authenticated_payloads_only_raise_protocol_error(
    kind: bytes, payload: bytes
) -> None:
    codec = Codec(JOB, SECRET, max_bytes=4096)
    try:
        env = codec.decode(_sign(codec, kind, payload))
    except ProtocolError:
        return
    assert isinstance(env.msg, M.KINDS[kind])  # a random payload happened to be valid


_leaf = (
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | st.floats()
    | st.text(max_size=8)
    | st.binary(max_size=8)
)
_values = st.recursive(
    _leaf,
    lambda children: (
        st.lists(children, max_size=4)
        | st.dictionaries(st.text(max_size=6) | st.integers(-5, 5), children, max_size=4)
    ),
    max_leaves=12,
)


@settings(max_examples=150, deadline=None)
@given(st.sampled_from(sorted(M.KINDS)), _values, _values)
def test_random_authenticated_bodies_only_raise_protocol_error(
    kind: bytes, body: Any, epoch: Any
) -> None:
    codec = Codec(JOB, SECRET)
    for envelope in (_envelope(body), _envelope(body, epoch=epoch), body):
        try:
            env = codec.decode(_frames(codec, kind, envelope))
        except ProtocolError:
            continue
        assert isinstance(env.msg, M.KINDS[kind])


# ----------------------------------------------------------------------------- Codec.quick
QUICK = sorted(codec_mod._HEADS)


def _quick_agrees(codec: Codec, frame: bytes, kind: bytes) -> bool:
    """``quick`` takes exactly the frames of ``kind`` that ``decode`` accepts, with the same
    values; whether ``decode`` accepted it."""
    got = codec.quick(frame, kind)
    try:
        env = codec.decode([frame])
    except ProtocolError:
        assert got is None
        return False
    if env.msg.KIND != kind:
        assert got is None
        return True
    assert got == (env.epoch, env.sender, env.seq, env.nonce, env.msg.to_wire())
    return True


def test_quick_kinds_are_the_flat_ones() -> None:
    assert M.AgentHeartbeat.KIND in QUICK and M.WorkerHeartbeat.KIND in QUICK
    assert not {M.RelayUp.KIND, M.RelayDown.KIND, M.StatusReply.KIND} & set(QUICK)
    with pytest.raises(KeyError):
        Codec(JOB, SECRET).quick(b"", M.RelayUp.KIND)


@pytest.mark.parametrize("kind", QUICK)
def test_quick_takes_what_decode_takes(codec: Codec, kind: bytes) -> None:
    frame = codec.encode(SAMPLES[kind], 3, "agent:1", 9)[0]
    assert _quick_agrees(codec, frame, kind)
    assert codec.quick(frame, kind) is not None
    other = next(k for k in QUICK if k != kind)
    assert codec.quick(frame, other) is None  # another kind's frame


@pytest.mark.parametrize("kind", QUICK)
def test_quick_refuses_what_decode_refuses(codec: Codec, kind: bytes) -> None:
    frame = codec.encode(SAMPLES[kind], 3, "agent:1", 9)[0]
    body = SAMPLES[kind].to_wire()
    bad = [
        Codec(JOB, b"another secret").encode(SAMPLES[kind], 3, "agent:1", 9)[0],
        Codec("job-2", SECRET).encode(SAMPLES[kind], 3, "agent:1", 9)[0],
        frame[:-1] + bytes([frame[-1] ^ 1]),  # the tag
        frame[:12] + bytes([frame[12] ^ 1]) + frame[13:],  # the envelope
        frame[:-33],  # truncated
        _frames(codec, kind, _envelope({**body, "extra": 1}))[0],
        _frames(codec, kind, _envelope(body, epoch=-1))[0],
        _frames(codec, kind, _envelope(body, sender="x" * 65))[0],
        _frames(codec, kind, {**_envelope(body), "more": 1})[0],
        _sign(codec, kind, msgpack.packb(_envelope(body)) + b"\x00")[0],
    ]
    for field, value in body.items():
        wrong = "text" if not isinstance(value, str) else 7
        bad.append(_frames(codec, kind, _envelope({**body, field: wrong}))[0])
    for frame in bad:
        assert not _quick_agrees(codec, frame, kind)


@settings(max_examples=150, deadline=None)
@given(st.sampled_from(QUICK), _values, _values)
def test_quick_agrees_with_decode_on_random_bodies(kind: bytes, body: Any, epoch: Any) -> None:
    codec = Codec(JOB, SECRET)
    for envelope in (_envelope(body), _envelope(body, epoch=epoch), body):
        _quick_agrees(codec, _frames(codec, kind, envelope)[0], kind)


@settings(max_examples=100, deadline=None)
@given(st.sampled_from(QUICK), st.binary(max_size=256))
def test_quick_agrees_with_decode_on_random_payloads(kind: bytes, payload: bytes) -> None:
    codec = Codec(JOB, SECRET, max_bytes=4096)
    _quick_agrees(codec, _sign(codec, kind, payload)[0], kind)


# ----------------------------------------------------------------------------- drop log
class _Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> _Clock:
    fake = _Clock()
    monkeypatch.setattr(codec_mod.time, "monotonic", fake)
    return fake


def _drop_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if "dropped frame" in r.getMessage()]


def test_drop_log_rate_limits_per_reason(caplog: pytest.LogCaptureFixture, clock: _Clock) -> None:
    drops = DropLog(logging.getLogger("test.drops"), interval_s=1.0)
    with caplog.at_level(logging.WARNING, logger="test.drops"):
        drops.drop("bad MAC (wrong secret or tampered frame)", "peer-a")
        for _ in range(3):
            clock.t += 0.2
            drops.drop("bad MAC (wrong secret or tampered frame)", "peer-a")
        assert drops.total == 4
        assert _drop_lines(caplog) == [
            "dropped frame from peer-a: bad MAC (wrong secret or tampered frame) "
            "(1 dropped since last report)"
        ]
        drops.drop("foreign job_id 'x' (this job: 'y')", "peer-b")  # another reason: logged
        assert len(_drop_lines(caplog)) == 2
        clock.t += 0.5  # 1.1 s after the first report
        drops.drop("bad MAC (wrong secret or tampered frame)", "peer-a")
    lines = _drop_lines(caplog)
    assert len(lines) == 3 and drops.total == 6
    assert lines[2].endswith("(4 dropped since last report)")


def test_drop_log_never_logs_more_than_once_per_interval(
    caplog: pytest.LogCaptureFixture, clock: _Clock
) -> None:
    drops = DropLog(logging.getLogger("test.drops"), interval_s=0.5)
    logged_at: list[float] = []
    with caplog.at_level(logging.WARNING, logger="test.drops"):
        for _ in range(100):  # 100 drops over 2.5 s of fake time
            clock.t += 0.025
            before = len(_drop_lines(caplog))
            drops.drop("stale stopped of epoch 1 (now 2)", "rank:0")
            if len(_drop_lines(caplog)) > before:
                logged_at.append(clock.t)
    assert drops.total == 100
    assert len(logged_at) >= 4
    gaps = [b - a for a, b in zip(logged_at[:-1], logged_at[1:], strict=True)]
    assert all(gap >= 0.5 - 1e-9 for gap in gaps), gaps
    counted = [int(line.rsplit("(", 1)[1].split()[0]) for line in _drop_lines(caplog)]
    assert counted[0] == 1 and sum(counted) <= 100 and all(n >= 1 for n in counted)


def test_drop_log_distinct_reasons_sharing_a_first_word(
    caplog: pytest.LogCaptureFixture, clock: _Clock
) -> None:
    drops = DropLog(logging.getLogger("test.drops"), interval_s=1.0)
    with caplog.at_level(logging.WARNING, logger="test.drops"):
        drops.drop("bad MAC (wrong secret or tampered frame)", "peer-a")
        drops.drop("bad magic/version b'msr0', expected b'msr1'", "peer-b")
    assert len(_drop_lines(caplog)) == 2


@pytest.mark.parametrize(
    ("ranks", "wire"),
    [([], []), ([0, 1, 2, 3], [[0, 3]]), ([3, 0, 1, 5], [[0, 1], [3, 3], [5, 5]])],
)
def test_rank_runs_round_trip(ranks: list[int], wire: list[list[int]]) -> None:
    assert M.runs(ranks) == wire
    assert M.ranks_of(wire, 8) == sorted(ranks)


@pytest.mark.parametrize(
    ("wire", "problem"),
    [
        ([[0]], "need \\[first, last\\]"),
        ([[2, 1]], "first <= last"),
        ([[0, 8]], "last < 8"),
        ([[-1, 0]], "0 <= first"),
        ([[0, 3], [2, 5]], "overlap or are out of order"),
    ],
)
def test_malformed_rank_runs_are_refused(wire: list[list[int]], problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        M.ranks_of(wire, 8)


def test_the_relay_carries_every_worker_message_kind_both_ways() -> None:
    """A kind added to the protocol must travel through an agent too: every message documented
    as worker -> manager goes up, every manager -> worker one comes down (Peers once did not,
    and a relayed rank creating a group waited for an answer that was dropped)."""
    import inspect

    from ms_recover.protocol import messages as M
    from ms_recover.protocol.relay import DOWN_KINDS, UP_KINDS

    classes = [
        c
        for c in vars(M).values()
        if inspect.isclass(c) and issubclass(c, M.Message) and c is not M.Message
    ]
    up = {c.KIND for c in classes if (c.__doc__ or "").lstrip().startswith("worker -> manager")}
    heads = {c.KIND: (c.__doc__ or "").lstrip().split(":")[0] for c in classes}
    down = {k for k, h in heads.items() if h.startswith("manager ->") and "worker" in h}
    assert up and down
    assert up == UP_KINDS
    assert down == DOWN_KINDS
