"""The in-graph reduction op: a compiled MindSpore ``aot`` custom op that calls Python once.

``graphreduce.cc`` (next to this module) is compiled with the host's C++ compiler at first use
into a per-user cache (``$XDG_CACHE_HOME/ms_recover``, else ``~/.cache/ms_recover``), keyed by
the source's hash, and renamed into place atomically, so concurrent ranks never load a half
written library. The op hands the addresses of the gradient buffers the backward pass wrote to
a :class:`ReduceSlot` through a ctypes callback; the slot reduces them in place, bucket by
bucket (:func:`plan_buckets`), and the optimizer reads the reduced values from the same
buffers. A gradient of at least ``inplace_bytes`` is reduced where it lies, with no copy at
all when the reduction works in place; the smaller ones are gathered into staging buckets by
the op itself (a ``memcpy`` before the callback), reduced, and scattered back by the op once
the callback has succeeded on every bucket.

Why not ``func_type="pyfunc"``: its per-call cost was about 0.16 ms on this host (a demo step
is about 0.5 ms); the ctypes callback costs a few tens of microseconds, mostly Python running
with caches the graph's kernels left cold (in GRAPH_MODE on CPU the callback runs on the
training thread itself: measured, 400 calls of 400).

A reduction that raises, on any bucket, is latched in its slot (ctypes would otherwise print
and swallow it); the op then fails, MindSpore aborts the graph before the optimizer ran, and
:meth:`ReduceSlot.take_error` hands the original exception back to the caller.
"""

from __future__ import annotations

import ctypes
import dataclasses
import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from ms_recover.errors import CommError, MsRecoverError

log = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("graphreduce.cc")
FUNC = "MsrReduce"
FLAG_FUNC = "MsrReduceFlag"  # a failed reduction sets the token instead of failing the op
NOOP_FUNC = "MsrNoop"  # the same op with an empty body: the floor bench overhead measures
# The callback's one argument is its flags: ctypes makes a Python object of every argument on
# every call (a pointer argument is a ctypes instance): the five-argument callback this replaced
# cost 0.5-0.6 us a call from a C loop on this host, this one 0.17-0.2 us (warm caches; several
# times that inside a graph). The buffers' addresses and sizes are needed only when they are new
# (msr_inputs reads them).
_CALLBACK = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_int64)
SAME = 1  # the callback's flags: the same buffers as on the slot's previous call
STAGED = 2  # the op gathered the small gradients into the slot's staging buffers
# A gradient this large is reduced where it lies, in its own bucket. Gathering one into a
# staging bucket and back is slow inside the graph (the buffers are cold there): on the
# 64-1024-1024-8 MLP, staging its 256 KB first layer cost about 2 % of a 8.5 ms step. Each
# bucket is one allreduce call on many ranks, so tiny gradients are still gathered.
INPLACE_BYTES = 256 << 10
STAGE_BYTES = 4 << 20  # the smaller ones are gathered into staging buckets of up to this
_lock = threading.Lock()
_lib: ctypes.CDLL | None = None
_slots: dict[int, ReduceSlot] = {}

FlatGrads = NDArray[np.float32]


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "ms_recover"


def library_path() -> Path:
    """Where the compiled op for this source lives (it may not exist yet)."""
    digest = hashlib.sha256(SOURCE.read_bytes()).hexdigest()[:16]
    return cache_dir() / f"graphreduce-{digest}.so"


