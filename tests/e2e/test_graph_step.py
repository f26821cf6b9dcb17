"""GraphStep (one compiled graph, the reduction in it) against DataParallelStep, real MindSpore.

Same bits as DataParallelStep with the same reduction; a reduction that fails leaves every
parameter and optimizer entry unchanged, surfaces as its own exception type, and the same
step object runs the step again afterwards; PyNative (jit) in this process, GRAPH_MODE in a
fresh child process (the mode is per process).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

ms = pytest.importorskip("mindspore")
nn = ms.nn

from ms_recover.errors import CommError, Interrupted, MsRecoverError  # noqa: E402
from ms_recover.mindspore.graphstep import GraphStep  # noqa: E402
from ms_recover.mindspore.state import MindSporeState  # noqa: E402
from ms_recover.mindspore.step import DataParallelStep  # noqa: E402
from tests.e2e.graph_step_case import batch, build, scaled  # noqa: E402

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

CHILD = """
import json
import sys
import mindspore as ms
import numpy as np
from ms_recover.mindspore.state import MindSporeState
from tests.e2e.graph_step_case import batch, build, scaled
ms.set_context(mode=ms.GRAPH_MODE, device_target="CPU")
from ms_recover.errors import Interrupted
from ms_recover.mindspore.graphstep import GraphStep
net, loss_fn, opt = build()
step = GraphStep(net, loss_fn, opt, reduce_fn=scaled, on_failure=sys.argv[1])
losses = [step(*batch(s)) for s in range(5)]
cell = step._cell
before = MindSporeState(net, opt).state_dict()
def fail(flat):
    raise Interrupted("recovery in progress")
step.reduce_fn = fail
try:
    step(*batch(5))
    raised = None
except Interrupted as exc:
    raised = type(exc).__name__
after = MindSporeState(net, opt).state_dict()
unchanged = all(np.array_equal(before[k], after[k]) for k in before)
step.reduce_fn = scaled
losses += [step(*batch(s)) for s in range(5, 8)]
final = {k: v.tolist() for k, v in MindSporeState(net, opt).state_dict().items()}
print("RESULT " + json.dumps({"raised": raised, "unchanged": unchanged, "losses": losses,
                               "final": final, "same_graph": step._cell is cell}))
