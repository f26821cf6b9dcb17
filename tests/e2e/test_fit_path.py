"""The ``Model.train`` path (``ms_recover.mindspore.fit``) with real MindSpore.

In one process (world of 1, the real Session with a fake manager link): fit equals the
hand-written DataParallelStep loop bit for bit; re-entering ``Model.train`` after an
``Interrupted`` allreduce and after a stop latched at a step boundary (mid-epoch and on an epoch
boundary) changes neither the weights nor what callbacks see; bad input is a ConfigError naming
the valid values. Then a real 2x2 job running ``fit_train`` survives SIGKILL of a rank under
recover-in-place with weights bit-identical to an uninterrupted run, whether the rank dies after
a commit or inside the gradient allreduce, and a pre-warmed spare (``fit_warm_up``) that takes
over a killed rank compiled its graphs before it waited: its steps compile nothing.
"""

from __future__ import annotations

import importlib
import json
import os
import re
import sys
import types
from collections.abc import Callable, Iterator
from typing import Any

import mindspore
import numpy as np
import pytest
from mindspore import nn
from mindspore.amp import FixedLossScaleManager
from mindspore.train import Callback, Model

from ms_recover.comm.local import LocalBackend
from ms_recover.config import JobConfig
from ms_recover.errors import ConfigError, Interrupted
from ms_recover.localrun.faults import Faults
from ms_recover.localrun.job import LocalJob
from ms_recover.mindspore.fit import fit, fit_warm_up
from ms_recover.mindspore.programs.demo_train import CLASSES, GLOBAL_BATCH, IN_DIM, SEED, build
from ms_recover.mindspore.sharded import ShardedArrays
from ms_recover.mindspore.state import MindSporeState
from ms_recover.mindspore.step import DataParallelStep
from ms_recover.protocol import messages as M
from ms_recover.strategy import parse_strategies
from ms_recover.worker.repair import sha256_of
from ms_recover.worker.sampler import make_dataset, shard_indices
from ms_recover.worker.session import Session
from tests import kit
from tests.kit.fit_train import StepRecorder, compiled_graphs
from tests.kit.floats import bit_diff

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]
fit_module = importlib.import_module("ms_recover.mindspore.fit")  # the package exports fit()
SAMPLES, EPOCHS = 512, 3  # 8 steps per epoch with GLOBAL_BATCH 64
STEPS = EPOCHS * SAMPLES // GLOBAL_BATCH


# ---------------------------------------------------------------------- one process
class FakeLink:
    """Stands in for ManagerLink: after chosen commits, latches a recovery in the order a
    manager sends it (STOP, REBUILD, REPAIR with nothing to copy, RESUME at the next step)."""

    def __init__(self, session: Session, latch_after: set[int]) -> None:
        self.session, self.latch_after, self.committed = session, set(latch_after), -1
        self.sent: list[M.Message] = []
        self.epoch = 0
        self.queue: list[M.Message] = []

    def send(self, msg: M.Message, epoch: int | None = None) -> None:
        self.sent.append(msg)

    def has_command(self) -> bool:
        return self.committed in self.latch_after

    def next_command(self, timeout_s: float) -> Any:
        if not self.queue:
            self.latch_after.discard(self.committed)
            self.epoch += 1
            step = self.committed
            self.queue = [
                M.Stop("test"),
                M.Rebuild([[0, 0]], {0: "local"}, True, []),
                M.Repair(step, 0, [], -1),
                M.Resume(step + 1),
            ]
        return types.SimpleNamespace(epoch=self.epoch, msg=self.queue.pop(0))


@pytest.fixture(scope="module")
def pynative() -> Iterator[dict[str, np.ndarray]]:
    """PyNative CPU, and the initial state every in-process run starts from."""
    mindspore.set_context(mode=mindspore.PYNATIVE_MODE, device_target="CPU")
    net, _, optimizer = build()
    yield MindSporeState(net, optimizer).state_dict()


def _fresh(init: dict[str, np.ndarray]) -> tuple[nn.Cell, nn.Cell, nn.Optimizer]:
    net, loss_fn, optimizer = build()
    MindSporeState(net, optimizer).load_state_dict(init)
    return net, loss_fn, optimizer


def _session(
    state: MindSporeState, interrupt_at: int = -1, latch_after: set[int] | None = None
) -> Session:
    session = Session(JobConfig(), 0, LocalBackend(), state, standalone=True)
    session.connect()
    if latch_after:
        session.link = FakeLink(session, latch_after)  # type: ignore[assignment]
    real, fired = session.allreduce, []

    def allreduce(flat: np.ndarray, op: str) -> np.ndarray:
        if session.next_step == interrupt_at and not fired:
            fired.append(interrupt_at)
            raise Interrupted(f"test: recovery interrupts step {interrupt_at}")
        return real(flat, op)

    session.allreduce = allreduce  # type: ignore[method-assign]
    return session


