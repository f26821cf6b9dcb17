"""``fit()``: ``Model.train`` with recovery, for users of MindSpore's high-level training API.

Replace ``model.train(epochs, dataset, callbacks)`` with::

    from ms_recover.mindspore import MindSporeState, ShardedArrays, fit, fit_warm_up

    net, loss_fn, optimizer = ...
    model = mindspore.train.Model(net, loss_fn=loss_fn, optimizer=optimizer)
    data = ShardedArrays(x, y, global_batch=64, seed=1234)  # (first_epoch, rank, world)
    session = ms_recover.init(
        state=MindSporeState(net, optimizer), warm_up=fit_warm_up(model, data)
    )
    fit(model, epochs, data, callbacks=[LossMonitor()], session=session)
    session.finish()

``warm_up`` runs only in a pre-warmed spare (``ms-recover agent --spares N``): it compiles
``fit``'s train cell there before the spare waits, and ``fit`` trains with that cell, so a spare
that takes over a rank compiles nothing (:mod:`ms_recover.mindspore.fitwarm`). ``fit`` passes
it itself when it builds the session.

``fit`` runs ``Model.train`` on a train network of its own, :class:`DataParallelTrainCell`:
forward, backward and the optimizer update stay MindSpore's (jit-compiled,
:class:`~ms_recover.mindspore.step.DataParallelStep`), and the gradients are averaged by
ms_recover's active ``CommBackend`` (``session.allreduce(flat, "mean")``), never by MindSpore's
collectives, which cannot be rebuilt on CPU. A callback commits each finished step
(``session.commit``) and, when the manager has latched a command, requests a stop at that step
boundary. ``fit`` then runs the session's safe point (stop, rebuild, repair, resume) and enters
``Model.train`` again at the resume step ``session.next_step``, as MindSpore's own fault-tolerance
wrapper (``mindspore.train.model._handle_tft``) does: ``initial_epoch = step // steps_per_epoch``
and the dataset's ``set_init_step(step % steps_per_epoch)`` skips the finished part of that epoch.
A step interrupted inside its allreduce (``Interrupted``) has changed no state and is not
committed; ``Model.train`` unwinds and the step is redone after recovery.

Guarantees: a rank commits each step at most once and in order, never one whose allreduce was
interrupted, and ``fit`` returns with ``session.committed == epochs * steps_per_epoch - 1``
(unless another callback stopped training). With the same world size and seed, a recovered run
ends with weights bit-identical to an uninterrupted one, and to the hand-written
``DataParallelStep`` loop over the same batches (the batch of a step is a pure function of
(step, rank, world)).

Constraints:

* **PyNative mode only.** The train step runs Python (the host allreduce) between MindSpore's
  two compiled phases; a whole-graph (``GRAPH_MODE``) build cannot contain it. The two phases
  are still ``mindspore.jit``-compiled.
* **No dataset sinking**: ``dataset_sink_mode`` must be False and ``sink_size`` -1. A sink runs
  many steps per call, so gradients could not be reduced, nor steps committed, one by one.
* **Stand-alone parallel mode** (no ``mindspore.communication.init``), and a
  ``Model(net, loss_fn=..., optimizer=...)`` with ``amp_level="O0"``, ``boost_level="O0"`` and no
  ``loss_scale_manager``: ``fit`` builds its own train step from those three pieces and would
  otherwise silently drop the rest.
* **A step** is one batch of the dataset: forward, backward, allreduce and optimizer update.
  Step numbers are global and 0-based; epoch ``e`` holds steps ``e*spe .. (e+1)*spe - 1``, where
  ``spe`` is ``dataset(...).get_dataset_size()``.
* **The dataset** is a function ``dataset(first_epoch, rank, world) -> mindspore.dataset.Dataset``
  whose k-th pass yields the whole epoch ``first_epoch + k`` for that rank, deterministically.
  A rank that joins mid-run may call it once more with ``first_epoch=0`` only to read ``spe``.
  :class:`~ms_recover.mindspore.sharded.ShardedArrays` is one over in-memory arrays, using
  :func:`~ms_recover.worker.sampler.shard_indices`. The skipped part of a resumed epoch is read
  and dropped by MindSpore's pipeline, as in MindSpore's own resume. A ``GeneratorDataset``
  source cannot ask MindSpore which epoch a pass is for, so it counts passes; it must count a
  pass at its first batch, not at ``iter()`` (see :class:`_EpochSource`). If the dataset's last
  column is :data:`STEP_COLUMN` (``ShardedArrays`` adds it), each batch's step is checked
  against the step being run, and a dataset out of position is a ConfigError instead of a
  silently different model; the column is stripped before the network sees the batch, but
  callbacks see it in ``cb_params.train_dataset_element``.
* **What callbacks see.** Each entry into ``Model.train`` is a *segment*: callbacks get
  ``on_train_begin`` / ``on_train_end`` once per segment. ``cb_params.cur_step_num`` and
  ``cur_epoch_num`` are global, as in an uninterrupted run (the step in progress is
  ``cur_step_num - 1``), ``batch_num`` is ``spe``, and ``network`` / ``optimizer`` /
  ``loss_fn`` are the user's (``train_network`` is the :class:`DataParallelTrainCell`). A segment
  stopped for recovery at a step boundary ends its partial epoch with ``on_train_epoch_end``; a
  segment unwound by ``Interrupted`` gets no further hook (only each callback's ``__exit__``;
  note that ``ModelCheckpoint`` with ``exception_save=True`` then writes a breakpoint file, as
  for any exception); the resumed segment begins that epoch again with
  ``on_train_epoch_begin``. A rank whose step ``s`` was interrupted while a peer committed it
  receives step ``s``'s state by repair and resumes at ``s + 1``: its callbacks never see step
  ``s`` (``session.skipped`` lists it), though its weights are the same bits as everyone's.
  A stop requested by another callback ends ``fit`` on this rank (in
  data-parallel training every rank must make the same decision). MindSpore's
  ``TrainFaultTolerance`` cannot be combined with ``fit``.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from typing import Any

import mindspore
import mindspore.dataset as msds
from mindspore import Tensor, nn
from mindspore.train import Callback, Model, RunContext, TrainFaultTolerance

from ms_recover.config import JobConfig
from ms_recover.errors import ConfigError, Interrupted
from ms_recover.mindspore.fitwarm import PreparedCells, first_batch
from ms_recover.mindspore.sharded import STEP_COLUMN, DatasetFn
from ms_recover.mindspore.state import MindSporeState
from ms_recover.mindspore.step import DataParallelStep, FlatGrads, ReduceFn
from ms_recover.worker.bootstrap import init
from ms_recover.worker.session import Session

log = logging.getLogger(__name__)

_PREPARED = PreparedCells()  # train cells a spare compiled ahead (fit_warm_up), by Model


@dataclasses.dataclass(frozen=True)
class FitResult:
    """What :func:`fit` did on this rank."""

    committed: int  # last committed global step
    total_steps: int  # epochs * steps_per_epoch
    steps_per_epoch: int
    segments: int  # entries into Model.train (1 + one per re-entry)
    stopped_by_callback: bool  # another callback requested the stop


class DataParallelTrainCell(nn.Cell):  # type: ignore[misc]
    """``Model``'s train network: each call runs one :class:`DataParallelStep`, returns the loss.

    Gradients are reduced by ``reduce_fn`` (outside MindSpore). If it raises, nothing was
    applied. Parameter names are unchanged (``auto_prefix=False``), and the cell is in training
    mode, as ``nn.TrainOneStepCell`` would be. When ``expected_step`` is set, the batch's last
    column is its global step (:data:`STEP_COLUMN`): it must equal ``expected_step()`` (else
    ConfigError, before anything runs) and is stripped.
    """

    def __init__(
        self,
        net: nn.Cell,
        loss_fn: nn.Cell,
        optimizer: nn.Optimizer,
        reduce_fn: ReduceFn,
        jit: bool = True,
    ) -> None:
        super().__init__(auto_prefix=False)
        self.network = net
        self.optimizer = optimizer
        self.dp_step = DataParallelStep(net, loss_fn, optimizer, reduce_fn=reduce_fn, jit=jit)
        self.expected_step: Callable[[], int] | None = None
        self.set_train(True)

    def construct(self, *batch: Any) -> Tensor:
        if self.expected_step is not None:
            got, want = int(batch[-1].asnumpy()), self.expected_step()
            if got != want:
                raise ConfigError(
                    f"data out of position: the dataset gave the batch of step {got} to step {want}"
                )
            batch = batch[:-1]
        return Tensor(self.dp_step(*batch), mindspore.float32)


@dataclasses.dataclass
class _Segment:
    """One entry into ``Model.train``, shared by its two callbacks."""

    session: Session
    start: int
    spe: int
    parts: tuple[nn.Cell, nn.Cell, nn.Optimizer]
    recover: bool = False
    stopped_by_callback: bool = False


class _Position(Callback):  # type: ignore[misc]
    """First callback: makes ``cb_params`` global (step, epoch) and the user's cells."""

    def __init__(self, seg: _Segment) -> None:
        self.seg = seg

    def on_train_begin(self, run_context: RunContext) -> None:
        params = run_context.original_args()
        params.cur_step_num = self.seg.start
        params.network, params.loss_fn, params.optimizer = self.seg.parts


