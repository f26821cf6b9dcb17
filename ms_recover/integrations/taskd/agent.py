"""The agent behind the ``taskd.api.taskd_agent_api`` shim: msrun as the launcher.

msrun (with ``MS_ENABLE_TFT`` enabling MindX) calls, in its own process::

    init_taskd_agent({"Framework": "MindSpore"})      # before it starts the scheduler
    register_func("KILL_WORKER", ...)                  # and START_ALL_WORKER, START_WORKER_LIST,
                                                       # MONITOR
    start_taskd_agent()                                # instead of joining its workers

:func:`start` then runs an ordinary :class:`~ms_recover.agent.agent.Agent` whose hands are those
callbacks (:class:`~ms_recover.integrations.msrun.hands.MsrunHands`): it registers with the
manager, starts the workers once the manager answers, reports exits, obeys kill / restart /
exit, and finally **ends the process itself** with the node's exit code (msrun would return 0
whatever happened): 0 done, 86 reschedule this pod (``recover``), 87 the job gave up, 88
dumped, 143 asked to stop (SIGTERM: a planned stop, see :meth:`Agent.leave`), 1 failure, 2
refused.

The node's settings come from the pod's environment (``MS_NODE_RANK``, ``MS_LOCAL_WORKER``,
``MS_WORKER_NUM``, ``MS_SCHED_HOST``, ``POD_IP``, ``MS_RECOVER_*``); where msrun's own process
lacks one, from msrun's command line (the object that owns the callbacks).

Without a reachable manager the agent waits ``MS_RECOVER_MANAGER_WAIT_S`` (default 60 s), then
runs the workers without recovery, as plain msrun would, after one loud warning; with
``MS_RECOVER_NO_MANAGER=exit`` it stops instead (exit 1). ``TASKD_PROCESS_ENABLE=off`` turns the
agent down at ``init_taskd_agent``, so msrun keeps control of its workers itself.

msrun starts the workers, not this agent, so they do not get a relay endpoint: they keep their
own DEALER connection to the manager (the node relay of docs/design.md §1c serves the ranks that
``ms-recover agent`` launches itself). With standby managers (``MS_RECOVER_MANAGERS``,
docs/manager-takeover.md) this agent and each worker follow a takeover on their own; the agent
also moves on from a standby while it waits for its welcome, and starts its workers with the
manager it talks to first in their list.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import signal
import sys
import time
import types
from collections.abc import Callable, Mapping
from typing import Any

from ms_recover import env as E
from ms_recover import exitcodes
from ms_recover.agent.agent import Agent
from ms_recover.agent.hands import LauncherError, RankHands
from ms_recover.config import JobConfig
from ms_recover.errors import ConfigError, MsRecoverError
from ms_recover.integrations.msrun import children
from ms_recover.integrations.msrun.hands import OPERATORS, MsrunHands

log = logging.getLogger("ms_recover.taskd")

#: MindCluster's agent config keys we understand -> what they set.
CONFIG_KEYS = {
    "Framework": "must be 'MindSpore' (msrun)",
    "ServerRank": "this node's rank (else MS_NODE_RANK)",
    "UpstreamAddr": "the manager's host (else MS_SCHED_HOST)",
    "UpstreamPort": "the manager's port (else MS_RECOVER_PORT, 9601)",
}
NO_MANAGER_CHOICES = ("run", "exit")


@dataclasses.dataclass(frozen=True)
class AgentSettings:
    """How the msrun agent behaves when the manager cannot be reached."""

    manager_wait_s: float = 60.0  # MS_RECOVER_MANAGER_WAIT_S
    no_manager: str = "run"  # MS_RECOVER_NO_MANAGER: run | exit

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> AgentSettings:
        raw = environ.get(E.MANAGER_WAIT, "").strip()
        wait = cls.manager_wait_s
        if raw:
            try:
                wait = float(raw)
            except ValueError:
                wait = -1.0
            if not 0 < wait < float("inf"):
                raise ConfigError(f"{E.MANAGER_WAIT}={raw!r} is not a positive number of seconds")
        choice = environ.get(E.NO_MANAGER, "").strip().lower() or cls.no_manager
        if choice not in NO_MANAGER_CHOICES:
            raise ConfigError(
                f"{E.NO_MANAGER}={choice!r} is not one of: {', '.join(NO_MANAGER_CHOICES)}"
            )
        return cls(wait, choice)


@dataclasses.dataclass
class _State:
    config: dict[str, Any] | None = None
    callbacks: dict[str, Callable[..., Any]] = dataclasses.field(default_factory=dict)


_state = _State()


def init(config: object = None, cls: object = None) -> bool:
    """``init_taskd_agent``: True when this agent will drive msrun; False (one log line) when
    it will not, in which case msrun keeps control of its workers itself."""
    _setup_logging()
    if os.environ.get(E.TASKD_PROCESS_ENABLE, "").strip().lower() == "off":
        log.info(
            "%s=off: ms_recover's taskd agent stays out; msrun runs the workers itself",
            E.TASKD_PROCESS_ENABLE,
        )
        return False
    try:
        _state.config = _check_config(config, cls)
    except ConfigError as exc:
        log.error("init_taskd_agent: %s", exc)
        return False
    _state.callbacks.clear()
    # The scheduler process msrun starts next, and every worker, must die with this process.
    os.environ[E.LAUNCHER_PID] = str(os.getpid())
    return True


def register(operator: object, func: object) -> bool:
    """``register_func``: keep one of msrun's callbacks; False (one log line) for anything else."""
    if _state.config is None:
        log.error("register_func(%r) before a successful init_taskd_agent: ignored", operator)
        return False
    if operator not in OPERATORS:
        log.error("register_func: unknown operator %r; valid: %s", operator, ", ".join(OPERATORS))
        return False
    if not callable(func):
        log.error("register_func(%r): %r is not callable", operator, func)
        return False
    _state.callbacks[str(operator)] = func
    return True


