"""Real MindSpore, one process (plus two fresh child processes for determinism).

MindSporeState round-trips and loads in place (jit-compiled graphs see loaded values);
mismatches are named and load nothing; DataParallelStep with an identity reduce is bit-identical
to a plain MindSpore train step; the same state and batch give the same bits in fresh processes.
"""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

import numpy as np
import pytest

ms = pytest.importorskip("mindspore")
nn = ms.nn

from ms_recover.errors import CommError, Interrupted, RepairError  # noqa: E402
from ms_recover.mindspore.state import MindSporeState  # noqa: E402
from ms_recover.mindspore.step import DataParallelStep  # noqa: E402
from ms_recover.worker.repair import digest, pack, unpack  # noqa: E402
from ms_recover.worker.sampler import make_dataset, shard_indices  # noqa: E402
from ms_recover.worker.state import state_digest  # noqa: E402
from tests.kit.floats import bit_diff, special_values  # noqa: E402

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

# Shared verbatim with the child processes: builds the model from numpy weights (so the
# initial state does not depend on MindSpore's initialisers), trains 3 steps, prints a digest.
CHILD = """
import hashlib
import mindspore as ms
import numpy as np
from mindspore import nn
from ms_recover.mindspore.state import MindSporeState
from ms_recover.mindspore.step import DataParallelStep
from ms_recover.worker.sampler import make_dataset, shard_indices

def digest_after_steps():
    net = nn.SequentialCell(nn.Dense(20, 32), nn.ReLU(), nn.Dense(32, 5))
    opt = nn.Adam(net.trainable_params(), 1e-2)
    state = MindSporeState(net, opt)
    rng = np.random.default_rng(123)
    init = {k: (rng.standard_normal(v.shape) * 0.3).astype(v.dtype) if k.startswith(("0.", "2."))
            else v for k, v in state.state_dict().items()}
    state.load_state_dict(init)
    step = DataParallelStep(net, nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean"),
                            opt, reduce_fn=lambda flat: flat)
    x, y = make_dataset(128, 20, 5, seed=3)
    for s in range(3):
        idx = shard_indices(s, 1, 2, 32, len(x), seed=9)
        step(x[idx], y[idx])
    h = hashlib.sha256()
    for name, arr in state.state_dict().items():
        h.update(name.encode() + arr.tobytes())
    return h.hexdigest()

if __name__ == "__main__":
    print("DIGEST", digest_after_steps())
"""

LOSS = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
X, Y = make_dataset(256, 16, 4, seed=0)


def build(seed: int = 1) -> tuple[Any, Any]:
    ms.set_seed(seed)
    net = nn.SequentialCell(nn.Dense(16, 32), nn.ReLU(), nn.Dense(32, 4))
    return net, nn.Adam(net.trainable_params(), 1e-2)


def batch(step: int) -> tuple[np.ndarray, np.ndarray]:
    idx = shard_indices(step, 0, 1, 32, len(X), seed=0)
    return X[idx], Y[idx]