def _data() -> ShardedArrays:
    x, y = make_dataset(SAMPLES, IN_DIM, CLASSES, SEED)
    return ShardedArrays(x, y, global_batch=GLOBAL_BATCH, seed=SEED)


def _fit(
    init: dict[str, np.ndarray],
    dataset: Callable[..., Any] | None = None,
    warm_up: bool = False,
    **faults: Any,
) -> dict[str, Any]:
    net, loss_fn, optimizer = _fresh(init)
    state = MindSporeState(net, optimizer)
    model, data = Model(net, loss_fn=loss_fn, optimizer=optimizer), dataset or _data()
    warmed: dict[str, Any] = {}
    if warm_up:  # what a spare does in init(), before it waits for a rank
        with_rng = MindSporeState(net, optimizer, include_rng=True)
        before, graphs = with_rng.state_dict(), compiled_graphs()
        fit_warm_up(model, data)()
        warmed["compiled"] = compiled_graphs() - graphs
        assert bit_diff(with_rng.state_dict(), before) == []
    session = _session(state, **faults)
    recorder = StepRecorder()
    result = fit(model, EPOCHS, data, callbacks=[recorder], session=session)
    return {
        "sha": sha256_of(state.state_dict()),
        "result": result,
        "losses": recorder.losses,
        "view": recorder.view,
        "recoveries": session.recoveries,
        "graphs": recorder.graphs,
        "warmed": warmed,
    }


@pytest.fixture(scope="module")
def uninterrupted(pynative: dict[str, np.ndarray]) -> dict[str, Any]:
    return _fit(pynative)


def test_fit_is_bit_identical_to_the_custom_loop(pynative, uninterrupted):
    net, loss_fn, optimizer = _fresh(pynative)
    step = DataParallelStep(net, loss_fn, optimizer)
    x, y = make_dataset(SAMPLES, IN_DIM, CLASSES, SEED)
    losses = {}
    for s in range(STEPS):
        idx = shard_indices(s, 0, 1, GLOBAL_BATCH, SAMPLES, SEED)
        losses[s] = step(x[idx], y[idx])
    assert sha256_of(MindSporeState(net, optimizer).state_dict()) == uninterrupted["sha"]
    assert losses == uninterrupted["losses"]
    assert uninterrupted["result"].committed == STEPS - 1
    assert uninterrupted["result"].segments == 1
    # cb_params as an uninterrupted Model.train shows them: (cur_epoch_num, cur_step_num).
    assert uninterrupted["view"][0] == (1, 1) and uninterrupted["view"][8] == (2, 9)


def test_reentry_after_interrupt_and_stops_is_bit_identical(pynative, uninterrupted):
    # Interrupted inside step 5's allreduce; stops latched after step 11 (resume mid-epoch 1 at
    # step 12) and after step 15 (resume at step 16, the first step of epoch 2).
    run = _fit(pynative, interrupt_at=5, latch_after={11, 15})
    assert run["sha"] == uninterrupted["sha"]
    assert run["losses"] == uninterrupted["losses"]
    assert run["view"] == uninterrupted["view"]
    assert run["result"].segments == 4 and run["result"].committed == STEPS - 1
    assert run["recoveries"] == 2


def test_a_dataset_out_of_position_is_caught(pynative):
    data = _data()

    def always_epoch_0(first_epoch: int, rank: int, world: int) -> Any:
        return data(0, rank, world)

    with pytest.raises(ConfigError, match="batch of step 4 to step 12"):
        _fit(pynative, dataset=always_epoch_0, latch_after={11})


def test_a_warm_up_ahead_changes_nothing_and_fit_then_compiles_no_graph(pynative, uninterrupted):
    # fit_warm_up in a spare: fit's train cell compiled on the first batch, every value (RNG
    # included) restored bit for bit (asserted in _fit); fit trains with that cell, so no
    # step compiles, and the warm-up's own Dataset left fit's data at step 0 (else the
    # step column check raises) with the uninterrupted run's bits.
    run = _fit(pynative, warm_up=True)
    assert run["warmed"]["compiled"] == 2  # forward/backward and the optimizer update
    assert set(run["graphs"].values()) == {run["graphs"]["at_start"]}
    assert uninterrupted["graphs"]["after_first_step"] - uninterrupted["graphs"]["at_start"] == 2
    assert run["sha"] == uninterrupted["sha"]
    assert run["losses"] == uninterrupted["losses"] and run["view"] == uninterrupted["view"]


