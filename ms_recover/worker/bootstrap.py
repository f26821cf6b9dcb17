"""``ms_recover.init()``: build this rank's session from the environment the agent set."""

from __future__ import annotations

import logging
import os
import warnings
from collections.abc import Callable

from ms_recover import env as E
from ms_recover import faulthooks
from ms_recover.comm.base import CommBackend
from ms_recover.comm.local import LocalBackend
from ms_recover.config import JobConfig
from ms_recover.errors import ConfigError, RecoveryError
from ms_recover.integrations.msrun.sched_process import bind_to_launcher, run_scheduler_role
from ms_recover.observability import lastwords
from ms_recover.worker.session import Session
from ms_recover.worker.spare import await_assignment
from ms_recover.worker.spare import settled as spare_settled
from ms_recover.worker.state import StateProvider

log = logging.getLogger("ms_recover.worker")


def make_backend(config: JobConfig, rank: int) -> CommBackend:
    """The data-plane backend named by ``config.backend``."""
    if config.backend == "ascend":
        from ms_recover.comm.ascend import AscendBackend

        return AscendBackend(rank, config.world_size)
    from ms_recover.comm.host.auth import DataCurve, data_plane_password
    from ms_recover.comm.host.backend import HostBackend

    password = data_plane_password(config.effective_secret(), config.job_id)
    curve = DataCurve.derive(config.secret, config.job_id) if config.data_plane_curve else None
    return HostBackend(
        rank, config.world_size, bind_host=config.pod_ip, password=password, curve=curve
    )


def _standalone(state: StateProvider | None, why: str) -> Session:
    warnings.warn(
        f"ms_recover: {why}; running as a plain single-process job without recovery",
        RuntimeWarning,
        stacklevel=3,
    )
    session = Session(JobConfig(), 0, LocalBackend(), state, standalone=True)
    session.connect()
    return session


def init(
    state: StateProvider | None = None,
    shard: int = 0,
    connect_timeout_s: float | None = None,
    warm_up: Callable[[], object] | None = None,
) -> Session:
    """Join the job as the rank the agent started, or run alone if there is no job.

    ``state`` exposes this rank's training state for repair; ``shard`` groups replicas (ranks
    with the same shard hold the same state; pure data parallelism uses 0 everywhere). A
    restarted rank returns from here only after its state was repaired, with
    ``session.next_step`` set to the step to run. Without ``MS_ROLE`` (no agent), or when no
    manager answers in a one-rank job, it warns once and runs as a plain single job.
    In msrun's scheduler process (``MS_ROLE=MS_SCHED``) it never returns: it serves the manager
    or exits 0 (:mod:`ms_recover.integrations.msrun.sched_process`).

    ``warm_up`` runs only in a pre-warmed spare, before it waits for a rank: e.g. the step's
    ``warm_up`` on a batch of the real shape, so the spare's first step compiles nothing. It
    must leave the training state as it found it (the steps' ``warm_up`` do, bit for bit).
    """
    if not await_assignment(warm_up):  # a pre-warmed spare the agent released unused
        raise SystemExit(0)
    if os.environ.get(E.ROLE) == E.ROLE_SCHED:
        run_scheduler_role(os.environ)
    bind_to_launcher(os.environ)
    if not os.environ.get(E.ROLE):
        return _standalone(state, f"{E.ROLE} is unset (not started by ms-recover agent)")
    if os.environ.get(lastwords.ERROR_FILE):  # the agent reads it when this rank dies
        lastwords.install(os.environ[lastwords.ERROR_FILE])
    config = JobConfig.from_env()
    try:
        rank = int(os.environ[E.RANK_ID])
        incarnation = int(os.environ.get(E.INCARNATION, "0"))
    except (KeyError, ValueError) as exc:
        raise ConfigError(
            f"{E.RANK_ID} and {E.INCARNATION} must be integers set by the agent "
            f"(got {os.environ.get(E.RANK_ID)!r})"
        ) from exc
    timeout = connect_timeout_s if connect_timeout_s is not None else config.phase_timeout_s
    backend = make_backend(config, rank)
    faults = faulthooks.from_env(rank, incarnation)
    session = Session(config, rank, backend, state, shard, incarnation, faults)
    session.on_first_commit = spare_settled  # a former spare lets its agent warm the next one
    try:
        session.connect(timeout)
    except RecoveryError:
        if config.world_size > 1:
            backend.close()
            raise
        backend.close()
        return _standalone(state, f"no manager at {config.manager_endpoint}")
    return session
