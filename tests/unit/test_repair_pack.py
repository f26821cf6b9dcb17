"""Repair packing: manifest, per-tensor checksums, and every way a received state is rejected."""

from __future__ import annotations

import json
import zlib

import numpy as np
import pytest

from ms_recover.errors import RepairError
from ms_recover.worker.repair import MANIFEST, checksum, digest, pack, unpack
from tests.kit.floats import bit_diff, special_bits, special_values


def _state() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(7)
    return {
        "w": rng.standard_normal((4, 3)).astype(np.float32),
        "b": np.arange(3, dtype=np.float64),
        "adam.m/w": rng.standard_normal((4, 3)).astype(np.float16),
        "step": np.array(41, dtype=np.int64),  # a 0-d array
        "mask": np.array([True, False, True]),
        "empty": np.zeros((0, 5), dtype=np.int32),
        "strided": np.arange(20, dtype=np.int16)[::3],  # not contiguous
        "be": np.arange(4, dtype=">i4"),  # big-endian
    }


def _with_manifest(received: dict[str, np.ndarray], manifest: object) -> dict[str, np.ndarray]:
    raw = np.frombuffer(json.dumps(manifest).encode(), dtype=np.uint8)
    return {**received, MANIFEST: raw}


def test_round_trip_keeps_every_tensor_bit_for_bit() -> None:
    state = _state()
    packed = pack(state, step=41)
    assert set(packed) == set(state) | {MANIFEST}
    arrays, step = unpack(packed, src=0)
    assert step == 41 and set(arrays) == set(state)
    for name, value in state.items():
        assert arrays[name].dtype == value.dtype and arrays[name].shape == value.shape
        assert arrays[name].tobytes() == value.tobytes()


def test_round_trip_through_copies_as_a_transport_would() -> None:
    packed = pack(_state(), step=3)
    wire = {
        n: np.frombuffer(a.tobytes(), dtype=a.dtype).reshape(a.shape) for n, a in packed.items()
    }
    arrays, step = unpack(wire, src=1)
    assert step == 3 and digest(arrays) == digest(_state())


def test_pack_does_not_modify_the_state() -> None:
    state = _state()
    before = digest(state)
    pack(state, 1)
    assert MANIFEST not in state and digest(state) == before


def test_empty_state_round_trips() -> None:
    assert unpack(pack({}, 0), 5) == ({}, 0)


def test_a_flipped_byte_is_a_checksum_mismatch_naming_the_tensor() -> None:
    packed = pack(_state(), step=41)
    bad = np.array(packed["w"], copy=True)
    bad.view(np.uint8)[0, 5] ^= 0x10
    packed["w"] = bad
    with pytest.raises(RepairError, match=r"checksum mismatch on tensor 'w' from rank 2"):
        unpack(packed, src=2)


def test_a_missing_tensor() -> None:
    packed = pack(_state(), 1)
    del packed["b"]
    with pytest.raises(RepairError, match=r"state from rank 3: missing \['b'\], unexpected \[\]"):
        unpack(packed, 3)


def test_an_extra_tensor() -> None:
    packed = pack(_state(), 1)
    packed["zz"] = np.zeros(1)
    with pytest.raises(RepairError, match=r"missing \[\], unexpected \['zz'\]"):
        unpack(packed, 3)


def test_a_shape_mismatch() -> None:
    packed = pack(_state(), 1)
    packed["w"] = packed["w"].reshape(3, 4)  # same bytes, same checksum, wrong shape
    with pytest.raises(
        RepairError,
        match=r"tensor 'w' from rank 0: got \(3, 4\)/float32, "
        r"manifest says \(4, 3\)/<f4",
    ):
        unpack(packed, 0)


def test_a_dtype_mismatch() -> None:
    packed = pack(_state(), 1)
    packed["w"] = packed["w"].view(np.int32)  # same bytes and shape, wrong dtype
    with pytest.raises(RepairError, match=r"tensor 'w' from rank 0: got \(4, 3\)/int32"):
        unpack(packed, 0)


def test_a_byte_order_mismatch() -> None:
    packed = pack(_state(), 1)
    packed["be"] = packed["be"].astype("<i4")
    with pytest.raises(RepairError, match="tensor 'be'"):
        unpack(packed, 0)


def test_the_manifest_name_is_reserved() -> None:
    with pytest.raises(RepairError, match=r"state name '__manifest__' is reserved"):
        pack({MANIFEST: np.zeros(1)}, 0)


