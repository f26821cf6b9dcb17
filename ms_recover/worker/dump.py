"""Dump files: a rank's whole state saved when the job cannot recover, and the manifest over them.

The ``dump`` strategy (MindCluster's "save last words"): the manager picks one healthy replica
per data-parallel shard, each chosen rank writes its state at the last committed step with
:func:`write_rank_dump`, the manager records them with :func:`write_manifest`, and a later
job-level restart finds each rank's file with :func:`locate`. Layout of a dump directory::

    rank_0.ckpt        # provider.save_checkpoint(path) (format "mindspore"), or
    rank_1.npz         # provider.state_dict() as an .npz archive (format "npz")
    manifest.json      # written last: a dump without it is incomplete

Guarantees:

* **Durable and atomic.** Every file is written under a temporary name in the same directory,
  fsynced, renamed to its final name with ``os.replace``, and the directory is fsynced: a reader
  sees the complete previous file or the complete new one, never a torn one, and a temporary is
  removed again if writing fails.
* **Verified on read.** The manifest records each file's SHA-256 and size; :func:`locate`
  checks both before returning a path, and raises :class:`RepairError` naming the file.
* **Every rank is covered.** The manifest maps every rank of the world to the file holding its
  shard's state: its own file if it wrote one, else the lowest-ranked replica of its shard that
  did. A manifest that would leave a shard without a file is refused when it is written.

The layout, durable writes and the manifest live in :mod:`ms_recover.dumpfiles` (re-exported
here), so that the manager writes manifests without importing the worker. Pure numpy and stdlib
(no MindSpore, no zmq): the MindSpore side is
``MindSporeState.save_checkpoint`` and :mod:`ms_recover.mindspore.checkpoint`.
"""

from __future__ import annotations

import math
import os
import zipfile
from collections.abc import Callable
from typing import Any, BinaryIO

import numpy as np
from numpy.typing import NDArray

from ms_recover.dumpfiles import (
    FORMATS,
    MANIFEST_NAME,
    MANIFEST_VERSION,
    DumpFile,
    Manifest,
    _atomic_write,
    file_sha256,
    fsync_path,
    locate,
    read_manifest,
    write_manifest,
)
from ms_recover.errors import RepairError
from ms_recover.inputs import open_regular
from ms_recover.worker.state import StateProvider

__all__ = [
    "FORMATS",
    "MANIFEST_NAME",
    "MANIFEST_VERSION",
    "DumpFile",
    "Manifest",
    "file_sha256",
    "fsync_path",
    "load_npz",
    "locate",
    "read_manifest",
    "write_manifest",
    "write_rank_dump",
]


# -- npz -------------------------------------------------------------------------------------


def _write_npz(fh: BinaryIO, arrays: dict[str, NDArray[Any]]) -> None:
    # The .npz layout that np.savez writes, done by hand: np.savez(file, **arrays) breaks on an
    # entry named "file", and here nothing may ever be pickled.
    with zipfile.ZipFile(fh, mode="w", compression=zipfile.ZIP_STORED, allowZip64=True) as zf:
        for name, array in arrays.items():
            with zf.open(name + ".npy", mode="w", force_zip64=True) as member:
                # numpy 1.26 ships no annotations for np.lib.format.
                np.lib.format.write_array(  # type: ignore[no-untyped-call, unused-ignore]
                    member, np.asarray(array), allow_pickle=False
                )


def _save_npz(path: str, arrays: dict[str, NDArray[Any]]) -> None:
    pickled = [f"{n!r} ({a.dtype})" for n, a in arrays.items() if np.asarray(a).dtype.hasobject]
    if pickled:
        raise RepairError(f"state entries {', '.join(pickled)} hold Python objects; not dumped")
    with open(path, "xb") as fh:
        _write_npz(fh, arrays)


#: Deflate cannot shrink data much more than 1032:1: an archive whose members claim more
#: bytes than this many times its own size lies about them.
_MAX_RATIO = 1100
#: numpy 1.26 ships no annotations for np.lib.format.
_NPY_HEADERS: dict[tuple[int, int], Callable[[Any], tuple[tuple[int, ...], bool, np.dtype[Any]]]]
_NPY_HEADERS = {
    (1, 0): np.lib.format.read_array_header_1_0,
    (2, 0): np.lib.format.read_array_header_2_0,
}


def load_npz(path: str) -> dict[str, NDArray[Any]]:
    """Every array of an .npz archive, by name; RepairError naming the file and the problem
    if it is unreadable, not a regular file, or claims more bytes than it holds (each array's
    shape and dtype are checked against its member's size before anything is allocated)."""
    try:
        with open_regular(path) as fh:
            _check_npz(fh, os.fstat(fh.fileno()).st_size)
            fh.seek(0)
            with np.load(fh, allow_pickle=False) as archive:
                return {name: archive[name] for name in archive.files}
    except RepairError as exc:
        raise RepairError(f"npz dump file {path} is refused: {exc}") from exc
    except (OSError, ValueError, zipfile.BadZipFile, EOFError, OverflowError) as exc:
        raise RepairError(f"cannot read npz dump file {path}: {exc}") from exc


def _check_npz(fh: BinaryIO, size: int) -> None:
    """RepairError unless every member of the archive ``fh`` (of ``size`` bytes) is a .npy
    array of a plain dtype whose shape fits in the member's own bytes."""
    with zipfile.ZipFile(fh) as zf:
        members = zf.infolist()
        if sum(m.file_size for m in members) > _MAX_RATIO * size + (1 << 20):
            raise RepairError(f"its members claim more bytes than {_MAX_RATIO}x its {size}")
        for member in members:
            with zf.open(member) as npy:
                version = np.lib.format.read_magic(npy)  # type: ignore[no-untyped-call, unused-ignore]
                read = _NPY_HEADERS.get(version)
                if read is None:
                    raise RepairError(f"{member.filename!r} is .npy version {version}")
                shape, _, dtype = read(npy)
            need = math.prod(shape) * dtype.itemsize
            if dtype.hasobject or need > member.file_size:
                raise RepairError(
                    f"{member.filename!r} claims {shape} of {dtype} ({need} bytes) in a "
                    f"member of {member.file_size} bytes"
                )


# -- rank dumps ------------------------------------------------------------------------------


def write_rank_dump(provider: StateProvider, directory: str, rank: int, step: int) -> DumpFile:
    """Durably write ``provider``'s whole state as ``rank``'s dump file for ``step``.

    A provider with a ``save_checkpoint(path)`` method writes its own file (format
    ``"mindspore"``, ``rank_{rank}.ckpt``); any other provider's ``state_dict()`` is saved as
    ``rank_{rank}.npz``. The returned sha256 and size are those of the final file's bytes.
    """
    if rank < 0 or step < 0:
        raise RepairError(f"dump needs rank >= 0 and step >= 0, got rank {rank} step {step}")
    save = getattr(provider, "save_checkpoint", None)
    fmt = "mindspore" if callable(save) else "npz"
    name = f"rank_{rank}{FORMATS[fmt]}"

    def write(tmp: str) -> None:
        if callable(save):
            save(tmp)
        else:
            _save_npz(tmp, provider.state_dict())

    path = _atomic_write(directory, name, write)
    sha256, size = file_sha256(path)
    return DumpFile(rank=rank, step=step, file=name, format=fmt, sha256=sha256, size=size)