"""


def reference(steps: int) -> tuple[list[float], dict[str, np.ndarray]]:
    net, loss_fn, opt = build()
    step = DataParallelStep(net, loss_fn, opt, reduce_fn=scaled)
    losses = [step(*batch(s)) for s in range(steps)]
    return losses, MindSporeState(net, opt).state_dict()


def assert_same(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> None:
    assert list(a) == list(b)
    for name in a:
        assert a[name].dtype == b[name].dtype and np.array_equal(a[name], b[name]), name


def test_same_losses_and_bits_as_data_parallel_step() -> None:
    ref_losses, ref_state = reference(8)
    net, loss_fn, opt = build()
    step = GraphStep(net, loss_fn, opt, reduce_fn=scaled)
    try:
        losses = [step(*batch(s)) for s in range(8)]
    finally:
        step.close()
    assert losses == ref_losses
    assert_same(MindSporeState(net, opt).state_dict(), ref_state)


def test_warm_up_ahead_changes_nothing_and_the_first_step_compiles_no_new_graph(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # What a pre-warmed spare does before it waits: build and compile on a batch of the right
    # shape. The state (RNG included) is untouched, and the later steps give the reference's
    # bits without building another graph.
    ref_losses, ref_state = reference(3)
    net, loss_fn, opt = build()
    state = MindSporeState(net, opt, include_rng=True)
    step = GraphStep(net, loss_fn, opt, reduce_fn=scaled)
    try:
        before = state.state_dict()
        step.warm_up(*batch(5))
        assert_same(state.state_dict(), before)
        cell, warm_ups = step._cell, []
        monkeypatch.setattr(step, "_warm_up", lambda *a: warm_ups.append(a))
        losses = [step(*batch(s)) for s in range(3)]
        assert step._cell is cell and warm_ups == []
    finally:
        step.close()
    assert losses == ref_losses
    assert_same(MindSporeState(net, opt).state_dict(), ref_state)


@pytest.mark.parametrize("error", [Interrupted("recovery in progress"), CommError("peer gone")])
def test_a_failed_reduction_applies_nothing_raises_its_own_type_and_the_step_reruns(
    error: Exception,
) -> None:
    ref_losses, ref_state = reference(6)
    net, loss_fn, opt = build()
    step = GraphStep(net, loss_fn, opt, reduce_fn=scaled)
    calls: list[int] = []
    try:
        losses = [step(*batch(s)) for s in range(3)]
        before = MindSporeState(net, opt).state_dict()
        assert {"beta1_power", "beta2_power", "global_step"} <= set(before)

        def fail(flat: np.ndarray) -> np.ndarray:
            calls.append(flat.size)
            raise error

        step.reduce_fn = fail
        for _ in range(2):  # a failure twice in a row: each time nothing applied
            with pytest.raises(type(error)) as got:
                step(*batch(3))
            assert got.value is error
            assert_same(MindSporeState(net, opt).state_dict(), before)
        assert calls == [step.num_elements] * 2  # the reduction ran, once per attempt
        step.reduce_fn = scaled
        losses += [step(*batch(s)) for s in range(3, 6)]
    finally:
        step.close()
    assert losses == ref_losses
    assert_same(MindSporeState(net, opt).state_dict(), ref_state)


def test_a_reduction_returning_the_wrong_buffer_is_a_comm_error_and_applies_nothing() -> None:
    net, loss_fn, opt = build()
    step = GraphStep(net, loss_fn, opt, reduce_fn=lambda flat: flat[:-1].copy())
    try:
        before = MindSporeState(net, opt).state_dict()
        with pytest.raises(CommError, match="float32 array"):
            step(*batch(0))
        assert_same(MindSporeState(net, opt).state_dict(), before)
    finally:
        step.close()


def test_an_unknown_on_failure_is_refused_naming_the_valid_values() -> None:
    with pytest.raises(MsRecoverError, match=r"on_failure='retry'; valid: abort, skip"):
        GraphStep(*build(), on_failure="retry")


def test_non_float32_parameters_are_refused_by_name() -> None:
    ms.set_seed(1)
    net = nn.Dense(4, 2).to_float(ms.float16)
    for p in net.trainable_params():
        p.set_dtype(ms.float16)
    opt = nn.SGD(net.trainable_params(), 0.1)
    with pytest.raises(MsRecoverError, match=r"float32 gradients only.*weight"):
        GraphStep(net, nn.MSELoss(), opt)


@pytest.mark.parametrize("on_failure", ["abort", "skip"])
def test_graph_mode_in_a_fresh_process_matches_and_survives_a_failed_reduction(
    on_failure: str,
) -> None:
    ref_losses, ref_state = reference(8)
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = dict(os.environ, PYTHONPATH=repo + os.pathsep + os.environ.get("PYTHONPATH", ""))
    done = subprocess.run(
        [sys.executable, "-c", CHILD, on_failure],
        capture_output=True,
        text=True,
        timeout=150,
        env=env,
    )
    line = next((x for x in done.stdout.splitlines() if x.startswith("RESULT ")), None)
    assert done.returncode == 0 and line is not None, done.stderr[-3000:]
    got = json.loads(line[len("RESULT ") :])
    assert got["raised"] == "Interrupted" and got["unchanged"] is True
    # "skip": the graph branched around the optimizer and runs on; "abort": it was rebuilt.
    assert got["same_graph"] is (on_failure == "skip")
    assert got["losses"] == ref_losses
    final = {k: np.asarray(v, dtype=ref_state[k].dtype) for k, v in got["final"].items()}
    assert_same(final, ref_state)


def _scale_in_place(flat: np.ndarray) -> np.ndarray:
    np.multiply(flat, np.float32(0.75), out=flat)  # the same bits as scaled(), in the op's buffer
    return flat


@pytest.mark.parametrize(
    ("fail_on", "on_failure"), [("first", "abort"), ("last", "abort"), ("last", "skip")]
)
def test_in_place_buckets_give_the_same_bits_and_a_failure_on_any_bucket_applies_nothing(
    fail_on: str, on_failure: str
) -> None:
    ref_losses, ref_state = reference(5)
    net, loss_fn, opt = build()
    # 2 KB: the first layer's weight (16x32) is reduced in its own buffer, the rest is staged.
    step = GraphStep(
        net, loss_fn, opt, reduce_fn=_scale_in_place, inplace_bytes=2048, on_failure=on_failure
    )
    assert [(b.members, b.inplace) for b in step.buckets] == [((0,), True), ((1, 2, 3), False)]
    calls: list[int] = []

    def fail(flat: np.ndarray) -> np.ndarray:
        calls.append(flat.size)
        if len(calls) == (1 if fail_on == "first" else len(step.buckets)):
            raise CommError("peer gone")
        return _scale_in_place(flat)  # the buckets before the failing one: reduced in place

    try:
        losses = [step(*batch(s)) for s in range(3)]
        before = MindSporeState(net, opt).state_dict()
        step.reduce_fn = fail
        with pytest.raises(CommError, match="peer gone"):
            step(*batch(3))
        assert calls == [512, 164][: len(calls)] and len(calls) == (1 if fail_on == "first" else 2)
        assert_same(MindSporeState(net, opt).state_dict(), before)
        step.reduce_fn = _scale_in_place
        losses += [step(*batch(s)) for s in range(3, 5)]
    finally:
        step.close()
    assert losses == ref_losses
    assert_same(MindSporeState(net, opt).state_dict(), ref_state)


def test_host_allreduce_into_each_bucket_same_bits_and_an_abort_applies_nothing() -> None:
    # What GraphStep runs under a session: each bucket reduced with out= itself, so at one
    # rank nothing is copied and the op writes nothing back (the reduce returns the bucket).
    from ms_recover.comm.host.backend import HostBackend

    ref_losses, ref_state = reference(5)
    comm = HostBackend(0, 1)
    comm.init(1, {0: comm.endpoint})
    net, loss_fn, opt = build()
    same: list[bool] = []

    def reduce(flat: np.ndarray) -> np.ndarray:
        got = comm.allreduce(flat, "mean", out=flat)
        same.append(got is flat)
        return _scale_in_place(got)

    step = GraphStep(net, loss_fn, opt, reduce_fn=reduce, inplace_bytes=2048)
    try:
        losses = [step(*batch(s)) for s in range(3)]
        assert same == [True] * 2 * 3  # two buckets a step, each reduced where it lies
        before = MindSporeState(net, opt).state_dict()
        comm.abort()
        with pytest.raises(Interrupted):
            step(*batch(3))
        assert_same(MindSporeState(net, opt).state_dict(), before)
        comm.rebuild(2, {0: comm.endpoint}, comm.group_log)
        losses += [step(*batch(s)) for s in range(3, 5)]
    finally:
        step.close()
        comm.close()
    assert losses == ref_losses
    assert_same(MindSporeState(net, opt).state_dict(), ref_state)
