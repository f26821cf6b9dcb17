"""Fault injection for tests and the demo: a small builder, its env encoding, and the
:class:`~ms_recover.faulthooks.FaultHooks` implementation that fires the faults.

A fault plan travels to rank processes in ``MS_RECOVER_FAULTS`` as ``;``-separated specs,
``kind:rank=R:step=K[:inc=N][:pod=P]``. A spec fires only in incarnation ``inc`` (0 by
default, the first process of the rank), so a restarted rank does not kill itself again, and
only in pod ``pod`` of its node (0 by default: the node's first pod; LocalPods numbers every
later one, a recreated pod, a hot switch's backup or a spare, in ``MS_RECOVER_FAULTS_POD``),
so a node's recreated pod, whose ranks start again at incarnation 0, does not either.

Kinds:

* ``kill``        SIGKILL this rank right after it commits step K (after its data plane has
  handed its last sends to the kernel, so every peer can finish step K: the survivors'
  target is K whatever the timing; a death with data in flight is ``allreduce``);
* ``node``        SIGKILL this rank's whole process group (its agent and siblings): a lost node;
* ``hang``        SIGSTOP this rank after step K (it stops heartbeating: a hung process);
* ``leave``       exit with code 0 right after committing step K, without ``session.finish()``
  (an early exit: a fault, however clean the exit code);
* ``computehang`` after step K, this rank blocks in its own compute for good, its heartbeat
  thread alive (a deadlocked data loader): the others wait for it in the next collective;
* ``slow``        from step K on, this rank's compute (its time outside collectives) takes
  1.5x as long: half its compute time of step K-1 is added before each allreduce (a fail-slow
  device);
* ``allreduce``   SIGKILL this rank in the middle of step K's gradient allreduce;
* ``transient``   raise a transient data-plane error in step K's allreduce (the rank survives);
* ``memory``      corrupt this rank's state in step K and report a device memory error;
* ``bitflip``     flip one bit of this rank's state when it commits step K, and report nothing
  (silent data corruption: only the replicas' digests can tell);
* ``corrupt``     flip one byte of the state this rank sends in its first repair;
* ``boot``        SIGKILL this rank as soon as the manager accepted its registration;
* ``repairdie``   SIGKILL this rank in the middle of sending its state for a repair;
* ``stopdie``, ``rebuilddie``, ``resumedie``: SIGKILL this rank when the manager's Stop,
  Rebuild or Resume of a recovery reaches it (a fault in that recovery phase; the formation's
  Rebuild and Resume, before the rank's first committed step, do not count).
"""

from __future__ import annotations

import dataclasses
import os
import signal
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np
from numpy.typing import NDArray

from ms_recover import env as E
from ms_recover.errors import CommError, ConfigError, Interrupted
from ms_recover.faulthooks import FaultHooks
from ms_recover.worker import repair

if TYPE_CHECKING:
    from ms_recover.worker.session import Session

KINDS = (
    "kill",
    "node",
    "hang",
    "leave",
    "computehang",
    "slow",
    "allreduce",
    "transient",
    "memory",
    "bitflip",
    "corrupt",
    "boot",
    "repairdie",
    "stopdie",
    "rebuilddie",
    "resumedie",
)


@dataclasses.dataclass(frozen=True)
class FaultSpec:
    kind: str
    rank: int
    step: int = -1
    inc: int = 0
    pod: int = 0

    def encode(self) -> str:
        text = f"{self.kind}:rank={self.rank}:step={self.step}:inc={self.inc}"
        return text + (f":pod={self.pod}" if self.pod else "")


