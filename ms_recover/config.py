"""JobConfig: every setting of a job, built once, frozen, validated.

Precedence is defaults < environment < explicit arguments. The environment is read only in
:meth:`JobConfig.from_env`. Unknown keys and invalid values raise :class:`ConfigError` with the
valid values in the message.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
import tempfile
from collections.abc import Mapping
from typing import Any

from ms_recover import env as E
from ms_recover import inputs
from ms_recover.errors import ConfigError
from ms_recover.strategy import (
    Strategy,
    format_strategies,
    from_operator_env,
    parse_strategies,
)
from ms_recover.subhealth import SubHealthy, parse_sub_healthy

DEFAULT_PORT = 9601
DEFAULT_STRATEGIES = (Strategy.RECOVER_IN_PLACE, Strategy.RECOVER, Strategy.EXIT)
BACKENDS = ("host", "ascend")
MAX_DIGEST_EVERY = 1_000_000_000
#: From this many nodes on, agents beat through group leaders by default (docs/design.md §1c).
GROUP_FROM_NODES = 256
ROLES = ("", E.ROLE_WORKER, E.ROLE_SCHED)


@dataclasses.dataclass(frozen=True)
class JobConfig:
    """One job's settings. Fields are documented by the environment variable they come from.

    Timeouts are in seconds. ``heartbeat_s * liveness`` is how long a silent peer stays alive;
    it must be shorter than ``hang_timeout_s`` and ``phase_timeout_s``. A silent *agent*
    means a lost node. A rank whose agent still reports it running is only declared lost
    after ``rank_silence_s``: its heartbeat thread can be starved for seconds (a long jit
    compile holding the GIL), and a dead process is reported by its agent anyway.
    """

    job_id: str = "default"  # MINDX_TASK_ID
    node_nums: int = 1  # MS_RECOVER_NODE_NUMS, or MS_WORKER_NUM / MS_LOCAL_WORKER
    proc_per_node: int = 1  # MS_LOCAL_WORKER
    node_rank: int = 0  # MS_NODE_RANK
    role: str = ""  # MS_ROLE
    manager_host: str = "127.0.0.1"  # MS_SCHED_HOST
    manager_port: int = DEFAULT_PORT  # MS_RECOVER_PORT
    tft_port: int = 0  # MS_TFT_PORT: the manager also serves MindIO processors here (0: no)
    pod_ip: str = "127.0.0.1"  # POD_IP
    strategies: tuple[Strategy, ...] = DEFAULT_STRATEGIES  # MS_RECOVER_STRATEGY / MS_ENABLE_TFT
    secret: bytes = b""  # MS_RECOVER_SECRET / MS_RECOVER_SECRET_FILE
    heartbeat_s: float = 0.5  # MS_RECOVER_HEARTBEAT_S
    liveness: int = 4
    rank_silence_s: float = 10.0  # MS_RECOVER_RANK_SILENCE_S
    hang_timeout_s: float = 120.0  # MS_RECOVER_HANG_TIMEOUT_S
    #: A hang is declared after max(hang_k x p99 step time, hang_floor_s), at most
    #: ``hang_timeout_s`` (:mod:`ms_recover.manager.detection`); False (MS_RECOVER_HANG_TIMEOUT_S
    #: is set): after ``hang_timeout_s`` alone.
    hang_adaptive: bool = True  # MS_RECOVER_HANG_ADAPTIVE
    hang_k: float = 2.0
    hang_floor_s: float = 4.0
    #: A rank whose compute time per step stays this many times its peers' is flagged.
    slow_ratio: float = 1.3
    #: What a flagged node meets: MindCluster's ``subHealthyStrategy`` (ms_recover.subhealth).
    sub_healthy: SubHealthy = SubHealthy.IGNORE  # MS_RECOVER_SUB_HEALTHY_STRATEGY
    #: hotSwitch: how long the new pod may take to come (ClusterD waits a minute).
    hot_switch_timeout_s: float = 60.0  # MS_RECOVER_HOT_SWITCH_TIMEOUT_S
    #: A replica that diverges again within this long after a divergence is flagged.
    diverge_window_s: float = 3600.0
    phase_timeout_s: float = 60.0  # MS_RECOVER_PHASE_TIMEOUT_S
    manager_grace_s: float = 0.0  # MS_RECOVER_MANAGER_GRACE_S; 0: phase_timeout_s
    wait_reschedule_timeout_s: float = 270.0  # MS_RECOVER_WAIT_RESCHEDULE_TIMEOUT
    max_tries: int = 2  # MS_RECOVER_MAX_TRIES, per strategy
    #: MS_RECOVER_RANK_RESTARTS_PER_HOUR: recoveries that may restart one rank within an hour;
    #: the next fault of that rank escalates past the strategies that restart ranks.
    rank_restarts_per_hour: int = 20
    events_path: str = ""  # MS_RECOVER_EVENTS
    sched_node_rank: int = 0  # MS_RECOVER_SCHED_NODE_RANK
    backend: str = "host"  # MS_RECOVER_BACKEND
    dump_dir: str = ""  # MS_RECOVER_DUMP_DIR (shared storage in production)
    max_frame_bytes: int = 4 << 20
    require_secret: bool = False  # MS_RECOVER_REQUIRE_SECRET: refuse to run without a secret
    curve: bool = True  # MS_RECOVER_CURVE: encrypt the control plane (only with a secret)
    data_curve: bool = False  # MS_RECOVER_DATA_CURVE: encrypt the data plane too (costs ~6x)
    digest_every_steps: int = 100  # MS_RECOVER_DIGEST_EVERY_STEPS; 0: compare only at stops
    relay_endpoint: str = ""  # MS_RECOVER_RELAY_ENDPOINT: the agent's relay ("": the manager)
    #: The pod's terminationGracePeriodSeconds (Kubernetes' default 30 s): SIGTERM to SIGKILL.
    termination_grace_s: float = 30.0  # MS_RECOVER_TERMINATION_GRACE_S
    #: MS_RECOVER_MANAGERS: ``host:port`` of every manager (the active one and its standbys),
    #: in takeover order; empty: the one manager at ``manager_host:manager_port``.
    managers: tuple[str, ...] = ()
    #: MS_RECOVER_GROUP_NODES: nodes per heartbeat group (docs/design.md §1c); 0: automatic
    #: (groups of about sqrt(nodes) from GROUP_FROM_NODES nodes on, none below), 1: none.
    group_nodes: int = 0

    def __post_init__(self) -> None:
        self._validate()

    @property
    def world_size(self) -> int:
        return self.node_nums * self.proc_per_node

    @property
    def manager_endpoint(self) -> str:
        return f"tcp://{self.manager_host}:{self.manager_port}"

    @property
    def manager_endpoints(self) -> tuple[str, ...]:
        """Every manager's endpoint in takeover order (docs/manager-takeover.md)."""
        if not self.managers:
            return (self.manager_endpoint,)
        return tuple(f"tcp://{m}" for m in self.managers)

    @property
    def silence_s(self) -> float:
        """How long a peer may stay silent before it is declared lost."""
        return self.heartbeat_s * self.liveness

    @property
    def frozen_s(self) -> float:
        """How long a rank's agent must see it stopped by a signal (state ``T``) before it says
        so: two missed heartbeats. A stopped process cannot be a starved heartbeat thread, so
        ``rank_silence_s`` does not apply (:mod:`ms_recover.agent.frozen`)."""
        return 2 * self.heartbeat_s

    @property
    def agent_heartbeat_s(self) -> float:
        """How often a node agent heartbeats: three times per silence window (ZeroMQ's
        Paranoid Pirate liveness of 3), never more often than ``heartbeat_s``. The manager
        hears one frame per node per period whatever the ranks per node, so at 2,048 nodes
        and the defaults (0.5 s x 4) that is 3,072 frames a second instead of 4,096, while a
        lost node is still declared ``silence_s`` after its last heartbeat (ranks still beat
        to their agent every ``heartbeat_s``; their steps ride on the agent's next beat)."""
        return max(self.heartbeat_s, self.silence_s / 3)

    @property
    def rank_report_s(self) -> float:
        """How often a node agent's heartbeat carries its ranks' steps (``AgentHeartbeat.steps``):
        four times per window the manager judges a rank by (its silence, ``rank_silence_s``
        or ``silence_s``, and ``hang_timeout_s`` for progress), never more often than the
        agent beats. A step between reports changes no decision: a rank is declared silent or
        hung only after a whole window, and a RESUME's closing heartbeat is relayed at once.
        At 2,048 nodes and the defaults that is 819 reports a second instead of 3,072, and
        the beats between them are a node number alone."""
        window = min(max(self.rank_silence_s, self.silence_s), self.hang_timeout_s)
        return max(self.agent_heartbeat_s, window / 4)

    @property
    def lost_manager_grace_s(self) -> float:
        """How long agents wait for a silent manager to come back (restarted) before they stop
        their node: ``manager_grace_s``, or ``phase_timeout_s`` when that is 0."""
        return self.manager_grace_s or self.phase_timeout_s

    @property
    def group_size(self) -> int:
        """Nodes per heartbeat group: ``group_nodes``, or automatic (the module constant
        GROUP_FROM_NODES); 1: no groups, every agent beats to the manager."""
        if self.group_nodes:
            return self.group_nodes
        if self.node_nums < GROUP_FROM_NODES:
            return 1
        return math.isqrt(self.node_nums - 1) + 1

    def group_leader(self, node_rank: int) -> int:
        """The node whose agent leads ``node_rank``'s heartbeat group (the group's first)."""
        return node_rank - node_rank % self.group_size

    def group_members(self, node_rank: int) -> range:
        """The nodes that beat through ``node_rank``'s agent: empty unless it leads a group
        of more than one node."""
        size = self.group_size
        if size <= 1 or node_rank % size:
            return range(0)
        return range(node_rank + 1, min(node_rank + size, self.node_nums))

    def node_of(self, rank: int) -> int:
        return rank // self.proc_per_node

    def ranks_of(self, node_rank: int) -> tuple[int, ...]:
        first = node_rank * self.proc_per_node
        return tuple(range(first, first + self.proc_per_node))

    @property
    def insecure(self) -> bool:
        """No secret is configured: anyone who can reach the manager's port can drive the job."""
        return not self.secret

    @property
    def control_curve(self) -> bool:
        """Whether the control plane is encrypted (ZeroMQ CURVE): with a secret, unless off."""
        return self.curve and not self.insecure

    @property
    def data_plane_curve(self) -> bool:
        """Whether the data plane is encrypted: on request (``data_curve``), with a secret."""
        return self.data_curve and not self.insecure

    def effective_secret(self) -> bytes:
        """The HMAC key: the configured secret, else one derived from the job id.

        The derived key is NOT a secret: anyone who knows the job id (it is in the pod names)
        can compute it, sign control frames and derive the data-plane password. It only keeps
        two jobs on one network from mixing frames by accident. Deployments that need
        protection set MS_RECOVER_SECRET or MS_RECOVER_SECRET_FILE (from a Kubernetes Secret);
        ``require_secret`` makes its absence an error.
        """
        return self.secret or b"ms-recover-insecure:" + self.job_id.encode()

    def effective_dump_dir(self) -> str:
        """Where the ``dump`` strategy writes: ``dump_dir``, else a per-job temp directory."""
        return self.dump_dir or os.path.join(
            tempfile.gettempdir(), "ms-recover", self.job_id, "dump"
        )

    def member_env(self) -> dict[str, str]:
        """The ``MS_RECOVER_*`` variables that give every agent and rank of the job the same
        timing, limits and backend as this config (what a pod spec sets for all containers)."""
        env = {
            E.HEARTBEAT: repr(self.heartbeat_s),
            E.HANG_TIMEOUT: repr(self.hang_timeout_s),
            E.HANG_ADAPTIVE: "1" if self.hang_adaptive else "0",
            E.RANK_SILENCE: repr(self.rank_silence_s),
            E.PHASE_TIMEOUT: repr(self.phase_timeout_s),
            E.MANAGER_GRACE: repr(self.manager_grace_s),
            E.WAIT_RESCHEDULE: repr(self.wait_reschedule_timeout_s),
            E.MAX_TRIES: str(self.max_tries),
            E.SCHED_NODE_RANK: str(self.sched_node_rank),
            E.BACKEND: self.backend,
            E.DIGEST_EVERY: str(self.digest_every_steps),
            E.SUB_HEALTHY: self.sub_healthy.value,
            E.HOT_SWITCH_TIMEOUT: repr(self.hot_switch_timeout_s),
        }
        if self.dump_dir:
            env[E.DUMP_DIR] = self.dump_dir
        if self.managers:
            env[E.MANAGERS] = ",".join(self.managers)
        if self.group_nodes:
            env[E.GROUP_NODES] = str(self.group_nodes)
        if not self.curve:
            env[E.CURVE] = "0"
        if self.data_curve:
            env[E.DATA_CURVE] = "1"
        return env

    def replace(self, **changes: Any) -> JobConfig:
        """A copy with some fields changed; unknown fields raise ConfigError."""
        _check_keys(changes)
        return dataclasses.replace(self, **changes)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: Any) -> JobConfig:
        """Defaults, then the environment (docs/design.md §6), then ``overrides``."""
        _check_keys(overrides)
        environ = os.environ if environ is None else environ
        inputs.check_env_text(environ, _ENV_KEYS)
        values = _read_env(environ)
        values.update({k: v for k, v in overrides.items() if v is not None})
        if isinstance(values.get("strategies"), str):
            values["strategies"] = parse_strategies(values["strategies"])
        return cls(**values)

    def _validate(self) -> None:
        for name in ("node_rank", "sched_node_rank", "manager_port", "max_frame_bytes"):
            _int_field(name, getattr(self, name))
        _positive_int("node_nums", self.node_nums)
        _positive_int("proc_per_node", self.proc_per_node)
        _positive_int("liveness", self.liveness)
        _positive_int("max_tries", self.max_tries)
        _positive_int("rank_restarts_per_hour", self.rank_restarts_per_hour)
        _int_field("digest_every_steps", self.digest_every_steps)
        if not 0 <= self.digest_every_steps <= MAX_DIGEST_EVERY:
            raise ConfigError(
                f"digest_every_steps must be 0 (off) or 1..{MAX_DIGEST_EVERY} steps, "
                f"got {self.digest_every_steps}"
            )
        if not isinstance(self.job_id, str) or not self.job_id:
            raise ConfigError(f"job_id must be a non-empty string, got {self.job_id!r}")
        for name in ("require_secret", "curve", "data_curve", "hang_adaptive"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(f"{name} must be true or false, got {getattr(self, name)!r}")
        if self.require_secret and self.insecure:
            raise ConfigError(
                f"a job secret is required ({E.REQUIRE_SECRET}=1 or --require-secret) but none "
                f"is set: set {E.SECRET} or {E.SECRET_FILE} (e.g. from a Kubernetes Secret)"
            )
        if not 0 <= self.node_rank < self.node_nums:
            raise ConfigError(
                f"node_rank {self.node_rank} is outside 0..{self.node_nums - 1} (node_nums)"
            )
        if not 0 <= self.sched_node_rank < self.node_nums:
            raise ConfigError(
                f"sched_node_rank {self.sched_node_rank} is outside 0..{self.node_nums - 1}"
            )
        _check_managers(self.managers)
        if not 0 <= self.manager_port < 65536:
            raise ConfigError(f"manager_port {self.manager_port} is not in 0..65535 (0: any)")
        if not 0 <= self.tft_port < 65536:
            raise ConfigError(f"{E.TFT_PORT}={self.tft_port} is not in 0..65535 (0: none)")
        if self.role not in ROLES:
            raise ConfigError(f"MS_ROLE {self.role!r} is not one of: {', '.join(map(repr, ROLES))}")
        if self.backend not in BACKENDS:
            raise ConfigError(f"backend {self.backend!r} is not one of: {', '.join(BACKENDS)}")
        if not all(isinstance(s, Strategy) for s in self.strategies):
            raise ConfigError(f"strategies must be Strategy values, got {self.strategies!r}")
        for name in (
            "heartbeat_s",
            "hang_timeout_s",
            "phase_timeout_s",
            "wait_reschedule_timeout_s",
            "rank_silence_s",
            "hang_floor_s",
            "hot_switch_timeout_s",
            "diverge_window_s",
        ):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
                raise ConfigError(f"{name} must be a positive number of seconds, got {value!r}")
        if not isinstance(self.sub_healthy, SubHealthy):
            self._set("sub_healthy", parse_sub_healthy(str(self.sub_healthy)))
        if not isinstance(self.slow_ratio, (int, float)) or not 1 < self.slow_ratio < 100:
            raise ConfigError(f"slow_ratio must be a number in (1, 100), got {self.slow_ratio!r}")
        if not isinstance(self.hang_k, (int, float)) or not 1 <= self.hang_k <= 1000:
            raise ConfigError(f"hang_k must be a number in 1..1000, got {self.hang_k!r}")
        grace = self.manager_grace_s
        if not isinstance(grace, (int, float)) or not math.isfinite(grace) or grace < 0:
            raise ConfigError(
                f"manager_grace_s must be 0 (use phase_timeout_s) or a positive number of "
                f"seconds, got {grace!r}"
            )
        if 0 < grace <= self.silence_s:
            raise ConfigError(
                f"manager_grace_s ({grace:g}s) must be above heartbeat_s*liveness "
                f"({self.silence_s:g}s), or 0 to use phase_timeout_s"
            )
        if self.silence_s >= min(self.hang_timeout_s, self.phase_timeout_s):
            raise ConfigError(
                f"heartbeat_s*liveness ({self.silence_s:g}s) must be below hang_timeout_s "
                f"({self.hang_timeout_s:g}s) and phase_timeout_s ({self.phase_timeout_s:g}s)"
            )
        self._check_limits()

    def _check_limits(self) -> None:
        """Ranges a real job stays inside, and the timing order poll < heartbeat < silence <
        hang/phase: outside them a job dies at start or the manager exhausts memory."""
        inputs.check_job_id(self.job_id)
        inputs.check_host("manager_host (MS_SCHED_HOST / --host)", self.manager_host)
        inputs.check_host("pod_ip (POD_IP)", self.pod_ip)
        inputs.check_int_range("node_nums", self.node_nums, 1, inputs.MAX_NODES)
        inputs.check_int_range("proc_per_node", self.proc_per_node, 1, inputs.MAX_PROCS_PER_NODE)
        if self.world_size > inputs.MAX_WORLD:
            raise ConfigError(
                f"world size {self.node_nums}x{self.proc_per_node}={self.world_size} is above "
                f"the maximum {inputs.MAX_WORLD} ranks"
            )
        inputs.check_int_range("liveness", self.liveness, 2, inputs.MAX_LIVENESS)
        inputs.check_int_range(
            f"group_nodes ({E.GROUP_NODES}; 0: automatic, 1: no groups)",
            self.group_nodes,
            0,
            inputs.MAX_NODES,
        )
        inputs.check_int_range("max_tries", self.max_tries, 1, inputs.MAX_TRIES)
        inputs.check_int_range(
            "rank_restarts_per_hour", self.rank_restarts_per_hour, 1, inputs.MAX_TRIES
        )
        inputs.check_int_range("max_frame_bytes", self.max_frame_bytes, *inputs.MAX_FRAME_BYTES)
        for name in ("hang_timeout_s", "phase_timeout_s", "wait_reschedule_timeout_s"):
            inputs.check_seconds(name, getattr(self, name))
        inputs.check_seconds("rank_silence_s", self.rank_silence_s)
        inputs.check_seconds(
            f"termination_grace_s ({E.TERMINATION_GRACE}, the pod's terminationGracePeriodSeconds)",
            self.termination_grace_s,
        )
        if self.relay_endpoint and not re.fullmatch(
            r"tcp://127\.0\.0\.1:\d{1,5}", self.relay_endpoint
        ):
            raise ConfigError(
                f"{E.RELAY_ENDPOINT}={self.relay_endpoint!r} is not tcp://127.0.0.1:PORT "
                "(the agent sets it for the ranks it launches), or unset"
            )
        # liveness >= 2 gives heartbeat < silence; _validate checked silence < hang, phase.
        if not inputs.MIN_HEARTBEAT_S <= self.heartbeat_s:
            raise ConfigError(
                f"heartbeat_s {self.heartbeat_s:g}s is below the minimum "
                f"{inputs.MIN_HEARTBEAT_S:g}s (members poll every 20 ms; a faster heartbeat "
                "makes every member look lost at start)"
            )

    def _set(self, name: str, value: object) -> None:
        """Normalise a field given as text (a frozen dataclass: only while validating)."""
        object.__setattr__(self, name, value)

    def describe(self) -> str:
        return (
            f"job={self.job_id} nodes={self.node_nums}x{self.proc_per_node} "
            f"strategy={format_strategies(self.strategies) or '(none)'} "
            f"manager={self.manager_endpoint}"
        )


FIELD_NAMES = frozenset(f.name for f in dataclasses.fields(JobConfig))
_MAX_SECRET_BYTES = 4096
_ENV_KEYS = tuple(v for k, v in vars(E).items() if k.isupper() and isinstance(v, str))


def _check_managers(managers: object) -> None:
    """Each entry of ``managers`` is ``host:port`` with a port in 1..65535."""
    if not isinstance(managers, tuple):
        raise ConfigError(f"managers must be a tuple of host:port, got {managers!r}")
    for entry in managers:
        host, _, port = str(entry).rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ConfigError(
                f"{E.MANAGERS} entry {entry!r} is not host:port with a port in 1..65535; "
                "valid: a comma list such as 10.0.0.1:9601,job-worker-1.job:9601"
            )
        inputs.check_host(E.MANAGERS, host)


def _check_keys(keys: Mapping[str, Any]) -> None:
    unknown = sorted(set(keys) - FIELD_NAMES)
    if unknown:
        raise ConfigError(
            f"unknown config key(s) {', '.join(unknown)}; valid: {', '.join(sorted(FIELD_NAMES))}"
        )


def _int_field(name: str, value: object) -> None:
    if not isinstance(value, int) or isinstance(value, bool):
        raise ConfigError(f"{name} must be an integer, got {value!r}")


def _positive_int(name: str, value: object) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise ConfigError(f"{name} must be a positive integer, got {value!r}")


def _int(environ: Mapping[str, str], key: str) -> int | None:
    raw = environ.get(key, "").strip()
    if not raw:
        return None
    try:
        return int(raw)
    except ValueError:
        raise ConfigError(f"{key}={raw!r} is not an integer") from None


def _float(environ: Mapping[str, str], key: str) -> float | None:
    raw = environ.get(key, "").strip()
    if not raw:
        return None
    try:
        return float(raw)
    except ValueError:
        raise ConfigError(f"{key}={raw!r} is not a number of seconds") from None


def _read_secret(environ: Mapping[str, str]) -> bytes | None:
    if environ.get(E.SECRET):
        return environ[E.SECRET].encode()
    path = environ.get(E.SECRET_FILE, "").strip()
    if not path:
        return None
    try:
        with inputs.open_regular(path) as fh:  # /dev/zero or a FIFO would never end
            secret = fh.read(_MAX_SECRET_BYTES + 1).strip()
    except OSError as exc:
        raise ConfigError(f"{E.SECRET_FILE}={path!r} cannot be read: {exc.strerror}") from exc
    if not secret:
        raise ConfigError(f"{E.SECRET_FILE}={path!r} is empty: the job would run unauthenticated")
    if len(secret) > _MAX_SECRET_BYTES:
        raise ConfigError(
            f"{E.SECRET_FILE}={path!r} holds over {_MAX_SECRET_BYTES} bytes; give a file with "
            "just the secret"
        )
    return secret


_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


def _hang_adaptive(environ: Mapping[str, str]) -> bool | None:
    """MS_RECOVER_HANG_ADAPTIVE, else False when MS_RECOVER_HANG_TIMEOUT_S is set (it replaces
    the adaptive rule), else None (the default)."""
    said = _bool(environ, E.HANG_ADAPTIVE)
    if said is not None:
        return said
    return False if environ.get(E.HANG_TIMEOUT, "").strip() else None


def _bool(environ: Mapping[str, str], key: str) -> bool | None:
    raw = environ.get(key, "").strip().lower()
    if not raw:
        return None
    if raw in _TRUE or raw in _FALSE:
        return raw in _TRUE
    raise ConfigError(f"{key}={raw!r} is not one of: {', '.join(_TRUE + _FALSE)}")


def _read_strategies(environ: Mapping[str, str]) -> tuple[Strategy, ...] | None:
    if E.STRATEGY in environ:
        return parse_strategies(environ[E.STRATEGY])
    if environ.get(E.ENABLE_TFT):
        return from_operator_env(environ[E.ENABLE_TFT], environ.get(E.RESTART_FAULT_PROCESS, ""))
    return None


def env_fields(environ: Mapping[str, str]) -> dict[str, Any]:
    """The fields the environment sets, by name: what :meth:`JobConfig.from_env` reads (raises
    ConfigError as it does). For ``ms-recover config``."""
    inputs.check_env_text(environ, _ENV_KEYS)
    return _read_env(environ)


ENV_KEYS = _ENV_KEYS  # every variable name of ms_recover.env


def _read_env(environ: Mapping[str, str]) -> dict[str, Any]:
    local = _int(environ, E.LOCAL_WORKER)
    world = _int(environ, E.WORKER_NUM)
    nodes = _int(environ, E.NODE_NUMS)
    if world is not None and local:
        if world % local:
            raise ConfigError(
                f"{E.WORKER_NUM}={world} is not a multiple of {E.LOCAL_WORKER}={local}"
            )
        if nodes is not None and nodes * local != world:
            raise ConfigError(
                f"{E.NODE_NUMS}={nodes} x {E.LOCAL_WORKER}={local} != {E.WORKER_NUM}={world}"
            )
        nodes = world // local
    elif world is not None and nodes is not None and local is None:
        if world % nodes:
            raise ConfigError(f"{E.WORKER_NUM}={world} is not a multiple of {E.NODE_NUMS}={nodes}")
        local = world // nodes
    elif world is not None and world != 1:
        raise ConfigError(f"{E.WORKER_NUM}={world} needs {E.LOCAL_WORKER} (ranks per node) too")
    found: dict[str, Any] = {
        "job_id": environ.get(E.TASK_ID) or None,
        "node_nums": nodes,
        "proc_per_node": local,
        "node_rank": _int(environ, E.NODE_RANK),
        "role": environ.get(E.ROLE),
        "manager_host": environ.get(E.SCHED_HOST) or None,
        "manager_port": _int(environ, E.PORT),
        "tft_port": _int(environ, E.TFT_PORT if environ.get(E.TFT_PORT) else E.TTP_PORT),
        "pod_ip": environ.get(E.POD_IP) or None,
        "strategies": _read_strategies(environ),
        "secret": _read_secret(environ),
        "heartbeat_s": _float(environ, E.HEARTBEAT),
        "hang_timeout_s": _float(environ, E.HANG_TIMEOUT),
        "hang_adaptive": _hang_adaptive(environ),
        "rank_silence_s": _float(environ, E.RANK_SILENCE),
        "phase_timeout_s": _float(environ, E.PHASE_TIMEOUT),
        "manager_grace_s": _float(environ, E.MANAGER_GRACE),
        "wait_reschedule_timeout_s": _float(environ, E.WAIT_RESCHEDULE),
        "max_tries": _int(environ, E.MAX_TRIES),
        "rank_restarts_per_hour": _int(environ, E.RANK_RESTARTS),
        "events_path": environ.get(E.EVENTS) or None,
        "sched_node_rank": _int(environ, E.SCHED_NODE_RANK),
        "backend": environ.get(E.BACKEND) or None,
        "dump_dir": environ.get(E.DUMP_DIR) or None,
        "require_secret": _bool(environ, E.REQUIRE_SECRET),
        "curve": _bool(environ, E.CURVE),
        "data_curve": _bool(environ, E.DATA_CURVE),
        "digest_every_steps": _int(environ, E.DIGEST_EVERY),
        "group_nodes": _int(environ, E.GROUP_NODES),
        "relay_endpoint": environ.get(E.RELAY_ENDPOINT) or None,
        "termination_grace_s": _float(environ, E.TERMINATION_GRACE),
        "managers": tuple(environ[E.MANAGERS].split(",")) if environ.get(E.MANAGERS) else None,
        "sub_healthy": parse_sub_healthy(environ[E.SUB_HEALTHY])
        if environ.get(E.SUB_HEALTHY, "").strip()
        else None,
        "hot_switch_timeout_s": _float(environ, E.HOT_SWITCH_TIMEOUT),
    }
    return {k: v for k, v in found.items() if v is not None}