def assert_same(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> None:
    assert list(a) == list(b)
    for name in a:
        assert a[name].dtype == b[name].dtype and np.array_equal(a[name], b[name]), name


def test_state_covers_parameters_and_adam_state_and_round_trips() -> None:
    net, opt = build()
    state = MindSporeState(net, opt, include_rng=True)
    names = state.names()
    assert names[:4] == ["0.weight", "0.bias", "2.weight", "2.bias"]
    for name in ("global_step", "beta1_power", "beta2_power", "moment1.0.weight", "moment2.2.bias"):
        assert name in names
    assert len(names) == len(set(names))
    original = state.state_dict()
    assert original["global_step"].dtype == np.int32 and original["beta1_power"].shape == ()
    perturbed = {k: (v + 1).astype(v.dtype) for k, v in original.items()}
    state.load_state_dict(perturbed)
    assert_same(state.state_dict(), perturbed)
    state.load_state_dict(original)
    assert_same(state.state_dict(), original)


def test_load_is_in_place_and_a_compiled_step_uses_the_loaded_values() -> None:
    net, opt = build()
    state = MindSporeState(net, opt)
    objects = {name: id(p) for name, p in state.parameters.items()}
    step = DataParallelStep(net, LOSS, opt, jit=True)
    step(*batch(0))  # compiles both graphs
    before = state.state_dict()
    step(*batch(1))
    after = state.state_dict()
    step(*batch(2))
    state.load_state_dict(before)
    assert {name: id(p) for name, p in state.parameters.items()} == objects
    assert all(p is q for p, q in zip(net.trainable_params(), opt.parameters, strict=True))
    step(*batch(1))  # the compiled graphs must start from the loaded values, not the stale ones
    assert_same(state.state_dict(), after)
    assert step.jit_enabled


def test_load_keeps_every_float_bit_pattern_through_the_repair_path() -> None:
    # Subnormals, signed zeros, infinities and NaN payloads in every float entry, packed and
    # verified as a repair sends them, loaded with ops.assign and read back: the same bits.
    net, opt = build()
    state = MindSporeState(net, opt)
    specials = special_values(np.float32)
    wanted = {
        name: np.resize(np.roll(specials, i), value.shape).astype(np.float32)
        if value.dtype == np.float32
        else value
        for i, (name, value) in enumerate(state.state_dict().items())
    }
    arrays, _ = unpack(pack(wanted, step=900), src=0)
    state.load_state_dict(arrays)
    assert bit_diff(state.state_dict(), wanted) == []


def test_a_fresh_process_first_step_keeps_subnormals_like_a_warm_replica() -> None:
    # Issue 9 #3: a replacement loads repaired state and then runs its graphs for the first
    # time; MindSpore runs a graph's first execution on a thread with flush-to-zero and
    # denormals-are-zero, so Adam's subnormal beta1_power (6e-45 after ~900 steps) became 0
    # on the replacement only. Model b stands for the replacement: a new model whose graphs
    # compile after the load. Its step must give the bits of model a, whose graphs were warm.
    (net_a, opt_a), (net_b, opt_b) = build(), build()
    warm, fresh = MindSporeState(net_a, opt_a), MindSporeState(net_b, opt_b)
    step_a = DataParallelStep(net_a, LOSS, opt_a)
    step_a(*batch(0))
    repaired = warm.state_dict()
    tiny = special_values(np.float32)[2:6]  # subnormals, the smallest one included
    repaired["beta1_power"] = np.array(6e-45, np.float32)
    repaired["moment2.0.weight"].reshape(-1)[: tiny.size] = tiny
    repaired["moment1.2.bias"][:2] = [tiny[3], -0.0]
    warm.load_state_dict(repaired)
    fresh.load_state_dict(repaired)
    step_b = DataParallelStep(net_b, LOSS, opt_b)
    for s in (1, 2):
        step_a(*batch(s))
        step_b(*batch(s))
        after = fresh.state_dict()
        assert bit_diff(after, warm.state_dict()) == [], f"step {s}"
    assert after["beta1_power"] != 0  # 6e-45 * 0.9**2 is still the subnormal 4.2e-45


def test_a_spare_warmed_up_before_its_repair_matches_a_warm_replica_and_compiles_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A pre-warmed spare runs warm_up on a batch of the right shape before it has a rank, then
    # loads the repaired state (with subnormals, as in the test above) and trains: the same
    # bits as the replica that trained all along, warm_up itself changes no value (RNG
    # included), and the first real step does not warm up (compile) again.
    (net_a, opt_a), (net_c, opt_c) = build(), build()
    warm, spare = MindSporeState(net_a, opt_a), MindSporeState(net_c, opt_c, include_rng=True)
    step_a = DataParallelStep(net_a, LOSS, opt_a)
    step_a(*batch(0))
    step_c = DataParallelStep(net_c, LOSS, opt_c)
    before = spare.state_dict()
    step_c.warm_up(*batch(7))  # another batch: only its shape matters
    assert bit_diff(spare.state_dict(), before) == []
    warm_ups: list[int] = []
    original = step_c._warm_up
    monkeypatch.setattr(step_c, "_warm_up", lambda t: (warm_ups.append(1), original(t)))
    repaired = warm.state_dict()
    repaired["beta1_power"] = np.array(6e-45, np.float32)
    warm.load_state_dict(repaired)
    MindSporeState(net_c, opt_c).load_state_dict(repaired)
    for s in (1, 2):
        step_a(*batch(s))
        step_c(*batch(s))
        assert bit_diff(MindSporeState(net_c, opt_c).state_dict(), warm.state_dict()) == []
    assert warm_ups == []


def test_mismatches_name_the_parameter_and_load_nothing() -> None:
    net, opt = build()
    state = MindSporeState(net, opt)
    good = state.state_dict()
    bad = {k: (v + 5).astype(v.dtype) for k, v in good.items()}
    bad["0.weight"] = np.zeros((16, 32), np.float32)
    bad["moment1.2.bias"] = bad["moment1.2.bias"].astype(np.float64)
    del bad["global_step"]
    bad["extra.thing"] = np.zeros(3, np.float32)
    with pytest.raises(RepairError) as info:
        state.load_state_dict(bad)
    message = str(info.value)
    assert "'0.weight': expected (32, 16) float32, got (16, 32) float32" in message
    assert "'moment1.2.bias': expected (4,) float32, got (4,) float64" in message
    assert "missing 'global_step' (expected (1,) int32)" in message
    assert "unexpected 'extra.thing' ((3,) float32)" in message
    assert_same(state.state_dict(), good)


class Position:
    """A minimal extra StateProvider (validates fully before loading)."""

    def __init__(self) -> None:
        self.step = np.array([5], np.int64)

    def state_dict(self) -> dict[str, np.ndarray]:
        return {"step": self.step.copy()}

    def load_state_dict(self, arrays: dict[str, np.ndarray]) -> None:
        if set(arrays) != {"step"}:
            raise RepairError(f"position state needs exactly 'step', got {sorted(arrays)}")
        self.step = np.array(arrays["step"], np.int64)


def test_extra_provider_entries_are_namespaced_and_loaded_all_or_nothing() -> None:
    net, opt = build()
    extra = Position()
    state = MindSporeState(net, opt, extra=extra)
    good = state.state_dict()
    assert good["__extra__/step"].tolist() == [5]
    changed = {**good, "__extra__/step": np.array([9], np.int64)}
    state.load_state_dict(changed)
    assert extra.step.tolist() == [9]
    bad_param = {**good, "0.bias": np.zeros(3, np.float32)}
    with pytest.raises(RepairError, match="'0.bias'"):
        state.load_state_dict(bad_param)
    assert extra.step.tolist() == [9]  # parameters are checked before the extra loads
    missing_extra = {k: (v + 1).astype(v.dtype) for k, v in good.items() if "extra" not in k}
    with pytest.raises(RepairError, match="needs exactly 'step'"):
        state.load_state_dict(missing_extra)
    assert_same(state.state_dict(), changed)


def test_digest_without_copies_is_the_digest_of_the_state_dict_and_follows_each_step() -> None:
    # The replica check compares these strings across ranks: the no-copy digest must be the
    # very string repair.digest gives the copied state, RNG and extra entries included.
    net, opt = build()
    state = MindSporeState(net, opt, include_rng=True, extra=Position())
    step = DataParallelStep(net, LOSS, opt, jit=True)
    seen = set()
    for s in range(3):
        assert state.digest() == digest(state.state_dict()) == state_digest(state)
        seen.add(state.digest())
        step(*batch(s))
    assert len(seen) == 3  # every step changed it


def test_state_digest_of_a_provider_without_its_own_digest() -> None:
    extra = Position()
    assert state_digest(extra) == digest({"step": np.array([5], np.int64)})
    extra.step[0] = 6
    assert state_digest(extra) == digest({"step": np.array([6], np.int64)})


def test_identity_reduce_matches_plain_mindspore_train_steps_bit_for_bit() -> None:
    (net_a, opt_a), (net_b, opt_b), (net_c, opt_c) = build(), build(), build()
    states = [MindSporeState(n, o) for n, o in ((net_a, opt_a), (net_b, opt_b), (net_c, opt_c))]
    for other in states[1:]:
        other.load_state_dict(states[0].state_dict())
    step = DataParallelStep(net_a, LOSS, opt_a, reduce_fn=lambda flat: flat, jit=True)
    one_step_cell = nn.TrainOneStepCell(nn.WithLossCell(net_b, LOSS), opt_b)
    grad_fn = ms.value_and_grad(lambda x, y: LOSS(net_c(x), y), None, opt_c.parameters)
    for s in range(4):
        x, y = batch(s)
        loss_a = step(x, y)
        loss_b = float(one_step_cell(ms.Tensor(x), ms.Tensor(y)).asnumpy())
        loss_c, grads = grad_fn(ms.Tensor(x), ms.Tensor(y))
        opt_c(grads)
        assert loss_a == loss_b == float(loss_c.asnumpy())
    assert_same(states[0].state_dict(), states[1].state_dict())
    assert_same(states[0].state_dict(), states[2].state_dict())


def test_an_interrupted_reduce_applies_nothing_and_the_step_can_be_redone() -> None:
    net, opt = build()
    state = MindSporeState(net, opt)
    calls = {"n": 0}

    def flaky(flat: np.ndarray) -> np.ndarray:
        calls["n"] += 1
        if calls["n"] == 2:
            raise Interrupted("aborted for recovery")
        return flat

    step = DataParallelStep(net, LOSS, opt, reduce_fn=flaky)
    step(*batch(0))
    committed = state.state_dict()
    with pytest.raises(Interrupted):
        step(*batch(1))
    assert_same(state.state_dict(), committed)
    step(*batch(1))  # redone after "recovery"
    redone = state.state_dict()

    state.load_state_dict(committed)  # an uninterrupted run of the same step gives the same bits
    step(*batch(1))
    assert_same(state.state_dict(), redone)
    step.reduce_fn = lambda flat: flat[:-1]
    with pytest.raises(CommError, match="must be a"):
        step(*batch(2))
    assert_same(state.state_dict(), redone)


def test_same_state_and_batches_give_the_same_bits_in_fresh_processes() -> None:
    env = {**os.environ, "GLOG_v": "3"}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", CHILD],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            env=env,
        )
        for _ in range(2)
    ]
    digests = []
    try:
        for proc in procs:
            out, _ = proc.communicate(timeout=90)
            assert proc.returncode == 0
            digests += [line.split()[1] for line in out.splitlines() if line.startswith("DIGEST")]
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    namespace: dict[str, Any] = {}
    exec(compile(CHILD, "<child>", "exec"), namespace)
    digests.append(namespace["digest_after_steps"]())
    assert len(digests) == 3 and len(set(digests)) == 1, digests