def build_library() -> Path:
    """Compile ``graphreduce.cc`` once; return the shared library's path.

    Raises MsRecoverError naming the command if no C++ compiler is found or it fails.
    """
    target = library_path()
    if target.exists():
        return target
    named = os.environ.get("CXX")
    cxx = shutil.which(named) if named else shutil.which("g++") or shutil.which("c++")
    if cxx is None:
        raise MsRecoverError(
            "the in-graph reduction needs a C++ compiler (g++ or c++ on PATH, or CXX) to build "
            f"{SOURCE.name} once; " + (f"CXX={named!r} was not found" if named else "none found")
        )
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=target.parent)
    os.close(fd)
    cmd = [cxx, "-O2", "-std=c++17", "-shared", "-fPIC", "-o", tmp, str(SOURCE)]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        if done.returncode != 0:
            raise MsRecoverError(
                f"building the in-graph reduction failed: {' '.join(cmd)}: {done.stderr.strip()}"
            )
        os.replace(tmp, target)  # atomic: another rank may be building the same file
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    log.info("built the in-graph reduction op: %s", target)
    return target


def noop_func() -> str:
    """The ``func`` of the op with an empty body (built on first use, as the real one)."""
    return f"{build_library()}:{NOOP_FUNC}"


def load_library() -> ctypes.CDLL:
    """The op's library, loaded once per process (MindSpore dlopens the same file)."""
    global _lib
    with _lock:
        if _lib is None:
            lib = ctypes.CDLL(str(build_library()))
            i64, ptrs, sizes = (
                ctypes.c_int64,
                ctypes.POINTER(ctypes.c_void_p),
                ctypes.POINTER(ctypes.c_int64),
            )
            for name, args in (
                ("msr_register", [i64, _CALLBACK, i64, i64]),
                ("msr_plan", [i64, i64, sizes, ptrs]),
                ("msr_inputs", [i64, i64, ptrs, sizes]),
            ):
                getattr(lib, name).argtypes = args
                getattr(lib, name).restype = ctypes.c_int
            lib.msr_slots.restype = ctypes.c_int
            _lib = lib
        return _lib


@dataclasses.dataclass(frozen=True)
class Bucket:
    """Gradients reduced by one call of the reduction: ``members`` are indices into the
    gradient list; ``inplace``: one gradient, reduced in its own buffer; else the members are
    gathered, in order, into a staging buffer of ``size`` values."""

    members: tuple[int, ...]
    inplace: bool
    size: int


def plan_buckets(
    sizes: Sequence[int], inplace_bytes: int = INPLACE_BYTES, stage_bytes: int = STAGE_BYTES
) -> list[Bucket]:
    """The buckets of gradients of these element counts (float32), in a fixed order.

    Each gradient of at least ``inplace_bytes`` is a bucket of its own, reduced in place; the
    others, in their order, fill staging buckets of at most ``stage_bytes`` (a single gradient
    larger than that still gets one). Buckets are ordered by their first member. The plan
    depends only on the sizes, so every rank of a job reduces the same buckets in the same
    order.
    """
    inplace = [Bucket((i,), True, n) for i, n in enumerate(sizes) if n * 4 >= inplace_bytes]
    staged: list[Bucket] = []
    members: list[int] = []
    total = 0
    for i, n in enumerate(sizes):
        if n * 4 >= inplace_bytes:
            continue
        if members and (total + n) * 4 > stage_bytes:
            staged.append(Bucket(tuple(members), False, total))
            members, total = [], 0
        members.append(i)
        total += n
    if members:
        staged.append(Bucket(tuple(members), False, total))
    return sorted(inplace + staged, key=lambda b: b.members[0])