def test_no_manifest() -> None:
    with pytest.raises(RepairError, match="state from rank 4 has no manifest"):
        unpack({"w": np.zeros(1)}, 4)


@pytest.mark.parametrize(
    "raw",
    [
        b"not json",
        b"\xff\xfe",
        b"[1, 2]",
        b'{"step": 1}',
        b'{"tensors": {}}',
        b'{"step": "x", "tensors": {}}',
        b'{"step": 1, "tensors": ["w"]}',
    ],
)
def test_a_malformed_manifest(raw: bytes) -> None:
    received = {MANIFEST: np.frombuffer(raw, dtype=np.uint8)}
    with pytest.raises(RepairError, match="state from rank 6 has a malformed manifest"):
        unpack(received, 6)


@pytest.mark.parametrize(
    "entry",
    [[1, [1]], 5, [0, 1, "<f8"]],
    ids=["two-fields", "not-a-list", "shape-not-a-list"],
)
def test_a_malformed_manifest_entry_is_a_repair_error(entry: object) -> None:
    received = _with_manifest({"x": np.zeros(1)}, {"step": 1, "tensors": {"x": entry}})
    with pytest.raises(RepairError):
        unpack(received, 6)


def test_checksum_is_crc32_of_the_c_order_bytes() -> None:
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    assert checksum(a) == zlib.crc32(a.tobytes())
    assert checksum(a.T) == zlib.crc32(a.T.tobytes()) == checksum(np.ascontiguousarray(a.T))
    assert checksum(a.T) != checksum(a)
    assert checksum(np.array(5)) == checksum(np.array([5]))


def test_digest_equality() -> None:
    state = _state()
    copy = {n: a.copy() for n, a in reversed(list(state.items()))}  # insertion order differs
    assert digest(state) == digest(copy)
    assert len(digest(state)) == 8 and int(digest(state), 16) >= 0
    assert digest({}) == "00000000"


def test_digest_inequality() -> None:
    state = _state()
    changed = dict(state)
    changed["b"] = state["b"] + 1e-12
    renamed = {("bias" if n == "b" else n): a for n, a in state.items()}
    missing = {n: a for n, a in state.items() if n != "mask"}
    for other in (changed, renamed, missing):
        assert digest(other) != digest(state)


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ({"w": np.zeros((2, 3), np.float32)}, {"w": np.zeros((3, 2), np.float32)}),
        ({"w": np.zeros(2, np.float32)}, {"w": np.zeros(2, np.int32)}),
        ({"a": np.frombuffer(b"bc", np.uint8)}, {"ab": np.frombuffer(b"c", np.uint8)}),
    ],
    ids=["shape", "dtype", "name-boundary"],
)
def test_digest_distinguishes_structure(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> None:
    assert digest(a) != digest(b)


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
def test_pack_and_unpack_keep_every_float_bit_pattern(dtype: str) -> None:
    # Subnormals, signed zeros, infinities and NaN payloads (quiet, signalling, negative) must
    # come back with the same bits: ``==`` would pass a flushed subnormal's neighbour (never
    # -0.0 vs 0.0 or two NaNs), so compare the unsigned-integer views.
    values = special_values(dtype)
    state = {"v": values, "grid": np.tile(values, (3, 1)).T.copy(), "scalar": values[2:3][0]}
    state["scalar"] = np.asarray(state["scalar"])  # a 0-d subnormal, like Adam's beta1_power
    arrays, _ = unpack(pack(state, step=7), src=0)
    assert bit_diff(arrays, state) == []
    assert np.array_equal(arrays["v"].view(special_bits(dtype).dtype), special_bits(dtype))


def test_digest_sees_every_bit_flush_and_sign_and_payload() -> None:
    values = special_values(np.float32)
    flushed = values.copy()
    flushed[2] = 0.0  # a subnormal flushed to zero
    negated = values.copy()
    negated[0] = -0.0
    payload = values.copy()
    payload.view(np.uint32)[12] += 2  # another quiet NaN
    base = digest({"v": values})
    assert len({base, digest({"v": flushed}), digest({"v": negated}), digest({"v": payload})}) == 4
    assert digest({"v": values.copy()}) == base


def test_special_values_reject_a_non_float_dtype() -> None:
    with pytest.raises(ValueError, match="int32 is not one of: float16, float32, float64"):
        special_bits(np.int32)