def test_fit_that_builds_its_session_gives_init_a_warm_up(pynative, uninterrupted, monkeypatch):
    # ms_recover.init runs warm_up only in a spare; this stand-in init runs it as a spare would.
    net, loss_fn, optimizer = _fresh(pynative)

    def spare_init(state: MindSporeState, warm_up: Callable[[], object]) -> Session:
        warm_up()
        return _session(state)

    monkeypatch.setattr(fit_module, "init", spare_init)
    recorder = StepRecorder()
    fit(Model(net, loss_fn=loss_fn, optimizer=optimizer), EPOCHS, _data(), callbacks=recorder)
    assert set(recorder.graphs.values()) == {recorder.graphs["at_start"]}
    assert sha256_of(MindSporeState(net, optimizer).state_dict()) == uninterrupted["sha"]


def test_fit_warm_up_rejects_what_fit_rejects(pynative):
    net, loss_fn, optimizer = _fresh(pynative)
    model = Model(net, loss_fn=loss_fn, optimizer=optimizer)
    with pytest.raises(ConfigError, match="dataset must be a function"):
        fit_warm_up(model, _data()(0, 0, 1))
    with pytest.raises(ConfigError, match=r"dataset\(0, 0, 1\) must return a mindspore.dataset"):
        fit_warm_up(model, lambda first_epoch, rank, world: [1, 2])()


class StopAt(Callback):
    """A user callback: checks what cb_params holds, and stops training after step ``at``."""

    def __init__(self, at: int, net: nn.Cell, optimizer: nn.Optimizer) -> None:
        self.at, self.net, self.optimizer = at, net, optimizer

    def on_train_step_end(self, run_context: Any) -> None:
        params = run_context.original_args()
        assert params.network is self.net and params.optimizer is self.optimizer
        if params.cur_step_num - 1 == self.at:
            run_context.request_stop()


def test_a_callback_stop_ends_fit_and_fit_can_own_the_session(pynative):
    net, loss_fn, optimizer = _fresh(pynative)
    model = Model(net, loss_fn=loss_fn, optimizer=optimizer)
    with pytest.warns(RuntimeWarning, match="single-process job"):  # no agent: standalone
        result = fit(model, EPOCHS, _data(), callbacks=StopAt(10, net, optimizer))
    assert result.stopped_by_callback and result.committed == 10 and result.segments == 1


@pytest.mark.parametrize(
    "change, message",
    [
        ({"dataset_sink_mode": True}, "dataset_sink_mode must be False"),
        ({"sink_size": 4}, "sink_size must be -1"),
        ({"epochs": 0}, "epochs must be a positive integer"),
        ({"dataset": "fixed"}, "dataset must be a function"),
        ({"model": "no-optimizer"}, "Model(net, loss_fn=..., optimizer=...)"),
        ({"model": "loss-scale"}, "loss_scale_manager must be None"),
        ({"mode": mindspore.GRAPH_MODE}, "mindspore.PYNATIVE_MODE"),
    ],
    ids=["sink", "sink_size", "epochs", "fixed-dataset", "no-optimizer", "loss-scale", "graph"],
)
def test_bad_input_is_a_config_error_naming_valid_values(pynative, change, message):
    change = dict(change)
    net, loss_fn, optimizer = _fresh(pynative)
    kind = change.pop("model", "")
    # (amp_level "O1" would be rejected the same way, but MindSpore's rewrite then leaves
    # generated files in the working directory.)
    if kind == "no-optimizer":
        model = Model(net, loss_fn=loss_fn)
    elif kind == "loss-scale":
        model = Model(
            net,
            loss_fn=loss_fn,
            optimizer=optimizer,
            loss_scale_manager=FixedLossScaleManager(1024.0, False),
        )
    else:
        model = Model(net, loss_fn=loss_fn, optimizer=optimizer)
    args: dict[str, Any] = {"epochs": 1, "dataset": _data()}
    if change.get("dataset") == "fixed":
        change["dataset"] = args["dataset"](0, 0, 1)
    mode = change.pop("mode", mindspore.PYNATIVE_MODE)
    mindspore.set_context(mode=mode)
    try:
        with pytest.raises(ConfigError, match=re.escape(message)):
            fit(model, **{**args, **change}, session=_session(MindSporeState(net, optimizer)))
    finally:
        mindspore.set_context(mode=mindspore.PYNATIVE_MODE)


# ---------------------------------------------------------------------- a real 2x2 job
def _job(out: str, faults: Faults | None, spares: int = 0) -> LocalJob:
    config = JobConfig(
        job_id="e2e-fit",
        node_nums=2,
        proc_per_node=2,
        strategies=parse_strategies("recover-in-place,exit"),
        wait_reschedule_timeout_s=60.0,
    )
    command = [
        sys.executable,
        "-m",
        "tests.kit.fit_train",
        "--epochs",
        str(EPOCHS),
        "--samples",
        str(SAMPLES),
        "--out",
        out,
    ]
    return LocalJob(
        config,
        command,
        {
            **(faults.to_env() if faults else {}),
            "PYTHONPATH": kit.pythonpath(os.environ.get("PYTHONPATH", "")),
        },
        log_dir=os.path.join(out, "logs"),
        spares=spares,
    )