class _Commit(Callback):  # type: ignore[misc]
    """Last callback: commits each step, then stops at the boundary if recovery is pending."""

    def __init__(self, seg: _Segment) -> None:
        self.seg = seg

    def on_train_step_end(self, run_context: RunContext) -> None:
        session = self.seg.session
        if run_context.get_stop_requested():
            self.seg.stopped_by_callback = True
        session.commit(session.next_step)
        if session.link is not None and session.link.has_command():
            self.seg.recover = True
            run_context.request_stop()

    def on_train_epoch_end(self, run_context: RunContext) -> None:
        if run_context.get_stop_requested():
            return
        epoch = run_context.original_args().cur_epoch_num
        if self.seg.session.next_step != epoch * self.seg.spe:
            raise ConfigError(
                f"the dataset's pass for epoch {epoch - 1} ended at step "
                f"{self.seg.session.next_step}, expected {epoch * self.seg.spe}: every pass must "
                f"yield get_dataset_size() = {self.seg.spe} batches"
            )


def _check_settings(epochs: int, dataset: Any, sink: bool, sink_size: int) -> None:
    mode = mindspore.get_context("mode")
    if mode != mindspore.PYNATIVE_MODE:
        raise ConfigError(
            f"fit() needs PyNative mode, got mode {mode} (GRAPH_MODE); valid: "
            "mindspore.set_context(mode=mindspore.PYNATIVE_MODE). The step calls the host "
            "allreduce in Python between two jit-compiled phases, which one graph cannot hold"
        )
    if sink is not False:
        raise ConfigError(
            f"dataset_sink_mode must be False, got {sink!r}: a sink runs many steps "
            "per call, so gradients could not be reduced and committed per step"
        )
    if sink_size != -1:
        raise ConfigError(f"sink_size must be -1 (no sinking), got {sink_size!r}")
    if isinstance(epochs, bool) or not isinstance(epochs, int) or epochs < 1:
        raise ConfigError(f"epochs must be a positive integer, got {epochs!r}")
    if isinstance(dataset, msds.Dataset) or not callable(dataset):
        raise ConfigError(
            f"dataset must be a function (first_epoch, rank, world) -> mindspore.dataset.Dataset "
            f"such as ShardedArrays(x, y, global_batch=..., seed=...), got "
            f"{type(dataset).__name__}: a fixed Dataset cannot be re-positioned at the resume step"
        )
    parallel = mindspore.get_auto_parallel_context("parallel_mode")
    if parallel != "stand_alone":
        raise ConfigError(
            f"parallel_mode must be 'stand_alone', got {parallel!r}: ms_recover "
            "reduces the gradients itself"
        )