class Faults:
    """Builder: ``Faults().kill(rank=1, step=5).node(rank=2, step=9).to_env()``."""

    def __init__(self, specs: tuple[FaultSpec, ...] = ()) -> None:
        self.specs = specs

    def add(self, kind: str, rank: int, step: int = -1, inc: int = 0, pod: int = 0) -> Faults:
        if kind not in KINDS:
            raise ConfigError(f"fault kind {kind!r} is not one of: {', '.join(KINDS)}")
        return Faults(self.specs + (FaultSpec(kind, rank, step, inc, pod),))

    def kill(self, rank: int, step: int, inc: int = 0) -> Faults:
        return self.add("kill", rank, step, inc)

    def node(self, rank: int, step: int) -> Faults:
        return self.add("node", rank, step)

    def hang(self, rank: int, step: int) -> Faults:
        return self.add("hang", rank, step)

    def leave(self, rank: int, step: int, inc: int = 0) -> Faults:
        return self.add("leave", rank, step, inc)

    def in_allreduce(self, rank: int, step: int) -> Faults:
        return self.add("allreduce", rank, step)

    def transient(self, rank: int, step: int) -> Faults:
        return self.add("transient", rank, step)

    def corrupt(self, rank: int) -> Faults:
        return self.add("corrupt", rank)

    def to_env(self) -> dict[str, str]:
        return {"MS_RECOVER_FAULTS": ";".join(s.encode() for s in self.specs)}


def parse(text: str) -> tuple[FaultSpec, ...]:
    """Parse ``MS_RECOVER_FAULTS``; raises ConfigError naming the bad spec and valid kinds."""
    specs = []
    for raw in filter(None, (t.strip() for t in text.split(";"))):
        kind, *pairs = raw.split(":")
        if kind not in KINDS:
            raise ConfigError(
                f"fault spec {raw!r}: kind {kind!r} is not one of: {', '.join(KINDS)}"
            )
        try:
            fields = {k: int(v) for k, v in (p.split("=", 1) for p in pairs)}
            specs.append(FaultSpec(kind, **fields))
        except (ValueError, TypeError) as exc:
            raise ConfigError(
                f"fault spec {raw!r} must look like kind:rank=R:step=K[:inc=N][:pod=P]"
            ) from exc
    return tuple(specs)