def _records(out: str) -> list[dict[str, Any]]:
    records = []
    for rank in range(4):
        with open(os.path.join(out, f"rank_{rank}.json")) as fh:
            records.append(json.load(fh))
        assert records[-1]["committed"] == STEPS - 1
    return records


@pytest.fixture(scope="module")
def job_reference(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    out = str(tmp_path_factory.mktemp("fit-reference"))
    with _job(out, None) as job:
        assert job.wait(240), job.status()
        assert job.exit_code == 0
    records = _records(out)
    assert len({r["sha256"] for r in records}) == 1
    return records


@pytest.mark.parametrize(
    "faults, targets",
    [
        # SIGKILL right after rank 1 committed step 9: the others are interrupted in step 10's
        # allreduce; everyone re-enters Model.train mid-epoch 1, at step 10.
        (Faults().kill(rank=1, step=9), (9,)),
        # SIGKILL inside step 8's allreduce, after rank 1's first send. Four ranks reduce the
        # small gradient by recursive doubling: if that send reached rank 0 before the kill,
        # ranks 0 and 2 finish step 8 (they hold every contribution) and rank 3, which waited
        # for rank 1, gets it by repair (target 8); otherwise step 8 is committed nowhere and
        # is redone (target 7, the re-entry on an epoch boundary: step 8 begins epoch 1).
        # Rank 1's last frame of step 7 may also not have left it (ZeroMQ sends from its own
        # thread): then rank 3 never completes step 7, and if ranks 0 and 2 are interrupted
        # before they do, the target is 6 (the numpy twin in test_end_of_training saw it).
        (Faults().in_allreduce(rank=1, step=8), (6, 7, 8)),
    ],
    ids=["kill-after-commit", "kill-in-allreduce"],
)
def test_sigkill_under_fit_recovers_in_place_bit_identical(
    tmp_path, job_reference, faults, targets
):
    out = str(tmp_path)
    with _job(out, faults) as job:
        assert job.wait(240), job.status()
        assert job.exit_code == 0
        recovery = job.find("recovery", ok=True)[-1]
    assert recovery["strategy"] == "recover-in-place" and recovery["lost_steps"] == 0
    target = recovery["target_step"]
    assert recovery["replaced"] == [1] and target in targets
    resume = target + 1
    records = _records(out)
    assert [r["sha256"] for r in records] == [job_reference[0]["sha256"]] * 4
    restarted = records[1]
    assert restarted["incarnation"] == 1 and restarted["segments"] == 1
    # The restarted rank entered Model.train at the resume step, and its callbacks saw
    # exactly what rank 1's callbacks saw in the uninterrupted run from there on.
    assert min(int(s) for s in restarted["view"]) == resume
    assert all(restarted["view"][s] == job_reference[1]["view"][s] for s in restarted["view"])
    assert restarted["skipped"] == [[0, target]]
    for survivor in (records[0], records[2], records[3]):
        assert survivor["segments"] == 2 and survivor["recoveries"] == 1
        # A survivor interrupted in the target step while rank 1 committed it received that
        # step by repair (ZeroMQ had not flushed rank 1's last ring chunks when it was killed):
        # its callbacks never saw it. Every step it ran matches the uninterrupted run.
        assert survivor["skipped"] in ([], [[target, target]])
        reference = job_reference[survivor["rank"]]
        ran = {str(s) for s in range(STEPS)} - {
            str(s) for a, b in survivor["skipped"] for s in range(a, b + 1)
        }
        assert survivor["losses"] == {s: reference["losses"][s] for s in ran}
        assert survivor["view"] == {s: reference["view"][s] for s in ran}


def test_a_prewarmed_fit_spare_takes_over_compiled_and_bit_identical(tmp_path, job_reference):
    out = str(tmp_path)
    with _job(out, Faults().kill(rank=2, step=9), spares=1) as job:
        assert job.wait(240), job.status()
        assert job.exit_code == 0
        recovery = job.find("recovery", ok=True)[-1]
    assert recovery["strategy"] == "recover-in-place" and recovery["replaced"] == [2]
    records = _records(out)
    assert [r["sha256"] for r in records] == [job_reference[0]["sha256"]] * 4
    # A rank started cold compiles its two graphs in its first step; the spare had compiled
    # them in init()'s warm-up before it waited, and compiled nothing from its first step on.
    assert job_reference[2]["graphs"] == {"at_start": 0, "after_first_step": 2, "at_end": 2}
    spare = records[2]
    assert spare["incarnation"] == 1
    assert spare["graphs"] == {"at_start": 2, "after_first_step": 2, "at_end": 2}