def _model_parts(model: Any) -> tuple[nn.Cell, nn.Cell, nn.Optimizer]:
    """(net, loss_fn, optimizer) of a ``Model(net, loss_fn, optimizer)``; ConfigError otherwise."""
    if not isinstance(model, Model):
        raise ConfigError(f"model must be a mindspore.train.Model, got {type(model).__name__}")
    net, loss_fn = getattr(model, "_network", None), getattr(model, "_loss_fn", None)
    optimizer = getattr(model, "_optimizer", None)
    if loss_fn is None or optimizer is None or isinstance(net, nn.GraphCell):
        raise ConfigError(
            "model must be built as Model(net, loss_fn=..., optimizer=...) with a trainable net, "
            f"got loss_fn={type(loss_fn).__name__}, optimizer={type(optimizer).__name__}, "
            f"net={type(net).__name__}"
        )
    for name, valid in (("_amp_level", "O0"), ("_boost_level", "O0")):
        if getattr(model, name, valid) != valid:
            raise ConfigError(
                f"{name[1:]} must be {valid!r} under fit(), got {getattr(model, name)!r}"
            )
    if getattr(model, "_loss_scale_manager", None) is not None:
        raise ConfigError(
            "loss_scale_manager must be None under fit() (loss scaling is not part "
            "of ms_recover's train step)"
        )
    return net, loss_fn, optimizer