def test_a_jit_compile_failure_falls_back_to_pynative_with_the_same_bits(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def broken_jit(fn: Any) -> Any:
        def compiled(*args: Any) -> Any:
            raise TypeError("simulated graph compile failure")

        return compiled

    (net_a, opt_a), (net_b, opt_b) = build(), build()
    state_a, state_b = MindSporeState(net_a, opt_a), MindSporeState(net_b, opt_b)
    state_b.load_state_dict(state_a.state_dict())
    eager = DataParallelStep(net_b, LOSS, opt_b, jit=False)
    with monkeypatch.context() as patch:
        patch.setattr(ms, "jit", broken_jit)
        fallen = DataParallelStep(net_a, LOSS, opt_a, jit=True)
    for s in range(2):
        assert fallen(*batch(s)) == eager(*batch(s))
    assert not fallen.jit_enabled
    assert_same(state_a.state_dict(), state_b.state_dict())
    x, y = batch(0)
    wrong_batch = DataParallelStep(net_a, LOSS, opt_a, jit=True)
    with pytest.raises(Exception, match="(?i)shape|dim"):
        wrong_batch(x[:, :5], y)
    assert wrong_batch.jit_enabled  # the eager retry failed too: not blamed on jit
    assert_same(state_a.state_dict(), state_b.state_dict())


def test_device_sync_uses_the_runtime_sync_off_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    from ms_recover.mindspore.state import device_sync

    synced: list[bool] = []
    device_sync()  # CPU: only the executor queue
    monkeypatch.setattr(ms, "get_context", lambda key: "Ascend")
    monkeypatch.setattr(ms.runtime, "synchronize", lambda: synced.append(True))
    device_sync()
    assert synced == [True]
