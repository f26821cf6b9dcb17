"""Dump files and their manifest (ms_recover.worker.dump), with numpy-only providers.

Each rank's file is written durably (temp + fsync + rename + directory fsync) and leaves no
temporary behind even when writing fails; the manifest maps every rank to its shard's file;
locate() verifies the file and names what is missing, corrupt or malformed.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import stat
from typing import Any

import numpy as np
import pytest
from numpy.typing import NDArray

from ms_recover.errors import RepairError
from ms_recover.worker import dump
from ms_recover.worker.dump import (
    MANIFEST_NAME,
    DumpFile,
    load_npz,
    locate,
    read_manifest,
    write_manifest,
    write_rank_dump,
)

pytestmark = pytest.mark.timeout(30)


class ArrayState:
    """A StateProvider over a dict of numpy arrays."""

    def __init__(self, arrays: dict[str, NDArray[Any]]) -> None:
        self.arrays = arrays

    def state_dict(self) -> dict[str, NDArray[Any]]:
        return {k: v.copy() for k, v in self.arrays.items()}

    def load_state_dict(self, arrays: dict[str, NDArray[Any]]) -> None:
        self.arrays = {k: v.copy() for k, v in arrays.items()}


class CheckpointingState(ArrayState):
    """A provider that writes its own file; records the path it was given."""

    def __init__(self, payload: bytes, fail: bool = False) -> None:
        super().__init__({})
        self.payload, self.fail, self.paths = payload, fail, list[str]()

    def save_checkpoint(self, path: str) -> None:
        self.paths.append(path)
        with open(path, "wb") as fh:
            fh.write(self.payload[:3])
            if self.fail:
                raise OSError("disk full")
            fh.write(self.payload[3:])


def state(seed: int) -> dict[str, NDArray[Any]]:
    rng = np.random.default_rng(seed)
    return {
        "w": rng.standard_normal((3, 4)).astype(np.float32),
        "moment1.w": rng.standard_normal((3, 4)),
        "global_step": np.array([seed], np.int32),
        "beta1_power": np.array(0.9, np.float32),
        "__extra__/pos": np.arange(3, dtype=np.uint64),
        "file": np.zeros((0, 2), np.float16),  # np.savez(file, **kw) could not take this name
        "mask": np.array([True, False]),
    }


def write_job(tmp: str, step: int = 7) -> dict[int, DumpFile]:
    """World 4, shards {0: 0, 1: 1, 2: 0, 3: 1}; ranks 0 and 3 dump (one replica per shard)."""
    files = {r: write_rank_dump(ArrayState(state(r)), tmp, r, step) for r in (0, 3)}
    write_manifest(tmp, "job-a", step, 4, list(files.values()), {0: 0, 1: 1, 2: 0, 3: 1})
    return files


def assert_same(a: dict[str, NDArray[Any]], b: dict[str, NDArray[Any]]) -> None:
    assert sorted(a) == sorted(b)
    for name in a:
        assert a[name].dtype == b[name].dtype and a[name].shape == b[name].shape, name
        assert a[name].tobytes() == b[name].tobytes(), name


def test_npz_dump_round_trips_bit_for_bit_and_describes_the_final_file(tmp_path: Any) -> None:
    directory = str(tmp_path / "new" / "dir")  # created on demand
    written = write_rank_dump(ArrayState(state(5)), directory, 2, 11)
    path = os.path.join(directory, "rank_2.npz")
    with open(path, "rb") as fh:
        raw = fh.read()
    sha256 = hashlib.sha256(raw).hexdigest()
    assert written == DumpFile(2, 11, "rank_2.npz", "npz", sha256, len(raw))
    assert_same(load_npz(path), state(5))
    assert os.listdir(directory) == ["rank_2.npz"]


def test_a_provider_with_save_checkpoint_writes_its_own_file_via_a_temporary(
    tmp_path: Any,
) -> None:
    provider = CheckpointingState(b"mindspore-bytes")
    written = write_rank_dump(provider, str(tmp_path), 1, 3)
    assert (written.file, written.format, written.size) == ("rank_1.ckpt", "mindspore", 15)
    assert written.sha256 == hashlib.sha256(b"mindspore-bytes").hexdigest()
    (given,) = provider.paths
    assert os.path.dirname(given) == str(tmp_path) and given != str(tmp_path / "rank_1.ckpt")
    assert os.listdir(tmp_path) == ["rank_1.ckpt"]


def test_a_failed_write_leaves_no_file_and_keeps_the_previous_one(tmp_path: Any) -> None:
    first = write_rank_dump(CheckpointingState(b"old-complete"), str(tmp_path), 0, 1)
    with pytest.raises(OSError, match="disk full"):
        write_rank_dump(CheckpointingState(b"new-bytes", fail=True), str(tmp_path), 0, 2)
    assert os.listdir(tmp_path) == ["rank_0.ckpt"]
    assert dump.file_sha256(str(tmp_path / "rank_0.ckpt")) == (first.sha256, first.size)

    class Broken(ArrayState):
        def state_dict(self) -> dict[str, NDArray[Any]]:
            return {"ok": np.ones(2), "bad": np.array([object()])}  # never pickled

    with pytest.raises(RepairError, match=r"'bad' \(object\) hold Python objects"):
        write_rank_dump(Broken({}), str(tmp_path), 4, 2)
    assert os.listdir(tmp_path) == ["rank_0.ckpt"]


def test_the_file_and_then_the_directory_are_fsynced(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    synced: list[str] = []
    real_fsync = os.fsync

    def recording_fsync(fd: int) -> None:
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", recording_fsync)
    write_rank_dump(ArrayState(state(0)), str(tmp_path), 0, 1)
    assert len(synced) == 2
    assert os.path.dirname(synced[0]) == str(tmp_path) and synced[0].endswith(".tmp")
    assert synced[1] == str(tmp_path)


def test_manifest_maps_every_rank_to_its_shard_file(tmp_path: Any) -> None:
    files = write_job(str(tmp_path))
    manifest = read_manifest(str(tmp_path))
    assert (manifest.job_id, manifest.step, manifest.world_size) == ("job-a", 7, 4)
    assert manifest.files == (files[0], files[3])
    assert manifest.holders == {0: "rank_0.npz", 1: "rank_3.npz", 2: "rank_0.npz", 3: "rank_3.npz"}
    body = json.loads((tmp_path / MANIFEST_NAME).read_text())
    assert body["ranks"]["1"] == {"shard": 1, "file": "rank_3.npz"}
    assert sorted(os.listdir(tmp_path)) == [MANIFEST_NAME, "rank_0.npz", "rank_3.npz"]


@pytest.mark.parametrize(("rank", "source"), [(0, 0), (1, 3), (2, 0), (3, 3)])
def test_locate_gives_the_own_file_or_the_shard_replicas(
    tmp_path: Any, rank: int, source: int
) -> None:
    files = write_job(str(tmp_path))
    path, found = locate(str(tmp_path), rank)
    assert found == files[source] and path == str(tmp_path / f"rank_{source}.npz")
    assert_same(load_npz(path), state(source))


def test_a_corrupted_or_missing_file_is_named(tmp_path: Any) -> None:
    write_job(str(tmp_path))
    target = tmp_path / "rank_3.npz"
    raw = bytearray(target.read_bytes())
    raw[len(raw) // 2] ^= 0x01
    target.write_bytes(bytes(raw))
    with pytest.raises(RepairError, match=r"rank_3\.npz for rank 1 is corrupt: .* sha256"):
        locate(str(tmp_path), 1)
    locate(str(tmp_path), 0)  # the other shard is still fine
    os.remove(target)
    with pytest.raises(RepairError, match=r"rank_3\.npz for rank 1 \(rank 3's .*\) is missing"):
        locate(str(tmp_path), 1)


def test_missing_and_malformed_manifests_say_so(tmp_path: Any) -> None:
    with pytest.raises(RepairError, match=r"no dump manifest at .*manifest\.json.*no complete"):
        locate(str(tmp_path), 0)
    write_job(str(tmp_path))
    manifest = tmp_path / MANIFEST_NAME
    good = json.loads(manifest.read_text())
    bad_bodies: list[Any] = [
        "{not json",
        {k: v for k, v in good.items() if k != "step"},
        {**good, "version": 99},
        {**good, "files": [{**good["files"][0], "file": "../rank_0.npz"}, good["files"][1]]},
        {**good, "files": [{**good["files"][0], "format": "pickle"}, good["files"][1]]},
        {**good, "ranks": {**good["ranks"], "2": {"shard": 0, "file": "rank_3.npz"}}},
    ]
    for body in bad_bodies:
        manifest.write_text(body if isinstance(body, str) else json.dumps(body))
        with pytest.raises(RepairError, match=r"manifest\.json is malformed"):
            read_manifest(str(tmp_path))


def test_locate_rejects_a_rank_outside_the_world(tmp_path: Any) -> None:
    write_job(str(tmp_path))
    with pytest.raises(RepairError, match=r"rank 4 is not in the dumped job \(world size 4"):
        locate(str(tmp_path), 4)


def test_write_manifest_refuses_an_incomplete_or_inconsistent_dump(tmp_path: Any) -> None:
    d = str(tmp_path)
    f0 = write_rank_dump(ArrayState(state(0)), d, 0, 7)
    f2 = write_rank_dump(ArrayState(state(2)), d, 2, 7)
    shards = {0: 0, 1: 1, 2: 0, 3: 1}
    cases: list[tuple[list[DumpFile], dict[int, int], str]] = [
        ([f0, f2], shards, r"no file for shard\(s\) \[1\]"),
        ([f0], {0: 0, 1: 0}, r"every rank 0\.\.3"),
        ([f0, f0], shards, "rank twice"),
        ([f0, DumpFile(3, 6, "rank_3.npz", "npz", "0" * 64, 1)], shards, "of step 6"),
        ([f0, DumpFile(9, 7, "rank_9.npz", "npz", "0" * 64, 1)], shards, "outside world size 4"),
    ]
    for files, shard_map, message in cases:
        with pytest.raises(RepairError, match=message):
            write_manifest(d, "job", 7, 4, files, shard_map)
    assert MANIFEST_NAME not in os.listdir(d)
    assert not [n for n in os.listdir(d) if n.startswith(".")]


def test_load_npz_names_an_unreadable_file(tmp_path: Any) -> None:
    path = tmp_path / "rank_0.npz"
    path.write_bytes(b"not a zip")
    with pytest.raises(RepairError, match=r"cannot read npz dump file .*rank_0\.npz"):
        load_npz(str(path))


def test_dump_file_from_dict_round_trips_and_checks_its_fields() -> None:
    f = DumpFile(1, 7, "rank_1.ckpt", "mindspore", "ab" * 32, 10)
    assert DumpFile.from_dict(dataclasses.asdict(f)) == f
    for bad, message in [
        ({"rank": 1}, "malformed"),
        ({**dataclasses.asdict(f), "format": "pickle"}, "not one of: mindspore, npz"),
        ({**dataclasses.asdict(f), "file": "/etc/passwd"}, "not a plain name"),
    ]:
        with pytest.raises(RepairError, match=message):
            DumpFile.from_dict(bad)


def test_dumps_are_private(tmp_path: Any) -> None:
    """Every directory the dump creates is 0o700, every file 0o600 (issue 9 #11)."""
    root = tmp_path / "ms-recover" / "job" / "dump"
    tmp_path.chmod(0o755)
    files = {r: write_rank_dump(ArrayState(state(r)), str(root), r, 3) for r in (0, 3)}
    write_manifest(str(root), "job", 3, 4, list(files.values()), {0: 0, 1: 1, 2: 0, 3: 1})
    for level in (tmp_path / "ms-recover", tmp_path / "ms-recover" / "job", root):
        assert stat.S_IMODE(level.stat().st_mode) == 0o700, level
    assert stat.S_IMODE(tmp_path.stat().st_mode) == 0o755  # an existing parent is left alone
    for name in [f.file for f in files.values()] + [MANIFEST_NAME]:
        assert stat.S_IMODE((root / name).stat().st_mode) == 0o600, name