def _callback_list(callbacks: Any) -> list[Callback]:
    if callbacks is None:
        return []
    listed = [callbacks] if isinstance(callbacks, Callback) else callbacks
    if not isinstance(listed, (list, tuple)) or not all(isinstance(c, Callback) for c in listed):
        raise ConfigError(
            f"callbacks must be None, a Callback or a list of Callbacks, got {callbacks!r}"
        )
    if any(isinstance(c, TrainFaultTolerance) for c in listed):
        raise ConfigError(
            "TrainFaultTolerance cannot be combined with fit(): ms_recover does the recovery"
        )
    return list(listed)


def _dataset_at(dataset: DatasetFn, epoch: int, session: Session, spe: int | None) -> Any:
    data = dataset(epoch, session.rank, session.world_size)
    if not isinstance(data, msds.Dataset):
        raise ConfigError(
            f"dataset({epoch}, {session.rank}, {session.world_size}) must return "
            f"a mindspore.dataset.Dataset, got {type(data).__name__}"
        )
    size = data.get_dataset_size()
    if spe is not None and size != spe:
        raise ConfigError(
            f"dataset({epoch}, ...) has {size} batches per epoch, but "
            f"dataset(0, ...) has {spe}: every epoch must have the same length"
        )
    return data


def _step_check(data: Any, session: Session) -> Callable[[], int] | None:
    names = data.get_col_names()
    if STEP_COLUMN not in names:
        return None
    if names[-1] != STEP_COLUMN:
        raise ConfigError(f"column {STEP_COLUMN!r} must be the dataset's last column, got {names}")
    return lambda: session.next_step


def fit(
    model: Model,
    epochs: int,
    dataset: DatasetFn,
    callbacks: Any = None,
    session: Session | None = None,
    *,
    dataset_sink_mode: bool = False,
    sink_size: int = -1,
    jit: bool = True,
) -> FitResult:
    """Train ``model`` for ``epochs`` epochs with ``Model.train``, recovering from faults.

    Arguments mirror ``Model.train``, except that ``dataset`` is a function
    ``(first_epoch, rank, world) -> Dataset`` (see the module doc). ``session`` defaults to
    ``ms_recover.init(state=MindSporeState(net, optimizer))``, which ``fit`` then also finishes;
    a session passed in stays the caller's to finish, and must have a state provider that
    covers the model's net and optimizer. Returns once every step is committed on this rank
    (or another callback stopped training). Raises ConfigError, naming the valid values, for
    graph mode, sinking, a fixed Dataset, or a Model ``fit`` cannot train faithfully.
    """
    _check_settings(epochs, dataset, dataset_sink_mode, sink_size)
    parts = _model_parts(model)
    user_callbacks = _callback_list(callbacks)
    own = session is None
    if session is None:
        warm_up = fit_warm_up(model, dataset, jit=jit)
        session = init(state=MindSporeState(parts[0], parts[2]), warm_up=warm_up)
    elif session.state is None:
        raise ConfigError(
            "session has no state provider; build it with "
            "ms_recover.init(state=MindSporeState(net, optimizer))"
        )
    result = _run(session, model, epochs, dataset, user_callbacks, jit)
    if own:
        session.finish()
    return result


