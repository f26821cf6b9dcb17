"""The in-graph reduction op: a compiled MindSpore ``aot`` custom op that calls Python once.

``graphreduce.cc`` (next to this module) is compiled with the host's C++ compiler at first use
into a per-user cache (``$XDG_CACHE_HOME/ms_recover``, else ``~/.cache/ms_recover``), keyed by
the source's hash, and renamed into place atomically, so concurrent ranks never load a half
written library. The op gathers the gradients into a flat float32 buffer owned by a
:class:`ReduceSlot`, calls the slot's Python reduction once on it through a ctypes callback,
and scatters the result back into the graph.

Why not ``func_type="pyfunc"``: its per-call cost was about 0.16 ms on this host (a demo step
is about 0.5 ms); the ctypes callback costs a few tens of microseconds, mostly the GIL hand-over
from MindSpore's kernel thread.

A reduction that raises is latched in its slot (ctypes would otherwise print and swallow it);
the op then fails, MindSpore aborts the graph before the optimizer ran, and
:meth:`ReduceSlot.take_error` hands the original exception back to the caller.
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from ms_recover.errors import CommError, MsRecoverError

log = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("graphreduce.cc")
FUNC = "MsrReduce"
_CALLBACK = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_int64, ctypes.POINTER(ctypes.c_void_p))
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


def load_library() -> ctypes.CDLL:
    """The op's library, loaded once per process (MindSpore dlopens the same file)."""
    global _lib
    with _lock:
        if _lib is None:
            lib = ctypes.CDLL(str(build_library()))
            lib.msr_register.argtypes = [ctypes.c_int64, _CALLBACK, ctypes.c_void_p, ctypes.c_int64]
            lib.msr_register.restype = ctypes.c_int
            lib.msr_slots.restype = ctypes.c_int
            _lib = lib
        return _lib


class ReduceSlot:
    """One registered reduction: a flat buffer and the Python function the op calls on it.

    ``reduce_fn(flat) -> flat`` is called with this slot's buffer (float32, ``size`` values)
    and must return an array of the same shape and dtype (the buffer itself, reduced in place,
    or a new array, which the op then reads directly: it is kept until the next call). It runs
    on a MindSpore kernel thread while the caller's thread waits in the graph, with the
    caller's floating-point environment.
    """

    def __init__(self, size: int, reduce_fn: Callable[[FlatGrads], FlatGrads]) -> None:
        lib = load_library()
        self.reduce_fn = reduce_fn
        self.buffer: FlatGrads = np.zeros(size, np.float32)
        self._error: BaseException | None = None
        self._result: FlatGrads | None = None  # alive while the op reads it
        self._callback = _CALLBACK(self._call)  # kept alive as long as the slot
        with _lock:
            free = next((i for i in range(lib.msr_slots()) if i not in _slots), None)
            if free is None:
                raise MsRecoverError(f"at most {lib.msr_slots()} in-graph reductions per process")
            _slots[free] = self
        self.index = free
        lib.msr_register(free, self._callback, self.buffer.ctypes.data, size)

    @property
    def func(self) -> str:
        """The ``func`` argument of ``ops.Custom(..., func_type="aot")``."""
        return f"{library_path()}:{FUNC}"

    def _call(self, _slot: int, result: Any) -> int:
        # Never let an exception escape into ctypes: it would be printed and turned into 0.
        try:
            out = self.reduce_fn(self.buffer)
            if out is not self.buffer:
                self._check(out)
                self._result = np.ascontiguousarray(out)
                result[0] = self._result.ctypes.data
            return 0
        except BaseException as exc:  # noqa: BLE001 - latched and re-raised by the caller
            self._error = exc
            return 1

    def _check(self, out: Any) -> None:
        want = self.buffer.shape
        if isinstance(out, np.ndarray) and out.shape == want and out.dtype == np.float32:
            return
        got = f"{out.shape} {out.dtype}" if isinstance(out, np.ndarray) else type(out).__name__
        raise CommError(f"the reduced gradient buffer must be a {want} float32 array, got {got}")

    def close(self) -> None:
        """Free the slot (the op must not run on it afterwards)."""
        lib = load_library()
        with _lock:
            if _slots.get(self.index) is self:
                lib.msr_register(self.index, _CALLBACK(), None, 0)
                del _slots[self.index]

    def take_error(self) -> BaseException | None:
        """The exception the last failed reduction raised (cleared by this call), if any."""
        error, self._error = self._error, None
        return error