class FaultInjector(FaultHooks):
    """Fires this rank's faults at the named points of the worker's step loop."""

    def __init__(
        self, specs: tuple[FaultSpec, ...], rank: int, incarnation: int, pod: int = 0
    ) -> None:
        super().__init__()
        self._specs = [s for s in specs if s.rank == rank and s.inc == incarnation and s.pod == pod]
        self._fired: set[FaultSpec] = set()
        self.armed = bool(self._specs)  # False: every hook is a no-op (skipped on hot paths)
        self._die_at_next_chunk = False
        slow = [s.step for s in self._specs if s.kind == "slow"]
        self._slow_from = min(slow) if slow else None
        self._slow_extra: float | None = None  # seconds added to each slow step

    @classmethod
    def from_env(cls, rank: int, incarnation: int) -> FaultInjector:
        plan = parse(os.environ.get(E.FAULTS, ""))
        pod = os.environ.get(E.FAULTS_POD, "0")
        if not pod.isdigit():
            raise ConfigError(f"{E.FAULTS_POD}={pod!r} must be a pod number (0, 1, ...)")
        return cls(plan, rank, incarnation, int(pod))

    def _take(self, kinds: tuple[str, ...], step: int) -> FaultSpec | None:
        for spec in self._specs:
            if spec.kind in kinds and spec not in self._fired and spec.step in (step, -1):
                self._fired.add(spec)
                return spec
        return None

    def after_commit(self, step: int, flush: Callable[[], None] | None = None) -> None:
        """Fire ``kill``, ``node``, ``hang``, ``computehang`` or ``leave`` for ``step``;
        ``flush`` (closing the data plane gracefully) runs before a ``kill`` or a ``leave``."""
        spec = self._take(("kill", "node", "hang", "computehang", "leave"), step)
        if spec is None:
            return
        if spec.kind == "computehang":
            while True:  # the manager's recovery kills this process
                time.sleep(3600)
        if spec.kind in ("kill", "leave"):
            if flush is not None:
                flush()
            if spec.kind == "leave":
                os._exit(0)  # no finish(), no atexit: a script that returns mid-training
            os.kill(os.getpid(), signal.SIGKILL)
        elif spec.kind == "node":
            # Under msrun each worker has its own session: the node is msrun's process group.
            launcher = os.environ.get("MS_RECOVER_LAUNCHER_PID", "")
            group = os.getpgid(int(launcher)) if launcher.isdigit() else os.getpgid(0)
            os.killpg(group, signal.SIGKILL)
        else:
            os.kill(os.getpid(), signal.SIGSTOP)

    def in_allreduce(self, step: int) -> bool:
        """True if this rank must die during this step's allreduce (the caller arranges it)."""
        return self._take(("allreduce",), step) is not None

    def before_allreduce(self, step: int) -> None:
        if self._take(("transient",), step) is not None:
            raise CommError(f"injected transient data-plane failure at step {step}")

    def memory_error(self, step: int) -> bool:
        return self._take(("memory",), step) is not None

    def corrupt_repair(self) -> bool:
        return self._take(("corrupt",), -1) is not None

    def die_in_repair(self) -> bool:
        return self._take(("repairdie",), -1) is not None

    def at_command(self, command: str) -> None:
        """SIGKILL this rank if a ``<command>die`` spec is armed (command: stop, rebuild,
        resume); the caller calls it only in a recovery."""
        if self._take((f"{command}die",), -1) is not None:
            os.kill(os.getpid(), signal.SIGKILL)

    def at_registration(self) -> None:
        if self._take(("boot",), -1) is not None:
            os.kill(os.getpid(), signal.SIGKILL)

    # -- the FaultHooks points: each fires the faults above where the worker calls it -------

    def at_allreduce(self, step: int, session: Session) -> None:
        """``transient`` raises CommError; ``allreduce`` dies once the first chunk of this
        allreduce is on the wire; ``memory`` zeroes the state, reports it and interrupts."""
        self.before_allreduce(step)
        if self._slow_from is not None and step >= self._slow_from:
            if self._slow_extra is None:  # the compute before the slowdown, measured once
                self._slow_extra = 0.5 * session.clock.last_compute
            time.sleep(self._slow_extra)
        if self.in_allreduce(step):
            self._die_at_next_chunk = True
        if self.memory_error(step):
            state = session._state()  # no provider: the error a repair would give
            state.load_state_dict({n: np.zeros_like(a) for n, a in state.state_dict().items()})
            session.report_fault("device_memory", f"injected memory error at step {step}")
            raise Interrupted(f"rank {session.rank}: device memory error at step {step}")

    def at_commit(self, step: int, session: Session) -> None:
        """``bitflip`` flips the lowest bit of the first element of the rank's first non-empty
        state entry once ``step`` is committed, and reports nothing (silent corruption)."""
        if self._take(("bitflip",), step) is None:
            return
        state = session._state()  # no provider: the error a repair would give
        arrays = state.state_dict()
        name = next(n for n in sorted(arrays) if arrays[n].nbytes)
        flipped = np.array(arrays[name], copy=True)
        flipped.view(np.uint8).reshape(-1)[0] ^= 1
        state.load_state_dict({**arrays, name: flipped})

    def before_repair_send(self, payload: dict[str, NDArray[Any]]) -> None:
        """``corrupt`` flips one byte of the state sent; ``repairdie`` dies mid-send."""
        if self.corrupt_repair():
            _flip_one_byte(payload)
        if self.die_in_repair():
            self._die_at_next_chunk = True

    def after_chunk_sent(self) -> None:
        if self._die_at_next_chunk:
            os.kill(os.getpid(), signal.SIGKILL)


def _flip_one_byte(payload: dict[str, NDArray[Any]]) -> None:
    name = next(n for n in sorted(payload) if n != repair.MANIFEST and payload[n].nbytes)
    corrupted = np.array(payload[name], copy=True)
    corrupted.view(np.uint8).reshape(-1)[0] ^= 0xFF
    payload[name] = corrupted
