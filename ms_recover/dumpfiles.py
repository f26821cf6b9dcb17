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
* **Read safely.** :func:`read_manifest` reads only a regular file of at most
  :data:`MAX_MANIFEST_BYTES` (a FIFO, a device or a directory is refused at once), nested at
  most :data:`MANIFEST_DEPTH` levels, with every count and size checked as plausible (a world
  of at most :data:`~ms_recover.inputs.MAX_WORLD` ranks) before anything is allocated from it:
  a bad manifest is one RepairError naming the file and the problem, never a MemoryError, a
  RecursionError or a wait.
* **Every rank is covered.** The manifest maps every rank of the world to the file holding its
  shard's state: its own file if it wrote one, else the lowest-ranked replica of its shard that
  did. A manifest that would leave a shard without a file is refused when it is written.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import secrets
import stat
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

from ms_recover.errors import ConfigError, RepairError
from ms_recover.inputs import MAX_WORLD, load_json, open_regular, os_reason
from ms_recover.protocol.bounds import STEP_MAX, show

MANIFEST_NAME = "manifest.json"
#: A manifest of the largest world (MAX_WORLD ranks, each with its own file) is about 40 MiB.
MAX_MANIFEST_BYTES = 64 << 20
#: body > "files" list > one file's map: 3 levels are in use.
MANIFEST_DEPTH = 4
MAX_FILE_BYTES = 1 << 62  # a dump file's size as the manifest may state it
_NAME_MAX = 255  # a file name, as most file systems allow
_HEX = frozenset("0123456789abcdef")
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
        if not isinstance(entry, Mapping):
            raise RepairError(f"dump file entry {show(entry)} is malformed: not a map")
        try:
            return cls._checked(entry)
        except RepairError as exc:
            raise RepairError(f"dump file entry is malformed: {exc}") from exc

    @classmethod
    def _checked(cls, entry: Mapping[str, Any]) -> DumpFile:
        f = cls(
            rank=_int(entry, "rank", 0, MAX_WORLD - 1),
            step=_int(entry, "step", 0, STEP_MAX),
            file=_str(entry, "file", _NAME_MAX),
            format=_str(entry, "format", 16),
            sha256=_str(entry, "sha256", 64),
            size=_int(entry, "size", 0, MAX_FILE_BYTES),
        )
        if f.sha256 and (len(f.sha256) != 64 or not set(f.sha256) <= _HEX):  # "": unknown
            raise RepairError(f"dump file {f.file!r} has sha256 {f.sha256!r}, not 64 hex digits")
        if f.format not in FORMATS:
            raise RepairError(
                f"dump file {f.file!r} has format {f.format!r}, not one of: {', '.join(FORMATS)}"
            )
        if os.path.basename(f.file) != f.file or f.file in ("", ".", ".."):
            raise RepairError(f"dump file name {f.file!r} is not a plain name in the directory")
        return f


def _int(entry: Mapping[str, Any], key: str, low: int, high: int) -> int:
    """``entry[key]``, an int in ``low..high`` (a JSON number, not a bool); else RepairError."""
    value = entry.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise RepairError(f"'{key}' is {show(value)}, not an integer in {low}..{high}")
    return value


def _str(entry: Mapping[str, Any], key: str, most: int) -> str:
    """``entry[key]``, a string of at most ``most`` characters; else RepairError."""
    value = entry.get(key)
    if not isinstance(value, str) or len(value) > most:
        raise RepairError(f"'{key}' is {show(value)}, not a string of at most {most} characters")
    return value


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


def check_dump_dir(directory: str) -> None:
    """At a process's start, when its strategies can dump: ``directory`` exists (created
    owner-only if missing) and this process can create files in it; else ConfigError naming it
    and the problem, so a job does not learn at its fault that its state cannot be saved."""
    what = f"dump directory {directory!r} (MS_RECOVER_DUMP_DIR, where the dump strategy writes)"
    try:
        make_private_dirs(directory)
    except OSError as exc:
        raise ConfigError(f"{what} cannot be created: {os_reason(exc)}") from exc
    if not os.access(directory, os.W_OK | os.X_OK):
        raise ConfigError(f"{what} is not writable by this process (uid {os.getuid()})")