def start() -> int:
    """Run this node under the manager until its part of the job ends; the exit code.

    Never raises: a bad setting or a failing msrun callback is one log line and exit 1 or 2.
    """
    if _state.config is None:
        log.error("start_taskd_agent before a successful init_taskd_agent: nothing to run")
        return exitcodes.USAGE
    try:
        settings = AgentSettings.from_env(os.environ)
        config = node_config(os.environ, _state.config, _state.callbacks)
        hands = MsrunHands(config, _state.callbacks)
    except MsRecoverError as exc:
        log.error("taskd agent cannot start: %s", exc)
        return exitcodes.USAGE
    log.info("taskd agent for msrun: node %d of %s", config.node_rank, config.describe())
    agent = Agent(config, [], hands=hands)
    hands.manager_index = lambda: agent.manager_index
    _on_sigterm(agent.leave)  # a planned stop (pod deletion, drain): see Agent.leave
    agent.hello()
    if agent.await_welcome(settings.manager_wait_s):
        code = agent.serve(start=True)
    elif agent.stopping or agent.leaving:  # SIGTERM while waiting: start nothing
        agent.chan.close()
        code = 128 + signal.SIGTERM
    else:
        agent.chan.close()
        code = _without_manager(config, hands, settings)
    children.settle(os.getpid(), ok=code == exitcodes.OK, wait_s=config.phase_timeout_s)
    return code


def node_config(
    environ: Mapping[str, str],
    init_config: Mapping[str, Any],
    callbacks: Mapping[str, Callable[..., Any]],
) -> JobConfig:
    """The node's JobConfig: the pod's environment, msrun's own arguments where the
    environment is silent, and the keys given to ``init_taskd_agent`` on top."""
    env = dict(environ)
    layout = msrun_layout(callbacks)
    fill = {
        E.NODE_RANK: layout.get("node_rank"),
        E.LOCAL_WORKER: layout.get("local_worker_num"),
        E.WORKER_NUM: layout.get("worker_num"),
        E.SCHED_HOST: layout.get("master_addr"),
    }
    for name, value in fill.items():
        if not env.get(name, "").strip() and value not in (None, -1, ""):
            env[name] = str(value)
    msrun_rank = layout.get("node_rank")
    if isinstance(msrun_rank, int) and msrun_rank >= 0 and env.get(E.NODE_RANK, "").strip():
        if env[E.NODE_RANK].strip() != str(msrun_rank):
            raise ConfigError(
                f"{E.NODE_RANK}={env[E.NODE_RANK]} but msrun runs with --node_rank {msrun_rank}"
            )
    env.pop(E.ROLE, None)  # msrun sets MS_ROLE=MS_SCHED in its own process for the scheduler
    overrides: dict[str, Any] = {}
    if "ServerRank" in init_config:
        overrides["node_rank"] = _as_int("ServerRank", init_config["ServerRank"])
    if "UpstreamAddr" in init_config:
        overrides["manager_host"] = str(init_config["UpstreamAddr"])
    if "UpstreamPort" in init_config:
        overrides["manager_port"] = _as_int("UpstreamPort", init_config["UpstreamPort"])
    return JobConfig.from_env(env, **overrides)


