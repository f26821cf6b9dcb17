"""MindSpore checkpoint files of a rank's named state, and loading a dump at a job-level restart.

:func:`write_ckpt` / :func:`read_ckpt` turn named numpy arrays into a ``.ckpt`` file with
``mindspore.save_checkpoint`` and back with ``mindspore.load_checkpoint``, bit for bit, with the
same names, shapes and dtypes. :func:`load_dump` loads a rank's state from a dump directory
written by :mod:`ms_recover.worker.dump`.

What MindSpore 2.10's ``save_checkpoint`` does, and how it is handled here:

* A file name that does not end in ``ckpt`` gets ``.ckpt`` appended (``x.tmp`` becomes
  ``x.tmp.ckpt``), and ``load_checkpoint`` refuses a name not ending in ``.ckpt``. So the file
  is written under a private ``*.staging.ckpt`` name next to the target and renamed to it.
* It writes through its own temporary (the name with ``.ckpt`` replaced by ``.tmp``), deletes
  any existing target first (not atomic), renames, and makes the file read-only (mode 0400).
  It does not fsync; the caller (the dump writer) does.
* If its temporary vanished it only logs a warning and returns, and with ``AITURBO=1`` or the
  MindIO backend it writes elsewhere or in place: the written file is checked to exist.
* A zero-size array is silently dropped (no bytes, so no record). Zero-size entries are
  recorded by shape and dtype in a string entry, :data:`META_KEY`, and recreated on read.
* Complex and string arrays are written, but ``load_checkpoint`` then fails on the whole file
  (``KeyError: 'Complex64'``); :func:`write_ckpt` refuses them up front. Bool, int8..64,
  uint8..64 and float16/32/64 arrays, 0-d included, were checked to read back bit for bit.
"""

from __future__ import annotations

import json
import os
from typing import TYPE_CHECKING, Any

import mindspore
import numpy as np
from mindspore import Tensor
from numpy.typing import NDArray

from ms_recover.errors import ConfigError, RepairError
from ms_recover.worker.dump import load_npz, locate

if TYPE_CHECKING:
    from ms_recover.mindspore.state import MindSporeState

META_KEY = "__ms_recover_ckpt__"
META_VERSION = 1


def write_ckpt(arrays: dict[str, NDArray[Any]], path: str) -> None:
    """Write ``arrays`` to exactly ``path`` with ``mindspore.save_checkpoint``.

    :func:`read_ckpt` returns the same names, shapes, dtypes and bytes. Not durable by itself
    (no fsync); an existing file at ``path`` is replaced atomically.
    """
    if META_KEY in arrays:
        raise RepairError(f"state name {META_KEY!r} is reserved for the checkpoint metadata")
    unreadable = [f"{n!r} ({a.dtype})" for n, a in arrays.items() if a.dtype.kind not in "biuf"]
    if unreadable:
        raise RepairError(
            f"a MindSpore checkpoint cannot hold {', '.join(unreadable)}: only bool, int, uint "
            "and float arrays read back"
        )
    empty = {n: [list(a.shape), a.dtype.str] for n, a in arrays.items() if a.size == 0}
    # np.asarray, not np.ascontiguousarray: the latter turns a 0-d array into shape (1,).
    entries = [
        {"name": n, "data": Tensor(np.asarray(a, order="C"))} for n, a in arrays.items() if a.size
    ]
    meta = json.dumps({"version": META_VERSION, "empty": empty}, sort_keys=True)
    staging = f"{path}.{os.getpid()}.staging.ckpt"
    try:
        mindspore.save_checkpoint(entries, staging, append_dict={META_KEY: meta})
        if not os.path.isfile(staging):
            raise RepairError(
                f"mindspore.save_checkpoint wrote no file at {staging} (AITURBO or MindIO "
                "checkpoint backends write elsewhere)"
            )
        os.replace(staging, path)
    except BaseException:
        for leftover in (staging, staging[: -len(".ckpt")] + ".tmp"):
            _remove_quietly(leftover)
        raise


def _remove_quietly(path: str) -> None:
    try:
        os.remove(path)
    except FileNotFoundError:
        pass


def read_ckpt(path: str) -> dict[str, NDArray[Any]]:
    """The named arrays of a file written by :func:`write_ckpt` (C-contiguous copies).

    RepairError naming the file if MindSpore cannot read it. A ``.ckpt`` file not written by
    :func:`write_ckpt` reads too (its string entries are dropped).
    """
    if not path.endswith(".ckpt"):
        raise RepairError(f"MindSpore checkpoint {path} must have a name ending in .ckpt")
    try:
        loaded = mindspore.load_checkpoint(path)
    except (ValueError, RuntimeError, OSError) as exc:
        raise RepairError(f"cannot read MindSpore checkpoint {path}: {exc}") from exc
    meta = loaded.pop(META_KEY, None)
    arrays = {
        name: np.array(value.asnumpy(), order="C", copy=True)
        for name, value in loaded.items()
        if not isinstance(value, str)
    }
    if isinstance(meta, str):
        try:
            arrays.update(_empty_arrays(json.loads(meta)["empty"]))
        except (ValueError, KeyError, TypeError, RecursionError, OverflowError) as exc:
            raise RepairError(
                f"MindSpore checkpoint {path} has malformed {META_KEY}: {exc}"
            ) from exc
    return arrays


def _empty_arrays(empty: Any) -> dict[str, NDArray[Any]]:
    """The arrays of no element that :func:`write_ckpt` records by shape and dtype; ValueError
    for an entry that is not one (a shape of any other size would allocate from the file's
    say-so: a corrupted one must not be able to ask for terabytes)."""
    out: dict[str, NDArray[Any]] = {}
    for name, (shape, dtype) in dict(empty).items():
        dims = tuple(shape)
        if len(dims) > 64 or not all(type(d) is int and 0 <= d < 2**31 for d in dims):
            raise ValueError(f"entry {str(name)[:64]!r} has shape {str(dims)[:64]}")
        if 0 not in dims:
            raise ValueError(f"entry {str(name)[:64]!r} of shape {dims} is not empty")
        kind = np.dtype(dtype)
        if kind.hasobject:
            raise ValueError(f"entry {str(name)[:64]!r} has dtype {kind} (Python objects)")
        out[str(name)] = np.zeros(dims, kind)
    return out


def _rank_from_env() -> int:
    raw = os.environ.get("RANK_ID")
    if raw is None:
        return 0
    try:
        return int(raw)
    except ValueError as exc:
        raise ConfigError(f"RANK_ID={raw!r} is not an integer rank") from exc


def load_dump(directory: str, state: MindSporeState, rank: int | None = None) -> int:
    """Load ``rank``'s dumped state into ``state`` in place; returns the dumped step.

    ``rank`` defaults to ``RANK_ID`` from the environment, else 0. The file is verified
    against the manifest (:func:`ms_recover.worker.dump.locate`), and ``load_state_dict``
    loads all or nothing: a dump of another model raises RepairError naming each mismatched
    parameter and leaves ``state`` untouched.
    """
    if rank is None:
        rank = _rank_from_env()
    path, dump = locate(directory, rank)
    arrays = read_ckpt(path) if dump.format == "mindspore" else load_npz(path)
    state.load_state_dict(arrays)
    return dump.step