class ReduceSlot:
    """One registered reduction: the Python function the op calls on each bucket of gradients.

    ``reduce_fn(buf) -> buf`` is called once per bucket (:func:`plan_buckets`), in the plan's
    order, with a float32 vector: the gradient's own buffer (an in-place bucket) or a staging
    buffer. It returns an array of the same shape and dtype: ``buf`` itself, reduced in
    place, or a new array, which is then copied into the gradients. Results are written back
    only once every bucket has been reduced. It runs on the thread that runs the graph's
    kernels (the training thread itself in GRAPH_MODE on CPU), with the caller's
    floating-point environment. The
    staging buffers are the slot's own, the same every step; the op fills them before the call
    and scatters them back after it (:meth:`reduce_views` does both itself).

    If two gradients share memory (the backward pass may hand out one tensor twice), every
    bucket of that call is staged, so nothing is reduced twice; the calls of the reduction
    are the same either way.
    """

    def __init__(
        self,
        sizes: Sequence[int],
        reduce_fn: Callable[[FlatGrads], FlatGrads],
        inplace_bytes: int = INPLACE_BYTES,
    ) -> None:
        lib = load_library()
        self.reduce_fn = reduce_fn
        self.sizes = [int(n) for n in sizes]
        self.buckets = plan_buckets(self.sizes, inplace_bytes)
        self._stages = [
            np.zeros(b.size, np.float32) if not b.inplace else None for b in self.buckets
        ]
        self._error: BaseException | None = None
        self._views: tuple[tuple[int, ...], list[FlatGrads], bool] = ((), [], False)
        self._bufs: list[FlatGrads] | None = None  # each bucket's buffer, the op staging
        self._callback = _CALLBACK(self._call)  # kept alive as long as the slot
        with _lock:
            free = next((i for i in range(lib.msr_slots()) if i not in _slots), None)
            if free is None:
                raise MsRecoverError(f"at most {lib.msr_slots()} in-graph reductions per process")
            _slots[free] = self
        self.index = free
        lib.msr_register(free, self._callback, len(self.sizes), sum(self.sizes))
        self._plan(lib)

    def _plan(self, lib: ctypes.CDLL) -> None:
        """Tell the op where it stages each small gradient (a place in its bucket's buffer)."""
        k = len(self.sizes)
        where = (ctypes.c_void_p * k)()
        for bucket, stage in zip(self.buckets, self._stages, strict=True):
            if stage is None:
                continue  # reduced where it lies
            off = 0
            for i in bucket.members:
                where[i] = stage.ctypes.data + 4 * off
                off += self.sizes[i]
        sizes = (ctypes.c_int64 * k)(*self.sizes)
        if lib.msr_plan(self.index, k, sizes, where) != 0:
            raise MsRecoverError(
                f"the in-graph reduction refused the staging plan of slot {self.index}"
            )

    @property
    def func(self) -> str:
        """The ``func`` argument of ``ops.Custom(..., func_type="aot")``."""
        return f"{library_path()}:{FUNC}"

    @property
    def flag_func(self) -> str:
        """The same op, but a reduction that raises sets its token to 1 instead of failing."""
        return f"{library_path()}:{FLAG_FUNC}"

    def _call(self, flags: int) -> int:
        # Never let an exception escape into ctypes: it would be printed and turned into 0.
        # Every step but a graph's first: the same buffers, staged by the op, so the bucket
        # loop runs here, with no call of its own (a call costs a few us inside the graph:
        # caches cold after its kernels).
        try:
            bufs = self._bufs
            if flags != SAME | STAGED or bufs is None:
                bufs = self._prepare(flags)
                if bufs is None:
                    return 0  # reduced bucket by bucket by reduce_views
            fn = self.reduce_fn
            late = None
            for buf in bufs:
                out = fn(buf)
                if out is not buf:
                    _check(out, buf)
                    if late is None:
                        late = []
                    late.append((buf, out))
            if late is not None:  # a new array: written only once every bucket is reduced
                for buf, out in late:
                    np.copyto(buf, out)
            return 0
        except BaseException as exc:  # noqa: BLE001 - latched and re-raised by the caller
            self._error = exc
            return 1

    def _prepare(self, flags: int) -> list[FlatGrads] | None:
        """Each bucket's buffer for ``_call`` when the op's buffers are new; None when two
        gradients overlap (the op staged nothing): they were reduced here, every bucket
        staged."""
        if not flags & SAME:  # new buffers: every view of the old ones is stale
            self._views, self._bufs = ((), [], False), None
        if not flags & STAGED:  # two gradients overlap: stage every bucket here
            self.reduce_views(*self._grads())
            return None
        return self._bufs if self._bufs is not None else self._bind(self._grads()[0])

    def _bind(self, grads: Sequence[FlatGrads]) -> list[FlatGrads]:
        """Each bucket's buffer when the op stages: its gradient's own, or its staging one."""
        self._bufs = [
            grads[b.members[0]] if stage is None else stage
            for b, stage in zip(self.buckets, self._stages, strict=True)
        ]
        return self._bufs

    def _grads(self) -> tuple[list[FlatGrads], bool]:
        """Views of the op's input buffers, and whether any two overlap."""
        if self._views[0]:
            return self._views[1], self._views[2]  # a graph keeps its buffers between steps
        k = len(self.sizes)
        ptrs, sizes = (ctypes.c_void_p * k)(), (ctypes.c_int64 * k)()
        if load_library().msr_inputs(self.index, k, ptrs, sizes) != 0:
            raise CommError(f"the op was not given the {k} gradients of slot {self.index}")
        addrs = tuple(int(ptrs[i] or 0) for i in range(k))
        got = [int(sizes[i]) for i in range(k)]
        if got != self.sizes or 0 in addrs:
            raise CommError(f"the op was given gradients of sizes {got}, not {self.sizes}")
        views = [
            np.ctypeslib.as_array(ctypes.cast(a, ctypes.POINTER(ctypes.c_float)), (n,))
            for a, n in zip(addrs, got, strict=True)
        ]
        shared = _overlapping(views)
        if shared:
            log.info("gradients share memory: every bucket is staged")
        self._views = (addrs, views, shared)
        return views, shared

    def reduce_views(self, grads: Sequence[FlatGrads], shared: bool | None = None) -> None:
        """Reduce these gradient buffers in place, bucket by bucket (what the op calls).

        ``shared``: whether any two of them overlap (computed when not given)."""
        if shared is None:
            shared = _overlapping(grads)
        done = []
        for bucket, stage in zip(self.buckets, self._stages, strict=True):
            if bucket.inplace and not shared:
                buf = grads[bucket.members[0]]
            else:
                buf = stage if stage is not None else np.empty(bucket.size, np.float32)
                _gather(buf, [grads[i] for i in bucket.members])
            out = self.reduce_fn(buf)
            if out is not buf:
                _check(out, buf)
            done.append((bucket, buf, out))
        for bucket, buf, out in done:  # every bucket reduced: only now is anything written
            if bucket.inplace and not shared:
                if out is not buf:
                    np.copyto(buf, out)
            else:
                _scatter(out, [grads[i] for i in bucket.members])

    def close(self) -> None:
        """Free the slot (the op must not run on it afterwards)."""
        lib = load_library()
        with _lock:
            if _slots.get(self.index) is self:
                lib.msr_register(self.index, _CALLBACK(), 0, 0)
                del _slots[self.index]
        self._views = ((), [], False)
        self._bufs = None

    def take_error(self) -> BaseException | None:
        """The exception the last failed reduction raised (cleared by this call), if any."""
        error, self._error = self._error, None
        return error


def _gather(buf: FlatGrads, parts: Sequence[FlatGrads]) -> None:
    off = 0
    for part in parts:
        buf[off : off + part.size] = part
        off += part.size


def _scatter(buf: FlatGrads, parts: Sequence[FlatGrads]) -> None:
    off = 0
    for part in parts:
        part[:] = buf[off : off + part.size]
        off += part.size


def _overlapping(grads: Sequence[FlatGrads]) -> bool:
    spans = sorted((g.ctypes.data, g.ctypes.data + g.nbytes) for g in grads if g.size)
    return any(b[0] < a[1] for a, b in zip(spans, spans[1:], strict=False))


def _check(out: Any, buf: FlatGrads) -> None:
    want = buf.shape
    if isinstance(out, np.ndarray) and out.shape == want and out.dtype == np.float32:
        return
    got = f"{out.shape} {out.dtype}" if isinstance(out, np.ndarray) else type(out).__name__
    raise CommError(f"the reduced gradient buffer must be a {want} float32 array, got {got}")
