"""Dump files and the manifest over them: the layout of a dump directory, durable writes,
and verified reads. Shared by the worker (which writes rank files, see
:mod:`ms_recover.worker.dump`) and the manager (which writes the manifest). Standard library
only: no numpy, no MindSpore, no zmq.

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
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

from ms_recover.errors import RepairError

MANIFEST_NAME = "manifest.json"
MANIFEST_VERSION = 1
FORMATS = {"mindspore": ".ckpt", "npz": ".npz"}
_CHUNK = 1 << 20
PRIVATE_DIR, PRIVATE_FILE = 0o700, 0o600  # dumps hold the whole training state


@dataclass(frozen=True)
class DumpFile:
    """One rank's dump file: ``file`` is a basename inside the dump directory."""

    rank: int
    step: int
    file: str
    format: str
    sha256: str
    size: int

    @classmethod
    def from_dict(cls, entry: Mapping[str, Any]) -> DumpFile:
        """A DumpFile from its JSON/msgpack form (``dataclasses.asdict``), checked: RepairError
        for a missing or mistyped field, an unknown format or a name that is not a plain name.
        """
        try:
            f = cls(
                rank=int(entry["rank"]),
                step=int(entry["step"]),
                file=str(entry["file"]),
                format=str(entry["format"]),
                sha256=str(entry["sha256"]),
                size=int(entry["size"]),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise RepairError(f"dump file entry {dict(entry)!r} is malformed: {exc!r}") from exc
        if f.format not in FORMATS:
            raise RepairError(
                f"dump file {f.file!r} has format {f.format!r}, not one of: {', '.join(FORMATS)}"
            )
        if os.path.basename(f.file) != f.file or f.file in ("", ".", ".."):
            raise RepairError(f"dump file name {f.file!r} is not a plain name in the directory")
        return f


@dataclass(frozen=True)
class Manifest:
    """A complete dump: ``holders`` maps every rank of the world to the file with its state."""

    job_id: str
    step: int
    world_size: int
    files: tuple[DumpFile, ...]
    shards: dict[int, int]
    holders: dict[int, str]

    def file_for(self, rank: int) -> DumpFile:
        """The DumpFile holding ``rank``'s state; RepairError for a rank outside the world."""
        if rank not in self.holders:
            raise RepairError(
                f"rank {rank} is not in the dumped job (world size {self.world_size}: "
                f"ranks 0..{self.world_size - 1})"
            )
        name = self.holders[rank]
        return next(f for f in self.files if f.file == name)


# -- durable writes ------------------------------------------------------------------------


def fsync_path(path: str) -> None:
    """fsync a file (its data reaches the disk) or a directory (renames in it do)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _temp_name(directory: str, name: str) -> str:
    # Dot-prefixed, unique per process and call, so concurrent writers never share a temporary.
    return os.path.join(directory, f".{name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")


def _atomic_write(directory: str, name: str, write: Callable[[str], None]) -> str:
    """Run ``write(tmp_path)``, fsync the result, rename it to ``name``, fsync the directory.

    The temporary is removed if anything fails. (fsync through a fresh descriptor flushes the
    file's data too: it acts on the inode, so writers need not fsync their own handle.)
    """
    make_private_dirs(directory)
    tmp = _temp_name(directory, name)
    final = os.path.join(directory, name)
    try:
        write(tmp)
        if not os.path.isfile(tmp):
            raise RepairError(f"writing {final} produced no file at the temporary path {tmp}")
        os.chmod(tmp, PRIVATE_FILE)  # a dump is the job's whole state: owner only
        fsync_path(tmp)
        os.replace(tmp, final)
    except BaseException:
        _remove_quietly(tmp)
        raise
    fsync_path(directory)
    return final


def make_private_dirs(directory: str) -> None:
    """Create ``directory`` and any missing parents with mode 0o700 (existing ones are kept)."""
    missing: list[str] = []
    path = os.path.abspath(directory)
    while not os.path.isdir(path) and os.path.dirname(path) != path:
        missing.append(path)
        path = os.path.dirname(path)
    for level in reversed(missing):
        try:
            os.mkdir(level, PRIVATE_DIR)
        except FileExistsError:
            if not os.path.isdir(level):
                raise
        os.chmod(level, PRIVATE_DIR)  # mkdir's mode is masked by the umask


def _remove_quietly(path: str) -> None:
    try:
        os.remove(path)
    except FileNotFoundError:
        pass


def file_sha256(path: str) -> tuple[str, int]:
    """(SHA-256 hex digest, size in bytes) of the file's contents."""
    h = hashlib.sha256()
    size = 0
    with open(path, "rb") as fh:
        while chunk := fh.read(_CHUNK):
            h.update(chunk)
            size += len(chunk)
    return h.hexdigest(), size


# -- manifest --------------------------------------------------------------------------------


def _holders(files: list[DumpFile], shards: dict[int, int], world_size: int) -> dict[int, str]:
    """rank -> file name: the rank's own file, else the lowest-ranked file of its shard."""
    if sorted(shards) != list(range(world_size)):
        raise RepairError(
            f"shards must map every rank 0..{world_size - 1} to its shard, got ranks "
            f"{sorted(shards)}"
        )
    own = {f.rank: f.file for f in files}
    by_shard: dict[int, str] = {}
    for f in sorted(files, key=lambda f: f.rank):
        by_shard.setdefault(shards[f.rank], f.file)
    uncovered = sorted({s for s in shards.values() if s not in by_shard})
    if uncovered:
        raise RepairError(
            f"dump has no file for shard(s) {uncovered} (files from ranks {sorted(own)}); "
            "every shard needs at least one replica's file"
        )
    return {r: own.get(r, by_shard[shards[r]]) for r in range(world_size)}


def _check_files(files: list[DumpFile], step: int, world_size: int) -> None:
    ranks = [f.rank for f in files]
    if len(set(ranks)) != len(ranks):
        raise RepairError(f"dump lists a rank twice: file ranks {sorted(ranks)}")
    for f in files:
        if not 0 <= f.rank < world_size:
            raise RepairError(
                f"dump file {f.file} is from rank {f.rank}, outside world size {world_size}"
            )
        if f.step != step:
            raise RepairError(f"dump file {f.file} is of step {f.step}, the dump is of step {step}")


def write_manifest(
    directory: str,
    job_id: str,
    step: int,
    world_size: int,
    files: list[DumpFile],
    shards: dict[int, int],
) -> str:
    """Durably write ``manifest.json`` for a dump of ``step``; returns its path.

    ``shards`` maps every rank of the world to its data-parallel shard. Refuses (RepairError)
    a shard with no file, a file of another step, a rank outside the world or listed twice.
    The files themselves are not read here (the manager may not see the dump directory).
    """
    _check_files(files, step, world_size)
    holders = _holders(files, shards, world_size)
    body = {
        "version": MANIFEST_VERSION,
        "job_id": job_id,
        "step": step,
        "world_size": world_size,
        "files": [asdict(f) for f in sorted(files, key=lambda f: f.rank)],
        "ranks": {str(r): {"shard": shards[r], "file": holders[r]} for r in range(world_size)},
    }
    data = (json.dumps(body, indent=2, sort_keys=True) + "\n").encode()

    def write(tmp: str) -> None:
        with open(tmp, "xb") as fh:
            fh.write(data)

    return _atomic_write(directory, MANIFEST_NAME, write)


def read_manifest(directory: str) -> Manifest:
    """The dump's manifest; RepairError if it is missing, unreadable or inconsistent."""
    path = os.path.join(directory, MANIFEST_NAME)
    try:
        with open(path, "rb") as fh:
            raw = fh.read()
    except FileNotFoundError as exc:
        raise RepairError(
            f"no dump manifest at {path}: the directory holds no complete dump (the manifest "
            "is written last, after every chosen rank saved its file)"
        ) from exc
    try:
        return _parse_manifest(json.loads(raw))
    except (RepairError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise RepairError(f"dump manifest {path} is malformed: {exc!r}") from exc


def _parse_manifest(body: dict[str, Any]) -> Manifest:
    if body["version"] != MANIFEST_VERSION:
        raise ValueError(f"version {body['version']!r}, this reader knows {MANIFEST_VERSION}")
    step, world_size = int(body["step"]), int(body["world_size"])
    files = [DumpFile.from_dict(e) for e in body["files"]]
    ranks = {int(r): dict(v) for r, v in dict(body["ranks"]).items()}
    shards = {r: int(v["shard"]) for r, v in ranks.items()}
    holders = {r: str(v["file"]) for r, v in ranks.items()}
    _check_files(files, step, world_size)
    if holders != _holders(files, shards, world_size):
        raise ValueError("the rank -> file map disagrees with the files and shards it lists")
    return Manifest(
        job_id=str(body["job_id"]),
        step=step,
        world_size=world_size,
        files=tuple(files),
        shards=shards,
        holders=holders,
    )


def locate(directory: str, rank: int) -> tuple[str, DumpFile]:
    """(path, DumpFile) of the verified file holding ``rank``'s state.

    A rank that wrote no file of its own gets its shard replica's file. The file's size and
    SHA-256 are checked against the manifest; a missing or altered file raises RepairError
    naming it.
    """
    manifest = read_manifest(directory)
    dump = manifest.file_for(rank)
    path = os.path.join(directory, dump.file)
    whose = "its own" if dump.rank == rank else f"rank {dump.rank}'s (same shard)"
    if not os.path.isfile(path):
        raise RepairError(f"dump file {path} for rank {rank} ({whose}) is missing")
    sha256, size = file_sha256(path)
    if (sha256, size) != (dump.sha256, dump.size):
        raise RepairError(
            f"dump file {path} for rank {rank} is corrupt: {size} bytes with sha256 {sha256}, "
            f"the manifest says {dump.size} bytes with sha256 {dump.sha256}"
        )
    return path, dump
