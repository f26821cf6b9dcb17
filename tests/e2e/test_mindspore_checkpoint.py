"""Real MindSpore, in process: a dump written with MindSporeState.save_checkpoint loads back.

A trained MLP + Adam is dumped (format "mindspore") with a manifest; a fresh model built from
another seed loads it with load_dump bit for bit (weights, Adam moments, step counters) and
then trains on identically; the checkpoint lands at exactly the requested path; a model of
another shape is refused with the parameter named and nothing loaded.
"""

from __future__ import annotations

import json
import os
from typing import Any

import numpy as np
import pytest
from numpy.typing import NDArray

ms = pytest.importorskip("mindspore")
nn = ms.nn

from ms_recover.errors import RepairError  # noqa: E402
from ms_recover.mindspore.checkpoint import (  # noqa: E402
    META_KEY,
    load_dump,
    read_ckpt,
    write_ckpt,
)
from ms_recover.mindspore.state import MindSporeState  # noqa: E402
from ms_recover.mindspore.step import DataParallelStep  # noqa: E402
from ms_recover.worker.dump import locate, write_manifest, write_rank_dump  # noqa: E402
from ms_recover.worker.sampler import make_dataset, shard_indices  # noqa: E402

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

LOSS = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
X, Y = make_dataset(256, 16, 4, seed=0)


def build(seed: int, hidden: int = 32) -> tuple[Any, Any]:
    ms.set_seed(seed)
    net = nn.SequentialCell(nn.Dense(16, hidden), nn.ReLU(), nn.Dense(hidden, 4))
    return net, nn.Adam(net.trainable_params(), 1e-2)


def train(net: Any, opt: Any, steps: range) -> None:
    step = DataParallelStep(net, LOSS, opt, jit=False)
    for s in steps:
        idx = shard_indices(s, 0, 1, 32, len(X), seed=0)
        step(X[idx], Y[idx])


def assert_same(a: dict[str, NDArray[Any]], b: dict[str, NDArray[Any]]) -> None:
    assert list(a) == list(b)
    for name in a:
        assert a[name].dtype == b[name].dtype and a[name].shape == b[name].shape, name
        assert a[name].tobytes() == b[name].tobytes(), name


@pytest.fixture(scope="module")
def dumped(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, dict[str, NDArray[Any]]]:
    """World 2, one shard: rank 0 trained 3 steps and dumped; rank 1 wrote nothing."""
    net, opt = build(seed=1)
    train(net, opt, range(3))
    state = MindSporeState(net, opt)
    live = state.state_dict()
    directory = str(tmp_path_factory.mktemp("dump"))
    written = write_rank_dump(state, directory, rank=0, step=3)
    assert (written.file, written.format) == ("rank_0.ckpt", "mindspore")
    write_manifest(directory, "job", 3, 2, [written], {0: 0, 1: 0})
    return directory, live


def test_dump_is_one_ckpt_with_the_whole_state(dumped: tuple[str, dict[str, NDArray[Any]]]) -> None:
    directory, live = dumped
    assert sorted(os.listdir(directory)) == ["manifest.json", "rank_0.ckpt"]
    assert int(live["global_step"][0]) == 3
    for name in ("moment1.0.weight", "moment2.2.bias", "beta1_power", "beta2_power"):
        assert name in live
    path, _ = locate(directory, 1)
    assert_same(read_ckpt(path), live)


def test_a_fresh_model_loads_the_dump_bit_for_bit_and_trains_on_identically(
    dumped: tuple[str, dict[str, NDArray[Any]]], monkeypatch: pytest.MonkeyPatch
) -> None:
    directory, live = dumped
    net, opt = build(seed=99)
    state = MindSporeState(net, opt)
    assert state.state_dict()["0.weight"].tobytes() != live["0.weight"].tobytes()
    monkeypatch.setenv("RANK_ID", "1")  # rank 1 wrote no file: it reads its replica's
    assert load_dump(directory, state) == 3
    assert_same(state.state_dict(), live)

    reference, reference_opt = build(seed=5)
    MindSporeState(reference, reference_opt).load_state_dict(live)
    train(net, opt, range(3, 5))
    train(reference, reference_opt, range(3, 5))
    assert_same(state.state_dict(), MindSporeState(reference, reference_opt).state_dict())