def fit_warm_up(model: Model, dataset: DatasetFn, *, jit: bool = True) -> Callable[[], None]:
    """A ``warm_up`` for ``ms_recover.init`` in a script that then calls ``fit(model, ...)``.

    ``fit`` passes it itself when it builds the session; a script that builds its own passes
    ``init(state=..., warm_up=fit_warm_up(model, dataset))`` (same ``dataset`` and ``jit`` as
    its ``fit``). It runs only in a pre-warmed spare: it builds ``fit``'s train cell, compiles
    and runs it once on the data's first batch and restores every value bit for bit
    (:mod:`ms_recover.mindspore.fitwarm`); ``fit`` then trains with that cell, and its first
    step compiles nothing. Raises ConfigError at once for what ``fit`` would reject.
    """
    _check_settings(1, dataset, False, -1)
    parts = _model_parts(model)

    def warm_up() -> None:
        cell = DataParallelTrainCell(*parts, _unattached, jit=jit)
        cell.dp_step.warm_up(*first_batch(dataset, JobConfig.from_env().world_size))
        _PREPARED.put(model, cell, jit)

    return warm_up


def _unattached(flat: FlatGrads) -> FlatGrads:
    # A prepared cell's warm-up reduces nothing; fit attaches the session's allreduce.
    raise ConfigError("a train cell prepared by fit_warm_up reduces only inside fit()")


def _run(
    session: Session,
    model: Model,
    epochs: int,
    dataset: DatasetFn,
    callbacks: list[Callback],
    jit: bool,
) -> FitResult:
    parts = _model_parts(model)
    cell = _PREPARED.take(model, jit)
    if cell is None:
        cell = DataParallelTrainCell(*parts, _unattached, jit=jit)
    cell.dp_step.reduce_fn = lambda flat: session.allreduce(flat, "mean")
    trainer = Model(cell)
    probe = _dataset_at(dataset, 0, session, None)  # also the first segment's, from step 0
    spe = probe.get_dataset_size()
    total, segments = epochs * spe, 0
    while True:
        session.safe_point()
        if session.next_step >= total:
            return FitResult(session.committed, total, spe, segments, False)
        start = session.next_step
        first_epoch, skip = divmod(start, spe)
        data = (
            probe
            if start == 0 and segments == 0
            else _dataset_at(dataset, first_epoch, session, spe)
        )
        if skip:
            data.set_init_step(skip)  # as mindspore.train.model._calc_cb_initial_step does
        cell.expected_step = _step_check(data, session)
        seg = _Segment(session, start, spe, parts)
        segments += 1
        log.info(
            "rank=%d step=%d epoch=%d: entering Model.train (segment %d)",
            session.rank,
            start,
            first_epoch,
            segments,
        )
        try:
            trainer.train(
                epochs,
                data,
                callbacks=[_Position(seg), *callbacks, _Commit(seg)],
                dataset_sink_mode=False,
                initial_epoch=first_epoch,
            )
        except Interrupted:
            log.info(
                "rank=%d step=%d: step interrupted by recovery; it will be redone",
                session.rank,
                session.next_step,
            )
            continue
        if seg.stopped_by_callback:
            if seg.recover:
                session.safe_point()  # take part in the pending recovery, then end
            return FitResult(session.committed, total, spe, segments, True)
        if not seg.recover and session.next_step < total:
            raise ConfigError(
                f"Model.train ended at step {session.next_step} of {total} "
                "without a stop: the dataset yielded too few batches"
            )