def _remove_quietly(path: str) -> None:
    try:
        os.remove(path)
    except FileNotFoundError:
        pass


def file_sha256(path: str) -> tuple[str, int]:
    """(SHA-256 hex digest, size in bytes) of the regular file's contents (OSError for a
    FIFO, a device or a directory: never read or waited on)."""
    h = hashlib.sha256()
    size = 0
    with open_regular(path) as fh:
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
    """The dump's manifest; RepairError naming the file and the problem in one line if it is
    missing, not a regular file, too large, too deep, implausible or inconsistent."""
    path = os.path.join(directory, MANIFEST_NAME)
    if not os.path.lexists(path):
        raise RepairError(
            f"no dump manifest at {path}: the directory holds no complete dump (the manifest "
            "is written last, after every chosen rank saved its file)"
        )
    body = load_json(path, MAX_MANIFEST_BYTES, MANIFEST_DEPTH, "dump manifest", RepairError)
    try:
        return _parse_manifest(body)
    except RepairError as exc:
        raise RepairError(f"dump manifest {path} is malformed: {exc}") from exc


def _parse_manifest(body: Any) -> Manifest:
    """The Manifest of a decoded (bounded-depth) body; RepairError naming the first problem.
    Every count is checked before anything is allocated from it."""
    if not isinstance(body, dict):
        raise RepairError(f"it is {show(body)}, not a JSON object")
    if body.get("version") != MANIFEST_VERSION:
        raise RepairError(f"version {show(body.get('version'))}, this reader knows 1")
    step, world_size = _int(body, "step", 0, STEP_MAX), _int(body, "world_size", 1, MAX_WORLD)
    listed, ranks = body.get("files"), body.get("ranks")
    if not isinstance(listed, list) or not 0 < len(listed) <= world_size:
        raise RepairError(f"'files' is not a list of 1..{world_size} (world size) entries")
    if not isinstance(ranks, dict) or len(ranks) != world_size:
        raise RepairError(f"'ranks' is not a map of the {world_size} ranks of the world")
    files = [DumpFile.from_dict(e) for e in listed]
    shards: dict[int, int] = {}
    holders: dict[int, str] = {}
    for key, entry in ranks.items():
        rank = _rank_key(key, world_size)
        if not isinstance(entry, dict):
            raise RepairError(f"rank {rank}'s entry is {show(entry)}, not a map")
        shards[rank] = _int(entry, "shard", 0, world_size - 1)
        holders[rank] = _str(entry, "file", _NAME_MAX)
    _check_files(files, step, world_size)
    if holders != _holders(files, shards, world_size):
        raise RepairError("the rank -> file map disagrees with the files and shards it lists")
    return Manifest(
        job_id=_str(body, "job_id", 253),
        step=step,
        world_size=world_size,
        files=tuple(files),
        shards=shards,
        holders=holders,
    )


def _rank_key(key: str, world_size: int) -> int:
    """A 'ranks' key: the decimal text of a rank of the world (ASCII digits only)."""
    if not (key.isascii() and key.isdigit() and len(key) <= 6 and int(key) < world_size):
        raise RepairError(f"'ranks' key {show(key)} is not a rank 0..{world_size - 1}")
    return int(key)


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
    if not os.path.lexists(path):
        raise RepairError(f"dump file {path} for rank {rank} ({whose}) is missing")
    try:
        info = os.stat(path)
        if not stat.S_ISREG(info.st_mode):
            raise OSError(errno.EINVAL, "not a regular file (a FIFO, device or directory)")
        size = info.st_size
        if size == dump.size:  # the size first: a file of another size is never hashed
            sha256, size = file_sha256(path)
        else:
            sha256 = "(not computed)"
    except OSError as exc:
        raise RepairError(
            f"dump file {path} for rank {rank} ({whose}) cannot be read: {os_reason(exc)}"
        ) from exc
    if (sha256, size) != (dump.sha256, dump.size):
        raise RepairError(
            f"dump file {path} for rank {rank} is corrupt: {size} bytes with sha256 {sha256}, "
            f"the manifest says {dump.size} bytes with sha256 {dump.sha256}"
        )
    return path, dump