def msrun_layout(callbacks: Mapping[str, Callable[..., Any]]) -> dict[str, Any]:
    """msrun's own view of the node (its command line), read from the object whose bound
    methods the callbacks are; empty when they are plain functions."""
    owner = next((getattr(f, "__self__", None) for f in callbacks.values()), None)
    names = ("node_rank", "local_worker_num", "worker_num", "master_addr")
    found = {name: getattr(owner, name, None) for name in names} if owner is not None else {}
    return {k: v for k, v in found.items() if v is not None}


def _without_manager(config: JobConfig, hands: RankHands, settings: AgentSettings) -> int:
    """No manager answered: stop (``exit``), or run the workers as plain msrun would."""
    if settings.no_manager == "exit":
        log.error(
            "no ms_recover manager at %s after %gs and %s=exit: not starting the workers",
            config.manager_endpoint,
            settings.manager_wait_s,
            E.NO_MANAGER,
        )
        return exitcodes.FAILED
    log.warning(
        "!!! NO FAULT RECOVERY: no ms_recover manager answered at %s within %gs; running the "
        "workers as plain msrun would (set %s=exit to stop instead) !!!",
        config.manager_endpoint,
        settings.manager_wait_s,
        E.NO_MANAGER,
    )
    return run_plain(hands, config.ranks_of(config.node_rank))


def run_plain(hands: RankHands, ranks: tuple[int, ...], poll_s: float = 0.1) -> int:
    """msrun's own policy: wait for every worker; the first failure kills the rest (exit 1)."""
    try:
        hands.start_all(ranks)
        while hands.pids():
            for exited in hands.poll():
                if exited.exit_code != 0:
                    log.error(
                        "rank %d failed (exit %d): stopping the node's workers",
                        exited.rank,
                        exited.exit_code,
                    )
                    return exitcodes.FAILED
            time.sleep(poll_s)
        return exitcodes.OK
    except LauncherError as exc:
        log.error("node stops: %s", exc)
        return exitcodes.FAILED
    finally:
        hands.close()


def _check_config(config: object, cls: object) -> dict[str, Any]:
    if not isinstance(config, Mapping):
        raise ConfigError(
            f"config must be a dict like {{'Framework': 'MindSpore'}}, got {config!r}"
        )
    unknown = sorted(str(k) for k in config if k not in CONFIG_KEYS)
    if unknown:
        valid = "; ".join(f"{k}: {v}" for k, v in CONFIG_KEYS.items())
        raise ConfigError(f"unknown key(s) {', '.join(unknown)}; valid: {valid}")
    framework = config.get("Framework")
    if framework != "MindSpore" or cls is not None:
        raise ConfigError(
            f"Framework {framework!r}{' with a cls' if cls is not None else ''} is not supported: "
            "ms_recover's taskd agent drives msrun ('MindSpore'); for other launchers run "
            "'ms-recover agent -- <command>'"
        )
    return dict(config)


def _as_int(key: str, value: object) -> int:
    try:
        return int(str(value))
    except ValueError:
        raise ConfigError(f"init_taskd_agent: {key}={value!r} is not an integer") from None


def _on_sigterm(leave: Callable[[str], None]) -> None:
    def handler(signum: int, frame: types.FrameType | None) -> None:
        leave("SIGTERM")

    try:
        signal.signal(signal.SIGTERM, handler)
    except ValueError:  # not the main thread: the caller keeps its own handling
        pass


def _setup_logging() -> None:
    """msrun configures only MindSpore's logger: give ours a stderr handler if none exists."""
    top = logging.getLogger("ms_recover")
    if not logging.getLogger().handlers and not top.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        top.addHandler(handler)
        top.setLevel(logging.INFO)
