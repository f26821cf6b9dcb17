"""Building the in-graph reduction op: a per-user cache keyed by the source, clear errors.

The library is plain C++ loaded with ctypes; MindSpore is only needed because the package
``ms_recover.mindspore`` imports it.
"""

from __future__ import annotations

import ctypes
import shutil
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("mindspore")

from ms_recover.errors import CommError, MsRecoverError  # noqa: E402
from ms_recover.mindspore import graphop  # noqa: E402

pytestmark = pytest.mark.timeout(120)


def test_a_missing_compiler_is_a_one_line_error_naming_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setenv("CXX", "no-such-compiler-xyz")
    with pytest.raises(MsRecoverError, match="CXX='no-such-compiler-xyz' was not found"):
        graphop.build_library()
    assert not list(tmp_path.rglob("*.so"))


@pytest.mark.skipif(shutil.which("g++") is None, reason="no g++ on this host")
def test_builds_once_into_the_cache_and_exports_the_op(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.delenv("CXX", raising=False)
    path = graphop.build_library()
    assert path.parent == tmp_path / "ms_recover" and path.name.startswith("graphreduce-")
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # no temp file left behind
    mtime = path.stat().st_mtime_ns
    assert graphop.build_library() == path and path.stat().st_mtime_ns == mtime  # cached
    lib = ctypes.CDLL(str(path))
    assert lib.msr_slots() == 256
    for name in ("MsrReduce", "MsrNoop", "msr_register"):
        assert hasattr(lib, name)


def test_bucket_plan_large_gradients_alone_small_ones_staged_in_order() -> None:
    plan = graphop.plan_buckets([10, 300, 20, 30, 40, 500, 5], inplace_bytes=1200, stage_bytes=240)
    got = [(b.members, b.inplace, b.size) for b in plan]
    assert got == [
        ((0, 2, 3), False, 60),  # staged buckets hold up to 240 bytes (60 values), in order
        ((1,), True, 300),  # 300 values = 1200 bytes: in place, alone
        ((4, 6), False, 45),  # ordered by their first member
        ((5,), True, 500),
    ]
    assert [b.members for b in graphop.plan_buckets([3, 4])] == [(0, 1)]  # the demo: one bucket


@pytest.mark.skipif(shutil.which("g++") is None, reason="no g++ on this host")
def test_gradients_sharing_memory_are_reduced_once_and_written_only_after_every_bucket() -> None:
    def add_one(flat: np.ndarray) -> np.ndarray:
        flat += np.float32(1)  # in place: a gradient reduced twice would gain 2
        return flat

    slot = graphop.ReduceSlot([300, 300, 4], add_one, inplace_bytes=1200)
    try:
        assert [b.inplace for b in slot.buckets] == [True, True, False]
        mem = np.zeros(300, np.float32)
        small = np.zeros(4, np.float32)
        slot.reduce_views([mem, mem, small])  # the backward pass handed out one tensor twice
        assert mem.tolist() == [1.0] * 300 and small.tolist() == [1.0] * 4
        assert _run_op(slot, [mem, mem, small]) == 0  # the op sees the overlap: Python stages
        assert mem.tolist() == [2.0] * 300 and small.tolist() == [2.0] * 4
        mem[:], small[:] = 1, 1
        other = np.zeros(300, np.float32)

        def fail_last(flat: np.ndarray) -> np.ndarray:
            if flat.size == 4:
                raise CommError("peer gone")
            return flat + np.float32(1)  # a new array: copied back only once all succeeded

        slot.reduce_fn = fail_last
        with pytest.raises(CommError):
            slot.reduce_views([mem, other, small])
        assert mem.tolist() == [1.0] * 300 and other.tolist() == [0.0] * 300
    finally:
        slot.close()


def _run_op(slot: graphop.ReduceSlot, grads: list[np.ndarray]) -> int:
    """Call the compiled op as MindSpore does: (slot, g_1 .. g_k) -> token."""
    lib = graphop.load_library()
    index = np.array(slot.index, np.int64)
    token = np.zeros(1, np.float32)
    arrays = [index, *grads, token]
    n = len(arrays)
    params = (ctypes.c_void_p * n)(*(a.ctypes.data for a in arrays))
    ndims = (ctypes.c_int * n)(*(1 for _ in arrays))
    dims = [(ctypes.c_int64 * 1)(a.size) for a in arrays]
    shapes = (ctypes.POINTER(ctypes.c_int64) * n)(
        *(ctypes.cast(d, ctypes.POINTER(ctypes.c_int64)) for d in dims)
    )
    names = [b"int64", *(b"float32" for _ in grads), b"float32"]
    dtypes = (ctypes.c_char_p * n)(*names)
    fn = lib.MsrReduce
    fn.restype = ctypes.c_int
    return int(fn(n, params, ndims, shapes, dtypes, None, None))


@pytest.mark.skipif(shutil.which("g++") is None, reason="no g++ on this host")
def test_the_op_stages_small_gradients_and_writes_them_back_only_if_every_bucket_succeeded() -> (
    None
):
    seen: list[np.ndarray] = []
    values: list[list[float]] = []

    def double(flat: np.ndarray) -> np.ndarray:
        seen.append(flat)
        values.append(flat.tolist())
        return flat * np.float32(2)  # a new array: written back once all buckets succeeded

    slot = graphop.ReduceSlot([2, 300, 3], double, inplace_bytes=1200)
    try:
        assert [b.members for b in slot.buckets] == [(0, 2), (1,)]
        small, big, tail = (np.arange(n, dtype=np.float32) + 1 for n in (2, 300, 3))
        assert _run_op(slot, [small, big, tail]) == 0
        assert values[0] == [1.0, 2.0, 1.0, 2.0, 3.0]  # gathered by the op, in order
        assert small.tolist() == [2.0, 4.0] and tail.tolist() == [2.0, 4.0, 6.0]
        assert big.tolist() == (np.arange(300, dtype=np.float32) * 2 + 2).tolist()
        first = list(seen)

        def fail_last(flat: np.ndarray) -> np.ndarray:
            seen.append(flat)
            if flat.size == 300:
                raise CommError("peer gone")
            flat *= np.float32(10)  # in place, in the staging buffer
            return flat

        slot.reduce_fn = fail_last
        assert _run_op(slot, [small, big, tail]) == 5
        assert isinstance(slot.take_error(), CommError)
        assert small.tolist() == [2.0, 4.0] and tail.tolist() == [2.0, 4.0, 6.0]  # untouched
        assert seen[2] is first[0] and seen[3] is first[1]  # the same buffers: views reused
    finally:
        slot.close()
