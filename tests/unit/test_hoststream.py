"""The host backend's point-to-point byte stream: chunking, coalescing and scattering."""

from __future__ import annotations

import numpy as np
import pytest

from ms_recover.comm.host import stream as hoststream
from ms_recover.errors import CommError


def _round_trip(arrays: dict[str, np.ndarray], chunk: int) -> dict[str, np.ndarray]:
    manifest, views = hoststream.flatten(arrays)
    out, scatter = hoststream.allocate(manifest)
    for offset, payload, _ in hoststream.chunks(views, chunk):
        assert offset == scatter.received and 0 < payload.size <= chunk
        scatter.write(memoryview(payload))
    assert scatter.received == scatter.total
    return out


@pytest.mark.parametrize("chunk", [1, 7, 64, 1 << 20])
def test_round_trip_any_chunk_size(chunk: int) -> None:
    arrays = {
        "a": np.arange(100, dtype=np.float32),
        "e": np.zeros(0),
        "s": np.array(3),
        "b": np.ones((3, 2), dtype=bool),
        "t": np.arange(10)[::2],
    }
    out = _round_trip(arrays, chunk)
    assert list(out) == list(arrays)
    for name, value in arrays.items():
        assert out[name].dtype == value.dtype and np.array_equal(out[name], value)


def test_large_arrays_are_borrowed_and_small_ones_coalesced() -> None:
    _, views = hoststream.flatten(
        {"big": np.zeros(256, np.uint8), **{f"s{i}": np.zeros(10, np.uint8) for i in range(10)}}
    )
    parts = list(hoststream.chunks(views, 64))
    assert [borrowed for _, _, borrowed in parts] == [True] * 4 + [False] * 2
    assert [p.size for _, p, _ in parts] == [64] * 5 + [36]


def test_rejects_objects_and_overruns() -> None:
    with pytest.raises(CommError, match="dtype object"):
        hoststream.flatten({"o": np.array([object()])})
    _, scatter = hoststream.allocate(hoststream.flatten({"a": np.zeros(2, np.uint8)})[0])
    with pytest.raises(CommError, match="does not fit"):
        scatter.write(memoryview(b"abc"))