def test_a_model_of_another_shape_is_refused_by_name_and_left_untouched(
    dumped: tuple[str, dict[str, NDArray[Any]]],
) -> None:
    directory, _ = dumped
    net, opt = build(seed=2, hidden=33)
    state = MindSporeState(net, opt)
    before = state.state_dict()
    with pytest.raises(RepairError, match=r"'0\.weight': expected \(33, 16\) float32, got \(32"):
        load_dump(directory, state, rank=0)
    assert_same(state.state_dict(), before)


class Cursor:
    """An extra provider with a zero-size entry (MindSpore's checkpoint drops those itself)."""

    def __init__(self) -> None:
        self.arrays: dict[str, NDArray[Any]] = {
            "pos": np.array([7], np.int64),
            "pending": np.zeros((0, 3), np.float16),
        }

    def state_dict(self) -> dict[str, NDArray[Any]]:
        return dict(self.arrays)

    def load_state_dict(self, arrays: dict[str, NDArray[Any]]) -> None:
        self.arrays = dict(arrays)


def test_save_checkpoint_writes_exactly_the_path_and_keeps_rng_extras_and_empties(
    tmp_path: Any,
) -> None:
    net, opt = build(seed=3)
    state = MindSporeState(net, opt, extra=Cursor(), include_rng=True)
    target = tmp_path / "no-suffix.tmp"
    state.save_checkpoint(str(target))
    assert os.listdir(tmp_path) == ["no-suffix.tmp"]
    os.replace(target, tmp_path / "state.ckpt")  # load_checkpoint insists on .ckpt
    back = read_ckpt(str(tmp_path / "state.ckpt"))
    expected = state.state_dict()
    assert_same({k: back[k] for k in expected}, expected)
    assert back["__extra__/pending"].shape == (0, 3)


def test_dtypes_mindspore_cannot_read_back_are_refused_before_writing(tmp_path: Any) -> None:
    # MindSpore 2.10 writes these, then load_checkpoint fails on the whole file.
    arrays = {"ok": np.ones(2, np.float32), "z": np.ones(2, np.complex64), "s": np.array(["a"])}
    with pytest.raises(RepairError, match=r"cannot hold 'z' \(complex64\), 's' \(<U1\)"):
        write_ckpt(arrays, str(tmp_path / "x.ckpt"))
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize(
    ("empty", "problem"),
    [
        ({"x": [[10**7, 10**7], "<f8"]}, "not empty"),  # 800 TB if it were allocated
        ({"x": [[0, 2**70], "<f8"]}, "shape"),
        ({"x": [[0], "O"]}, "Python objects"),
        ({"x": [[0], "<f8"], "y": "not a pair"}, "malformed"),
    ],
)
def test_a_checkpoint_whose_metadata_claims_an_array_is_refused(
    tmp_path: Any, empty: dict[str, Any], problem: str
) -> None:
    """The metadata names arrays of no element by shape; a corrupted one cannot make the
    reader allocate (issue 26 #6): one RepairError naming the file."""
    path = str(tmp_path / "forged.ckpt")
    entries = [{"name": "w", "data": ms.Tensor(np.ones(2, np.float32))}]
    meta = json.dumps({"version": 1, "empty": empty})
    ms.save_checkpoint(entries, path, append_dict={META_KEY: meta})
    with pytest.raises(RepairError, match="forged.ckpt") as caught:
        read_ckpt(path)
    assert problem in str(caught.value) and "\n" not in str(caught.value)
